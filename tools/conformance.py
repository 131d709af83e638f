"""ONNX backend node-test conformance of the NPU path: each single-node test of an op the
compiler knows is imported, optimized, quantized, built for a chip and run on the emulator,
and the emulator's outputs are compared with the test's expected outputs.

Outcomes per case: ``pass``, ``fail`` (with the max absolute error and the tolerance),
``unsupported`` (the compiler's NpuemuError message: an attribute, shape or element type the
hardware/compiler cannot do), ``not applicable`` (opset out of range, several data sets...)
or ``error`` (an unexpected Python exception: a bug).

int8 tolerance. The test input is the calibration set (one sample), so the ranges cover it.
A case passes when, element-wise,

    |emulated - expected| <= 2 * out_scale + max|fakequant - float|

``2 * out_scale``: the output's own rounding (1/2 LSB) plus requantization rounding inside
the layer (up to 1.5 LSB). ``max|fakequant - float|``: the accumulated input/weight
quantization error, measured as the gap between the compiler's fake-quant model
(``compiler.quant.fake_quant_evaluate``) and its float model (``compiler.float_eval``) of
the same graph; neither uses emulator code nor the expected outputs, so a wrong expectation
cannot widen its own tolerance.

fp16: the graph is quantized with ``default_dtype="float16"`` and really built and run (the
build lowers what it can; what it cannot raises and is reported unsupported). Tolerance for
float16 outputs: ``4 * 2^-11 * |expected| + 1e-3 * max(max|expected|, 1)`` (4 ulp plus
accumulation) plus, element-wise, ``|fakequant - float|`` (what fp16 storage of the inputs
moves). Outputs that are not quantized (integer/bool results of host steps) use onnx's own
tolerance, ``1e-5 + 1e-3 * |expected|``, plus the same element-wise ``|fakequant - float|``
(an int32 Pow of a quantized float exponent).
"""

from __future__ import annotations

import functools
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

STATUSES = ("pass", "fail", "unsupported", "not applicable", "error")
#: Ops whose inputs after the first configure the op (must be constant for the compiler).
CONFIG_INPUT_OPS = {"Reshape", "Slice", "Split", "Squeeze", "Unsqueeze", "ReduceMean", "ReduceSum", "ReduceMax",
                    "ReduceMin", "ReduceProd", "Resize", "Upsample", "Pad", "Clip", "Tile", "Expand"}
ALL_CONFIG_OPS = {"ConstantOfShape", "Range"}
#: Ops whose inputs after the first are weights: the NPU needs them constant (a model carries
#: them as initializers), so the test's values for them become initializers.
WEIGHT_INPUT_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "PRelu", "BatchNormalization", "LayerNormalization"}
#: Cases where npuemu deliberately follows onnxruntime (the project's float reference) and not
#: onnx's reference implementation: they are compared with onnxruntime's outputs instead.
DEVIATIONS = {
    # onnxruntime maps align_corners coordinates with the lengths, x * (in - 1) / (out - 1);
    # onnx's reference implementation divides by in * scale - 1 (a fractional length)
    "test_resize_downsample_scales_linear_align_corners": "align_corners follows onnxruntime",
    "test_resize_downsample_scales_cubic_align_corners": "align_corners follows onnxruntime",
}


@dataclass
class CaseResult:
    name: str
    op: str
    status: str
    reason: str = ""
    max_error: float | None = None
    tolerance: float | None = None
    target: str = ""  # "NPU", "CPU" or "NPU+CPU": where the built model runs the node
    seconds: float = 0.0
    partition_reason: str = ""  # the partition's reason when it gives the node to the CPU


@dataclass
class Report:
    chip: str
    dtype: str
    cases: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    def per_op(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for case in self.cases:
            row = table.setdefault(case.op, {status: 0 for status in STATUSES} | {"npu": 0, "cpu": 0})
            row[case.status] += 1
            if case.status in ("pass", "fail"):
                row["cpu" if case.target == "CPU" else "npu"] += 1
        return dict(sorted(table.items()))

    def to_json(self) -> dict[str, Any]:
        totals = {status: sum(case.status == status for case in self.cases) for status in STATUSES}
        return {"chip": self.chip, "dtype": self.dtype, "seconds": round(self.seconds, 2), "totals": totals,
                "ops": self.per_op(), "cases": [asdict(case) for case in self.cases]}


@functools.cache
def _all_node_cases() -> tuple:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(load_model_tests(kind="node"))


def discover(ops: list[str] | None = None) -> list:
    """Single-node cases (no ``_expanded`` variants) of ops in the compiler's registry,
    restricted to ``ops`` when given. Unknown names in ``ops`` raise ConfigError."""
    from npuemu.compiler.ops import REGISTRY
    from npuemu.isa.errors import ConfigError

    if ops:
        unknown = [op for op in ops if op not in REGISTRY]
        if unknown:
            raise ConfigError(f"--ops: the compiler does not know {', '.join(unknown)} (see compiler/SUPPORT.md)")
    wanted = set(ops) if ops else set(REGISTRY)
    return [case for case in _all_node_cases() if "_expanded" not in case.name and len(case.model.graph.node) == 1
            and case.model.graph.node[0].op_type in wanted]


def importable_model(case):
    """A copy of the case's model at an opset the importer takes (a later opset is lowered to
    MAX_OPSET when the model still checks: later opsets mostly only add element types), or the
    reason it does not apply. Shared with the float-IR node tests."""
    import onnx

    from npuemu.compiler.onnx_import import MAX_OPSET, MIN_OPSET

    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)
    if opset is None or opset < MIN_OPSET:
        return f"opset {opset} is older than the supported range"
    if opset > MAX_OPSET:
        for entry in model.opset_import:
            if entry.domain in ("", "ai.onnx"):
                entry.version = MAX_OPSET
        model.ir_version = min(model.ir_version, 10)
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError:
            return f"needs opset {opset}"
    return model


