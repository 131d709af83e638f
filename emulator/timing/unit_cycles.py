"""Compute cycles of a task without MAC work (DPU-only element-wise/LUT tasks, PPU pooling).

The vendor's estimator reports 0 NPU cycles for these layers (vendor-corpus README §4.1) and no
public source gives the DPU/PPU throughput, so this is our documented assumption
(emulator/TIMING.md): the unit streams one ``cycle_model.dpu_bytes_per_cycle`` (16 B, one
NC1HWC2 atom of int8) of its input cube per cycle. Read from the task's decoded state only:
DPU ``DATA_CUBE_WIDTH/HEIGHT/CHANNEL`` and the input precision; PPU input width/height/channels
and its precision. A task with a conv is pipelined behind the CORE, so the MAC cycles
(npu_cycles.py) decide - unless the platform bounds the rate at which a conv task's output
leaves the DPU (``cycle_model.conv_write_bytes_per_cycle``, fitted to board rows where
DDR-bound convs take time in proportion to the bytes they write, emulator/TIMING.md); then the
unit cycles are the task's written bytes at that rate.
"""

from __future__ import annotations

import math

from npuemu.emulator.units.state import BF16, PRECISION_DTYPES


def _itemsize(precision: int) -> int:
    """Bytes per element of a precision code; bf16 (no numpy type) is 2, like fp16."""
    if precision == BF16:
        return 2
    dtype = PRECISION_DTYPES.get(precision)
    return dtype.itemsize if dtype is not None else 1


def conv_output_cycles(write_bytes: int, rate: float | None) -> int:
    """Cycles a conv task's DPU needs to write ``write_bytes`` at ``rate`` bytes/cycle (0: no bound)."""
    return math.ceil(write_bytes / rate) if rate else 0


def unit_cycles(record, platform) -> int:
    """Cycles of a DPU-only or PPU-only task's unit; for a conv task the output bound (0 without one)."""
    if record.conv is not None:
        return conv_output_cycles(record.traffic.write_bytes, platform.cycle_model.conv_write_bytes_per_cycle)
    rate = platform.cycle_model.dpu_bytes_per_cycle
    cycles = 0
    unpool = getattr(record.dpu_rdma, "unpool", None)
    if record.dpu is not None and unpool is not None:
        # unpooling (kernels/dpu_unpool.py): the DPU writes kernel_h rows of its W-wide cube per
        # input line, one atom each, so the written cube is the larger side [I] (compiler/LOWERING.md 19)
        d = record.dpu
        cycles = math.ceil(d.width * d.height * unpool.kernel_h * d.atom_bytes / rate)
    elif record.dpu is not None:
        d = record.dpu
        cycles = max(cycles, math.ceil(d.width * d.height * d.channels * _itemsize(d.in_precision) / rate))
    if record.ppu is not None:
        p = record.ppu
        cycles = max(cycles, math.ceil(p.in_width * p.in_height * p.in_channels * _itemsize(p.proc_precision) / rate))
    return cycles
