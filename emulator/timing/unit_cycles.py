"""Compute cycles of a task without MAC work (DPU-only element-wise/LUT tasks, PPU pooling).

The vendor's estimator reports 0 NPU cycles for these layers (vendor-corpus README §4.1) and no
public source gives the DPU/PPU throughput, so this is our documented assumption
(emulator/TIMING.md): the unit streams one ``cycle_model.dpu_bytes_per_cycle`` (16 B, one
NC1HWC2 atom of int8) of its input cube per cycle. Read from the task's decoded state only:
DPU ``DATA_CUBE_WIDTH/HEIGHT/CHANNEL`` and the input precision; PPU input width/height/channels
and its precision. A task with a conv gets 0 here: its DPU/PPU work is pipelined behind the
CORE and the MAC cycles (npu_cycles.py) decide.
"""

from __future__ import annotations

import math

from npuemu.emulator.units.state import PRECISION_DTYPES


def _itemsize(precision: int) -> int:
    dtype = PRECISION_DTYPES.get(precision)
    return dtype.itemsize if dtype is not None else 1


def unit_cycles(record, platform) -> int:
    """Cycles of a DPU-only or PPU-only task's unit; 0 for conv tasks and empty tasks."""
    if record.conv is not None:
        return 0
    rate = platform.cycle_model.dpu_bytes_per_cycle
    cycles = 0
    if record.dpu is not None:
        d = record.dpu
        cycles = max(cycles, math.ceil(d.width * d.height * d.channels * _itemsize(d.in_precision) / rate))
    if record.ppu is not None:
        p = record.ppu
        cycles = max(cycles, math.ceil(p.in_width * p.in_height * p.in_channels * _itemsize(p.proc_precision) / rate))
    return cycles
