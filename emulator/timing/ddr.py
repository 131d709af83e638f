"""DDR traffic and DDR cycles of one task.

The bytes are exactly what the emulator's DMA moved in the task (``TaskRecord.traffic``,
emulator/memory.py ``DmaTraffic``): every read stream (regcmd fetch, CNA feature/weight,
DPU_RDMA bias/BN/EW/main, PPU_RDMA) and both write streams (DPU, PPU). DDR cycles follow the
proportional model of vendor-corpus README §4.2 (cycles = bytes / bytes-per-cycle) with the
platform's ``ddr`` read and write rates (rk3588: 5.9 B/cycle each, fitted to calibration.md
Table A rows 3-5; platforms/rk3588.yaml).
"""

from __future__ import annotations

import math

from npuemu.emulator.memory import DmaTraffic


def ddr_bytes(traffic: DmaTraffic) -> tuple[int, int]:
    """(read bytes, write bytes) the task's DMA moved."""
    return traffic.read_bytes, traffic.write_bytes


def ddr_cycles(read_bytes: int, write_bytes: int, platform) -> int:
    """Cycles to move the bytes at the platform's DDR rates (read and write serialised, rounded up)."""
    ddr = platform.ddr
    return math.ceil(read_bytes / ddr.read_bytes_per_cycle + write_bytes / ddr.write_bytes_per_cycle)
