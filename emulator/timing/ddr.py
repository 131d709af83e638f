"""DDR traffic and DDR cycles of one task.

The bytes are exactly what the emulator's DMA moved in the task (``TaskRecord.traffic``,
emulator/memory.py ``DmaTraffic``): every read stream (regcmd fetch, CNA feature/weight,
DPU_RDMA bias/BN/EW/main, PPU_RDMA) and both write streams (DPU, PPU).

Accounting (emulator/TIMING.md "One count per byte"): the task's *data* streams (everything but
the PC's regcmd fetch) overlap with its compute and make its DDR cycles; the regcmd fetch happens
before the task's units start, so its cycles belong to the task's launch (task_time.py), not to
DDR cycles. Both are read at the platform's ``ddr.read_bytes_per_cycle``, so every byte the DMA
moved is timed exactly once. DDR cycles follow the proportional model of vendor-corpus README
§4.2 (cycles = bytes / bytes-per-cycle) with the platform's ``ddr`` rates, fitted to the board
rows of calibration.md by ``npuemu calibrate --fit`` (platforms/*.yaml).
"""

from __future__ import annotations

import math

from npuemu.emulator.memory import DmaTraffic


def ddr_bytes(traffic: DmaTraffic) -> tuple[int, int]:
    """(read bytes, write bytes) the task's DMA moved to and from DDR, regcmd fetch included
    (SRAM hits are not DDR traffic; TIMING.md, SRAM)."""
    return traffic.ddr_read_bytes, traffic.ddr_write_bytes


def data_read_bytes(traffic: DmaTraffic) -> int:
    """DDR read bytes of the task's data streams (all but the regcmd fetch and SRAM hits)."""
    return traffic.ddr_read_bytes - traffic.regcmd_read


def ddr_cycles_at(read_bytes: int, write_bytes: int, read_rate: float, write_rate: float) -> int:
    """Cycles to move the bytes at the given rates (read and write serialised, rounded up)."""
    return math.ceil(read_bytes / read_rate + write_bytes / write_rate)


def fetch_cycles_at(regcmd_bytes: int, read_rate: float) -> int:
    """Cycles for the PC to fetch a task's register commands at the DDR read rate."""
    return math.ceil(regcmd_bytes / read_rate)


def ddr_cycles(read_bytes: int, write_bytes: int, platform) -> int:
    """:func:`ddr_cycles_at` with the platform's DDR rates."""
    ddr = platform.ddr
    return ddr_cycles_at(read_bytes, write_bytes, ddr.read_bytes_per_cycle, ddr.write_bytes_per_cycle)


def regcmd_fetch_cycles(regcmd_bytes: int, platform) -> int:
    """:func:`fetch_cycles_at` with the platform's DDR read rate."""
    return fetch_cycles_at(regcmd_bytes, platform.ddr.read_bytes_per_cycle)