def _prepare(case):
    """(model, float feeds, expected outputs) or a reason string when the case does not apply."""
    import onnx

    model = importable_model(case)
    if isinstance(model, str):
        return model
    inputs, outputs = case.data_sets[0]

    def to_array(value):
        return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)

    feeds = {value.name: to_array(data) for value, data in zip(model.graph.input, inputs)}
    node = model.graph.node[0]
    if node.op_type in ALL_CONFIG_OPS:
        keep = set()
    elif node.op_type in CONFIG_INPUT_OPS | WEIGHT_INPUT_OPS:
        keep = {node.input[0]}
    else:
        keep = set(feeds)
    for name in [name for name in feeds if name not in keep]:
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(feeds.pop(name)), name))
        model.graph.input.remove(next(value for value in model.graph.input if value.name == name))
    return model, feeds, [to_array(value) for value in outputs]


def _onnxruntime_outputs(model, feeds) -> list:
    """onnxruntime's outputs of a case (for DEVIATIONS)."""
    from npuemu.isa.errors import ConfigError

    try:
        import onnxruntime
    except ImportError:
        raise ConfigError("this case is compared with onnxruntime, which is not installed") from None
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {name: np.asarray(value) for name, value in feeds.items()})


def _target(model_file) -> str:
    """NPU / CPU / NPU+CPU from the kinds of the built model's schedule steps (trailer)."""
    kinds = {str(step.get("kind", "")).lower() for step in model_file.trailer.get("schedule", ())}
    npu, cpu = "npu" in kinds, bool(kinds - {"npu"})
    return "NPU+CPU" if cpu and npu else "CPU" if cpu else "NPU"


def _cpu_reason(graph, platform) -> str:
    """The partition's reasons for the nodes it gives to the CPU (empty when all go to the NPU)."""
    from npuemu.compiler.passes import PassContext
    from npuemu.compiler.passes.partition import CPU, decide

    reasons = []
    for node in graph.nodes:
        decision = decide(graph, node, PassContext(platform, 3))
        if decision.target == CPU:
            reasons.append(str(decision.reason))
    return "; ".join(reasons)


