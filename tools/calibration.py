"""Calibration of the timing model against the real-board rows of calibration.md.

Each row (tools/calibration_rows.py) becomes a one-layer ONNX model, compiled for the row's chip
(the compiler driver, int8 calibrated on random samples) and run on the emulator;
the timing model (emulator/timing) turns the tasks into NPU cycles, DDR cycles and time, which
are compared with the board's figures.

Measured time is per layer with per-layer profiling on (calibration.md), so the modelled time
of a row is the end of its run's timeline (emulator/timing/timeline.py: the tasks' cycles by the
one task formula, task_time.time_work, at ``clock.npu_mhz``) plus one host submit per layer,
``launch.host_submit_overhead_us``. A row keeps its executed schedule (timeline.Plan), and the
fit places it again with each set of candidate figures.

``fit`` solves, once per chip and with the same formulas for every row:
- DDR: ``ddr = data read bytes / r + write bytes / w`` by least squares on the relative error
  over the chip's fit rows (unknowns 1/r and 1/w);
- time: ``time - sum(max(compute, DDR) + regcmd fetch) / f = s * sum(min(compute, DDR)) / f +
  tasks * c / f + h`` by least squares on the relative error, with the fitted DDR rates (the min
  summed over conv tasks only: a task without a conv overlaps fully, task_time.py); unknowns
  s = 1 - ddr.compute_overlap in [0, 1], c = launch.task_overhead_cycles in [0, TASK_OVERHEAD_MAX]
  and h = launch.host_submit_overhead_us >= 0 (an unknown leaving its range is fixed at the bound
  and the others refitted);
- a conv task's output bound ``cycle_model.conv_write_bytes_per_cycle`` (compute = max(MAC
  cycles, written bytes / rate)): it enters through a max, so each candidate rate (and none) gets
  the time fit above and the one with the smallest squared relative residual wins; tried only
  with more fit rows than the four time unknowns.

Fit rows are the NPU rows whose tensors npuemu's build stores in the vendor's sizes (NC1HWC2 with
C padded to C2; a "uint8 input" first layer packed at 1 B per channel and pixel): where they
differ (today: 16-channel conv outputs padded to 32 on rk3588)
the bytes moved differ by construction; nor are rows whose tasks npuemu builds otherwise than
the vendor (TASK_STRUCTURE; an element-wise row with a helper conv task, HELPER_CONV: B144's
lane replication). Rows npuemu cannot build or run have no figures. The report lists every
row, with its errors or the reason it has none.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

import numpy as np

from npuemu.compiler.lower.lut import ONNX_LUT_KINDS
from npuemu.emulator.timing.task_time import TaskFigures, TaskWork, time_work
from npuemu.emulator.timing.timeline import Plan, PlannedStep, PlannedTask, Timeline, build_timeline
from npuemu.tools.calibration_rows import CalibrationRow

# Upper bound of the fitted fixed per-task overhead: the PC dispatches a task's register writes
# at about one per cycle and the largest vendor task writes 1097 registers (a LUT upload,
# vendor-corpus README §4.4). Without it the rk3562 rows push the figure to ~34000 cycles, which
# is per-layer size-dependent time the model lacks, not a launch cost (emulator/TIMING.md).
TASK_OVERHEAD_MAX = 1100

# the issue-5 agreement targets (relative error)
NPU_TARGET = 0.02
DDR_TARGET = 0.05
TIME_MEDIAN_TARGET = 0.25


@dataclass
class RowRun:
    row: CalibrationRow
    on_npu: bool
    reason: str = ""                     # why a row has no NPU figures
    tasks: list[TaskWork] = field(default_factory=list)
    layers: list[str] = field(default_factory=list)  # the built layers (op types, target)
    layout: str = ""                     # how npuemu's build differs from the vendor's: tensor sizes,
                                         # task structure ("" = same bytes and tasks; only those rows are fitted)

    plan: Plan | None = None             # the executed schedule (None: the tasks as one chain on core 0)

    @property
    def fit_row(self) -> bool:
        return self.on_npu and not self.layout

    def timeline(self, fig: Figures) -> Timeline:
        """The row's run placed with ``fig`` (emulator/timing/timeline.py)."""
        plan = self.plan or Plan([PlannedStep(0, "npu", tasks=tuple(PlannedTask(t) for t in self.tasks))], fig.npu_mhz)
        return build_timeline(replace(plan, mhz=fig.npu_mhz), fig.task_figures())


