"""Chrome / Perfetto trace of a model run from the timing model (emulator/TIMING.md).

Input: the tasks in execution order, each with its label (layer name), its emulator
:class:`~npuemu.emulator.core.TaskRecord` (enable mask, DMA traffic) and its
:class:`~npuemu.emulator.timing.task_time.TaskTime`. Output: a JSON object with ``traceEvents``
of phase ``"X"`` (complete events, ``ts``/``dur`` in microseconds):

- one track per NPU core (process "NPU", thread ``core N``): one event per task, laid end to end
  on its core; the steps of a layer split across cores (one schedule group) start together and
  the next step waits for the slowest core; duration = task cycles / ``clock.npu_mhz``;
- one track per DMA direction (process "DDR", threads ``read`` and ``write``): first the PC's
  regcmd fetch (category ``regcmd``, part of the task's launch cycles), then, after the launch,
  the task's data DDR time split into its read part ``ceil(data read / read rate)`` and the rest
  of its DDR cycles for the write part (write after read: the model serialises them).

Times are computed in cycles and converted once, so the NPU track's durations sum to the perf
report's total time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

NPU_PID = 1
DDR_PID = 2
READ_TID = 0
WRITE_TID = 1


@dataclass(frozen=True)
class TraceTask:
    label: str          # layer name (or "unassigned")
    record: object      # emulator TaskRecord
    time: object        # TaskTime
    group: int | None = None  # schedule group: the steps of one layer split across cores start together


def build_trace(tasks: Iterable[TraceTask], platform, *, model: str = "") -> dict:
    mhz = float(platform.clock.npu_mhz)
    read_rate = platform.ddr.read_bytes_per_cycle
    events: list[dict] = []
    cores: set[int] = set()
    now = 0  # cycles: where the next ungrouped task (or group) starts
    group, group_start, ends = None, 0, {}  # the running group, its start, each core's end in it
    count = 0
    for task in tasks:
        record, timing = task.record, task.time
        count += 1
        if task.group != group:  # leaving a group: everything after waits for its slowest core
            if group is not None:
                now = max(ends.values(), default=now)
            group, group_start, ends = task.group, now, {}
        start = ends.get(timing.core, group_start) if group is not None else now
        cores.add(timing.core)
        args = {"core": timing.core, "task": timing.index, "enable_mask": f"{record.enable_mask:#x}",
                "blocks": list(record.blocks), "npu_cycles": timing.npu_cycles,
                "ddr_cycles": timing.ddr_cycles, "cycles": timing.cycles,
                "overhead_cycles": timing.overhead_cycles,
                "ddr_read_bytes": timing.ddr_read_bytes, "ddr_write_bytes": timing.ddr_write_bytes}
        events.append(_event(f"{task.label} #{timing.index}", "task", NPU_PID, timing.core,
                             start, timing.cycles, mhz, args))
        # launch first: the PC fetches the task's register commands (part of overhead_cycles),
        # then the data DMA runs beside the compute: reads, then writes (serialised by the model)
        fetch_cycles = timing.overhead_cycles - platform.launch.task_overhead_cycles
        if timing.regcmd_bytes and fetch_cycles > 0:
            events.append(_event(f"regcmd {task.label} #{timing.index}", "regcmd", DDR_PID, READ_TID, start,
                                 fetch_cycles, mhz, {"bytes": timing.regcmd_bytes, "cycles": fetch_cycles}))
        data_start = start + timing.overhead_cycles
        data_read = timing.ddr_read_bytes - timing.regcmd_bytes
        read_cycles = min(math.ceil(data_read / read_rate), timing.ddr_cycles)
        write_cycles = timing.ddr_cycles - read_cycles
        if read_cycles > 0:
            events.append(_event(f"read {task.label} #{timing.index}", "dma", DDR_PID, READ_TID, data_start,
                                 read_cycles, mhz, {"bytes": data_read, "cycles": read_cycles}))
        if write_cycles > 0 and timing.ddr_write_bytes:
            events.append(_event(f"write {task.label} #{timing.index}", "dma", DDR_PID, WRITE_TID,
                                 data_start + read_cycles, write_cycles, mhz,
                                 {"bytes": timing.ddr_write_bytes, "cycles": write_cycles}))
        if group is not None:
            ends[timing.core] = start + timing.cycles
        else:
            now = start + timing.cycles
    if group is not None:
        now = max(ends.values(), default=now)
    start = now
    meta = [_meta("process_name", NPU_PID, 0, "NPU"), _meta("process_name", DDR_PID, 0, "DDR"),
            _meta("thread_name", DDR_PID, READ_TID, "DMA read"),
            _meta("thread_name", DDR_PID, WRITE_TID, "DMA write")]
    meta += [_meta("thread_name", NPU_PID, core, f"core {core}") for core in sorted(cores)]
    return {"traceEvents": meta + events, "displayTimeUnit": "ns",
            "otherData": {"model": model, "platform": platform.name, "npu_mhz": mhz, "tasks": count,
                          "total_cycles": start, "total_time_us": start / mhz}}


def _event(name: str, cat: str, pid: int, tid: int, start: int, cycles: int, mhz: float, args: dict) -> dict:
    # ts and dur from integer cycle counts; dur = end - start so consecutive events never overlap
    ts = start / mhz
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": ts,
            "dur": (start + cycles) / mhz - ts, "args": args}


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def trace_tasks_rknn(model, run, platform) -> list[TraceTask]:
    """Tasks of an :class:`~npuemu.emulator.rknn_runner.RknnRun`, in chain order, labelled by layer."""
    from npuemu.emulator.timing.task_time import time_task

    chain = model.program.chains[0]
    names = {layer.index: layer.name for layer in model.layers}
    out = []
    for offset, record in enumerate(run.chain.tasks):
        op_idx = model.program.tasks[chain.first_task + offset].op_idx
        out.append(TraceTask(names.get(op_idx, "unassigned"), record, time_task(record, platform)))
    return out


def trace_tasks_npu(model, runs, platform) -> list[TraceTask]:
    """Tasks of a ``.npu`` model's chain runs (``Runtime.runs``), in schedule order, labelled by layer."""
    from npuemu.emulator.timing.task_time import time_task

    labels: dict[tuple[int, int], str] = {}
    for info in model.layers():
        for task_range in info.tasks:
            for i in range(task_range.first, task_range.first + task_range.count):
                labels.setdefault((task_range.step, i), info.name or f"layer {info.id}")
    out = []
    runs_iter = iter(runs)
    for step_index, step in enumerate(model.schedule()):
        if step.kind != "npu":
            continue
        run = next(runs_iter)
        for i, record in enumerate(run.tasks):
            out.append(TraceTask(labels.get((step_index, i), "unassigned"), record, time_task(record, platform),
                                 getattr(step, "group", None)))
    return out
