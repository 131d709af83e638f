"""The edges of a sequence model on the NPU (LOWERING.md 38): a state tensor read in and read out as
one channel map (passes/recurrent_state_io.py) and a fully connected layer over the rows of an
unrolled recurrent layer's output as 1x1 convs joined for the readout (passes/sequence_fc.py).

Checked: the moves are exact - a silero-like state read in, split, fed to an LSTM, its final h
and c joined and read out gives stateN bit for bit equal to the same LSTM's own Y_h and Y_c; an FC
over the rows - one conv over T pixels (K within one cube), convs per part with one-hot picks of
each row (K wider than a cube), or per-row convs (T past the kernel size) - equals the exact
result of integer-valued weights and quarter-valued inputs bit for bit; an LSTM or GRU reading its
steps from a map's columns (all-steps projections with kernel [H, 1] and one-hot depthwise picks,
passes/recurrent_unroll.py) gives the same Y bit for bit as when fed the transposed X as a graph
input, and matches a float64 reference and onnxruntime; silero-like and ddddocr-like models run
with no host step but the X/Y Reshapes of graph inputs/outputs, within the LSTM tests'
tolerance, int8 and float16; patterns the passes must leave alone stay as they were.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine
from tests.compiler.test_lstm_npu import check_close, reference_lstm

OPSET = [helper.make_opsetid("", 14)]


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "edges",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


def _run(model, feeds, precision="fp16", level=3):
    dataset = None if precision == "fp16" else [{k: v * s for k, v in feeds.items()} for s in (1.0, -0.8, 0.6)]
    front = prepare(model, "rk3588", CompileOptions(precision=precision, dataset=dataset, optimization_level=level))
    built = build_graph(front.graph)
    runtime = Runtime(built)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return front, built, {o.name: np.asarray(runtime.output(o.name)) for o in model.graph.output}


def _ort(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _host(front) -> list[str]:
    return sorted(node.op_type for node in front.graph.nodes if node.target != "NPU")


# ---- the state's edges ---------------------------------------------------------------------------

def relay_model(rows=3, size=16, order=(2, 0, 1)):
    """state [rows, 1, size] -> a Gather per row (scalar index, or a 1-element one) -> [1, size, 1, 1]
    -> Relu -> [1, 1, size] -> Concat(axis 0) in ``order`` -> out [rows, 1, size]."""
    nodes, joined = [], []
    inits = {"flat": np.array([1, size, 1, 1], np.int64), "row": np.array([1, 1, size], np.int64)}
    for k in order:
        inits[f"i{k}"] = np.array(k, np.int64) if k != 1 else np.array([k], np.int64)
        nodes += [helper.make_node("Gather", ["state", f"i{k}"], [f"g{k}"], axis=0),
                  helper.make_node("Reshape", [f"g{k}", "flat"], [f"m{k}"]),
                  helper.make_node("Relu", [f"m{k}"], [f"r{k}"]),
                  helper.make_node("Reshape", [f"r{k}", "row"], [f"o{k}"])]
        joined.append(f"o{k}")
    nodes.append(helper.make_node("Concat", joined, ["out"], axis=0))
    return _model(nodes, [("state", [rows, 1, size])], ["out"], inits)


def test_state_gathers_without_a_recurrent_layer_are_left_alone():
    """A state input's Gathers are read in as channels only where they feed recurrent layers'
    initial states (the Gather of tests/compiler/test_silero_ops_npu.py stays a host step)."""
    front = prepare(relay_model(), "rk3588", CompileOptions(precision="fp16"))
    ops = [n.op_type for n in front.graph.nodes]
    assert "Readin" not in ops and ops.count("Gather") == 3


def silero_like(steps=2, size=16, hidden=16, seed=0, separate=False):
    """silero-vad's decoder: state [2, 1, H] -> Gathers -> Unsqueeze -> LSTM initial h / c; Y_h and Y_c
    -> Squeeze -> Unsqueeze -> Concat(axis 0) -> stateN; Y_h also feeds an output head (a Relu).
    ``separate``: the same LSTM with h0, c0 graph inputs and Y_h, Y_c graph outputs."""
    rng = np.random.default_rng(seed)
    w, r = (rng.normal(0, 0.4, (1, 4 * hidden, n)).astype(np.float32) for n in (size, hidden))
    b = rng.normal(0, 0.2, (1, 8 * hidden)).astype(np.float32)
    axes = np.array([0], np.int64)
    if separate:
        lstm = helper.make_node("LSTM", ["x", "W", "R", "B", "", "h0", "c0"], ["Y", "Y_h", "Y_c"], hidden_size=hidden)
        inputs = [("x", [steps, 1, size]), ("h0", [1, 1, hidden]), ("c0", [1, 1, hidden])]
        return _model([lstm], inputs, ["Y_h", "Y_c"], {"W": w, "R": r, "B": b}), (w, r, b)
    nodes = [helper.make_node("Gather", ["state", "zero"], ["g0"], axis=0),
             helper.make_node("Gather", ["state", "one"], ["g1"], axis=0),
             helper.make_node("Unsqueeze", ["g0", "axes"], ["h0"]),
             helper.make_node("Unsqueeze", ["g1", "axes"], ["c0"]),
             helper.make_node("LSTM", ["x", "W", "R", "B", "", "h0", "c0"], ["Y", "Y_h", "Y_c"], hidden_size=hidden),
             helper.make_node("Squeeze", ["Y_h", "axes"], ["hs"]), helper.make_node("Squeeze", ["Y_c", "axes"], ["cs"]),
             helper.make_node("Unsqueeze", ["hs", "axes"], ["hn"]),
             helper.make_node("Unsqueeze", ["cs", "axes"], ["cn"]),
             helper.make_node("Concat", ["hn", "cn"], ["stateN"], axis=0),
             helper.make_node("Relu", ["hs"], ["head"])]
    inits = {"W": w, "R": r, "B": b, "axes": axes, "zero": np.array(0, np.int64), "one": np.array(1, np.int64)}
    model = _model(nodes, [("x", [steps, 1, size]), ("state", [2, 1, hidden])], ["head", "stateN"], inits)
    return model, (w, r, b)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_silero_like_state_edges_on_the_npu(precision):
    model, (w, r, b) = silero_like()
    rng = np.random.default_rng(2)
    feeds = {"x": rng.normal(0, 1, (2, 1, 16)).astype(np.float32),
             "state": rng.normal(0, 0.3, (2, 1, 16)).astype(np.float32)}
    front, built, got = _run(model, feeds, precision)
    assert _host(front) == ["Reshape"]  # X [T, 1, I] flattened in (a graph input; LOWERING.md 30)
    records = {t["name"]: t for t in built.trailer["tensors"]}
    assert records["state"]["readin"] == {"perm": [0, 1, 2], "shape": [2, 1, 16]}
    assert records["stateN"]["readout"] == {"perm": [0, 1, 2, 3], "shape": [2, 1, 16]}
    _, h, c = reference_lstm(feeds["x"], w, r, b, h0=feeds["state"][:1], c0=feeds["state"][1:])
    want = np.concatenate([h, c])
    np.testing.assert_allclose(_ort(model, feeds)["stateN"], want, atol=1e-5)
    if precision == "fp16":
        check_close(got["stateN"], want)
        # bit for bit what the same LSTM gives with its own state inputs and outputs: the readin, the
        # Split, the channel Concat and the readout move values only
        separate, _ = silero_like(separate=True)
        _, _, own = _run(separate, {"x": feeds["x"], "h0": feeds["state"][:1], "c0": feeds["state"][1:]})
        np.testing.assert_array_equal(got["stateN"].reshape(2, 1, 16), np.concatenate([own["Y_h"], own["Y_c"]]))
    else:  # the state input is int8 (as its Gathers were); the chain and stateN are float16 (31.2)
        assert cosine(got["stateN"].reshape(want.shape), want) >= 0.999


def test_state_input_with_another_reader_is_left_alone():
    model, _ = silero_like()
    model.graph.node.append(helper.make_node("Relu", ["state"], ["extra"]))
    model.graph.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    ops = [n.op_type for n in front.graph.nodes]
    assert "Readin" not in ops and ops.count("Gather") == 2


# ---- a fully connected layer over the rows -------------------------------------------------------

def rows_fc_model(steps, channels, classes, seed=0, widths=None):
    """T maps [1, C, 1, 1] (or maps of ``widths`` channels) -> Relu -> Concat(axis 1) -> [T, C] -> Gemm
    (K classes) -> [T, 1, K]; integer weights and bias (exact in float16)."""
    rng = np.random.default_rng(seed)
    weight = rng.integers(-2, 3, (classes, channels)).astype(np.float32)
    bias = rng.integers(-4, 5, classes).astype(np.float32)
    widths = widths or [channels] * steps
    nodes = [helper.make_node("Relu", [f"a{t}"], [f"r{t}"]) for t in range(len(widths))]
    nodes += [helper.make_node("Concat", [f"r{t}" for t in range(len(widths))], ["y"], axis=1),
              helper.make_node("Reshape", ["y", "rows"], ["x2"]),
              helper.make_node("Gemm", ["x2", "w", "b"], ["z"], transB=1),
              helper.make_node("Reshape", ["z", "out_shape"], ["out"])]
    inits = {"w": weight, "b": bias, "rows": np.array([steps, channels], np.int64),
             "out_shape": np.array([steps, 1, classes], np.int64)}
    model = _model(nodes, [(f"a{t}", [1, width, 1, 1]) for t, width in enumerate(widths)], ["out"], inits)
    return model, weight, bias


@pytest.mark.parametrize("classes", [40, 8200])  # one conv over the T pixels; per-row convs in 2 parts
def test_fc_over_rows_exact_in_float16(classes):
    steps, channels = 3, 32
    model, weight, bias = rows_fc_model(steps, channels, classes)
    rng = np.random.default_rng(classes)
    feeds = {f"a{t}": (rng.integers(-8, 9, (1, channels, 1, 1)) / 4).astype(np.float32) for t in range(steps)}
    front, _, got = _run(model, feeds)
    assert _host(front) == []
    ops = [n.op_type for n in front.graph.nodes]
    picks = [n for n in front.graph.nodes if n.op_type == "Conv" and n.attrs.get("group", 1) > 1]
    assert "FullyConnected" not in ops and ops.count("Readout") == 1
    parts = 1 if classes <= 8192 else 2
    assert ops.count("Conv") - len(picks) == parts and len(picks) == (0 if parts == 1 else parts * steps)
    rows = np.concatenate([np.maximum(feeds[f"a{t}"], 0).reshape(1, channels) for t in range(steps)]).astype(np.float64)
    want = (rows @ weight.T.astype(np.float64) + bias)[:, None, :]  # integers and quarters: exact in float16
    assert np.abs(want).max() < 1024
    assert got["out"].shape == (steps, 1, classes)
    np.testing.assert_array_equal(got["out"].astype(np.float64), want)
    np.testing.assert_allclose(_ort(model, feeds)["out"], want, atol=1e-4)


def test_fc_over_rows_of_a_map_joined_otherwise_splits_it():
    model, weight, bias = rows_fc_model(3, 32, 40, widths=[48, 48])  # rows straddle the joined maps
    rng = np.random.default_rng(6)
    feeds = {f"a{t}": (rng.integers(-8, 9, (1, 48, 1, 1)) / 4).astype(np.float32) for t in range(2)}
    front, _, got = _run(model, feeds)
    assert _host(front) == [] and "Split" in [n.op_type for n in front.graph.nodes]
    rows = np.maximum(np.concatenate([feeds["a0"].ravel(), feeds["a1"].ravel()]), 0).reshape(3, 32)
    want = (rows.astype(np.float64) @ weight.T.astype(np.float64) + bias)[:, None, :]
    np.testing.assert_array_equal(got["out"].astype(np.float64), want)


def test_fc_over_more_rows_than_a_kernel_is_convs_per_row():
    steps, channels = 32, 16  # T > 31: no one-hot pick; each row's conv per part (weights stored once)
    model, weight, bias = rows_fc_model(steps, channels, 8200, seed=2)
    rng = np.random.default_rng(5)
    feeds = {f"a{t}": (rng.integers(-8, 9, (1, channels, 1, 1)) / 4).astype(np.float32) for t in range(steps)}
    front, _, got = _run(model, feeds)
    assert _host(front) == []
    convs = [n for n in front.graph.nodes if n.op_type == "Conv"]
    assert len(convs) == 2 * steps and all(tuple(front.graph.tensor(n.outputs[0]).shape) == (1, 4100, 1, 1)
                                           for n in convs)
    rows = np.concatenate([np.maximum(feeds[f"a{t}"], 0).reshape(1, channels) for t in range(steps)])
    want = (rows.astype(np.float64) @ weight.T.astype(np.float64) + bias)[:, None, :]
    np.testing.assert_array_equal(got["out"].astype(np.float64), want)


def test_fc_over_rows_int8_has_no_host_step():
    model, _, _ = rows_fc_model(3, 32, 40, seed=1)
    rng = np.random.default_rng(3)
    feeds = {f"a{t}": rng.normal(0, 1, (1, 32, 1, 1)).astype(np.float32) for t in range(3)}
    front, _, got = _run(model, feeds, "int8")
    assert _host(front) == []
    want = _ort(model, feeds)["out"]
    assert cosine(got["out"].reshape(want.shape), want) >= 0.999


def test_fc_whose_output_feeds_a_layer_is_left_alone():
    model, _, _ = rows_fc_model(3, 32, 40)
    graph = model.graph
    graph.node[-1].output[0] = "mid"
    graph.node.append(helper.make_node("Relu", ["mid"], ["out"]))
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    assert "FullyConnected" in [n.op_type for n in front.graph.nodes]


def ddddocr_like(steps=4, size=16, hidden=16, classes=24, seed=0):
    """A bidirectional LSTM's Y [T, 2, 1, H] -> Transpose(0, 2, 1, 3) -> [T, 2H] -> Gemm -> [T, 1, K]."""
    rng = np.random.default_rng(seed)
    w, r = (rng.normal(0, 0.4, (2, 4 * hidden, n)).astype(np.float32) for n in (size, hidden))
    b = rng.normal(0, 0.2, (2, 8 * hidden)).astype(np.float32)
    fc = rng.normal(0, 0.5, (classes, 2 * hidden)).astype(np.float32)
    fb = rng.normal(0, 0.5, classes).astype(np.float32)
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y"], hidden_size=hidden, direction="bidirectional"),
             helper.make_node("Transpose", ["Y"], ["yt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["yt", "rows"], ["y2"]),
             helper.make_node("Gemm", ["y2", "fc", "fb"], ["z"], transB=1),
             helper.make_node("Reshape", ["z", "out_shape"], ["out"])]
    inits = {"W": w, "R": r, "B": b, "fc": fc, "fb": fb, "rows": np.array([steps, 2 * hidden], np.int64),
             "out_shape": np.array([steps, 1, classes], np.int64)}
    return _model(nodes, [("x", [steps, 1, size])], ["out"], inits), (w, r, b, fc, fb)


@pytest.mark.parametrize("precision,level", [("fp16", 3), ("int8", 3), ("fp16", 1)])
def test_ddddocr_like_fc_over_lstm_rows(precision, level):
    """-O1 has no clean-up stage: Y's Transpose(0, 2, 1, 3), which moves an axis of size 1, is
    passed as a reshape."""
    model, (w, r, b, fc, fb) = ddddocr_like()
    x = np.random.default_rng(4).normal(0, 1, (4, 1, 16)).astype(np.float32)
    front, _, got = _run(model, {"x": x}, precision, level)
    assert _host(front) == ["Reshape"]  # X flattened in
    y = reference_lstm(x, w, r, b, "bidirectional")[0]
    want = (y.reshape(4, 32) @ fc.T.astype(np.float64) + fb)[:, None, :]
    np.testing.assert_allclose(_ort(model, {"x": x})["out"], want, atol=1e-4)
    have = got["out"].astype(np.float64).reshape(want.shape)
    if precision == "fp16":
        assert np.abs(have - want).max() <= 1e-2  # the FC sums 32 float16 h's times weights ~0.5
    # int8: the chain, Y and the FC are one float16 island (LOWERING.md 38.2); only X is int8
    assert cosine(have, want) >= (0.9999 if precision == "fp16" else 0.999)


# ---- the LSTM's steps read from a CNN's map ----------------------------------------------------------

def crnn_like(channels=16, height=2, steps=4, hidden=16, seed=0, transposed_input=False, op="LSTM"):
    """A map [1, C, H, T] -> Transpose(perm [3, 0, 1, 2]) -> [T, 1, C, H] -> Reshape [T, 1, C*H] -> a
    bidirectional LSTM (or GRU) -> Y. ``transposed_input``: the same layer fed X [T, 1, C*H] as a
    graph input."""
    rng = np.random.default_rng(seed)
    size, gates = channels * height, 4 if op == "LSTM" else 3
    w, r = (rng.normal(0, 0.3, (2, gates * hidden, n)).astype(np.float32) for n in (size, hidden))
    b = rng.normal(0, 0.2, (2, 2 * gates * hidden)).astype(np.float32)
    inits = {"W": w, "R": r, "B": b, "x_shape": np.array([steps, 1, size], np.int64)}
    lstm = helper.make_node(op, ["x", "W", "R", "B"], ["Y"], hidden_size=hidden, direction="bidirectional")
    if transposed_input:
        return _model([lstm], [("x", [steps, 1, size])], ["Y"], inits), (w, r, b)
    nodes = [helper.make_node("Transpose", ["map"], ["cols"], perm=[3, 0, 1, 2]),
             helper.make_node("Reshape", ["cols", "x_shape"], ["x"]), lstm]
    return _model(nodes, [("map", [1, channels, height, steps])], ["Y"], inits), (w, r, b)


@pytest.mark.parametrize("channels,height,steps", [(16, 2, 4), (8, 4, 3), (16, 1, 1)])
def test_lstm_reads_its_steps_from_the_map_columns(channels, height, steps):
    model, (w, r, b) = crnn_like(channels, height, steps)
    image = np.random.default_rng(steps).normal(0, 1, (1, channels, height, steps)).astype(np.float32)
    front, _, got = _run(model, {"map": image})
    ops = [n.op_type for n in front.graph.nodes]
    assert _host(front) == ["Reshape"]  # Y [T, 2, 1, H] reshaped out (a graph output)
    assert "Transpose" not in ops and "Split" not in ops
    reading_map = [n for n in front.graph.nodes if n.op_type == "Conv" and n.inputs[0] == "map"]
    projections = [n for n in reading_map if n.attrs["kernel_shape"] == [height, 1]]
    columns = [n for n in reading_map if n.attrs["kernel_shape"] == [1, steps] and n.attrs["group"] == channels]
    if steps > 1:  # each gate's input projection over all the steps (per step a pick of its pixel), and
        # the first step of each direction (no recurrent term) from its column, as the flattened route
        assert len(projections) == 2 * 4 and len(columns) == 2 and len(reading_map) == 10
        assert all(front.graph.tensor(n.outputs[0]).shape == (1, 16, 1, steps) for n in projections)
    else:  # one step: the gate convs read the map's only column (no forget gate: c(0) = 0)
        assert len(projections) == 2 * 3 and all(front.graph.tensor(n.outputs[0]).shape == (1, 16, 1, 1)
                                                  for n in projections)
    x = image[0].transpose(2, 0, 1).reshape(steps, 1, channels * height)  # X's definition: step t = column t
    want = reference_lstm(x, w, r, b, "bidirectional")[0]
    np.testing.assert_allclose(_ort(model, {"map": image})["Y"], want, atol=1e-5)
    check_close(got["Y"], want)
    # the same LSTM fed X as a graph input (flattened and split: LOWERING.md 30) gives the same Y bit
    # for bit: the picks are exact and the [H, 1] gate convs sum the same products
    flat, _ = crnn_like(channels, height, steps, transposed_input=True)
    _, _, old = _run(flat, {"x": x})
    np.testing.assert_array_equal(got["Y"], old["Y"])


def test_crnn_like_int8_steps_from_the_map():
    model, (w, r, b) = crnn_like(16, 2, 4, seed=1)
    image = np.random.default_rng(9).normal(0, 1, (1, 16, 2, 4)).astype(np.float32)
    front, _, got = _run(model, {"map": image}, "int8")
    assert _host(front) == ["Reshape"]
    x = image[0].transpose(2, 0, 1).reshape(4, 1, 32)
    want = reference_lstm(x, w, r, b, "bidirectional")[0]
    assert cosine(got["Y"].reshape(want.shape), want) >= 0.999


def test_gru_reads_its_steps_from_the_map_columns():
    model, _ = crnn_like(8, 4, 5, op="GRU")
    image = np.random.default_rng(11).normal(0, 1, (1, 8, 4, 5)).astype(np.float32)
    front, _, got = _run(model, {"map": image})
    assert _host(front) == ["Reshape"] and "Transpose" not in [n.op_type for n in front.graph.nodes]
    check_close(got["Y"], _ort(model, {"map": image})["Y"])
    flat, _ = crnn_like(8, 4, 5, transposed_input=True, op="GRU")
    _, _, old = _run(flat, {"x": image[0].transpose(2, 0, 1).reshape(5, 1, 32)})
    np.testing.assert_array_equal(got["Y"], old["Y"])