@dataclass(frozen=True)
class RowResult:
    run: RowRun
    npu: int
    ddr: int
    max: int
    time_us: float

    def error(self, key: str) -> float | None:
        measured = {"npu": self.run.row.npu, "ddr": self.run.row.ddr, "max": self.run.row.max,
                    "time": self.run.row.time_us}[key]
        model = {"npu": self.npu, "ddr": self.ddr, "max": self.max, "time": self.time_us}[key]
        if not self.run.on_npu:
            return None
        if measured == 0:
            return 0.0 if model == 0 else math.inf
        return (model - measured) / measured


# --- building and running one row ----------------------------------------------------------

def row_onnx(row: CalibrationRow):
    """A one-layer ONNX model of ``row`` (float32, He-scaled weights from a fixed seed)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(row.id)
    names = [f"x{i}" for i in range(len(row.inputs))]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, *shape]) for n, shape in zip(names, row.inputs)]
    inits, nodes = [], []
    if row.is_conv:
        o, i, kh, kw = row.weight
        weights = rng.normal(0, (2.0 / (i * kh * kw)) ** 0.5, (o, i, kh, kw)).astype(np.float32)
        bias = rng.normal(0, 0.1, o).astype(np.float32)
        inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")]
        pads = _same_pads(row.inputs[0][1:], row.out[1:], (kh, kw), row.stride)
        # the activation runs inline in the DPU: it moves no bytes and costs no MAC cycles, so
        # every conv row uses Relu (exSwish is not lowered by npuemu's compiler yet)
        relu = row.op != "Conv"
        nodes.append(helper.make_node("Conv", [names[0], "w", "b"], ["c" if relu else "y"], kernel_shape=[kh, kw],
                                      strides=[row.stride] * 2, pads=pads))
        if relu:
            nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif row.op == "Concat":
        nodes.append(helper.make_node("Concat", names, ["y"], axis=1))
    elif row.op in ("Add", "Mul"):
        nodes.append(helper.make_node(row.op, names, ["y"]))
    elif row.op == "Sigmoid":
        nodes.append(helper.make_node("Sigmoid", names, ["y"]))
    else:
        from npuemu.isa.errors import ConfigError
        raise ConfigError(f"calibration row {row.name}: no one-layer model for op {row.op!r}")
    graph = helper.make_graph(nodes, f"cal_{row.table}{row.id}", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _same_pads(in_hw, out_hw, kernel, stride) -> list[int]:
    """Pads (top, left, bottom, right) giving ``out_hw``; the extra pad goes bottom/right."""
    pads = []
    for size, out, k in zip(in_hw, out_hw, kernel):
        total = max((out - 1) * stride + k - size, 0)
        pads.append((total // 2, total - total // 2))
    return [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]


def run_row(row: CalibrationRow) -> RowRun:
    """Compile ``row`` for its chip, run it on the emulator and keep each NPU task's figures.

    A row npuemu cannot compile or run yet comes back with ``on_npu`` False and the error as its
    reason, so the report lists it instead of dropping it."""
    from npuemu.isa.errors import NpuemuError

    try:
        return _run_row(row)
    except NpuemuError as error:
        return RowRun(row, False, f"{type(error).__name__}: {error}")


def _run_row(row: CalibrationRow) -> RowRun:
    from npuemu.compiler.driver import CompileOptions, build, prepare
    from npuemu.emulator.runtime import Runtime
    from npuemu.platforms import load_platform

    platform = load_platform(row.chip)
    rng = np.random.default_rng(1000 + row.id)
    samples = [{f"x{i}": rng.normal(size=(1, *shape)).astype(np.float32) for i, shape in enumerate(row.inputs)}]
    front = prepare(row_onnx(row), platform, CompileOptions(dataset=samples))
    graph, model = front.graph, build(front)
    layers = [f"{info.op_type}@{info.target or '?'}" for info in model.layers()]
    npu_layers = [info for info in model.layers() if info.task_count]
    if not npu_layers:
        cpu = [info.op_type for info in model.layers()]
        return RowRun(row, False, f"npuemu's build runs {'/'.join(cpu) or row.op} on the CPU (no NPU tasks)",
                      layers=layers)
    layout = _layout_difference(row, model, graph.inputs, platform)
    structure = [reason for ops, reason in TASK_STRUCTURE if any(info.op_type in ops for info in npu_layers)]
    runtime = Runtime(model, platform)
    for i, name in enumerate(runtime.inputs):
        runtime.set_input(name, np.zeros((1, *row.inputs[i]), np.float32))
    runtime.run()
    from npuemu.emulator.timing.timeline import plan_npu

    plan = plan_npu(model, runtime.runs, platform, keep_records=False)
    # the row's own tasks write its output: conv tasks for a conv row, DPU/PPU-only tasks otherwise
    # (a helper conv of an element-wise row writes a tensor of its own: the lanes of a broadcast)
    records = [record for run in runtime.runs for record in run.tasks]
    own = [record for record in records
           if (record.dpu is not None or record.ppu is not None) and (record.conv is not None) == row.is_conv]
    written = sum(record.traffic.write_bytes for record in own)
    if not row.is_conv and any(record.conv is not None for record in records):
        structure.append(HELPER_CONV)
    layout = "; ".join(filter(None, [layout, _output_difference(row, written, platform), *structure]))
    # the figure-independent work; the fit times it with each candidate's figures (task_time.time_work)
    tasks = [planned.work for step in plan.steps for planned in step.tasks]
    return RowRun(row, True, tasks=tasks, layers=layers, layout=layout, plan=plan)


#: layers whose tasks differ from the vendor's, so their board rows are not fitted: (op types, why)
TASK_STRUCTURE = (
    (frozenset(ONNX_LUT_KINDS), "task structure: the vendor uploads the LUT in a DPU task of its own (rep10), "
                                "npuemu's build folds it into the layer's task"),
    (frozenset({"Concat"}), "task structure: npuemu copies each input with a DPU task; no vendor listing shows "
                            "how its Concat is built"),
)

#: an element-wise row whose build adds a conv task (LOWERING.md 16: a [1, 1, H, W] operand
#: replicated across the lanes of one surface, then read for every surface)
HELPER_CONV = ("task structure: npuemu's build replicates the broadcast operand across the lanes of one surface "
               "with a 1x1 conv task; the vendor's task structure is not known (its profile has 0 NPU cycles: no "
               "conv task)")


def vendor_bytes(shape: tuple[int, int, int], c2: int, packed: bool = False) -> int:
    """Bytes of an int8 (C, H, W) tensor as the vendor stores it: NC1HWC2 with C padded to C2,
    or 1 byte per channel per pixel for a packed first-layer image (vendor-corpus README §5)."""
    c, h, w = shape
    return c * h * w if packed else -(-c // c2) * c2 * h * w


def _layout_difference(row: CalibrationRow, model, inputs, platform) -> str:
    """Where npuemu's build stores the row's tensors in other sizes than the vendor's ("" if none)."""
    c2 = platform.nc1hwc2.int8
    sizes = {}
    for tensor in model.tensors():
        if tensor.native_shape:
            sizes[tensor.name] = int(np.prod(tensor.native_shape))
    diffs = []
    for name, shape in zip(inputs, row.inputs):
        want = vendor_bytes(shape, c2, packed=row.uint8_input)
        if name in sizes and sizes[name] != want:
            diffs.append(f"input {list(shape)} {sizes[name]} B (vendor {want} B"
                         f"{', packed uint8 image' if row.uint8_input else ''})")
    return "; ".join(diffs)


