"""Chrome / Perfetto trace of a model run: the run's timeline (timeline.py) drawn as phase ``"X"``
events (complete events, ``ts``/``dur`` in microseconds). Nothing is placed here: every event is
a span of the timeline, so the trace ends where ``perf`` and ``run`` say the frame ends.

- one track per NPU core (process "NPU", thread ``core N``): one event per task, labelled by its
  layer; a split layer's steps start together on their cores;
- one track per host context (process "Host", thread ``host`` or ``host context N`` in a batch
  build): one event per host (CPU) step, labelled by its op;
- a "barriers" track (process "Schedule"): one event per schedule group (a layer split across
  cores, a wave of batch slices) from its common start to its barrier, with the bound that
  decided it (slowest core or shared DDR);
- one track per DMA direction (process "DDR", threads ``read`` and ``write``): first the PC's
  regcmd fetch (category ``regcmd``, part of the task's launch cycles), then, after the launch,
  the task's data DDR time split into its read part ``ceil(data read / read rate)`` and the rest
  of its DDR cycles for the write part (write after read: the model serialises them).
"""

from __future__ import annotations

import math

from npuemu.emulator.timing.timeline import Clock, Span, Timeline

NPU_PID = 1
DDR_PID = 2
HOST_PID = 3
SCHEDULE_PID = 4
READ_TID = 0
WRITE_TID = 1


def build_trace(timeline: Timeline, platform, *, model: str = "") -> dict:
    events: list[dict] = []
    for span in timeline.spans():
        if span.kind == "npu":
            events += _task_events(span, timeline, platform)
        elif span.kind == "cpu":
            events.append(_event(timeline, f"{span.name} (host)", "host", HOST_PID, span.lane, span.start, span.end,
                                 {"step": span.step, "host_us": span.host_us, "layers": _labels(span, timeline)}))
        else:
            events.append(_event(timeline, f"barrier: {span.name}", "barrier", SCHEDULE_PID, 0, span.start,
                                 span.end, dict(span.args, layers=_labels(span, timeline))))
    tasks = timeline.task_spans()
    info = {"model": model, "platform": platform.name, "npu_mhz": timeline.mhz, "tasks": len(tasks),
            "host_steps": timeline.host_steps(), "total_cycles": timeline.npu_cycles,
            "host_us": timeline.host_us, "total_time_us": timeline.total_us}
    return {"traceEvents": _metadata(timeline) + events, "displayTimeUnit": "ns", "otherData": info}


def _labels(span: Span, timeline: Timeline) -> list[str]:
    return [timeline.layer_names.get(layer, f"layer {layer}") for layer in span.layers]


def _task_events(span: Span, timeline: Timeline, platform) -> list[dict]:
    timing, record = span.time, span.record
    label = (_labels(span, timeline) or ["unassigned"])[0]
    args = {"core": span.lane, "step": span.step, "task": span.index, "npu_cycles": timing.npu_cycles,
            "ddr_cycles": timing.ddr_cycles, "cycles": timing.cycles, "overhead_cycles": timing.overhead_cycles,
            "ddr_read_bytes": timing.ddr_read_bytes, "ddr_write_bytes": timing.ddr_write_bytes}
    if record is not None:
        args |= {"enable_mask": f"{record.enable_mask:#x}", "blocks": list(record.blocks)}
    events = [_event(timeline, f"{label} #{span.index}", "task", NPU_PID, span.lane, span.start, span.end, args)]
    return events + _dma_events(span, label, platform, timeline)


def _dma_events(span: Span, label: str, platform, timeline: Timeline) -> list[dict]:
    """The PC's regcmd fetch inside the launch, then the data DMA beside the compute: reads,
    then writes (serialised by the model)."""
    timing, start = span.time, span.start
    events = []
    fetch_cycles = timing.overhead_cycles - platform.launch.task_overhead_cycles
    if timing.regcmd_bytes and fetch_cycles > 0:
        events.append(_event(timeline, f"regcmd {label} #{span.index}", "regcmd", DDR_PID, READ_TID, start,
                             _after(start, fetch_cycles), {"bytes": timing.regcmd_bytes, "cycles": fetch_cycles}))
    data_start = _after(start, timing.overhead_cycles)
    data_read = timing.ddr_read_bytes - timing.regcmd_bytes
    read_cycles = min(math.ceil(data_read / platform.ddr.read_bytes_per_cycle), timing.ddr_cycles)
    write_cycles = timing.ddr_cycles - read_cycles
    if read_cycles > 0:
        events.append(_event(timeline, f"read {label} #{span.index}", "dma", DDR_PID, READ_TID, data_start,
                             _after(data_start, read_cycles), {"bytes": data_read, "cycles": read_cycles}))
    if write_cycles > 0 and timing.ddr_write_bytes:
        write_start = _after(data_start, read_cycles)
        events.append(_event(timeline, f"write {label} #{span.index}", "dma", DDR_PID, WRITE_TID, write_start,
                             _after(write_start, write_cycles),
                             {"bytes": timing.ddr_write_bytes, "cycles": write_cycles}))
    return events


def _after(clock: Clock, cycles: int) -> Clock:
    return Clock(clock.cycles + cycles, clock.host_us)


def _event(timeline: Timeline, name: str, cat: str, pid: int, tid: int, start: Clock, end: Clock,
           args: dict) -> dict:
    # ts and dur from the timeline's clocks; dur = end - start so consecutive events never overlap
    ts = timeline.us(start)
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": timeline.us(end) - ts,
            "args": args}


def _metadata(timeline: Timeline) -> list[dict]:
    """Process and thread names; the host and schedule tracks only where they have events."""
    meta = [_meta("process_name", NPU_PID, 0, "NPU"), _meta("process_name", DDR_PID, 0, "DDR"),
            _meta("thread_name", DDR_PID, READ_TID, "DMA read"), _meta("thread_name", DDR_PID, WRITE_TID, "DMA write")]
    meta += [_meta("thread_name", NPU_PID, core, f"core {core}")
             for core in sorted({span.lane for span in timeline.task_spans()})]
    hosts = sorted({span.lane for span in timeline.spans("cpu")})
    if hosts:
        meta.append(_meta("process_name", HOST_PID, 0, "Host"))
        meta += [_meta("thread_name", HOST_PID, lane, "host" if hosts == [0] else f"host context {lane}")
                 for lane in hosts]
    if timeline.spans("barrier"):
        meta += [_meta("process_name", SCHEDULE_PID, 0, "Schedule"), _meta("thread_name", SCHEDULE_PID, 0, "barriers")]
    return meta


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
