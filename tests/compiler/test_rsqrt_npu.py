"""1/sqrt on the NPU (passes/lower_rsqrt.py, compiler/lower/lut_rsqrt.py, LOWERING.md 24).

The float16 chain (a depthwise conv by 2^15, LUT pieces, element-wise products) is checked bit for
bit against a numpy chain written here from LOWERING.md 24 (the tables) and NUMERICS.md 5.1 /
4.6 (the LUT's fp32 arithmetic, one fp16 rounding per task); its accuracy against float64 over
every positive fp16 value; int8 against 1/sqrt rounded to the output grid on every input code;
whole graphs (Pow(x, -0.5), Reciprocal(Sqrt(x)), Sqrt(x)) against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.passes.lower_rsqrt import pieces
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine

F32, F16 = np.float32, np.float16
TOP, FLOOR, SCALE = 2.0 ** 12, 2.0 ** -24, 2.0 ** 15


# -- the reference ------------------------------------------------------------------------------
def piece_function(alpha: float, beta: float):
    """LOWERING.md 24: beta 0 -> max(x, alpha)^-1/2; else sqrt(beta / clamp(x, alpha, beta))."""
    if beta == 0:
        return lambda x: np.maximum(x, alpha) ** -0.5
    return lambda x: np.sqrt(beta / np.clip(x, alpha, beta))


def reference_piece(v: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """One float16 LUT layer: the 1025-knot table over [0, X] (entries rint(f / u), u = max f /
    32767), BN x = v * fp16(16384 / X) + (-0.0), the table read at x / 16 with fp32 linear
    interpolation (flat outside), EW y * u in fp32, fp16 round to nearest even."""
    span = beta if beta > 0 else 16.0 * alpha
    f = piece_function(alpha, beta)(np.arange(1025, dtype=np.float64) * (span / 1024))
    unit = f.max() / 32767
    table = np.rint(f / unit).astype(np.float32)
    m = F32(F16(16384.0 / span))
    out = np.empty(v.shape, F16)
    for index, value in np.ndenumerate(np.asarray(v, F32)):
        x = F32(F32(value * m) + F32(-0.0))
        if x <= 0:
            y = table[0]
        elif x >= 16384:
            y = table[-1]
        else:
            p = F32(x * F32(1 / 16))
            i = int(np.floor(p))
            y = F32(table[i] + F32(F32(table[i + 1] - table[i]) * F32(p - F32(i))))
        out[index] = F16(F32(y * F32(unit)))
    return out


def reference_rsqrt_fp16(v: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    """The float16 build of Rsqrt(v): top piece, then each piece multiplied in (fp16 products of
    fp16 operands, exact in fp32, rounded once); a piece whose top is below 0.5 reads
    fp16(v * 2^15), below 2^-15 fp16(fp16(v * 2^15) * 2^15)."""
    v = np.asarray(v, F16)
    with np.errstate(over="ignore"):  # overflows to inf: the pieces read it as above their range
        once = (v.astype(F32) * F32(SCALE)).astype(F16)
        twice = (once.astype(F32) * F32(SCALE)).astype(F16)
    partial = reference_piece(v, TOP, 0.0)
    top = TOP
    while top > max(floor, FLOOR):
        alpha, beta = max(top / 16, floor), top
        source, factor = (v, 1.0) if beta >= 0.5 else (once, SCALE) if beta * SCALE >= 0.5 else (twice, SCALE ** 2)
        piece = reference_piece(source, alpha * factor, beta * factor)
        partial = (partial.astype(F32) * piece.astype(F32)).astype(F16)
        top /= 16
    return partial


# -- builds -------------------------------------------------------------------------------------
def _model(nodes, shape, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _pow_model(shape):
    half = numpy_helper.from_array(np.array(-0.5, np.float32), "half")
    return _model([helper.make_node("Pow", ["x", "half"], ["y"])], shape, (half,))


def _run(model, x: np.ndarray, precision: str, samples=None):
    options = CompileOptions(precision=precision) if precision == "fp16" else \
        CompileOptions(precision="int8", dataset=samples)
    graph = prepare(model, "rk3588", options).graph
    built = build_graph(graph)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return graph, built, runtime


def _positive_fp16(channels: int = 16) -> np.ndarray:
    """Every positive finite fp16 value (subnormals included) as a [1, C, 32, W] cube (padded with 1)."""
    values = np.arange(1, 0x7C00, dtype=np.uint16).view(F16)
    values = np.concatenate([values, np.ones((-values.size) % (channels * 32), F16)])
    return values.reshape(1, channels, 32, -1).astype(np.float32)


@pytest.fixture(scope="module")
def pow_fp16_build():
    x = _positive_fp16()
    graph, built, runtime = _run(_pow_model(x.shape), x, "fp16")
    return x, graph, built, np.asarray(runtime.output("y"), np.float32).astype(F16)


def test_fp16_chain_is_bit_exact_on_every_positive_fp16_value(pow_fp16_build) -> None:
    x, graph, built, got = pow_fp16_build
    assert [s.kind for s in built.schedule()] == ["npu"]  # no host step
    kinds = [n.op_type for n in graph.nodes]
    assert kinds.count("Rsqrt") == 10 and kinds.count("Mul") == 9 and kinds.count("Conv") == 2, kinds
    want = reference_rsqrt_fp16(x)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_fp16_accuracy_over_the_range(pow_fp16_build) -> None:
    """Against float64 1/sqrt over every positive fp16 value (2^-24 .. 65504): within 0.56 fp16
    steps (relative 4.91e-4; rounding the exact value to fp16 alone: 0.5 steps, 4.88e-4), and
    the exactly rounded value for 98 % of the inputs."""
    x, _, _, got = pow_fp16_build
    exact = x.astype(np.float64) ** -0.5
    steps = np.abs(got.astype(np.float64) - exact) / np.spacing(exact.astype(F16)).astype(np.float64)
    assert steps.max() <= 0.56, steps.max()
    assert np.abs(got.astype(np.float64) / exact - 1).max() <= 4.91e-4
    assert np.mean(got == exact.astype(F16)) >= 0.98


@settings(max_examples=200, deadline=None)
@given(exponent=st.floats(-24.0, 16.0), floor_exponent=st.floats(-26.0, -15.0))
def test_pieces_telescope_to_the_inverse_square_root(exponent, floor_exponent) -> None:
    """top(v) * prod p_i(v) = v^-1/2 for v from the floor up, in float64 (the chain's algebra)."""
    floor = 2.0 ** floor_exponent
    v = max(2.0 ** exponent, max(floor, FLOOR))
    product = piece_function(TOP, 0.0)(v)
    for alpha, beta in pieces(floor):
        product *= piece_function(alpha, beta)(v)
    assert product == pytest.approx(v ** -0.5, rel=1e-12)


def test_int8_rsqrt_on_every_input_code() -> None:
    """int8 Pow(x, -0.5): one LUT layer; every code within 1 LSB of 1/sqrt rounded to the output
    grid, and exact away from rounding ties."""
    rng = np.random.default_rng(5)
    shape = (1, 4, 8, 8)
    samples = [{"x": rng.uniform(1e-3, 6.0, shape).astype(np.float32)} for _ in range(3)]
    x = np.linspace(-1.0, 7.0, int(np.prod(shape))).reshape(shape).astype(np.float32)
    graph, built, runtime = _run(_pow_model(shape), x, "int8", samples)
    assert [n.op_type for n in graph.nodes] == ["Rsqrt"] and [s.kind for s in built.schedule()] == ["npu"]
    tin, tout = graph.tensors[graph.nodes[0].inputs[0]].quant, graph.tensors["y"].quant
    codes = np.arange(-128, 128)
    runtime.set_input("x", np.resize(((codes - tin.zero_point) * tin.scale).astype(np.float32), shape))
    runtime.run()
    got = np.asarray(runtime.output("y", dequantize=False), np.int64).reshape(-1)[:256]
    real = (codes - tin.zero_point) * tin.scale
    with np.errstate(divide="ignore", invalid="ignore"):
        ideal = np.where(real > 0, np.abs(real) ** -0.5, np.inf) / tout.scale + tout.zero_point
    want = np.clip(np.rint(np.minimum(ideal, 1e9)), -128, 127)
    assert np.abs(got - want).max() <= 1
    finite = np.isfinite(ideal)
    clear = finite & (np.abs(np.where(finite, ideal - np.floor(np.where(finite, ideal, 0)), 0) - 0.5) > 1 / 32)
    assert np.all(got[clear | ~finite] == want[clear | ~finite])


@pytest.mark.parametrize("form", ["pow", "reciprocal_sqrt", "sqrt"])
def test_fp16_forms_run_on_the_npu_and_match_onnxruntime(form) -> None:
    rng = np.random.default_rng(11)
    shape = (1, 8, 6, 10)
    if form == "pow":
        model = _pow_model(shape)
    elif form == "reciprocal_sqrt":
        model = _model([helper.make_node("Sqrt", ["x"], ["s"]), helper.make_node("Reciprocal", ["s"], ["y"])], shape)
    else:
        model = _model([helper.make_node("Sqrt", ["x"], ["y"])], shape)
    # fp16 values (below 2^-14 they are subnormal: their own rounding would dominate the error)
    x = np.exp(rng.uniform(-16, 10, shape)).astype(F16).astype(np.float32)
    _, built, runtime = _run(model, x, "fp16")
    assert [s.kind for s in built.schedule()] == ["npu"]
    got = np.asarray(runtime.output("y"), np.float64)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.max(np.abs(got / want - 1)) <= 1e-3  # 4.9e-4 for 1/sqrt (above), one more rounding for sqrt
    assert cosine(got, want) >= 0.99999


def test_pow_on_a_rank_3_tensor_stays_a_host_step() -> None:
    """A map that is not 4-D [1, C, H, W] is left as it was (the partition's reason names Pow)."""
    model = _pow_model((1, 6, 10))
    graph = prepare(model, "rk3588", CompileOptions(precision="fp16")).graph
    assert [(n.op_type, n.target) for n in graph.nodes] == [("Pow", "CPU")]


def _hybrid_pow_build(shape, x_samples):
    """An int8 build of Pow(x, -0.5) (one Rsqrt layer, attributes cleared) whose layer a hybrid
    choice sets to float16 (as a quant config / auto-hybrid does): built at stage 5."""
    from npuemu.compiler.build import build_model
    from npuemu.compiler.ir import Graph, Node, Tensor
    from npuemu.compiler.passes import PassContext, optimize
    from npuemu.compiler.quant import calibrate, quantize_graph
    graph = Graph("g", inputs=["x"], outputs=["y"])
    graph.add_tensor(Tensor("x", shape, "float32"))
    graph.add_tensor(Tensor("y", shape, "float32"))
    graph.add_constant("half", np.array(-0.5, np.float32))
    graph.nodes.append(Node("p", "Pow", ["x", "half"], ["y"], {}))
    optimize(graph, PassContext.for_chip("rk3588", 3))
    assert [(n.op_type, n.attrs) for n in graph.nodes] == [("Rsqrt", {})]  # the int8 graph pass's one layer
    ranges = calibrate(graph, [{"x": s} for s in x_samples], "normal", progress=False).ranges
    quantize_graph(graph, ranges, layer_dtypes={graph.nodes[0].name: "float16"})
    return build_model(graph)


def test_float16_rsqrt_layer_in_a_hybrid_int8_build_runs_the_pieces_on_the_npu() -> None:
    """A float16 Rsqrt layer in an int8 build (default floor: the whole fp16 range) is expanded at
    build stage 5 (layer_records) into the float16 chain: no host step, bit-exact with the
    reference chain on every positive fp16 value, and within the fp16 accuracy of LOWERING.md 24
    of onnxruntime's Pow(x, -0.5)."""
    x = _positive_fp16()
    built = _hybrid_pow_build(x.shape, [x])
    assert [s.kind for s in built.schedule()] == ["npu"]  # no host step
    runtime = Runtime(built)
    assert runtime.dtype("x") == runtime.dtype("y") == "float16"
    runtime.set_input("x", x)
    runtime.run()
    got = np.asarray(runtime.output("y"), np.float32).astype(F16)
    np.testing.assert_array_equal(got.view(np.uint16), reference_rsqrt_fp16(x).view(np.uint16))
    model = _pow_model(x.shape)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    normal = x >= 2.0 ** -14  # below, onnxruntime's float32 result of a subnormal input is exact, ours rounded
    assert np.max(np.abs(got.astype(np.float64)[normal] / want[normal] - 1)) <= 4.91e-4
    assert cosine(got.astype(np.float64), want) >= 0.99999


def test_float16_rsqrt_layer_in_a_hybrid_layer_norm_runs_on_the_npu() -> None:
    """The int8 LayerNorm chain with its 1/sqrt set to float16 (before this the build refused it):
    DataConvert to float16, the pieces, DataConvert back, all on the NPU; the output against
    float64 LayerNorm within the int8 build's error."""
    from npuemu.compiler.build import build_model
    from npuemu.compiler.passes import PassContext, optimize
    from npuemu.compiler.quant import calibrate, quantize_graph
    from tests.compiler.test_layer_norm_npu import layer_norm_channels, ln_graph
    rng = np.random.default_rng(4)
    graph = ln_graph(16, 8, np.ones(16), None, 1e-5)
    optimize(graph, PassContext.for_chip("rk3588", 3))
    samples = [{"x": rng.normal(0, 1, (1, 16, 1, 8)).astype(np.float32)} for _ in range(4)]
    quantize_graph(graph, calibrate(graph, samples, "normal", progress=False).ranges,
                   layer_dtypes={"ln_rsqrt": "float16"})
    built = build_model(graph)
    assert [s.kind for s in built.schedule()] == ["npu"]
    runtime = Runtime(built)
    assert runtime.dtype("ln_rsqrt_piece9") == "float16"  # the stage-5 chain's last piece
    x = rng.normal(0, 1, (1, 16, 1, 8)).astype(np.float32)
    runtime.set_input("x", x)
    runtime.run()
    got = np.asarray(runtime.output("y"), np.float64)
    want = layer_norm_channels(x, np.ones(16), None, 1e-5)
    assert cosine(got, want) >= 0.995


def test_stage5_expansion_only_for_a_float16_layer_reading_float16() -> None:
    """expand_rsqrt: an int8 Rsqrt, or one a single table holds (floor from 2^12), is left to the
    layer as it is (None); a float16 one reading a map not stored in float16 becomes a host step."""
    from npuemu.compiler.ir import Graph, Node, QuantParams, Tensor
    from npuemu.compiler.passes.lower_rsqrt import expand_rsqrt
    int8, half = QuantParams("int8", 0.02, -128), QuantParams("float16", 1.0, 0)

    def case(source_quant, output_quant, attrs):
        graph = Graph("g", inputs=["x"], outputs=["y"])
        graph.add_tensor(Tensor("x", (1, 4, 2, 2), "float32", quant=source_quant))
        graph.add_tensor(Tensor("y", (1, 4, 2, 2), "float32", quant=output_quant))
        return expand_rsqrt(graph, Node("r", "Rsqrt", ["x"], ["y"], attrs, [], "NPU"))

    assert case(int8, int8, {}) is None
    assert case(half, half, {"alpha": TOP}) is None
    tensors, nodes = case(int8, half, {})
    assert tensors == [] and [(n.op_type, n.target) for n in nodes] == [("Rsqrt", "CPU")]
    tensors, nodes = case(half, half, {"alpha": 1e-5})  # LayerNorm's eps: 8 pieces, 1 scaling conv
    assert [n.op_type for n in nodes].count("Rsqrt") == 9 and [n.op_type for n in nodes].count("Conv") == 1
    assert all(n.target == "NPU" for n in nodes) and nodes[-1].outputs == ["y"]
    assert all(t.quant is not None and t.quant.dtype == "float16" for t in tensors if t.data is None)