def _output_difference(row: CalibrationRow, written: int, platform) -> str:
    """Where the row's tasks write other bytes than the vendor's output size ("" if the same):
    what the DPU writes (its real-channel surfaces, REGISTER_SEMANTICS 3.3), not the allocation."""
    want = vendor_bytes(row.out, platform.nc1hwc2.int8)
    return f"output {list(row.out)} written {written} B (vendor {want} B)" if written != want else ""


# --- the model with given figures ------------------------------------------------------------

@dataclass(frozen=True)
class Figures:
    """The platform figures calibration fits (platform YAML ``ddr`` and ``launch`` groups)."""

    read_bytes_per_cycle: float
    write_bytes_per_cycle: float
    task_overhead_cycles: int
    host_submit_overhead_us: float
    npu_mhz: float
    compute_overlap: float = 1.0
    conv_write_bytes_per_cycle: float | None = None  # cycle_model: a conv task's output bound (None: none)

    @classmethod
    def of(cls, platform) -> Figures:
        return cls(platform.ddr.read_bytes_per_cycle, platform.ddr.write_bytes_per_cycle,
                   platform.launch.task_overhead_cycles, platform.launch.host_submit_overhead_us,
                   platform.clock.npu_mhz, platform.ddr.compute_overlap, platform.cycle_model.conv_write_bytes_per_cycle)

    def task_figures(self) -> TaskFigures:
        """The figures the task formula reads (task_time.py)."""
        return TaskFigures(self.read_bytes_per_cycle, self.write_bytes_per_cycle, self.compute_overlap,
                           self.task_overhead_cycles, self.conv_write_bytes_per_cycle)


