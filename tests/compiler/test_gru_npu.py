"""GRU and RNN unrolled into NPU layers (compiler/passes/gru_npu.py, recurrent_rnn.py, LOWERING.md 31).

Checked as the LSTM's chain is (tests/compiler/test_lstm_npu.py): end to end against a GRU / RNN
written here from the ONNX definition (float64), against onnxruntime and against the runtime's
host step (the model built at -O0); every layer runs on the NPU except the Reshapes at the
graph's edges; in int8 builds the chain is a float16 island between DPU DataConverts; what the
passes do not take stays a host step whose partition reason names the limit. The layers the chain
is made of (1x1 and depthwise Conv, Sigmoid/Tanh LUTs, Relu, element-wise Mul/Add/Sub, Split,
Concat, DataConvert) are each checked bit for bit by their own tests.

Tolerance: as the LSTM's (float16 h and gates between layers): 3e-3 max abs error, cosine 0.9999.
"""

from __future__ import annotations

import lzma

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine
from tests.compiler.test_lstm_npu import check_close, run_npu
from tests.shared_data import RKNN_FIXTURES_OPS

GATES = {"GRU": 3, "RNN": 1}
DIRECTIONS = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}
MIN_INT8_COSINE = 0.999  # int8 X in and Y out (per-tensor int8 of the output range) around the fp16 island


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def reference_gru_direction(x, w, r, b, reverse, before_reset, h0=None):
    """One direction of the ONNX GRU (gates z, r, h; default Sigmoid/Tanh) in float64."""
    hidden = r.shape[-1]
    (wz, wr, wh), (rz, rr, rh) = np.split(w.astype(np.float64), 3), np.split(r.astype(np.float64), 3)
    wbz, wbr, wbh, rbz, rbr, rbh = np.split(b.astype(np.float64), 6)
    h = np.zeros(hidden) if h0 is None else h0.astype(np.float64).ravel()
    ys = {}
    for t in (range(len(x))[::-1] if reverse else range(len(x))):
        xt = x[t, 0].astype(np.float64)
        z = sigmoid(wz @ xt + wbz + rz @ h + rbz)
        reset = sigmoid(wr @ xt + wbr + rr @ h + rbr)
        if before_reset:
            n = np.tanh(wh @ xt + wbh + reset * (rh @ h + rbh))
        else:
            n = np.tanh(wh @ xt + wbh + rh @ (reset * h) + rbh)
        h = (1 - z) * n + z * h
        ys[t] = h
    return np.stack([ys[t] for t in range(len(x))]), h


def reference_rnn_direction(x, w, r, b, reverse, function, h0=None):
    """One direction of the ONNX RNN, h' = f(W x + R h + Wb + Rb), in float64."""
    hidden = r.shape[-1]
    f = {"Tanh": np.tanh, "Relu": lambda v: np.maximum(v, 0), "Sigmoid": sigmoid}[function]
    h = np.zeros(hidden) if h0 is None else h0.astype(np.float64).ravel()
    ys = {}
    for t in (range(len(x))[::-1] if reverse else range(len(x))):
        h = f(w.astype(np.float64) @ x[t, 0] + r.astype(np.float64) @ h + b[:hidden] + b[hidden:])
        ys[t] = h
    return np.stack([ys[t] for t in range(len(x))]), h


def reference(op, x, w, r, b, direction, h0=None, **kwargs):
    """Y [T, D, 1, H] and Y_h [D, 1, H] of the GRU or RNN."""
    one = reference_gru_direction if op == "GRU" else reference_rnn_direction
    runs = [one(x, w[d], r[d], b[d], back, h0=None if h0 is None else h0[d], **kwargs)
            for d, back in enumerate(DIRECTIONS[direction])]
    return np.stack([run[0] for run in runs], axis=1)[:, :, None, :], np.stack([run[1] for run in runs])[:, None]


