"""Per-layer accuracy analysis of a quantized model (SDK guide 3.2.2, 4.1.3.1; hardware.md 5).

Two sources of quantized values, compared with the float "golden" (the compiler's float
evaluation of the same fused graph, so tensor names line up):

- **simulator** (the vendor's ``simulator_error``): the compiler's fake-quant evaluation,
  ``entire`` (the whole graph quantized, errors accumulate) and ``single`` (the layer alone,
  fed the golden inputs stored as their quantization says) - ``compiler.quant.layer_accuracy``.
- **runtime** (the vendor's ``runtime_error``, measured on a board there): the emulated NPU.
  The graph is built into a model file with every layer output kept as a graph output, so
  the memory plan never reuses its bytes and the runtime can read each layer's int8 result
  after the run. Keeping a tensor alive moves addresses, not values: a layer's integer result
  does not depend on where its operands live (a test checks the final outputs against a plain
  build). Only ``entire`` exists here: the vendor's ``single_sim`` (the board fed golden
  inputs layer by layer) would need a single-layer build per layer; it is not done. Instead
  each layer's NPU value is also compared with the simulator's (``runtime_vs_simulator``), and
  the report names the first layer where the two part (:meth:`AccuracyReport.first_departure`).

When the build cannot be made (a float16 layer of a hybrid config, an op lowering does not
have yet) the runtime columns are empty and :attr:`AccuracyReport.runtime_note` says why; the
simulator columns still cover the whole model.

This module lives in ``tools`` because it needs both the compiler and the emulator.
"""

from __future__ import annotations

import copy
import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from npuemu.compiler.driver import CompileOptions, build_graph
from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.ir import Graph
from npuemu.compiler.quant import convert_op, cosine, fake_quant_evaluate, layer_accuracy, storage_hook
from npuemu.compiler.quant.quantize import layer_dtype
from npuemu.emulator.runtime import Runtime
from npuemu.isa.errors import NpuemuError

#: The vendor table marks a cosine below these in yellow / red (guide 3.2.2, figure 3-2
#: colours); we print the same thresholds as a flag column since a terminal table has no colour.
#: Chosen, not documented figures: 0.99 and 0.9.
WARN_COSINE = 0.99
BAD_COSINE = 0.9
#: The emulated NPU and the fake-quant simulator differ by requantization fixed-point error
#: (<= 1 LSB, compiler/quant/fake_quant.py); below this cosine they do more than that (chosen).
DEPARTURE_COSINE = 0.9999


@dataclass(frozen=True)
class LayerRow:
    """One tensor of the compiled graph: the layer producing it and its four figures."""

    layer: str
    op: str  # "Input" for a graph input
    dtype: str | None
    tensor: str
    entire_cosine: float
    entire_euclidean: float
    single_cosine: float
    single_euclidean: float
    runtime_cosine: float | None = None  # the emulated NPU, entire
    runtime_euclidean: float | None = None
    golden_zero: bool = False  # the float value is all zeros: cosine says nothing (0 or 1)
    runtime_vs_simulator: float | None = None  # cosine of the emulated NPU against the simulator, entire

    @property
    def label(self) -> str:
        """The vendor's row name: ``[OpType] tensor``."""
        return f"[{self.op}] {self.tensor}"


@dataclass(frozen=True)
class OutputMatch:
    """A graph output as the emulated NPU gives it, against golden and against the simulator."""

    tensor: str
    simulator_cosine: float
    runtime_cosine: float
    runtime_vs_simulator_cosine: float
    max_difference_lsb: float  # largest |runtime - simulator| in units of the output's scale


@dataclass
class AccuracyReport:
    model: str
    chip: str
    mode: str  # int8 / hybrid / float16 (the quantization summary's mode)
    rows: list[LayerRow]
    outputs: list[OutputMatch] = field(default_factory=list)
    runtime_note: str = ""  # why the runtime columns are empty, when they are
    # the emulated NPU's value of each analysed tensor (dequantized), by tensor name: what the
    # runtime columns measured, kept so a snapshot dump (tools/api/snapshot.py) needs no second run
    runtime_values: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def worst(self, count: int = 5, *, key: str = "single_cosine") -> list[LayerRow]:
        """The ``count`` rows with the lowest ``key`` (graph inputs and all-zero golden
        tensors, whose cosine is meaningless, left out)."""
        layers = [row for row in self.rows
                  if row.op != "Input" and not row.golden_zero and getattr(row, key) is not None]
        return sorted(layers, key=lambda row: getattr(row, key))[:count]

    def first_departure(self) -> LayerRow | None:
        """The first layer where the emulated NPU and the simulator part (cosine below
        DEPARTURE_COSINE): where to look for a compiler or emulator difference."""
        return next((row for row in self.rows if row.runtime_vs_simulator is not None
                     and row.runtime_vs_simulator < DEPARTURE_COSINE), None)