def model_row(run: RowRun, fig: Figures) -> RowResult:
    """The row's NPU, DDR, max cycles and time: the formulas of emulator/timing with ``fig``."""
    if not run.on_npu:
        return RowResult(run, 0, 0, 0, 0.0)
    timeline = run.timeline(fig)
    times = [span.time for span in timeline.task_spans()]
    return RowResult(run, sum(t.npu_cycles for t in times), sum(t.ddr_cycles for t in times),
                     sum(t.max_cycles for t in times), timeline.total_us + fig.host_submit_overhead_us)


def figures_with_platform_model(run: RowRun, platform) -> RowResult:
    return model_row(run, Figures.of(platform))


# --- the fit ---------------------------------------------------------------------------------

def _bounded_lstsq(a: np.ndarray, b: np.ndarray, lower, upper) -> np.ndarray:
    """Least squares with ``lower <= x <= upper``: an unknown that leaves its range is fixed at
    the bound it crossed (the worst one first) and the others are refitted."""
    n = a.shape[1]
    x = np.zeros(n)
    fixed: dict[int, float] = {}
    while len(fixed) < n:
        free = [i for i in range(n) if i not in fixed]
        rhs = b - sum((a[:, i] * v for i, v in fixed.items()), np.zeros(len(b)))
        sol, *_ = np.linalg.lstsq(a[:, free], rhs, rcond=None)
        low = [(lower[i] - v, i, lower[i]) for v, i in zip(sol, free) if v < lower[i]]
        high = [(v - upper[i], i, upper[i]) for v, i in zip(sol, free) if v > upper[i]]
        if not low and not high:
            x[free] = sol
            break
        _, index, bound = max(low + high)
        fixed[index] = bound
    for i, v in fixed.items():
        x[i] = v
    return x


