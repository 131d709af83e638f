"""One timeline of a model run: every schedule step placed on one time axis (emulator/TIMING.md,
"Timeline").

Built once from the model file's schedule, the executed chain runs and the platform; ``npuemu
run``'s summary, ``perf``, ``trace`` and ``calibrate`` all read it, so they give the same total.

Placement (the schedule is sequential, as the vendor runtime interleaves CPU and NPU operators):

- the schedule is cut into *segments*: consecutive NPU steps sharing a schedule ``group`` (a
  layer split across cores, or one wave of batch slices), consecutive host steps of one batch
  wave (the slices of one host op, ``batch.contexts`` at a time: the runtime runs the contexts on
  a thread pool), and every other step on its own;
- a segment starts when the previous one ends. An NPU step lays its tasks end to end on its
  core's track (task cycles, task_time.py); the steps of a group start together and the group
  ends at its barrier: when the slowest core is done, or - with a shared DDR rate on the
  platform and more than one core busy - when the DDR has moved all the group's bytes at
  ``ddr.shared_bytes_per_cycle``, whichever is later. A ``barrier`` span on its own track shows
  the group's extent and which bound decided it;
- a host step takes ``host_model.cpu_step_us`` of its input tensors on its context's host track;
  a host wave ends with its longest step.

Time is kept as a :class:`Clock`: NPU cycles (integers, converted once at ``clock.npu_mhz``) plus
host microseconds, which never run at the same time in a sequential schedule. Graph layers only
label the spans (layer ids from ``trailer.graph.layers[].tasks``; a host step's ``layers``): they
do not move them.
"""

from __future__ import annotations

import math
import operator
from itertools import chain
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from npuemu.emulator.memo import Memo
from npuemu.emulator.timing.task_time import TaskFigures, TaskTime, TaskWork, task_work, time_work


@dataclass(frozen=True, order=True)
class Clock:
    """A point on the timeline: NPU cycles and host microseconds elapsed before it."""

    cycles: int = 0
    host_us: float = 0.0

    def us(self, mhz: float) -> float:
        return self.cycles / mhz + self.host_us


@dataclass(frozen=True)
class PlannedTask:
    work: TaskWork
    record: object = None            # the emulator's TaskRecord (trace args), if kept
    layers: tuple[int, ...] = ()     # ids of the graph layers claiming the task (labels)


@dataclass(frozen=True)
class PlannedStep:
    """One schedule step as executed, before figures place it."""

    index: int
    kind: str                        # "npu" or "cpu"
    core: int = 0                    # NPU core (npu) / host context (cpu)
    segment: tuple | None = None     # steps with the same key in a row run side by side
    tasks: tuple[PlannedTask, ...] = ()
    host_us: float = 0.0
    layers: tuple[int, ...] = ()
    name: str = ""                   # host op / chain label
    context: int = 0                 # batch context (compiler/batch.py: slice i in context i mod C)


@dataclass
class Plan:
    """The executed schedule: what the timeline places, independent of the fitted figures."""

    steps: list[PlannedStep]
    mhz: float
    shared_ddr_rate: float | None = None
    layer_names: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Span:
    step: int                        # schedule step index
    kind: str                        # "npu" | "cpu" | "barrier"
    lane: int                        # core (npu), host context (cpu), 0 (barrier)
    start: Clock
    end: Clock
    index: int = 0                   # task index in its chain (npu)
    time: TaskTime | None = None     # npu: the task's figures
    record: object = None            # npu: the TaskRecord, when the plan kept it
    layers: tuple[int, ...] = ()
    context: int = 0
    name: str = ""                   # host op; a barrier's deciding bound
    args: dict = field(default_factory=dict)

    @property
    def cycles(self) -> int:
        return self.end.cycles - self.start.cycles

    @property
    def host_us(self) -> float:
        return self.end.host_us - self.start.host_us


@dataclass(frozen=True)
class Segment:
    kind: str                        # "npu" (one step or a group) or "cpu"
    start: Clock
    end: Clock
    spans: tuple[Span, ...]
    grouped: bool = False            # several steps side by side (a schedule group / host wave)