def run_case(case, chip: str = "rk3588", dtype: str = "int8", *, expected_override=None) -> CaseResult:
    """One case, never raising. ``expected_override``: replace the expected outputs (tests)."""
    op = case.model.graph.node[0].op_type
    start = time.perf_counter()
    result = CaseResult(case.name, op, "error")
    try:
        _run(case, chip, dtype, result, expected_override)
    except Exception as error:  # noqa: BLE001 - sorted below: NpuemuError is a reason, anything else a bug
        from npuemu.isa.errors import NpuemuError

        if isinstance(error, NpuemuError):
            text = " / ".join(line.strip() for line in f"{type(error).__name__}: {error}".splitlines() if line.strip())
            if result.partition_reason:  # why the node left the NPU: the hardware constraint that failed
                text = f"[CPU: {result.partition_reason}] {text}"
            result.status, result.reason = "unsupported", text[:400]
        else:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            result.status = "error"
            where = f"{frame.filename.split('/npuemu/')[-1]}:{frame.lineno}"
            result.reason = f"{type(error).__name__}: {error} (at {where})"[:400]
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _run(case, chip, dtype, result, expected_override):
    from npuemu.compiler.driver import CompileOptions, build, prepare
    from npuemu.compiler.float_eval import evaluate
    from npuemu.compiler.quant import fake_quant_evaluate
    from npuemu.emulator.runtime import Runtime
    from npuemu.platforms import load_platform

    prepared = _prepare(case)
    if isinstance(prepared, str):
        result.status, result.reason = "not applicable", prepared
        return
    model, feeds, expected = prepared
    if case.name in DEVIATIONS:
        expected = _onnxruntime_outputs(model, feeds)
        result.reason = f"deviation: compared with onnxruntime ({DEVIATIONS[case.name]})"
    if expected_override is not None:
        expected = expected_override
    platform = load_platform(chip)
    float_feeds = {name: np.asarray(value) for name, value in feeds.items()}
    # the test input is the calibration set (fp16 builds only use it for tensors no layer types,
    # e.g. a graph input only a Shape reads)
    options = CompileOptions(precision="int8" if dtype == "int8" else "fp16", dataset=[float_feeds],
                             input_shapes={name: list(np.shape(value)) for name, value in feeds.items()},
                             name=case.name)
    front = prepare(model, platform, options)
    graph = front.graph
    result.partition_reason = _cpu_reason(graph, platform)
    built = build(front)
    result.target = _target(built)
    runtime = Runtime(built, platform)
    for name, value in float_feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    simulated = fake_quant_evaluate(graph, float_feeds)
    golden = evaluate(graph, float_feeds)  # the compiler's float model: the quantization error's baseline
    worst_ratio, worst_error, worst_tol = -1.0, 0.0, 0.0
    for name, want in zip(graph.outputs, expected):
        got = np.asarray(runtime.output(name), np.float64)
        want = np.asarray(want, np.float64)
        if got.size != want.size:
            raise AssertionError(f"output {name}: {got.size} values, expected {want.size}")
        got = got.reshape(want.shape)
        with np.errstate(invalid="ignore"):  # NaN and infinities: equal ones match, others fail
            same = (got == want) | (np.isnan(got) & np.isnan(want))
            error = np.where(same, 0.0, np.abs(got - want))
        error = np.where(np.isnan(error), np.inf, error)
        quant = graph.tensors[name].quant
        # what quantizing / storing the inputs moves the result: the build's own fake-quant
        # prediction against the float model, element-wise
        gap = np.abs(np.asarray(simulated[name], np.float64).reshape(want.shape)
                     - np.asarray(golden[name], np.float64).reshape(want.shape))
        if quant is not None and getattr(quant, "dtype", "int8") == "int8":
            tolerance = np.full(want.shape, 2.0 * float(np.max(quant.scale)) + float(np.max(gap, initial=0.0)))
        elif quant is not None and getattr(quant, "dtype", "") == "float16":
            # fp16: 4 ulp relative (2^-11 each) plus 1e-3 of the output's range for accumulation,
            # plus the storage gap (a Softmax of inputs near 10000 cannot be exact when its inputs are fp16)
            tolerance = (4 * 2.0**-11 * np.abs(want) + 1e-3 * max(float(np.max(np.abs(want), initial=0.0)), 1.0)
                         + gap)
        else:  # onnx's own tolerance, plus the gap (an int Pow's exponent)
            tolerance = 1e-5 + 1e-3 * np.abs(want) + np.where(np.isnan(gap), 0.0, gap)
        ratio = float(np.max(error / tolerance, initial=0.0))
        if ratio > worst_ratio:
            index = np.unravel_index(np.argmax(error / tolerance), want.shape) if error.size else ()
            worst_ratio, worst_error = ratio, float(error.max(initial=0.0))
            worst_tol = float(tolerance[index]) if error.size else 0.0
    result.max_error, result.tolerance = worst_error, worst_tol
    result.status = "pass" if worst_ratio <= 1.0 else "fail"


def run_conformance(chip: str = "rk3588", dtype: str = "int8", ops: list[str] | None = None,
                    progress=None, *, bar: bool = False) -> Report:
    """Every case of ``ops`` (default: all known) compiled and run; ``progress`` is called with
    each finished case, ``bar`` draws a progress bar on stderr when it is a terminal."""
    from npuemu.isa.errors import ConfigError

    if dtype not in ("int8", "fp16"):
        raise ConfigError(f"--dtype must be int8 or fp16, not {dtype!r}")
    from npuemu.platforms import load_platform

    load_platform(chip)  # unknown chip: the platform loader's own error
    report = Report(chip, dtype)
    start = time.perf_counter()
    from npuemu.compiler.quant.progress import Progress

    cases = discover(ops)
    with Progress(len(cases), f"conformance {chip} {dtype}", enabled=bar) as shown:
        for case in cases:
            report.cases.append(run_case(case, chip, dtype))
            shown.advance()
            if progress:
                progress(report.cases[-1])
    report.seconds = time.perf_counter() - start
    return report


def format_table(report: Report) -> str:
    lines = [f"conformance {report.chip} {report.dtype}: {len(report.cases)} node tests, {report.seconds:.1f} s",
             f"{'op':<24}{'pass':>6}{'fail':>6}{'unsup':>7}{'n/a':>5}{'error':>7}{'npu':>5}{'cpu':>5}"]
    for op, row in report.per_op().items():
        lines.append(f"{op:<24}{row['pass']:>6}{row['fail']:>6}{row['unsupported']:>7}{row['not applicable']:>5}"
                     f"{row['error']:>7}{row['npu']:>5}{row['cpu']:>5}")
    totals = report.to_json()["totals"]
    lines.append(f"{'total':<24}{totals['pass']:>6}{totals['fail']:>6}{totals['unsupported']:>7}"
                 f"{totals['not applicable']:>5}{totals['error']:>7}")
    return "\n".join(lines)


def format_unsupported(report: Report) -> str:
    return "\n".join(f"{case.name}: {case.reason}" for case in report.cases if case.status == "unsupported")
