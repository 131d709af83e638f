"""MatMul of two activations on the NPU (LOWERING.md 37): ``passes/matmul_act_npu.py`` makes an
``ActMatMul`` (``passes/lower_matmul_act.py``) of a MatMul whose operands both come from earlier
layers or graph inputs; at build stage 5 it becomes per head and 8-channel surface a 1x1 conv
whose weights are the second operand's bytes (LOWERING.md 22.3's run-time weights), chained by
residual adds; with the heads on the rows each head's last conv writes its row of the output
itself (a plain DPU write at a row offset with the whole map's surface stride, LOWERING.md 41).

Checked here, with references written in this file:

- the float semantics against einsum;
- the built layer list: no placement convs, each head's last product conv writing the output's
  row h (LOWERING.md 41), and the task count that replaced them;
- float16 builds bit for bit against a numpy float16 chain (one product per surface conv, so the
  MAC order does not matter and a wrong layout shows), for shapes off the 8-channel atom, 2-D,
  3-D and 4-D operands, heads 1..8;
- int8 builds (a float16 island between DataConverts) bit for bit against the DataConverts'
  register arithmetic (test_data_convert_npu.reference_convert) around the same chain, and the
  product's int8 rounding: round half to even of y / s + zp, saturated (within one LSB of the
  exact product of the int8 operands);
- hypothesis over (H, T, K, N): the emulated build against float, no host step;
- the vendor fixtures' own models (matmul_act_fp16 / _int8) against onnxruntime, their partition
  and the cycles `perf` reports (with the vendor's table beside them);
- the MatMuls that stay host steps, each with the limit the partition report names.
"""

from __future__ import annotations

import lzma
from io import BytesIO

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.emulator.runtime import Runtime
from tests.shared_data import RKNN_FIXTURES_OPS

C2 = 8  # float16 channels per NC1HWC2 surface on rk3588 [V] hardware.md 3


def reference_act_matmul(x: np.ndarray, w: np.ndarray, heads: int) -> np.ndarray:
    """ActMatMul written from its definition: x [1, H K, 1, T], w [1, H K, 1, N] ->
    out[0, n, h, t] = sum_k x[0, h K + k, 0, t] w[0, h K + k, 0, n]."""
    _, channels, _, tokens = x.shape
    depth, columns = channels // heads, w.shape[3]
    out = np.zeros((1, columns, heads, tokens))
    for h in range(heads):
        for k in range(depth):
            out[0, :, h, :] += np.outer(w[0, h * depth + k, 0, :], x[0, h * depth + k, 0, :])
    return out


def test_float_semantics_is_the_reference():
    from npuemu.compiler.passes.lower_matmul_act import act_matmul
    rng = np.random.default_rng(0)
    x, w = rng.normal(0, 1, (1, 3 * 5, 1, 7)), rng.normal(0, 1, (1, 3 * 5, 1, 4))
    np.testing.assert_allclose(act_matmul({"heads": 3}, [x, w]), reference_act_matmul(x, w, 3), rtol=1e-12)


# ---- models and builds ------------------------------------------------------------------------

def matmul_model(a_shape, b_shape, *, second_transposed: bool = False, before: str | None = None):
    """y = MatMul(a, b) on two graph inputs; ``second_transposed``: b given as [.., N, K] and
    transposed in the graph; ``before``: a unary op applied to a first."""
    nodes, first, second = [], "a", "b"
    y_shape = [*a_shape[:-1], b_shape[-1]]
    b_input = list(b_shape)
    if second_transposed:
        b_input = [*b_shape[:-2], b_shape[-1], b_shape[-2]]
        perm = [*range(len(b_shape) - 2), len(b_shape) - 1, len(b_shape) - 2]
        nodes.append(helper.make_node("Transpose", ["b"], ["bt"], perm=perm))
        second = "bt"
    if before:
        nodes.append(helper.make_node(before, ["a"], ["a1"]))
        first = "a1"
    nodes.append(helper.make_node("MatMul", [first, second], ["y"]))
    graph = helper.make_graph(nodes, "matmul", [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape)),
                                                helper.make_tensor_value_info("b", TensorProto.FLOAT, b_input)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _front(model, precision: str, samples=None):
    return prepare(model, "rk3588", CompileOptions(precision=precision, dataset=samples))


def _host(front) -> dict[str, str]:
    return {d.node: d.reason for d in front.partition.decisions if d.target != "NPU"}


