"""Cycles of one task: ``max(NPU, DDR) + launch.task_overhead_cycles``.

The MAC array and the DMA overlap (the vendor's estimator reports Total = max(DDR, NPU) on all
4284 corpus rows, vendor-corpus README §4.1); the per-task overhead is the platform's
``launch.task_overhead_cycles`` (PC fetch and dispatch; rk3588: 200, "assumed, to calibrate").
Only the task's decoded register state and its DMA byte counts are used (architecture.md,
"The one rule").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from npuemu.emulator.timing.ddr import ddr_bytes, ddr_cycles
from npuemu.emulator.timing.npu_cycles import task_npu_cycles


@dataclass(frozen=True)
class TaskTime:
    core: int
    index: int
    npu_cycles: int
    ddr_cycles: int
    ddr_read_bytes: int
    ddr_write_bytes: int
    overhead_cycles: int
    macs: int  # MACs of the real work (conv tasks), for MAC usage

    @property
    def max_cycles(self) -> int:
        return max(self.npu_cycles, self.ddr_cycles)

    @property
    def cycles(self) -> int:
        return self.max_cycles + self.overhead_cycles


def time_task(record, platform) -> TaskTime:
    read, write = ddr_bytes(record.traffic)
    return TaskTime(record.core, record.index, task_npu_cycles(record, platform),
                    ddr_cycles(read, write, platform), read, write,
                    platform.launch.task_overhead_cycles,
                    record.conv.macs if record.conv is not None else 0)


def time_tasks(records: Iterable, platform) -> tuple[TaskTime, ...]:
    return tuple(time_task(record, platform) for record in records)
