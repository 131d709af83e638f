"""LSTM, GRU and RNN host steps (emulator/cpu_ops_recurrent.py) and the compiler's float
semantics of the same ops (compiler/ops/recurrent.py), both against onnxruntime on generated
one-node models: every direction, both layouts (layout 1 against onnxruntime's layout 0 result
transposed, as the ONNX definition states it), optional inputs present or absent, sequence_lens,
the alternate activations with their alpha/beta, clip, GRU's linear_before_reset. Then an LSTM
model compiled in float16 and int8 and run on the emulator, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.onnx_import import import_onnx
from npuemu.emulator.cpu_ops import OPS
from npuemu.emulator.runtime import Runtime
from npuemu.isa.errors import UnsupportedOpError

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": 3, "GRU": 2, "RNN": 2}
SLOTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def _case(op, direction="forward", layout=0, seq=3, batch=2, size=4, hidden=5, seed=0, bias=True, initial=True,
          lengths=False, peephole=False):
    """(inputs by slot name, attributes) of one node; states in ``layout``'s order."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    x_shape = (batch, seq, size) if layout else (seq, batch, size)
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    given_ = {"X": rng.normal(size=x_shape), "W": rng.normal(0, 0.5, (dirs, g * hidden, size)),
              "R": rng.normal(0, 0.5, (dirs, g * hidden, hidden))}
    if bias:
        given_["B"] = rng.normal(0, 0.5, (dirs, 2 * g * hidden))
    if lengths:
        given_["sequence_lens"] = rng.integers(1, seq + 1, batch).astype(np.int32)
    if initial:
        given_["initial_h"] = rng.normal(size=state)
        if op == "LSTM":
            given_["initial_c"] = rng.normal(size=state)
    if peephole and op == "LSTM":
        given_["P"] = rng.normal(0, 0.5, (dirs, 3 * hidden))
    given_ = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in given_.items()}
    return given_, {"hidden_size": hidden, "direction": direction, "layout": layout}


def _model(op, given_, attrs, constant_weights=True):
    """One-node model: X (and, unless constant, everything) a graph input; names = slot names."""
    names = [slot if slot in given_ else "" for slot in SLOTS[:len(SLOTS) if op == "LSTM" else 6]]
    while names and not names[-1]:
        names.pop()
    outputs = ["Y", "Y_h", "Y_c"][:OUTPUTS[op]]
    node = helper.make_node(op, names, outputs, **attrs)
    weights = {"W", "R", "B", "P"} if constant_weights else set()
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for k, v in given_.items() if k not in weights]
    inits = [numpy_helper.from_array(v, k) for k, v in given_.items() if k in weights]
    out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    model = helper.make_model(helper.make_graph([node], "rnn", inputs, out, inits),
                              opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    inferred = {v.name: v.type for v in onnx.shape_inference.infer_shapes(model).graph.output}
    for value in model.graph.output:
        value.type.CopyFrom(inferred[value.name])
    return model


def _ort(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _reference(op, given_, attrs):
    """onnxruntime's outputs; layout 1 computed in layout 0 and transposed back (ONNX's definition)."""
    if not attrs.get("layout"):
        return _ort(_model(op, given_, attrs, False), given_)
    flipped = {k: np.swapaxes(v, 0, 1) if k in ("X", "initial_h", "initial_c") else v for k, v in given_.items()}
    result = _ort(_model(op, flipped, attrs | {"layout": 0}, False), flipped)
    return [result[0].transpose(2, 0, 1, 3)] + [np.swapaxes(v, 0, 1) for v in result[1:]]


def _ours(op, given_, attrs):
    """(the compiler's float semantics, the runtime's host step) through the imported node."""
    model = _model(op, given_, attrs)
    feeds = {k: v for k, v in given_.items() if k not in ("W", "R", "B", "P")}
    graph = import_onnx(model)
    node = next(n for n in graph.nodes if n.op_type == op)
    compiler = evaluate(graph, feeds)
    values = [graph.tensor(name).data if graph.tensor(name).is_const else feeds[name] for name in node.inputs]
    host = OPS[op]([np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v) for v in values],
                   dict(node.attrs))
    return [compiler[name] for name in node.outputs], host


def _check(op, given_, attrs, tol=2e-5):
    want = _reference(op, given_, attrs)
    compiler, host = _ours(op, given_, attrs)
    assert len(compiler) == len(host) == len(want) == OUTPUTS[op]
    for a, b, w in zip(compiler, host, want):
        assert a.shape == b.shape == w.shape
        np.testing.assert_allclose(a, w, rtol=tol, atol=tol)
        np.testing.assert_allclose(b, w, rtol=tol, atol=tol)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(GATES)), st.sampled_from(["forward", "reverse", "bidirectional"]), st.integers(0, 1),
       st.integers(1, 5), st.integers(1, 3), st.integers(1, 6), st.integers(1, 6), st.integers(0, 9999),
       st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_recurrent_matches_onnxruntime(op, direction, layout, seq, batch, size, hidden, seed, bias, initial, lengths,
                                       peephole):
    given_, attrs = _case(op, direction, layout, seq, batch, size, hidden, seed, bias, initial, lengths, peephole)
    _check(op, given_, attrs)