def _emulate(model_file, feeds: dict) -> np.ndarray:
    runtime = Runtime(model_file)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return np.asarray(runtime.output("y"), np.float64)


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def ort_run(model, feeds: dict) -> np.ndarray:
    import onnxruntime as ort
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _as_heads(a: np.ndarray, b: np.ndarray):
    """[.., T, K], [.., K, N] -> [H, T, K], [H, K, N]."""
    return a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])


# ---- float16: bit for bit ---------------------------------------------------------------------

def chain_reference_fp16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The build's float16 arithmetic per head: one conv per 8-channel surface s of K, its float32
    sum rounded with the running float16 result added (EW stage: fp32 add, one fp16 rounding);
    the selection and placement convs copy exactly. Valid for b where each surface has at most
    one non-zero product per output (the test's masks), so each conv's sum is exact."""
    a, b = _as_heads(np.asarray(a, np.float16), np.asarray(b, np.float16))
    heads, tokens, depth = a.shape
    out = np.zeros((heads, tokens, b.shape[2]), np.float16)
    for h in range(heads):
        running = None
        for start in range(0, depth, C2):
            part = (a[h, :, start:start + C2].astype(np.float64) @ b[h, start:start + C2].astype(np.float64))
            part = part.astype(np.float32)
            running = part if running is None else (part + running.astype(np.float32))
            running = running.astype(np.float16)
        out[h] = running
    return out


def _one_product_per_surface(rng, b_shape) -> np.ndarray:
    """b on float16 values with, per output column n and 8-channel surface, one non-zero row k
    (k = n mod 8 + the surface's start, where the surface has it)."""
    b = rng.normal(0, 1, b_shape).astype(np.float16)
    k = np.arange(b_shape[-2])[:, None]
    n = np.arange(b_shape[-1])[None, :]
    return np.where(k % C2 == (n + k // C2) % C2, b, 0).astype(np.float32)


SHAPES = [((1, 8, 40, 15), (1, 8, 15, 40)),  # the vendor fixture's: K off the atom, 8 heads
          ((1, 40, 15), (1, 15, 40)), ((7, 12), (12, 10)), ((1, 3, 9, 20), (1, 3, 20, 6)),
          ((1, 2, 5, 16), (1, 2, 16, 14)), ((1, 1, 33, 3), (1, 1, 3, 2)), ((3, 6, 10), (3, 10, 4)),
          ((1, 8, 13, 53), (1, 8, 53, 18)),  # 8 x 56 x 8 x 53 selection weights: one selection conv per head
          ((1, 4, 6, 8), (1, 4, 8, 10)), ((2, 7, 5), (2, 5, 12)),  # one surface per head: no residual at the row write
          ((1, 20, 5, 15), (1, 20, 15, 6))]  # more than 16 heads (the old placement's limit)


@pytest.mark.parametrize("a_shape, b_shape", SHAPES)
def test_float16_bit_exact(a_shape, b_shape):
    rng = np.random.default_rng(sum(a_shape) + sum(b_shape))
    model = matmul_model(a_shape, b_shape)
    front = _front(model, "fp16")
    assert _host(front) == {}
    assert [n.op_type for n in front.graph.nodes].count("ActMatMul") == 1
    a = rng.normal(0, 2, a_shape).astype(np.float16).astype(np.float32)
    b = _one_product_per_surface(rng, b_shape)
    got = _emulate(build(front), {"a": a, "b": b}).astype(np.float16)
    want = chain_reference_fp16(a, b).reshape(got.shape)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    size = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))  # fp16 steps of the partial sums
    assert np.all(np.abs(got - exact) <= 2e-3 * size + 1e-6)


def test_rounding_differs_from_a_single_rounding():
    """The chain rounds after every surface: on values where that matters the emulated result
    follows the chain, not fp16(exact) (a control that the reference above is not trivial)."""
    rng = np.random.default_rng(5)
    a_shape, b_shape = (1, 16, 24), (1, 24, 8)
    a = rng.normal(0, 2, a_shape).astype(np.float16).astype(np.float32)
    b = _one_product_per_surface(rng, b_shape)
    got = _emulate(build(_front(matmul_model(a_shape, b_shape), "fp16")), {"a": a, "b": b}).astype(np.float16)
    single = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float16)
    assert not np.array_equal(got, single)
    assert np.array_equal(got.view(np.uint16), chain_reference_fp16(a, b).reshape(got.shape).view(np.uint16))


# ---- the heads' rows: written by the product convs themselves (LOWERING.md 41) -----------------

@pytest.mark.parametrize("a_shape, b_shape", [s for s in SHAPES if len(s[0]) > 2 and np.prod(s[0][:-2]) > 1])
def test_heads_write_their_rows_without_placement_convs(a_shape, b_shape):
    """Heads on the rows: no placement conv is built; the output is written by exactly H convs, the
    last product conv of each head (one task each), and the layer has 2 selection convs (K off the
    surface) + H ceil(K / 8) product convs - H fewer layers and tasks than with placement convs."""
    heads, depth = int(np.prod(a_shape[:-2])), a_shape[-1]
    front = _front(matmul_model(a_shape, b_shape), "fp16")
    (act,) = [node for node in front.graph.nodes if node.op_type == "ActMatMul"]
    assert act.attrs["layout"] == "rows"
    layers = build(front).layers()
    assert not [layer.name for layer in layers if "_row" in layer.name]
    surfaces = -(-depth // C2)
    written = "y"  # the readout's graph output: the build stores the ActMatMul's result under it
    assert [node.outputs for node in front.graph.nodes if act.outputs[0] in node.inputs] in ([], [[written]])
    writers = [layer for layer in layers if written in layer.outputs or act.outputs[0] in layer.outputs]
    assert [layer.name for layer in writers] == \
        [f"{act.name}_h{h}_{surfaces - 1}" + ("_fuse_add" if surfaces > 1 else "") for h in range(heads)]
    assert all(sum(r.count for r in layer.tasks) == 1 for layer in writers)
    selections = 0 if depth % C2 == 0 else (2 if heads * surfaces * C2 * heads * depth <= 65536 else 2 * heads)
    convs = [layer for layer in layers if layer.op_type.startswith("Conv")]  # not a graph input's surface copies
    assert sum(r.count for layer in convs for r in layer.tasks) == selections + heads * surfaces


def test_a_row_window_of_another_width_is_refused():
    """The plain write has no output line stride (REGISTER_SEMANTICS 3.3): a stride-1 window must
    be as wide as its output and inside it; otherwise a clear error, not a misplaced write."""
    from npuemu.compiler.lower import ConvLayer
    from npuemu.compiler.lower.lower_conv import _row_window
    from npuemu.compiler.lower.placement import feature_placement
    from npuemu.isa.errors import CompileError
    from npuemu.platforms import load_platform
    spec = load_platform("rk3588")
    layer = ConvLayer("c", "x", "y", (8, 1, 10), np.zeros((16, 8, 1, 1)), dtype="float16", interleave=(1, 2, 0, 3, 10))
    assert _row_window(layer, feature_placement("y", 0, (16, 3, 10), "float16", spec)) == 2
    for shape in ((16, 3, 12), (16, 2, 10)):  # wider than the conv; row 2 past the output
        with pytest.raises(CompileError, match="stride-1 write window"):
            _row_window(layer, feature_placement("y", 0, shape, "float16", spec))


@settings(max_examples=12, deadline=None)
@given(heads=st.integers(1, 4), tokens=st.integers(1, 24), depth=st.integers(1, 24), half_n=st.integers(1, 12),
       seed=st.integers(0, 999))
def test_float16_against_float(heads, tokens, depth, half_n, seed):
    a_shape, b_shape = (1, heads, tokens, depth), (1, heads, depth, 2 * half_n)
    rng = np.random.default_rng(seed)
    front = _front(matmul_model(a_shape, b_shape), "fp16")
    assert _host(front) == {}
    a, b = rng.normal(0, 1, a_shape).astype(np.float32), rng.normal(0, 1, b_shape).astype(np.float32)
    got = _emulate(build(front), {"a": a, "b": b})
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.shape == want.shape
    # float16 operands (2^-11 relative each) and one fp16 rounding per 8-channel surface
    assert np.abs(got - want).max() <= 4e-3 * (1 + np.abs(want).max()) * np.sqrt(-(-depth // C2))
    assert cosine(got, want) >= 0.99999


# ---- int8: a float16 island, and the product's int8 rounding ----------------------------------

def _island(front):
    """(the input DataConverts by graph input, the output DataConvert) of an int8 build."""
    graph = front.graph
    converts = [node for node in graph.nodes if node.op_type == "DataConvert"]
    to_fp16 = [node for node in converts if graph.tensors[node.outputs[0]].quant.dtype == "float16"]
    (to_int8,) = [node for node in converts if graph.tensors[node.outputs[0]].quant.dtype == "int8"]
    return to_fp16, to_int8


def _convert_layer(graph, node, to: str):
    from npuemu.compiler.lower import Quant
    from npuemu.compiler.lower.lower_convert import ConvertLayer
    side = node.inputs[0] if to == "float16" else node.outputs[0]
    quant = graph.tensors[side].quant
    return ConvertLayer("c", "x", "y", (1, 1, 1), Quant(float(quant.scale), int(quant.zero_point)), to)


def test_int8_bit_exact_and_its_rounding():
    """int8 operands -> DataConvert to fp16 (exact integer stage, one fp16 rounding) -> the fp16
    chain -> DataConvert to int8: round half to even of fp32(fp32(y a) b) + zp, saturated
    (LOWERING.md 26, 37). Bit for bit with the registers' arithmetic, and within one LSB of
    the exact product of the int8 operands' values rounded to the output grid."""
    from tests.compiler.test_data_convert_npu import reference_convert
    a_shape, b_shape = (1, 4, 12, 15), (1, 4, 15, 10)
    rng = np.random.default_rng(11)
    samples = [{"a": rng.normal(0, 1, a_shape).astype(np.float32), "b": rng.normal(0, 1, b_shape).astype(np.float32)}
               for _ in range(4)]
    front = _front(matmul_model(a_shape, b_shape), "int8", samples)
    assert _host(front) == {}
    act = next(node for node in front.graph.nodes if node.op_type == "ActMatMul")
    assert front.graph.tensors[act.outputs[0]].quant.dtype == "float16"
    to_fp16, to_int8 = _island(front)
    assert len(to_fp16) == 2
    graph = front.graph
    quant = {name: graph.tensors[name].quant for name in ("a", "b", "y")}
    # operands on the inputs' int8 grids, b with one product per surface and output
    q = {name: rng.integers(-100, 100, shape).astype(np.int8) for name, shape in (("a", a_shape), ("b", b_shape))}
    mask = _one_product_per_surface(rng, b_shape) != 0
    q["b"] = np.where(mask, q["b"], np.int8(quant["b"].zero_point)).astype(np.int8)
    feeds = {name: ((q[name].astype(np.float64) - quant[name].zero_point) * quant[name].scale).astype(np.float32)
             for name in q}
    got = _emulate(build(front), feeds)
    got_q = np.rint(got / quant["y"].scale + quant["y"].zero_point)
    assert np.allclose(got / quant["y"].scale + quant["y"].zero_point, got_q, atol=1e-3)  # on the output grid
    layers = {node.inputs[0]: node for node in to_fp16}
    halves = {}
    for name in q:
        (node,) = [n for key, n in layers.items() if key.startswith(name)]
        halves[name] = reference_convert(q[name], _convert_layer(graph, node, "float16"))
    y16 = chain_reference_fp16(halves["a"].astype(np.float32), halves["b"].astype(np.float32))
    want_q = reference_convert(y16.astype(np.float16), _convert_layer(graph, to_int8, "int8")).astype(np.float64)
    assert np.array_equal(got_q, want_q.reshape(got_q.shape))
    exact = np.matmul(feeds["a"].astype(np.float64), feeds["b"].astype(np.float64))
    ideal = np.clip(np.rint(exact / quant["y"].scale + quant["y"].zero_point), -128, 127)
    assert np.abs(got_q - ideal).max() <= 1


# ---- the vendor's fixtures: its own models, against onnxruntime --------------------------------

def _fixture(name: str, item: str) -> np.ndarray:
    return np.load(BytesIO(lzma.open(RKNN_FIXTURES_OPS / name / f"{item}.npy.xz").read()))


def _calibration() -> list[dict[str, np.ndarray]]:
    """The fixture's own calibration samples (meta.json data.calibration: RandomState per sample)."""
    samples = []
    for seed in (20272226, 20272227, 20272228, 20272229):
        rng = np.random.RandomState(seed)
        samples.append({"q": rng.randn(1, 8, 40, 15).astype(np.float32),
                        "kt": rng.randn(1, 8, 15, 40).astype(np.float32)})
    return samples


@pytest.mark.parametrize("name, precision, cos_min, max_error",
                         [("matmul_act_fp16", "fp16", 0.999999, 0.02), ("matmul_act_int8", "int8", 0.9999, 0.7)])
def test_vendor_fixture_models_against_onnxruntime(name, precision, cos_min, max_error):
    """The fixture's model.onnx ([1,8,40,15] x [1,8,15,40]): both inputs the runtime's readin, the
    output its readout, the MatMul one NPU ActMatMul; the fixture's inputs against its onnxruntime
    outputs (int8 max error: the vendor simulator's own is 0.63 on input 0, a saturated element)."""
    model = onnx.load(RKNN_FIXTURES_OPS / name / "model.onnx")
    front = _front(model, precision, _calibration() if precision == "int8" else None)
    assert _host(front) == {}
    assert sorted(d.op for d in front.partition.decisions) == ["ActMatMul", "Readin", "Readin", "Readout"]
    model_file = build(front)
    for index in range(3):
        feeds = {"q": _fixture(name, f"input_{index}_q"), "kt": _fixture(name, f"input_{index}_kt")}
        got, want = _emulate(model_file, feeds), _fixture(name, f"ort_output_{index}").astype(np.float64)
        assert cosine(got, want) >= cos_min and np.abs(got - want).max() <= max_error, (cosine(got, want), index)


def test_perf_reports_the_product_cycles():
    """`npuemu perf --ddr-model vendor` of the fp16 fixture build: every conv of the ActMatMul has
    cycles; the vendor's table for its exMatMul is beside it (LOWERING.md 37 compares them)."""
    import json

    from npuemu.emulator.timing.report import report_npu
    from npuemu.platforms import load_platform
    model_file = build(_front(onnx.load(RKNN_FIXTURES_OPS / "matmul_act_fp16" / "model.onnx"), "fp16"))
    runtime = Runtime(model_file)
    runtime.set_input("q", np.zeros((1, 8, 40, 15), np.float32))
    runtime.set_input("kt", np.zeros((1, 8, 15, 40), np.float32))
    runtime.run()
    report = report_npu(model_file, runtime.runs, load_platform("rk3588"), ddr_model="vendor")
    convs = [layer for layer in report.layers if layer.op_type.startswith("Conv")]
    assert len(convs) == 8 * 2 + 2  # products (2 surfaces of K = 15 per head), selections; no placements
    assert sum(len(layer.tasks) for layer in report.layers) == 18  # 26 with the 8 placement convs (LOWERING.md 41)
    assert all(layer.npu_cycles > 0 and layer.ddr_cycles > 0 for layer in convs)
    vendor = json.loads((RKNN_FIXTURES_OPS / "matmul_act_fp16" / "meta.json").read_text())["librknnc"]["layers"]
    (ex_matmul,) = [layer for layer in vendor if layer["op_type"] == "exMatMul"]
    assert (ex_matmul["ddr_cycles"], ex_matmul["npu_cycles"]) == (1949, 2304)  # the figures LOWERING.md 37 uses


# ---- what stays a host step, and why ----------------------------------------------------------

@pytest.mark.parametrize("a_shape, b_shape, kwargs, reason", [
    ((1, 2, 8, 16), (1, 2, 16, 7), {}, "N = 7 columns (odd)"),
    ((1, 8193, 1, 2), (1, 8193, 2, 2), {}, "8193 heads"),
    ((1, 2, 4, 250), (1, 2, 250, 4), {}, "heads of K = 250: 256 x 264 selection weights per head"),
    ((1, 2, 6, 8), (1, 1, 8, 4), {}, "is not [.., T, K] x [.., K, N] over the same single batch axis"),
    ((1, 12, 16), (1, 16, 8), {"before": "Relu"}, "layout changes would be host steps"),
])
def test_what_stays_a_host_step_names_its_limit(a_shape, b_shape, kwargs, reason):
    model = matmul_model(a_shape, b_shape, **kwargs)
    front = _front(model, "fp16")
    host = _host(front)
    (matmul,) = [node.name for node in front.graph.nodes if node.op_type == "MatMul"]
    assert reason in host[matmul], host
    assert "ActMatMul" not in [node.op_type for node in front.graph.nodes]
    rng = np.random.default_rng(1)
    feeds = {"a": rng.normal(0, 1, a_shape).astype(np.float32),
             "b": rng.normal(0, 1, b_shape).astype(np.float32)}
    got, want = _emulate(build(front), feeds), ort_run(model, feeds)
    assert cosine(got, want) >= 0.9999


def test_second_operand_transposed_in_the_graph():
    """b given as [1, N, K] and transposed by the model (q k^T): the readin takes the transpose
    too, so the product still runs with no host step."""
    model = matmul_model((1, 10, 16), (1, 16, 12), second_transposed=True)
    front = _front(model, "fp16")
    assert _host(front) == {}
    rng = np.random.default_rng(2)
    feeds = {"a": rng.normal(0, 1, (1, 10, 16)).astype(np.float32),
             "b": rng.normal(0, 1, (1, 12, 16)).astype(np.float32)}
    got, want = _emulate(build(front), feeds), ort_run(model, feeds)
    assert cosine(got, want) >= 0.99999


# ---- inside transformer graphs: operands and result in token regions' maps ---------------------

def _onnx(nodes, inputs: dict, output_shape, inits: dict):
    from onnx import numpy_helper
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def scores_between_projections(tokens=12, features=32, depth=16, out=24):
    """x [1, T, C] -> q = x Wq, k = x Wk -> s = q k^T -> Relu -> s Wo: a lone q k^T (no softmax, so
    not the attention pass's) whose operands are FC outputs and whose result an FC reads."""
    rng = np.random.default_rng(0)
    inits = {"wq": rng.normal(0, .2, (features, depth)), "wk": rng.normal(0, .2, (features, depth)),
             "wo": rng.normal(0, .2, (tokens, out))}
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]), helper.make_node("MatMul", ["r", "wo"], ["y"])]
    return _onnx(nodes, {"x": [1, tokens, features]}, [1, tokens, out],
                 {k: v.astype(np.float32) for k, v in inits.items()})


def heads_merged_into_an_fc(heads=4, tokens=10, depth=12, columns=16, out=24):
    """p = a b per head, merged (Transpose [0, 2, 1, 3] + Reshape [1, T, H N]) into an FC: the
    product writes the heads on the channels, where the FC's token region reads them."""
    rng = np.random.default_rng(1)
    inits = {"wo": rng.normal(0, .2, (heads * columns, out)).astype(np.float32),
             "shape": np.array([1, tokens, heads * columns], np.int64)}
    nodes = [helper.make_node("MatMul", ["a", "b"], ["p"]),
             helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["pt", "shape"], ["m"]), helper.make_node("MatMul", ["m", "wo"], ["y"])]
    return _onnx(nodes, {"a": [1, heads, tokens, depth], "b": [1, heads, depth, columns]}, [1, tokens, out], inits)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("builder, layout",
                         [(scores_between_projections, "rows"), (heads_merged_into_an_fc, "channels")])
