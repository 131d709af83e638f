"""A forward float16 LSTM unrolled into NPU layers (compiler/passes/lstm_npu.py, LOWERING.md 30).

Checked: end to end against an LSTM written here from the ONNX definition (float64), against
onnxruntime and against the runtime's host step (the same model built at -O0, where the LSTM
stays itself); every layer of the unrolled chain runs on the NPU except the Reshapes at the
graph's edges; an LSTM the slice does not take stays a host step whose partition reason
names the limit. The layers the chain is made of (1x1 Conv, the Sigmoid/Tanh float16 LUTs,
element-wise Mul/Add, Split, Concat) are each checked bit for bit by their own tests.

Tolerance: float16 storage of every intermediate (h, c, the gates) and the LUT's interpolation
give a max error of ~1e-3 for |Y| <= 1 over 8 steps (measured 5e-4 .. 8e-4 for H 8..32);
the tests allow 3e-3 max abs error and a cosine of 0.9999.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine
from tests.shared_data import RKNN_FIXTURES_OPS

MAX_ERROR, MIN_COSINE = 3e-3, 0.9999
OUTPUTS = ("Y", "Y_h", "Y_c")


def reference_direction(x, w, r, b, reverse=False):
    """One direction of the ONNX LSTM, default activations, zero initial state (float64): gates
    i, o, f, c; returns Y [T, H] in step order and the last h and c."""
    hidden = r.shape[-1]
    w, r = w.astype(np.float64), r.astype(np.float64)
    bias = b[:4 * hidden].astype(np.float64) + b[4 * hidden:]
    h, c, ys = np.zeros(hidden), np.zeros(hidden), {}
    sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    order = range(len(x))[::-1] if reverse else range(len(x))
    for t in order:
        i, o, f, g = np.split(w @ x[t, 0].astype(np.float64) + r @ h + bias, 4)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        ys[t] = h
    return np.stack([ys[t] for t in range(len(x))]), h, c


def reference_lstm(x, w, r, b, direction="forward"):
    """ONNX LSTM outputs Y [T, D, 1, H], Y_h and Y_c [D, 1, H]."""
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    runs = [reference_direction(x, w[d], r[d], b[d], back) for d, back in enumerate(reverse)]
    y = np.stack([run[0] for run in runs], axis=1)[:, :, None, :]
    return y, np.stack([run[1] for run in runs])[:, None], np.stack([run[2] for run in runs])[:, None]


def lstm_model(steps, size, hidden, seed=0, outputs=OUTPUTS, **attrs):
    rng = np.random.default_rng(seed)
    directions = 2 if attrs.get("direction") == "bidirectional" else 1
    w = rng.normal(0, 0.4, (directions, 4 * hidden, size)).astype(np.float32)
    r = rng.normal(0, 0.4, (directions, 4 * hidden, hidden)).astype(np.float32)
    b = rng.normal(0, 0.2, (directions, 8 * hidden)).astype(np.float32)
    extra = attrs.pop("extra_inputs", {})
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))]
    names = ["x", "W", "R", "B"]
    for slot, (name, value) in sorted(extra.items()):
        names += [""] * (slot - len(names)) + [name]
        inits.append(numpy_helper.from_array(value, name))
    node = helper.make_node("LSTM", names, list(outputs), hidden_size=hidden, **attrs)
    graph = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, size])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), (w, r, b)


def run_npu(model, x, level=3):
    front = prepare(model, "rk3588", CompileOptions(precision="fp16", optimization_level=level))
    runtime = Runtime(build_graph(front.graph))
    runtime.set_input("x", x)
    runtime.run()
    names = [o.name for o in model.graph.output]
    return front, [np.asarray(runtime.output(name), np.float64) for name in names]


def check_close(got, want):
    got = np.asarray(got, np.float64).reshape(np.shape(want))
    assert float(np.abs(got - want).max()) <= MAX_ERROR
    assert cosine(got, want) >= MIN_COSINE


@pytest.mark.parametrize("steps,size,hidden,direction", [
    (2, 8, 8, "forward"), (3, 5, 12, "forward"), (4, 8, 16, "forward"), (8, 16, 32, "forward"), (1, 8, 8, "forward"),
    (3, 8, 8, "reverse"), (4, 6, 16, "bidirectional"), (1, 8, 8, "bidirectional")])
def test_unrolled_lstm_matches_onnxruntime_reference_and_host_step(steps, size, hidden, direction):
    model, (w, r, b) = lstm_model(steps, size, hidden, seed=steps, direction=direction)
    x = np.random.default_rng(hidden).normal(0, 1, (steps, 1, size)).astype(np.float32)
    front, got = run_npu(model, x)
    assert not [n for n in front.graph.nodes if n.op_type == "LSTM"]
    host = [n.op_type for n in front.graph.nodes if n.target != "NPU"]
    assert host == ["Reshape"] * 4  # X flattened in, Y / Y_h / Y_c reshaped out
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})
    for have, want, mine in zip(got, expected, reference_lstm(x, w, r, b, direction)):
        np.testing.assert_allclose(want, mine, atol=1e-5)  # the reference written here agrees with onnxruntime
        check_close(have, mine)
    host_front, host_out = run_npu(model, x, level=0)
    assert [n.target for n in host_front.graph.nodes if n.op_type == "LSTM"] == ["CPU"]
    for have, want in zip(got, host_out):
        check_close(have, want)


def test_only_y_h_wanted_and_zero_initial_state_given():
    zeros = np.zeros((1, 1, 16), np.float32)
    model, (w, r, b) = lstm_model(3, 8, 16, outputs=("", "Y_h"), extra_inputs={5: ("h0", zeros), 6: ("c0", zeros)})
    x = np.random.default_rng(1).normal(0, 1, (3, 1, 8)).astype(np.float32)
    front, (y_h,) = run_npu(model, x)
    assert all(n.target == "NPU" for n in front.graph.nodes if n.op_type != "Reshape")
    assert [n.op_type for n in front.graph.nodes].count("Reshape") == 2  # X in, Y_h out: no Y is made
    assert "Concat" not in [n.op_type for n in front.graph.nodes]
    check_close(y_h, reference_lstm(x, w, r, b)[1])


def _reason(model, precision="fp16"):
    front = prepare(model, "rk3588", CompileOptions(precision=precision))
    lstm = [n.name for n in front.graph.nodes if n.op_type == "LSTM"]
    assert len(lstm) == 1, "the LSTM should have stayed itself"
    return front.partition.by_node()[lstm[0]]


@pytest.mark.parametrize("kwargs,steps,words", [
    ({"layout": 1}, 4, "layout 1"),
    ({"clip": 3.0}, 4, "clip"),
    ({"activations": ["HardSigmoid", "Tanh", "Tanh"]}, 4, "activations"),
    ({"extra_inputs": {5: ("h0", np.ones((1, 1, 8), np.float32))}}, 4, "initial_h is not a constant zero"),
    ({"extra_inputs": {7: ("p", np.ones((1, 24), np.float32))}}, 4, "peepholes"),
    ({}, 65, "sequence length 65 (at most 64"),
])
def test_lstm_outside_the_slice_stays_on_the_host_with_its_reason(kwargs, steps, words):
    model, _ = lstm_model(steps, 8, 8, **kwargs)
    decision = _reason(model)
    assert decision.target == "CPU" and words in decision.reason, decision.reason


def test_int8_build_keeps_the_lstm_on_the_host():
    model, _ = lstm_model(4, 8, 8)
    samples = [{"x": np.random.default_rng(s).normal(0, 1, (4, 1, 8)).astype(np.float32)} for s in range(2)]
    front = prepare(model, "rk3588", CompileOptions(precision="int8", dataset=samples))
    lstm = [n.name for n in front.graph.nodes if n.op_type == "LSTM"]
    decision = front.partition.by_node()[lstm[0]]
    assert decision.target == "CPU" and "not a float16 build" in decision.reason


def test_lstm_whose_weights_are_too_large_stays_on_the_host():
    model, _ = lstm_model(2, 2048, 1536)  # one copy: 4 x 1536 x (2048 + 1536) x 2 bytes = 42 MiB > 32 MiB
    decision = _reason(model)
    assert decision.target == "CPU" and "42.0 MiB of float16 weights" in decision.reason, decision.reason


def test_every_step_shares_one_stored_copy_of_w_and_r():
    """16 steps would pack 16 copies of W and R (1.5 MiB); the build stores each gate's once
    (compiler/shared_weights.py), so the weights section stays under two copies' worth."""
    steps, size, hidden = 16, 32, 64
    model, (w, r, b) = lstm_model(steps, size, hidden, seed=3, direction="bidirectional")
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    assert not [n for n in front.graph.nodes if n.op_type == "LSTM"]
    built = build_graph(front.graph)
    one_copy = 2 * 2 * 4 * hidden * (size + hidden)  # float16 W and R of both directions
    weights = next(s.data for s in built.sections if s.name == "weights")
    assert one_copy <= len(weights) < 2 * one_copy
    x = np.random.default_rng(4).normal(0, 1, (steps, 1, size)).astype(np.float32)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    for name, want in zip(OUTPUTS, reference_lstm(x, w, r, b, "bidirectional")):
        check_close(runtime.output(name), want)


@pytest.mark.skipif(not RKNN_FIXTURES_OPS.exists(), reason="vendor fixtures not present")
def test_vendor_lstm_fixture_model_against_its_onnxruntime_output():
    """rknn-fixtures-ops lstm_fp16 (T 16, I 32, H 64): the vendor's own sim reaches cosine
    0.99999996 / max error 1.2e-4 (meta.json checks); this chain keeps every h and c in float16
    between layers (the vendor's exLSTM also stores them as float16, y_compute_zone)."""
    import lzma

    import onnx

    folder = RKNN_FIXTURES_OPS / "lstm_fp16"
    model = onnx.load(folder / "model.onnx")
    x = np.load(lzma.open(folder / "input_0.npy.xz"))
    want = np.load(lzma.open(folder / "ort_output_0.npy.xz"))
    front, (got,) = run_npu(model, x)
    assert [n.op_type for n in front.graph.nodes if n.target != "NPU"] == ["Reshape", "Reshape"]
    got = got.reshape(want.shape)
    assert float(np.abs(got - want).max()) <= MAX_ERROR and cosine(got, want) >= MIN_COSINE