@pytest.mark.parametrize("op, activations, alpha, beta", [
    ("LSTM", ["HardSigmoid", "Tanh", "Relu"], [0.3], [0.4]),
    ("LSTM", ["Sigmoid", "ScaledTanh", "Affine"], [0.9, 1.5], [1.1, 0.2]),
    ("GRU", ["Sigmoid", "LeakyRelu"], [0.05], []),
    ("GRU", ["HardSigmoid", "Softsign"], [], []),
    ("RNN", ["Relu"], [], []),
    ("RNN", ["Elu"], [0.7], []),
    ("RNN", ["Softplus"], [], []),
    ("RNN", ["ThresholdedRelu"], [0.3], []),
])
def test_alternate_activations(op, activations, alpha, beta):
    given_, attrs = _case(op, "bidirectional", seed=3)
    attrs |= {"activations": activations * 2}
    if alpha:
        attrs["activation_alpha"] = alpha * 2
    if beta:
        attrs["activation_beta"] = beta * 2
    _check(op, given_, attrs)


@pytest.mark.parametrize("op", sorted(GATES))
def test_clip(op):
    given_, attrs = _case(op, "forward", seed=5)
    given_["X"] *= 4.0
    _check(op, given_, attrs | {"clip": 0.5})


@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_gru_linear_before_reset(linear_before_reset, direction):
    given_, attrs = _case("GRU", direction, seed=11, lengths=True)
    _check("GRU", given_, attrs | {"linear_before_reset": linear_before_reset})


def test_lstm_input_forget():
    given_, attrs = _case("LSTM", "forward", seed=13)
    _check("LSTM", given_, attrs | {"input_forget": 1})


def test_unknown_activation_is_refused_naming_the_node():
    given_, attrs = _case("RNN", seed=1)
    with pytest.raises(UnsupportedOpError, match=r"node 'RNN_0': RNN .*activation GELU"):
        import_onnx(_model("RNN", given_, attrs | {"activations": ["Gelu"]}))