def _overlapped(run: RowRun, fig: Figures) -> int:
    """Sum of min(compute, DDR) over the row's conv tasks with ``fig``: the part the overlap
    figure acts on."""
    task_fig = fig.task_figures()
    return sum(min(timed.compute_cycles, timed.ddr_cycles)
               for timed in (time_work(task, task_fig) for task in run.tasks if task.conv))


def fit(runs: list[RowRun], start: Figures) -> Figures:
    """Fitted DDR rates, compute/DMA overlap and launch overheads for one chip's rows (the
    clock is kept from ``start``)."""
    rows = [run for run in runs if run.fit_row]
    if not rows:
        from npuemu.isa.errors import ConfigError
        raise ConfigError("no calibration row of this chip runs on the NPU with the vendor's tensor sizes in "
                          "npuemu's build; nothing to fit")
    # DDR: relative residual (model - measured) / measured, unknowns 1/r and 1/w
    a = np.array([[sum(t.data_read_bytes for t in r.tasks) / r.row.ddr,
                   sum(t.write_bytes for t in r.tasks) / r.row.ddr] for r in rows])
    inv_r, inv_w = _bounded_lstsq(a, np.ones(len(rows)), [0, 0], [np.inf, np.inf])
    if inv_r <= 0 or inv_w <= 0:  # one direction unidentifiable from these rows: one shared rate
        inv_r = inv_w = float(np.linalg.lstsq(a.sum(axis=1, keepdims=True), np.ones(len(rows)), rcond=None)[0][0])
    fig = replace(start, read_bytes_per_cycle=round(1 / inv_r, 3), write_bytes_per_cycle=round(1 / inv_w, 3),
                  task_overhead_cycles=0, host_submit_overhead_us=0.0, compute_overlap=1.0,
                  conv_write_bytes_per_cycle=None)
    # the conv output bound enters through a max(), so it is chosen from candidates, each with the
    # linear time fit below; only with more rows than the 4 unknowns it adds up to
    candidates = [None] + (list(CONV_WRITE_RATES) if len(rows) > 4 else [])
    fits = [_fit_time(rows, replace(fig, conv_write_bytes_per_cycle=rate)) for rate in candidates]
    return min(fits, key=lambda pair: pair[1])[0]


#: candidate conv output rates (bytes/cycle) for the fit: 0.25 .. 16 in steps of 5%
CONV_WRITE_RATES = tuple(round(0.25 * 1.05 ** k, 3) for k in range(86))


def _fit_time(rows: list[RowRun], fig: Figures) -> tuple[Figures, float]:
    """Overlap and launch overheads fitted with ``fig``'s DDR rates and output bound, and the sum
    of squared relative time residuals they leave. Unknowns: s = 1 - overlap (on the sum of
    min(compute, DDR)), c (cycles per task), h (us per layer)."""
    f = fig.npu_mhz
    a, b = [], []
    for r in rows:
        low = _overlapped(r, fig)
        t = r.row.time_us
        a.append([low / f / t, len(r.tasks) / f / t, 1 / t])
        b.append((t - model_row(r, fig).time_us) / t)
    s, c, h = _bounded_lstsq(np.array(a), np.array(b), [0, 0, 0], [1, TASK_OVERHEAD_MAX, np.inf])
    fitted = replace(fig, compute_overlap=round(1 - float(s), 3), task_overhead_cycles=int(round(c)),
                     host_submit_overhead_us=round(float(h), 1))
    return fitted, sum(((model_row(r, fitted).time_us - r.row.time_us) / r.row.time_us) ** 2 for r in rows)


# --- the report ------------------------------------------------------------------------------

