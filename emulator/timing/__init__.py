"""Timing model (issue 5): per-task cycles from each task's decoded register state
and the bytes its DMA moved; per-layer sums and the vendor-style perf report. See
emulator/TIMING.md."""

from npuemu.emulator.timing.ddr import ddr_bytes, ddr_cycles
from npuemu.emulator.timing.npu_cycles import atom_k, conv_npu_cycles, task_npu_cycles
from npuemu.emulator.timing.task_time import TaskTime, time_task, time_tasks

__all__ = ["atom_k", "conv_npu_cycles", "task_npu_cycles", "ddr_bytes", "ddr_cycles", "TaskTime",
           "time_task", "time_tasks"]