def _cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("precision, floor", [("fp16", 0.9999), ("int8", 0.99)])
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_compiled_recurrent_runs_on_the_emulator(op, precision, floor):
    """Conv -> Reshape -> recurrent node (bidirectional, all three outputs used): the host step
    in a built model (-O0; from -O1 it is unrolled onto the NPU, tests/compiler/test_gru_npu.py),
    int8 inputs dequantized and outputs requantized by the runtime."""
    rng = np.random.default_rng(2)
    seq, channels, hidden = 6, 8, 5
    given_, attrs = _case(op, "bidirectional", seq=seq, batch=1, size=channels, hidden=hidden, seed=4, initial=False)
    conv = numpy_helper.from_array(rng.normal(0, 0.3, (channels, 1, 1, 1)).astype(np.float32), "cw")
    shape = numpy_helper.from_array(np.array([seq, 1, channels], np.int64), "shape")
    perm_nodes = [helper.make_node("Conv", ["img", "cw"], ["feat"], group=1),
                  helper.make_node("Transpose", ["feat"], ["featT"], perm=[3, 0, 1, 2]),  # [W, 1, C, 1]
                  helper.make_node("Reshape", ["featT", "shape"], ["X"])]
    model = _model(op, given_, attrs)
    graph = model.graph
    conv_in = helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 1, 1, seq])
    nodes = [*perm_nodes, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend([conv, shape])
    del graph.input[:]
    graph.input.append(conv_in)
    onnx.checker.check_model(model)
    samples = [{"img": rng.normal(size=(1, 1, 1, seq)).astype(np.float32)} for _ in range(4)]
    options = CompileOptions(precision=precision, dataset=samples if precision == "int8" else None,
                             optimization_level=0)
    runtime = Runtime(compile_model(model, "rk3588", options))
    runtime.set_input("img", samples[0]["img"])
    runtime.run()
    want = _ort(model, samples[0])
    for name, expected in zip([o.name for o in graph.output], want):
        got = runtime.output(name)
        assert got.shape == expected.shape
        assert _cosine(got, expected) >= floor, (name, _cosine(got, expected))


def _fixture_array(folder, name):
    import io
    import lzma

    return np.load(io.BytesIO(lzma.open(folder / f"{name}.npy.xz").read()))


@pytest.mark.parametrize("case", ["lstm_int8", "lstm_fp16", "gru_int8", "gru_fp16"])
def test_vendor_fixture_models_run_as_host_steps(case):
    """The vendor's single-op LSTM / GRU (linear_before_reset) fixtures built by npuemu in the
    fixture's precision (int8 calibrated on inputs 0 and 1), run on input 2 against the
    fixture's onnxruntime output; int8 as close as the vendor's own int8 simulator output.
    (-O0 keeps the host step; from -O1 they are unrolled onto the NPU, tests/compiler/test_gru_npu.py.)"""
    from tests.shared_data import MISSING_REASON, RKNN_FIXTURES_OPS

    folder = RKNN_FIXTURES_OPS / case
    if not folder.is_dir():
        pytest.skip(MISSING_REASON)
    model = onnx.load(str(folder / "model.onnx"))
    inputs = [_fixture_array(folder, f"input_{k}") for k in range(3)]
    precision = "int8" if case.endswith("int8") else "fp16"
    dataset = [{"x": value} for value in inputs[:2]] if precision == "int8" else None
    options = CompileOptions(precision=precision, dataset=dataset, optimization_level=0)
    runtime = Runtime(compile_model(model, "rk3588", options))
    runtime.set_input("x", inputs[2])
    runtime.run()
    got, want = runtime.output("y"), _fixture_array(folder, "ort_output_2")
    vendor = _cosine(_fixture_array(folder, "sim_output_2"), want)
    assert got.shape == want.shape
    ours = _cosine(got, want)
    assert ours >= (0.9999 if precision == "fp16" else min(0.999, vendor - 0.001)), (ours, vendor)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_an_output_left_out_in_the_middle_costs_no_step(precision):
    """LSTM outputs ["", "Y_h"] (as the ONNX node tests write them): the importer names the
    stand-in Y (compiler/ir.py UNUSED_OUTPUT), the build makes no host step for it."""
    from onnx import TensorProto, helper, numpy_helper

    from npuemu.compiler.driver import CompileOptions, compile_model
    from npuemu.emulator.runtime import Runtime

    rng = np.random.RandomState(0)
    weights = {"W": rng.randn(1, 32, 5).astype(np.float32) * 0.3, "R": rng.randn(1, 32, 8).astype(np.float32) * 0.3}
    node = helper.make_node("LSTM", ["x", "W", "R"], ["", "yh"], hidden_size=8)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 1, 5])],
                              [helper.make_tensor_value_info("yh", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(value, name) for name, value in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    x = rng.randn(6, 1, 5).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # -O0 keeps the LSTM itself (from -O1 it is unrolled into NPU layers, LOWERING.md 30, 31)
    options = CompileOptions(precision="fp16", optimization_level=0) if precision == "fp16" else \
        CompileOptions(dataset=[{"x": x}], optimization_level=0)
    built = compile_model(model, "rk3588", options)
    assert len(built.schedule()) == 1
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    np.testing.assert_allclose(runtime.output("yh"), want, atol=0.01 if precision == "int8" else 2e-3)