@dataclass
class Timeline:
    mhz: float
    segments: list[Segment]
    layer_names: dict[int, str] = field(default_factory=dict)

    @property
    def end(self) -> Clock:
        return self.segments[-1].end if self.segments else Clock()

    @property
    def npu_cycles(self) -> int:
        """NPU time on the critical path, in cycles (cores overlapped)."""
        return self.end.cycles

    @property
    def host_us(self) -> float:
        """Host time on the critical path (a batch wave's steps overlapped)."""
        return self.end.host_us

    @property
    def total_us(self) -> float:
        return self.end.us(self.mhz)

    def us(self, clock: Clock) -> float:
        return clock.us(self.mhz)

    def spans(self, kind: str | None = None) -> list[Span]:
        return [s for seg in self.segments for s in seg.spans if kind is None or s.kind == kind]

    def task_spans(self) -> list[Span]:
        return self.spans("npu")

    def host_steps(self) -> int:
        return len(self.spans("cpu"))

    def busy_cycles(self) -> int:
        """NPU cycles summed over every task, cores and batch contexts not overlapped: the work
        a batch does, where ``npu_cycles`` is the time it takes."""
        return sum(span.cycles for span in self.task_spans())

    def contexts(self) -> int:
        """Batch contexts the NPU tasks ran in (1 for a single-batch build)."""
        return len({span.context for span in self.task_spans()}) or 1

    def layer_host_us(self) -> dict[int, float]:
        """Host time per graph layer: the extent of each host segment holding one of its steps."""
        out: dict[int, float] = {}
        for seg in self.segments:
            if seg.kind == "cpu":
                for layer in sorted({lid for span in seg.spans for lid in span.layers}):
                    out[layer] = out.get(layer, 0.0) + (seg.end.host_us - seg.start.host_us)
        return out


def concurrent_cycles(per_core: dict[int, int], moved_bytes: int, shared_rate: float | None) -> int:
    """Cycles of work that cores do side by side: the busiest core, or - several cores busy and a
    shared DDR rate on the platform - the cycles the DDR needs for all their bytes, if longer.
    The one overlap rule: the timeline places groups with it, perf's layer rows attribute with it."""
    longest = max(per_core.values(), default=0)
    if len(per_core) <= 1 or not shared_rate:
        return longest
    return max(longest, math.ceil(moved_bytes / shared_rate))


# --- placing a plan ---------------------------------------------------------------------------

def build_timeline(plan: Plan, figures: TaskFigures) -> Timeline:
    """Place every step of ``plan`` with the task figures ``figures`` (module note)."""
    segments: list[Segment] = []
    now = Clock()
    for steps in _segments(plan.steps):
        place = _place_npu if steps[0].kind == "npu" else _place_cpu
        segment = place(steps, now, figures, plan.shared_ddr_rate)
        segments.append(segment)
        now = segment.end
    return Timeline(plan.mhz, segments, dict(plan.layer_names))


def _segments(steps: Sequence[PlannedStep]) -> list[list[PlannedStep]]:
    """Consecutive steps of one kind with the same non-None segment key run side by side."""
    out: list[list[PlannedStep]] = []
    for step in steps:
        last = out[-1][-1] if out else None
        if last is not None and step.segment is not None and (last.kind, last.segment) == (step.kind, step.segment):
            out[-1].append(step)
        else:
            out.append([step])
    return out


#: time_work by (work, figures), both frozen and compared by identity: a repeated run places
#: the same TaskWork objects (task_time._WORK) with the platform's one TaskFigures (TaskFigures.of)
_TIMED: Memo[TaskTime] = Memo(time_work, identity=2, limit=1 << 16)


def _place_npu(steps: list[PlannedStep], start: Clock, fig: TaskFigures, shared_rate: float | None) -> Segment:
    cursor: dict[int, int] = {}  # each core's next free cycle in the segment
    spans: list[Span] = []
    moved = 0
    for step in steps:
        for planned in step.tasks:
            timed = _TIMED(planned.work, fig)
            begin = cursor.get(step.core, start.cycles)
            cursor[step.core] = begin + timed.cycles
            moved += timed.ddr_read_bytes + timed.ddr_write_bytes
            spans.append(Span(step.index, "npu", step.core, Clock(begin, start.host_us),
                              Clock(begin + timed.cycles, start.host_us), planned.work.index, timed, planned.record,
                              planned.layers, step.context))
    busy = {core: end - start.cycles for core, end in cursor.items()}
    extent = concurrent_cycles(busy, moved, shared_rate)
    end = Clock(start.cycles + extent, start.host_us)
    if len(steps) > 1:
        longest = max(busy.values(), default=0)
        bound = "shared DDR" if extent > longest else "slowest core"
        spans.append(Span(steps[0].index, "barrier", 0, start, end, layers=steps[0].layers, name=bound,
                          args={"steps": [s.index for s in steps], "cores": sorted(busy), "longest_core_cycles": longest,
                                "ddr_bytes": moved, "cycles": extent}))
    return Segment("npu", start, end, tuple(spans), len(steps) > 1)