def recurrent_model(op, steps, size, hidden, seed=0, state="none", outputs=("Y", "Y_h"), **attrs):
    """A one-GRU/RNN model; ``state``: "none", "input" (initial_h a graph input) or "const"."""
    rng = np.random.default_rng(seed)
    directions = len(DIRECTIONS[attrs.get("direction", "forward")])
    gates = GATES[op] * hidden
    w = rng.normal(0, 0.4, (directions, gates, size)).astype(np.float32)
    r = rng.normal(0, 0.4, (directions, gates, hidden)).astype(np.float32)
    b = rng.normal(0, 0.2, (directions, 2 * gates)).astype(np.float32)
    h0 = rng.normal(0, 0.5, (directions, 1, hidden)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, size])]
    names = ["x", "W", "R", "B"]
    if state == "input":
        names += ["", "h0"]
        inputs.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT, [directions, 1, hidden]))
    elif state == "const":
        names += ["", "h0"]
        inits.append(numpy_helper.from_array(h0, "h0"))
    node = helper.make_node(op, names, list(outputs), hidden_size=hidden, **attrs)
    graph = helper.make_graph([node], op.lower(), inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    return model, (w, r, b), (h0 if state != "none" else None)


def _onnxruntime(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _check(op, steps, size, hidden, direction, state, seed, **attrs):
    model, (w, r, b), h0 = recurrent_model(op, steps, size, hidden, seed=seed, state=state, direction=direction,
                                           **attrs)
    x = np.random.default_rng(seed + 100).normal(0, 1, (steps, 1, size)).astype(np.float32)
    feeds = {"h0": h0} if state == "input" else {}
    front, got = run_npu(model, x, feeds=feeds)
    assert not [n for n in front.graph.nodes if n.op_type == op]
    host = [n.op_type for n in front.graph.nodes if n.target != "NPU"]
    assert host == ["Reshape"] * (3 + (state == "input"))  # X (and h0) in, Y and Y_h out
    extra = {"before_reset": bool(attrs.get("linear_before_reset", 0))} if op == "GRU" else {
        "function": attrs.get("activations", ["Tanh"])[0]}
    mine = reference(op, x, w, r, b, direction, h0, **extra)
    for have, want, ours in zip(got, _onnxruntime(model, {"x": x} | feeds), mine):
        np.testing.assert_allclose(want, ours, atol=1e-5)  # the reference written here agrees with onnxruntime
        check_close(have, ours)
    host_front, host_out = run_npu(model, x, level=0, feeds=feeds)
    assert [n.target for n in host_front.graph.nodes if n.op_type == op] == ["CPU"]
    for have, want in zip(got, host_out):
        check_close(have, want)


@pytest.mark.parametrize("before_reset", [0, 1])
@pytest.mark.parametrize("steps,size,hidden,direction,state", [
    (3, 8, 16, "forward", "none"), (1, 8, 8, "forward", "none"), (4, 6, 16, "reverse", "input"),
    (3, 8, 8, "bidirectional", "none"), (3, 5, 16, "bidirectional", "input"), (2, 8, 8, "forward", "const")])
def test_unrolled_gru_matches_reference_onnxruntime_and_host_step(before_reset, steps, size, hidden, direction, state):
    _check("GRU", steps, size, hidden, direction, state, seed=steps * 10 + hidden + before_reset,
           linear_before_reset=before_reset)


def test_gru_with_zero_recurrent_bias_and_zero_state_skips_the_reset_gate():
    """linear_before_reset 1, h(0) = 0 and Rbh = 0: r multiplies nothing at step 0, so it is not made."""
    model, (w, r, b), _ = recurrent_model("GRU", 2, 8, 8, linear_before_reset=1)
    b[:, 5 * 8:] = 0.0
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(b, "B"))
    x = np.random.default_rng(3).normal(0, 1, (2, 1, 8)).astype(np.float32)
    front, got = run_npu(model, x)
    assert not [n for n in front.graph.nodes if "d0_t0_r" in n.name]
    for have, want in zip(got, reference("GRU", x, w, r, b, "forward", before_reset=True)):
        check_close(have, want)


@pytest.mark.parametrize("function", ["Tanh", "Relu", "Sigmoid"])
@pytest.mark.parametrize("steps,size,hidden,direction,state", [
    (4, 8, 16, "forward", "none"), (3, 6, 8, "reverse", "input"), (3, 8, 16, "bidirectional", "const")])
def test_unrolled_rnn_matches_reference_onnxruntime_and_host_step(function, steps, size, hidden, direction, state):
    count = len(DIRECTIONS[direction])
    _check("RNN", steps, size, hidden, direction, state, seed=steps + hidden, activations=[function] * count)


def _int8(model, x, feeds=None):
    samples = [{"x": np.random.default_rng(s).normal(0, 1, x.shape).astype(np.float32)} | (feeds or {})
               for s in range(4)]
    return run_npu(model, x, feeds=feeds, precision="int8", dataset=samples)


@pytest.mark.parametrize("op,attrs", [("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}),
                                      ("GRU", {"linear_before_reset": 0}), ("RNN", {"direction": "reverse"})])
def test_int8_build_runs_the_chain_as_a_float16_island(op, attrs):
    """As the vendor keeps exGRU float16 in int8 builds ([V] rknn-fixtures-ops gru_int8: every
    tensor FLOAT16): int8 X is converted once by a DPU task, every h by one on its way to Y's int8
    Concat; only the Reshapes at the edges are host steps."""
    model, (w, r, b), _ = recurrent_model(op, 4, 16, 16, seed=5, **attrs)
    x = np.random.default_rng(9).normal(0, 1, (4, 1, 16)).astype(np.float32)
    front, got = _int8(model, x)
    dtypes = front.quantization.layer_dtypes
    chain = [n for n in front.graph.nodes if n.op_type not in ("Reshape", "DataConvert", "Concat")]
    assert chain and all(dtypes[n.name] == "float16" and n.target == "NPU" for n in chain)
    assert [n.op_type for n in front.graph.nodes if n.target != "NPU"] == ["Reshape"] * 3
    extra = {"before_reset": bool(attrs.get("linear_before_reset", 0))} if op == "GRU" else {"function": "Tanh"}
    for have, want in zip(got, reference(op, x, w, r, b, attrs.get("direction", "forward"), **extra)):
        assert cosine(have.reshape(want.shape), want) >= MIN_INT8_COSINE


def _reason(model):
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    left = [n.name for n in front.graph.nodes if n.op_type in GATES]
    assert len(left) == 1, "the node should have stayed itself"
    return front.partition.by_node()[left[0]]


@pytest.mark.parametrize("op,kwargs,steps,words", [
    ("GRU", {"clip": 2.0}, 4, "clip"),
    ("GRU", {"activations": ["HardSigmoid", "Tanh"]}, 4, "activations"),
    ("RNN", {"activations": ["Elu"]}, 4, "activations"),
    ("RNN", {"layout": 1}, 4, "layout 1"),
    ("GRU", {}, 65, "sequence length 65 (at most 64"),
])
def test_outside_the_slice_stays_on_the_host_with_its_reason(op, kwargs, steps, words):
    model, _, _ = recurrent_model(op, steps, 8, 8, **kwargs)
    decision = _reason(model)
    assert decision.target == "CPU" and words in decision.reason, decision.reason


def test_unaligned_steps_below_o3_stay_on_the_host():
    """Below -O3 no pass turns X's Split off C2 boundaries into selection convs, which the build
    cannot lower: the GRU stays a host step naming the limit; at -O1 an aligned one is unrolled."""
    model, _, _ = recurrent_model("GRU", 3, 6, 8)
    front = prepare(model, "rk3588", CompileOptions(precision="fp16", optimization_level=1))
    decision = front.partition.by_node()[next(n.name for n in front.graph.nodes if n.op_type == "GRU")]
    assert decision.target == "CPU" and "input size 6 / hidden size 8 off the 8-channel C2 boundaries below -O3" \
        in decision.reason, decision.reason
    aligned, (w, r, b), _ = recurrent_model("GRU", 3, 8, 8)
    x = np.random.default_rng(1).normal(0, 1, (3, 1, 8)).astype(np.float32)
    front, got = run_npu(aligned, x, level=1)
    assert not [n for n in front.graph.nodes if n.op_type == "GRU"]
    for have, want in zip(got, reference("GRU", x, w, r, b, "forward", before_reset=False)):
        check_close(have, want)


@pytest.mark.skipif(not RKNN_FIXTURES_OPS.exists(), reason="vendor fixtures not present")
@pytest.mark.parametrize("fixture,precision", [("gru_fp16", "fp16"), ("gru_int8", "int8")])
def test_vendor_gru_fixture_models_against_their_onnxruntime_output(fixture, precision):
    """rknn-fixtures-ops gru_fp16 / gru_int8 (linear_before_reset 1, T 16, I 32, H 64): the vendor
    builds both as a float16 exGRU; here fp16 keeps every tensor float16, int8 makes the chain a
    float16 island behind int8 X and Y."""
    folder = RKNN_FIXTURES_OPS / fixture
    model = onnx.load(folder / "model.onnx")
    x = np.load(lzma.open(folder / "input_0.npy.xz"))
    want = np.load(lzma.open(folder / "ort_output_0.npy.xz")).astype(np.float64)
    if precision == "fp16":
        front, (got,) = run_npu(model, x)
    else:
        front, (got,) = _int8(model, x)
    assert [n.op_type for n in front.graph.nodes if n.target != "NPU"] == ["Reshape", "Reshape"]
    got = got.reshape(want.shape)
    if precision == "fp16":
        assert float(np.abs(got - want).max()) <= 3e-3
    assert cosine(got, want) >= (0.9999 if precision == "fp16" else MIN_INT8_COSINE)


@pytest.mark.parametrize("precision,floor", [("fp16", 0.9999), ("int8", 0.995)])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_inside_an_int8_or_fp16_graph_with_an_odd_hidden_size(op, precision, floor):
    """Conv -> Transpose -> Reshape -> bidirectional op (hidden 5: every Concat of the h's off the C2
    boundaries, placement convs at -O3) -> all outputs; in int8 the island is fed by the conv's int8
    output through a DPU DataConvert."""
    rng = np.random.default_rng(4)
    steps, channels, hidden = 6, 8, 5
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    w = rng.normal(0, 0.4, (2, gates * hidden, channels)).astype(np.float32)
    r = rng.normal(0, 0.4, (2, gates * hidden, hidden)).astype(np.float32)
    b = rng.normal(0, 0.2, (2, 2 * gates * hidden)).astype(np.float32)
    outputs = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))] + [
        numpy_helper.from_array(rng.normal(0, 0.5, (channels, 1, 1, 1)).astype(np.float32), "cw"),
        numpy_helper.from_array(np.array([steps, 1, channels], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["img", "cw"], ["feat"], group=channels),
             helper.make_node("Transpose", ["feat"], ["featT"], perm=[3, 0, 1, 2]),  # [T, 1, C, 1]
             helper.make_node("Reshape", ["featT", "shape"], ["X"]),
             helper.make_node(op, ["X", "W", "R", "B"], outputs, hidden_size=hidden, direction="bidirectional")]
    image = helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, channels, 1, steps])
    graph = helper.make_graph(nodes, "g", [image], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                    for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    samples = [{"img": rng.normal(size=(1, channels, 1, steps)).astype(np.float32)} for _ in range(4)]
    front = prepare(model, "rk3588", CompileOptions(precision=precision,
                                                    dataset=samples if precision == "int8" else None))
    assert not [n for n in front.graph.nodes if n.op_type == op]
    runtime = Runtime(build_graph(front.graph))
    runtime.set_input("img", samples[0]["img"])
    runtime.run()
    for name, want in zip(outputs, _onnxruntime(model, samples[0])):
        got = runtime.output(name).reshape(want.shape)
        assert cosine(got, want) >= floor, (name, cosine(got, want))


@settings(max_examples=6, deadline=None)
@given(op=st.sampled_from(["LSTM", "GRU", "RNN"]), steps=st.integers(1, 5), size=st.integers(1, 20),
       hidden=st.integers(1, 20), direction=st.sampled_from(sorted(DIRECTIONS)), before_reset=st.integers(0, 1),
       state=st.sampled_from(["none", "input", "const"]), seed=st.integers(0, 1000))
def test_any_small_shape_matches_the_float64_reference(op, steps, size, hidden, direction, before_reset, state, seed):
    """Shapes off every C2 boundary (selection convs for X's steps, placement convs for Y's Concat),
    one step, every direction and state kind: within the float16 chain's tolerance."""
    from tests.compiler.test_lstm_npu import lstm_model, reference_lstm

    x = np.random.default_rng(seed).normal(0, 1, (steps, 1, size)).astype(np.float32)
    if op == "LSTM":
        states = {n: np.random.default_rng(seed + 1).normal(0, 0.5, (len(DIRECTIONS[direction]), 1, hidden))
                  .astype(np.float32) for n in ("h0", "c0")} if state != "none" else {}
        extra = {5: ("h0", states["h0"]), 6: ("c0", states["c0"])} if state == "const" else {}
        model, (w, r, b) = lstm_model(steps, size, hidden, seed=seed, direction=direction,
                                      state_inputs=state == "input", extra_inputs=extra)
        want = reference_lstm(x, w, r, b, direction, states.get("h0"), states.get("c0"))
        feeds = states if state == "input" else {}
    else:
        attrs = {"linear_before_reset": before_reset} if op == "GRU" else {}
        model, (w, r, b), h0 = recurrent_model(op, steps, size, hidden, seed=seed, state=state, direction=direction,
                                               **attrs)
        kind = {"before_reset": bool(before_reset)} if op == "GRU" else {"function": "Tanh"}
        want = reference(op, x, w, r, b, direction, h0, **kind)
        feeds = {"h0": h0} if state == "input" else {}
    front, got = run_npu(model, x, feeds=feeds)
    assert not [n for n in front.graph.nodes if n.op_type == op]
    for have, value in zip(got, want):
        check_close(have, value)