def analyze(graph: Graph, platform: Any, inputs: Mapping[str, np.ndarray], *, model: str = "model",
            mode: str = "int8", run_emulator: bool = True) -> AccuracyReport:
    """The report for a fused, quantized ``graph`` on one sample ``inputs`` (float, after the
    model's preprocessing). ``platform``: a loaded platform (``npuemu.platforms.load_platform``)."""
    golden = evaluate(graph, inputs, return_all=True)
    rows = _input_rows(graph, inputs) + [_row(item, golden) for item in layer_accuracy(graph, inputs)]
    report = AccuracyReport(model, platform.name, mode, rows)
    float16 = [node.layer_name for node in graph.nodes
               if node.op_type != convert_op.OP_TYPE and layer_dtype(graph, node) not in (None, "int8")]
    if not run_emulator:
        report.runtime_note = "emulator not run (asked)"
    elif float16:
        # the probe build is int8 only; never run a partial model
        report.runtime_note = (f"the model-file build is int8 only and {len(float16)} layer(s) are float16 "
                               f"({', '.join(float16[:3])}{', ...' if len(float16) > 3 else ''}): this analysis is "
                               "at the fake-quant level")
    else:
        try:
            runtime = _run_probe(graph, platform, inputs, [row.tensor for row in rows if row.op != "Input"])
        except NpuemuError as error:
            report.runtime_note = f"not built for the emulator: {error}"
        else:
            _add_runtime(report, graph, inputs, runtime, golden)
    return report


def _row(item, golden: Mapping[str, np.ndarray]) -> LayerRow:
    return LayerRow(item.layer, item.op, item.dtype, item.tensor, item.entire_cosine, item.entire_euclidean,
                    item.single_cosine, item.single_euclidean,
                    golden_zero=not np.asarray(golden[item.tensor]).any())


def _input_rows(graph: Graph, inputs: Mapping[str, np.ndarray]) -> list[LayerRow]:
    """A graph input's error is its own storage rounding, the same entire and single."""
    hook = storage_hook(graph)
    rows = []
    for name in graph.inputs:
        golden = np.asarray(inputs[name], dtype=np.float32)
        stored = hook(graph.tensors[name], golden)
        quant = graph.tensors[name].quant
        cos, euc = cosine(stored, golden), _distance(stored, golden)
        rows.append(LayerRow(name, "Input", quant.dtype if quant is not None else None, name, cos, euc, cos, euc))
    return rows


def _run_probe(graph: Graph, platform: Any, inputs: Mapping[str, np.ndarray], tensors: list[str]) -> Runtime:
    """Build with every analysed tensor kept as a graph output (module docstring), run once."""
    probe = copy.deepcopy(graph)
    probe.outputs = list(dict.fromkeys([*probe.outputs, *tensors]))
    runtime = Runtime(build_graph(probe, platform, CompileOptions(name="accuracy-probe")), platform)
    for name in graph.inputs:
        runtime.set_input(name, np.asarray(inputs[name], dtype=np.float32))
    runtime.run()
    return runtime