def _place_cpu(steps: list[PlannedStep], start: Clock, fig: TaskFigures, shared_rate: float | None) -> Segment:
    spans = tuple(Span(step.index, "cpu", step.core, start, Clock(start.cycles, start.host_us + step.host_us),
                       layers=step.layers, context=step.context, name=step.name) for step in steps)
    extent = max(step.host_us for step in steps)
    return Segment("cpu", start, Clock(start.cycles, start.host_us + extent), spans, len(steps) > 1)


# --- plans of model files ---------------------------------------------------------------------

def timeline_npu(model, runs: Sequence, platform, figures: TaskFigures | None = None) -> Timeline:
    """The timeline of a ``.npu`` model's run (``Runtime.runs``, one per NPU step). A run whose
    tasks left the very same (frozen) records as the last one timed for this model, platform
    and figures places exactly as that one did: its timeline is handed out again (read-only)."""
    figures = figures or TaskFigures.of(platform)
    tasks = tuple(run.tasks for run in runs)
    recent = _TIMELINES.get(model.trailer, platform, figures)
    if recent is None:
        recent = _TIMELINES.put([], model.trailer, platform, figures)
    # (the same tuples of records: core.py's ``_replayed`` hands a replay's out again; a tuple never changes)
    for known, timeline in recent:
        if len(known) == len(tasks) and all(map(operator.is_, known, tasks)):
            return timeline
    counts = tuple(map(len, tasks))
    for at, (known, timeline) in enumerate(recent):  # (the same records in other tuples: these from now on)
        if tuple(map(len, known)) == counts and all(map(operator.is_, chain.from_iterable(known),
                                                        chain.from_iterable(tasks))):
            recent[at] = (tasks, timeline)
            return timeline
    timeline = build_timeline(plan_npu(model, runs, platform), figures)
    recent[:] = [(tasks, timeline)] + recent[:_RECENT_RUNS - 1]
    return timeline


#: per (trailer, platform, figures): [(each run's tuple of records, timeline)] of the last runs timed, newest
#: first. More than one: a chain of an odd number of tasks runs each task from
#: the other register group on the next run (core.py), so runs alternate between two records.
_TIMELINES: Memo[list] = Memo(identity=3, limit=16)
_RECENT_RUNS = 4


def timeline_rknn(model, run, platform) -> Timeline:
    """The timeline of a vendor ``.rknn`` run: its chain 0 on core 0 (rknn_runner.py)."""
    return build_timeline(plan_rknn(model, run, platform), TaskFigures.of(platform))


def plan_npu(model, runs: Sequence, platform, keep_records: bool = True) -> Plan:
    """The executed schedule of a ``.npu`` model: NPU steps with their tasks' work, host steps
    with their host time, batch waves and layer labels."""
    from npuemu.emulator.timing.model_index import model_index

    steps, tensors, layers, _ = model_index(model)
    claims = _claims(layers)
    contexts = int((model.trailer.get("batch") or {}).get("contexts", 1))
    waves = _host_waves(steps, contexts)
    runs_iter = iter(runs)
    planned = []
    for index, step in enumerate(steps):
        if step.kind == "npu":
            planned.append(_npu_step(index, step, next(runs_iter), claims, platform, contexts, keep_records))
        else:
            context, segment = waves.get(index, (0, None))
            planned.append(PlannedStep(index, "cpu", context, segment, host_us=_host_us(step, tensors, platform),
                                       layers=tuple(step.layers), name=step.op, context=context))
    names = {info.id: info.name or f"layer {info.id}" for info in layers}
    return Plan(planned, float(platform.clock.npu_mhz), platform.ddr.shared_bytes_per_cycle, names)


def _claims(layers) -> dict[tuple[int, int], tuple[int, ...]]:
    """(step, task) -> ids of the layers whose task ranges hold it."""
    claims: dict[tuple[int, int], tuple[int, ...]] = {}
    for info in layers:
        for task_range in info.tasks:
            for i in range(task_range.first, task_range.first + task_range.count):
                claims[(task_range.step, i)] = claims.get((task_range.step, i), ()) + (info.id,)
    return claims


def _npu_step(index: int, step, run, claims, platform, contexts: int, keep_records: bool) -> PlannedStep:
    tasks = tuple(PlannedTask(task_work(record, platform), record if keep_records else None,
                              claims.get((index, i), ())) for i, record in enumerate(run.tasks))
    segment = ("npu", step.group) if step.group is not None else None
    # a batch slice's NPU step runs on the core of its context (compiler/batch.py)
    return PlannedStep(index, "npu", step.core, segment, tasks, layers=tuple(step.layers),
                       context=step.core if contexts > 1 else 0)