def test_in_transformer_graphs(builder, layout, precision, monkeypatch):
    """No host step: the second operand is read as weights where the k projection's conv wrote it
    (k^T's native layout is k's channel-major map), the result lands in the next FC's map; int8:
    the ActMatMul a float16 island between the int8 convs, as accurate as the build that keeps
    the MatMul on the host (4 calibration samples: the int8 convs' quantization dominates)."""
    model = builder()
    rng = np.random.default_rng(3)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    draw = lambda: {name: rng.normal(0, 1, shape).astype(np.float32) for name, shape in shapes.items()}  # noqa: E731
    front = _front(model, precision, [draw() for _ in range(4)] if precision == "int8" else None)
    assert _host(front) == {}
    (act,) = [node for node in front.graph.nodes if node.op_type == "ActMatMul"]
    assert act.attrs["layout"] == layout
    feeds = draw()
    got, want = _emulate(build(front), feeds), ort_run(model, feeds)
    if precision == "fp16":
        assert cosine(got, want) >= 0.99999, cosine(got, want)
        return
    from npuemu.compiler.passes import matmul_act_npu
    rng = np.random.default_rng(3)
    monkeypatch.setattr(matmul_act_npu, "matmul_form", lambda graph, node: "off")  # the MatMul stays a host step
    host_front = _front(model, precision, [draw() for _ in range(4)])
    assert "ActMatMul" not in [node.op_type for node in host_front.graph.nodes]
    host = _emulate(build(host_front), feeds)
    assert cosine(got, want) >= min(0.99, cosine(host, want) - 0.003), (cosine(got, want), cosine(host, want))