def _add_runtime(report: AccuracyReport, graph: Graph, inputs: Mapping[str, np.ndarray], runtime: Runtime,
                 golden: Mapping[str, np.ndarray]) -> None:
    stored = {tensor["name"] for tensor in runtime.model.trailer.get("tensors", ())}
    simulated = fake_quant_evaluate(graph, inputs, return_all=True)
    emulated: dict[str, np.ndarray] = {}
    for index, row in enumerate(report.rows):
        if row.op == "Input" or row.tensor not in stored:
            continue
        emulated[row.tensor] = report.runtime_values[row.tensor] = value = runtime.output(row.tensor)
        report.rows[index] = LayerRow(**{**row.__dict__, "runtime_cosine": cosine(value, golden[row.tensor]),
                                         "runtime_euclidean": _distance(value, golden[row.tensor]),
                                         "runtime_vs_simulator": cosine(value, simulated[row.tensor])})
    for name in graph.outputs:
        if name not in emulated:
            continue
        scale = graph.tensors[name].quant.scale if graph.tensors[name].quant is not None else 1.0
        difference = np.abs(emulated[name].reshape(-1).astype(np.float64)
                            - np.asarray(simulated[name], np.float64).reshape(-1))
        report.outputs.append(OutputMatch(name, cosine(simulated[name], golden[name]),
                                          cosine(emulated[name], golden[name]),
                                          cosine(emulated[name], simulated[name]),
                                          float(difference.max() / float(np.max(scale)))))


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    return float(np.linalg.norm(a - b))


# --- rendering -------------------------------------------------------------------------------

def _cos(value: float | None) -> str:
    return "" if value is None else f"{value:.5f}"


def _euc(value: float | None) -> str:
    """Five significant digits, as the vendor prints (37.674, 2.5780, 0.0)."""
    if value is None:
        return ""
    return "0.0" if value == 0 else f"{value:#.5g}".rstrip(".")


def _flag(row: LayerRow) -> str:
    if row.golden_zero:
        return "(float value all zero)"
    low = min(value for value in (row.entire_cosine, row.single_cosine, row.runtime_cosine) if value is not None)
    return "!!" if low < BAD_COSINE else "!" if low < WARN_COSINE else ""


def format_table(report: AccuracyReport) -> str:
    """The vendor's layout (guide 4.1.3.1): one row per tensor, ``cos | euc`` pairs for
    simulator entire and single, then runtime (emulated NPU) entire."""
    width = max([len(row.label) for row in report.rows] + [24]) + 2
    pair = 21
    lines = [
        f"# accuracy analysis of {report.model} for {report.chip} ({report.mode})",
        "# simulator_error: the compiler's fake-quant model against golden (the float graph);",
        "#   entire: errors accumulate layer by layer; single: the layer fed golden inputs.",
        "# runtime_error: the emulated NPU (the compiled register commands) against golden, entire.",
        "# The simulator rounds in float arithmetic: it approximates the NPU, it is not the exact prediction;",
        "#   the emulated NPU is bit-exact, so where the two differ the runtime column is what the chip gives.",
        "# ! cosine below %.2f, !! below %.2f; a float value of all zeros has no meaningful cosine" % (
            WARN_COSINE, BAD_COSINE),
        "",
        f"{'layer_name':<{width}}{'simulator_error':<{2 * pair}}{'runtime_error':<{pair}}",
        f"{'':<{width}}{'entire':<{pair}}{'single':<{pair}}{'entire':<{pair}}",
        f"{'':<{width}}" + f"{'cos':<9}{'euc':<12}" * 3,
        "-" * (width + 3 * pair + 3),
    ]
    for row in report.rows:
        cells = [_pair(row.entire_cosine, row.entire_euclidean), _pair(row.single_cosine, row.single_euclidean),
                 _pair(row.runtime_cosine, row.runtime_euclidean)]
        lines.append(f"{row.label:<{width}}" + "".join(f"{cell:<{pair}}" for cell in cells) + _flag(row))
    lines.append("")
    if report.runtime_note:
        lines.append(f"runtime columns empty: {report.runtime_note}")
    lines.extend(_output_lines(match) for match in report.outputs)
    departs = report.first_departure()
    if departs is not None:
        lines.append(f"emulated NPU vs simulator: first below {DEPARTURE_COSINE} at {departs.label} "
                     f"(cos {departs.runtime_vs_simulator:.6f}; every earlier layer is at {DEPARTURE_COSINE} or more)")
    worst = report.worst(5)
    if worst:
        lines.append("worst single: " + ", ".join(f"{row.label} {row.single_cosine:.5f}" for row in worst))
    return "\n".join(lines) + "\n"