def _host_waves(steps, contexts: int) -> dict[int, tuple[int, tuple]]:
    """Host step -> (context, wave key) in a batch build: the slices of one host op follow each
    other in the schedule (same op and layers), slice i in context i mod C, C at a time."""
    if contexts <= 1:
        return {}
    out: dict[int, tuple[int, tuple]] = {}
    run_start, position = -1, 0
    for index, step in enumerate(steps):
        if step.kind != "cpu":
            run_start = -1
            continue
        prev = steps[index - 1] if index else None
        if run_start < 0 or prev.kind != "cpu" or (prev.op, prev.layers) != (step.op, step.layers):
            run_start, position = index, 0
        out[index] = (position % contexts, ("cpu", run_start, position // contexts))
        position += 1
    return out


def _host_us(step, tensors, platform) -> float:
    """The step's modelled host time: its input shapes are fixed, so once per (step, platform)
    (steps come from model_index's one parse of the trailer)."""
    known = _HOST_US.get(step, platform)
    if known is None:
        from npuemu.emulator.timing.host_model import cpu_step_us

        known = _HOST_US.put(cpu_step_us([tensors[n].shape for n in step.inputs if n in tensors], platform),
                             step, platform)
    return known


_HOST_US: Memo[float] = Memo(identity=2, limit=1 << 16)


def plan_rknn(model, run, platform) -> Plan:
    """A vendor ``.rknn`` run as one NPU step (chain 0, core 0), each task labelled by its op_idx;
    the CPU layers the program waits for (``run.host_steps``, rknn_cpu_layers.py) are host steps
    between its submits, timed like npuemu's own (host_model.py); the CPU layers after the
    program stay untimed (rknn_runner.py). A multi-core
    program's run (``run.pieces``): one step per piece on its core, the pieces of one barrier
    phase of a launch group side by side, ending at the barrier (rknn_multicore.py)."""
    layer_ids = {layer.index for layer in model.layers}
    names = {layer.index: layer.name for layer in model.layers}

    def planned(task_indices, records):
        return tuple(PlannedTask(task_work(record, platform), record,
                                 (op,) if (op := model.program.tasks[i].op_idx) in layer_ids else ())
                     for i, record in zip(task_indices, records))

    pieces = getattr(run, "pieces", ())
    if not pieces:
        steps = _rknn_chain0_steps(model, run, planned, platform)
    else:
        together = {}
        for piece in pieces:
            key = (piece.placed.launch, piece.placed.phase)
            together.setdefault(key, set()).add(piece.core)
        steps = [PlannedStep(index, "npu", piece.core,
                             ("rknn", *key) if len(together[key := (piece.placed.launch, piece.placed.phase)]) > 1
                             else None, planned(piece.placed.piece.tasks, piece.run.tasks),
                             name=f"launch {piece.placed.launch} phase {piece.placed.phase}")
                 for index, piece in enumerate(pieces)]
        hosts = _rknn_host_steps(getattr(run, "host_steps", ()), platform)   # all before the first task
        steps = [replace(step, index=i) for i, step in enumerate(hosts + steps)]
    return Plan(steps, float(platform.clock.npu_mhz), platform.ddr.shared_bytes_per_cycle, names)


def _rknn_chain0_steps(model, run, planned, platform) -> list[PlannedStep]:
    """Chain 0's records as NPU steps cut at the host steps, which sit between them."""
    chain = model.program.chains[0]
    tasks, records = tuple(chain.tasks), run.chain.tasks
    steps: list[PlannedStep] = []
    start = 0
    for host in getattr(run, "host_steps", ()):
        if host.after_tasks > start:
            steps.append(PlannedStep(len(steps), "npu", run.chain.core, None,
                                     planned(tasks[start:host.after_tasks], records[start:host.after_tasks]),
                                     name="chain 0"))
            start = host.after_tasks
        steps.append(replace(_rknn_host_steps((host,), platform)[0], index=len(steps)))
    steps.append(PlannedStep(len(steps), "npu", run.chain.core, None, planned(tasks[start:], records[start:]),
                             name="chain 0"))
    return steps


def _rknn_host_steps(hosts, platform) -> list[PlannedStep]:
    from npuemu.emulator.timing.host_model import cpu_step_us

    return [PlannedStep(0, "cpu", 0, None, host_us=cpu_step_us(host.input_shapes, platform),
                        layers=(host.layer.index,), name=host.layer.op_type) for host in hosts]
