"""Cycles of one task: ``max(compute, DDR) + (1 - overlap) * min(compute, DDR) + launch``.

compute = the MAC cycles (model H1, npu_cycles.py) of a conv task, or the DPU/PPU unit cycles of
a task without MAC work (unit_cycles.py). In a conv task the CORE and the data DMA overlap by the
platform's ``ddr.compute_overlap`` (1 = fully, the vendor's estimator's Total = max(DDR, NPU) on
all 4284 corpus rows, vendor-corpus README §4.1; fitted per chip to calibration.md). A task
without a conv overlaps fully: its DPU/PPU consumes the read stream and feeds the write stream as
they flow (no CBUF staging), so its time is max(unit, DDR) on every chip (emulator/TIMING.md
"Per task"; the RK3562 Add row takes 0.90 x its DDR cycles, not DDR + unit). ``launch`` is what
the task costs before its units start: the PC fetching its register commands (``regcmd`` bytes at the DDR read rate,
ddr.py) plus the platform's fixed ``launch.task_overhead_cycles`` (dispatch; fitted to
calibration.md by ``npuemu calibrate --fit``). DDR cycles count the data streams only, so the
regcmd bytes are timed once, in the launch (emulator/TIMING.md "One count per byte").
Only the task's decoded register state and its DMA byte counts are used (architecture.md,
"The one rule").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from npuemu.emulator.timing.ddr import data_read_bytes, ddr_bytes, ddr_cycles, regcmd_fetch_cycles
from npuemu.emulator.timing.npu_cycles import task_npu_cycles
from npuemu.emulator.timing.unit_cycles import unit_cycles


@dataclass(frozen=True)
class TaskTime:
    core: int
    index: int
    npu_cycles: int
    ddr_cycles: int       # data streams (feature, weight, bias, EW, DPU/PPU reads and writes)
    ddr_read_bytes: int   # every byte read, regcmd fetch included
    ddr_write_bytes: int
    overhead_cycles: int  # launch: fixed per-task overhead + regcmd fetch cycles
    macs: int  # MACs of the real work (conv tasks), for MAC usage
    regcmd_bytes: int = 0
    unit_cycles: int = 0  # DPU/PPU cycles of a task without MAC work (not in the NPUCycles column)
    serial_cycles: int = 0  # the part of min(compute, DDR) not hidden by the overlap
    sram_hit_bytes: int = 0  # bytes read from or written to SRAM instead of DDR (no DDR cycles)

    @property
    def compute_cycles(self) -> int:
        return max(self.npu_cycles, self.unit_cycles)

    @property
    def max_cycles(self) -> int:
        return max(self.compute_cycles, self.ddr_cycles) + self.serial_cycles

    @property
    def cycles(self) -> int:
        return self.max_cycles + self.overhead_cycles


def serial_part(compute: int, ddr: int, overlap: float, conv: bool = True) -> int:
    """Cycles of the shorter of compute and DMA that the overlap (``ddr.compute_overlap``) does
    not hide (none without a conv)."""
    return round((1.0 - overlap) * min(compute, ddr)) if conv else 0


def time_task(record, platform) -> TaskTime:
    read, write = ddr_bytes(record.traffic)
    regcmd = record.traffic.regcmd_read
    launch = platform.launch.task_overhead_cycles + regcmd_fetch_cycles(regcmd, platform)
    npu, unit = task_npu_cycles(record, platform), unit_cycles(record, platform)
    ddr = ddr_cycles(data_read_bytes(record.traffic), write, platform)
    return TaskTime(record.core, record.index, npu, ddr, read, write, launch,
                    record.conv.macs if record.conv is not None else 0, regcmd, unit,
                    serial_part(max(npu, unit), ddr, platform.ddr.compute_overlap, record.conv is not None),
                    record.traffic.sram_hit_reads + record.traffic.sram_hit_writes)


def time_tasks(records: Iterable, platform) -> tuple[TaskTime, ...]:
    return tuple(time_task(record, platform) for record in records)