def _output_lines(match: OutputMatch) -> str:
    """A graph output's two cosines to the float model and how far the two quantized columns
    are apart - worded so a gap reads as what it is: the float fake-quant model's rounding
    against the NPU's integer arithmetic, not an emulator fault."""
    return (f"output {match.tensor}: cosine to the float model: simulator (fake-quant, float arithmetic) "
            f"{match.simulator_cosine:.5f}, emulated NPU (bit-exact) {match.runtime_cosine:.5f}\n"
            f"  emulated NPU vs the fake-quant simulator: cos {match.runtime_vs_simulator_cosine:.6f}, max difference "
            f"{match.max_difference_lsb:.1f} LSB of the output scale (the simulator's float rounding, not an "
            "emulation error: the NPU column is the chip's exact result)")


def _pair(cos: float | None, euc: float | None) -> str:
    return "" if cos is None else f"{_cos(cos)} | {_euc(euc)}"


CSV_COLUMNS = ("layer", "op", "dtype", "tensor", "simulator_entire_cos", "simulator_entire_euc",
               "simulator_single_cos", "simulator_single_euc", "runtime_entire_cos", "runtime_entire_euc",
               "float_all_zero", "runtime_vs_simulator_cos")


def format_csv(report: AccuracyReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in report.rows:
        writer.writerow([row.layer, row.op, row.dtype or "", row.tensor, *(
            "" if value is None else repr(float(value)) for value in (
                row.entire_cosine, row.entire_euclidean, row.single_cosine, row.single_euclidean,
                row.runtime_cosine, row.runtime_euclidean)), int(row.golden_zero),
            "" if row.runtime_vs_simulator is None else repr(float(row.runtime_vs_simulator))])
    return out.getvalue()


def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plot(report: AccuracyReport, path: Path) -> None:
    """Cosine per layer (entire, single, emulated NPU) as a PNG; needs matplotlib (the
    ``plot`` extra)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot

    rows = report.rows
    positions = np.arange(len(rows))

    def series(key: str) -> list[float]:
        # an all-zero float tensor has no meaningful cosine: a gap, not a plunge to 0
        return [np.nan if row.golden_zero or getattr(row, key) is None else getattr(row, key) for row in rows]

    figure, axes = pyplot.subplots(figsize=(max(8.0, 0.18 * len(rows)), 4.5))
    axes.plot(positions, series("entire_cosine"), marker=".", label="simulator entire")
    axes.plot(positions, series("single_cosine"), marker=".", label="simulator single")
    runtime = series("runtime_cosine")
    if not np.isnan(runtime).all():
        axes.plot(positions, runtime, linestyle="none", marker="x", label="emulated NPU entire")
    for row_index, row in enumerate(report.worst(3)):
        index = rows.index(row)
        axes.annotate(row.label, (index, row.single_cosine), fontsize=7, xytext=(4, -10 - 9 * row_index),
                      textcoords="offset points")
    _layer_ticks(axes, rows)
    axes.ticklabel_format(axis="y", useOffset=False)
    axes.set_ylabel("cosine to float")
    axes.set_title(f"{report.model} on {report.chip} ({report.mode}): cosine per layer")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


#: At most this many x-axis labels: beyond it every k-th layer is named (readable, not a smear).
MAX_TICK_LABELS = 60


def tick_layers(rows: list[LayerRow], limit: int = MAX_TICK_LABELS) -> list[tuple[int, str]]:
    """(position, layer name) of the labelled x ticks: every layer up to ``limit``, else every
    k-th, always the last. Layer names, not tensor ids: the id of a fused tensor says nothing."""
    step = max(1, -(-len(rows) // limit))
    keep = sorted(set(range(0, len(rows), step)) | ({len(rows) - 1} if rows else set()))
    return [(index, rows[index].layer or rows[index].tensor) for index in keep]


def _layer_ticks(axes: Any, rows: list[LayerRow]) -> None:
    ticks = tick_layers(rows)
    axes.set_xticks([index for index, _ in ticks])
    axes.set_xticklabels([name for _, name in ticks], rotation=60, ha="right", rotation_mode="anchor", fontsize=7)
    axes.set_xlabel("layer" if len(ticks) == len(rows) else f"layer ({len(ticks)} of {len(rows)} named)")


__all__ = ["AccuracyReport", "LayerRow", "OutputMatch", "analyze", "format_csv", "format_table", "plot_available",
           "write_plot"]