@dataclass
class ChipReport:
    chip: str
    figures: Figures
    results: list[RowResult]

    def medians(self) -> dict[str, float | None]:
        out = {}
        for key in ("npu", "ddr", "time"):
            errors = [abs(e) for r in self.results if (e := r.error(key)) is not None
                      and not (key == "npu" and r.run.row.npu == 0)]
            out[key] = statistics.median(errors) if errors else None
        return out

    def to_json(self) -> dict:
        rows = []
        for r in self.results:
            row = r.run.row
            rows.append({"row": f"{row.table}{row.id}", "op": row.op, "on_npu": r.run.on_npu,
                         "fit_row": r.run.fit_row, "reason": r.run.reason, "tasks": len(r.run.tasks),
                         "measured": {"npu_cycles": row.npu, "ddr_cycles": row.ddr, "max_cycles": row.max,
                                      "time_us": row.time_us},
                         "model": {"npu_cycles": r.npu, "ddr_cycles": r.ddr, "max_cycles": r.max,
                                   "time_us": round(r.time_us, 2)} if r.run.on_npu else None,
                         "error": {k: _finite(r.error(k)) for k in ("npu", "ddr", "time")} if r.run.on_npu else None})
        f = self.figures
        return {"chip": self.chip, "figures": {"ddr.read_bytes_per_cycle": f.read_bytes_per_cycle,
                                              "ddr.write_bytes_per_cycle": f.write_bytes_per_cycle,
                                              "launch.task_overhead_cycles": f.task_overhead_cycles,
                                              "launch.host_submit_overhead_us": f.host_submit_overhead_us,
                                              "ddr.compute_overlap": f.compute_overlap,
                                              "cycle_model.conv_write_bytes_per_cycle": f.conv_write_bytes_per_cycle,
                                              "clock.npu_mhz": f.npu_mhz},
                "rows": rows, "median_abs_error": self.medians()}

    def format_text(self) -> str:
        f = self.figures
        lines = [f"{self.chip}: DDR read {f.read_bytes_per_cycle:g} B/cycle, write {f.write_bytes_per_cycle:g} "
                 f"B/cycle, overlap {f.compute_overlap:g}; launch {f.task_overhead_cycles} cycles/task + "
                 f"{f.host_submit_overhead_us:g} us/layer; NPU {f.npu_mhz:g} MHz"
                 + (f"; conv output {f.conv_write_bytes_per_cycle:g} B/cycle" if f.conv_write_bytes_per_cycle else ""),
                 f"{'row':<6}{'op':<13}{'tasks':>5}  {'NPU model/board':>19} {'err':>7}  {'DDR model/board':>17} "
                 f"{'err':>7}  {'time us model/board':>20} {'err':>7}"]

        def pct(e):
            if e is not None and math.isinf(e):
                return "n/a"  # the board says 0 (B144's helper conv: its MAC cycles against none)
            return "" if e is None else f"{100 * e:+.1f}%"
        for r in self.results:
            row = r.run.row
            label = f"{row.table}{row.id}"
            if not r.run.on_npu:
                lines.append(f"{label:<6}{row.op:<13}{'-':>5}  not on the NPU: {r.run.reason}")
                continue
            mark = "" if r.run.fit_row else f"  (not fitted: {r.run.layout})"
            lines.append(f"{label:<6}{row.op:<13}{len(r.run.tasks):>5}  {r.npu:>9}/{row.npu:<9} "
                         f"{pct(r.error('npu')):>7}  {r.ddr:>8}/{row.ddr:<8} {pct(r.error('ddr')):>7}  "
                         f"{r.time_us:>9.1f}/{row.time_us:<10g} {pct(r.error('time')):>7}{mark}")
        med = self.medians()
        names = {"npu": "NPU", "ddr": "DDR", "time": "time"}
        lines.append("median |error|: " + ", ".join(
            f"{names[k]} {'-' if v is None else f'{100 * v:.1f}%'}" for k, v in med.items()))
        return "\n".join(lines)


def _finite(error: float | None) -> float | None:
    """A relative error for JSON: None where there is none (a board figure of 0, the model's not)."""
    return None if error is None or math.isinf(error) else error


def report(chip: str, runs: list[RowRun], figures: Figures) -> ChipReport:
    return ChipReport(chip, figures, [model_row(run, figures) for run in runs])
