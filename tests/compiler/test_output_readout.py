"""A token region that reaches the graph output (LOWERING.md 25): the model's [1, T, C] output
is the channel-major [1, C, 1, T] map the NPU writes, handed out by the runtime's readout
(isa/CONTAINER.md 3.3 ``readout``: NHWC order of the map, reshaped) instead of two host steps.

Checked: PP-OCRv4 rec's tail (Squeeze, Transpose, the head FC and the Softmax over its classes)
as a model of its own: no host layer in float16, the output record's readout, the output bit for
bit equal to the stored map read from the memory image and transposed here (an NC1HWC2 decode
written from NUMERICS.md 8.1), and against onnxruntime; the float graph with its Readout against
onnxruntime; an int8 region ending in the graph output; a multi-batch build (each slice read
out); the container accepts exactly the readouts that fit (hypothesis over perms and shapes) and
names the bound it refuses; files without one are unchanged (benchmarks.bitexact)."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.float_eval import evaluate
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
from npuemu.isa.container_trailer import SchemaViolation
from tests.compiler.test_build_e2e import cosine

F32 = np.float32


def reference_readout(attrs: dict, x: np.ndarray) -> np.ndarray:
    """The Readout op: the input transposed by ``perm``, reshaped to ``shape``."""
    return np.reshape(np.transpose(x, attrs["perm"]), attrs["shape"])


def rec_tail(channels: int = 24, tokens: int = 10, classes: int = 40, softmax: bool = True, seed: int = 0):
    """PP-OCRv4 rec's head: [1, C, 1, T] -> Squeeze -> Transpose -> MatMul + Add [-> Softmax]."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Squeeze", ["x", "axes"], ["s"], name="squeeze"),
             helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1], name="transpose"),
             helper.make_node("MatMul", ["t", "w"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "b"], ["z"], name="bias"),
             helper.make_node("Softmax", ["z"], ["y"], axis=2, name="softmax") if softmax
             else helper.make_node("Relu", ["z"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(np.array([2], np.int64), "axes"),
             numpy_helper.from_array(rng.normal(0, 0.4, (channels, classes)).astype(F32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.5, classes).astype(F32), "b")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 1, tokens])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, classes])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _build(model, precision: str, x: np.ndarray):
    dataset = None if precision == "fp16" else [{"x": x * scale} for scale in (1.0, -1.0, 0.5)]
    front = prepare(model, "rk3588", CompileOptions(precision=precision, dataset=dataset))
    return front, build_graph(front.graph)


def _ort(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _stored_map(runtime: Runtime, name: str) -> np.ndarray:
    """The output's NC1HWC2 bytes from the memory image, decoded here: element (c, h, w) at
    ((c // C2 * surface + h * W + w) * C2 + c % C2) (NUMERICS.md 8.1)."""
    info = runtime.tensor_info(name)
    _, c1, height, width, c2 = info["native_shape"]
    surface = info.get("surface_stride", height * width)
    raw = runtime.machine.memory.dump(int(info["address"]), c1 * surface * c2 * 2).view(np.float16)
    atoms = raw.reshape(c1, surface, c2)[:, :height * width].reshape(c1, height, width, c2)
    return atoms.transpose(0, 3, 1, 2).reshape(c1 * c2, height, width)[:info["shape"][1]][None]


@pytest.mark.parametrize("channels, tokens, classes", [(24, 10, 40), (120, 40, 700)])
def test_rec_tail_runs_on_the_npu_and_the_runtime_reads_it_out(channels, tokens, classes) -> None:
    model = rec_tail(channels, tokens, classes)
    x = np.random.default_rng(1).normal(0, 1, (1, channels, 1, tokens)).astype(np.float16).astype(F32)
    front, built = _build(model, "fp16", x)
    assert front.partition.count("CPU") == 0
    assert [node.op_type for node in front.graph.nodes] == ["Conv", "Softmax", "Readout"]
    assert [step.kind for step in built.schedule()] == ["npu"]
    record = next(t for t in built.trailer["tensors"] if t["name"] == "y")
    assert record["shape"] == [1, classes, 1, tokens]
    assert record["readout"] == {"perm": [0, 2, 3, 1], "shape": [1, tokens, classes]}
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    got = runtime.output("y", dequantize=False)
    want = _stored_map(runtime, "y").transpose(0, 2, 3, 1).reshape(1, tokens, classes)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    expected = _ort(model, x)
    assert got.shape == expected.shape and cosine(got.astype(F32), expected) >= 0.9999


def test_float_graph_with_its_readout_matches_onnxruntime() -> None:
    model = rec_tail()
    x = np.random.default_rng(2).normal(0, 1, (1, 24, 1, 10)).astype(F32)
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    readout = front.graph.nodes[-1]
    assert readout.op_type == "Readout" and readout.target == "NPU"
    np.testing.assert_allclose(evaluate(front.graph, {"x": x})["y"], _ort(model, x), rtol=1e-5, atol=1e-6)
    channel_major = np.random.default_rng(3).normal(0, 1, (1, 40, 1, 10)).astype(F32)
    np.testing.assert_array_equal(reference_readout(readout.attrs, channel_major),
                                  channel_major[0, :, 0, :].T[None])


def test_int8_region_ending_in_the_graph_output() -> None:
    model = rec_tail(softmax=False)
    x = np.random.default_rng(4).normal(0, 1, (1, 24, 1, 10)).astype(F32)
    front, built = _build(model, "int8", x)
    assert front.partition.count("CPU") == 0 and front.graph.nodes[-1].op_type == "Readout"
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    assert cosine(runtime.output("y"), _ort(model, x)) >= 0.99


def _with_readout(built: ModelFile, name: str, readout) -> ModelFile:
    trailer = {key: value for key, value in built.trailer.items() if key != "format"}
    trailer["tensors"] = [dict(t, readout=readout) if t["name"] == name else t for t in trailer["tensors"]]
    return ModelFile(built.sections, trailer)


def test_container_keeps_a_readout_and_refuses_one_that_does_not_fit(tmp_path) -> None:
    model = rec_tail()
    _, built = _build(model, "fp16", np.zeros((1, 24, 1, 10), F32))
    path = tmp_path / "m.npu"
    built.write(path)
    assert ModelFile.read(path).trailer == built.trailer
    inner = next(t["name"] for t in built.trailer["tensors"] if t["name"] not in ("x", "y") and "shape" in t)
    cases = [("y", {"perm": [0, 2, 1], "shape": [1, 10, 40]}, "perm"),
             ("y", {"perm": [0, 2, 3, 1], "shape": [1, 10, 41]}, "shape"),
             (inner, {"perm": [0, 1, 2, 3], "shape": [1, 40, 1, 10]}, "not a graph output")]
    for name, readout, words in cases:
        with pytest.raises(SchemaViolation, match=words):
            _with_readout(built, name, readout)


def test_multi_batch_output_is_read_out_per_slice() -> None:
    """--batch-size 2: each slice's record carries the readout; the slices are stacked after it."""
    from npuemu.compiler.build import build_model

    model = rec_tail()
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    built = build_model(front.graph, "rk3588", batch=2)
    records = {t["name"]: t for t in built.trailer["tensors"]}
    assert records["y#b0"]["readout"] == records["y#b1"]["readout"] == {"perm": [0, 2, 3, 1], "shape": [1, 10, 40]}
    x = np.random.default_rng(5).normal(0, 1, (2, 24, 1, 10)).astype(np.float16).astype(F32)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    want = np.concatenate([_ort(model, x[i:i + 1]) for i in range(2)])
    assert runtime.output("y").shape == (2, 10, 40) and cosine(runtime.output("y"), want) >= 0.9999


@settings(max_examples=60, deadline=None)
@given(perm=st.lists(st.integers(0, 5), min_size=0, max_size=6), shape=st.lists(st.integers(0, 500), max_size=5))
def test_container_accepts_exactly_the_readouts_that_fit(perm, shape) -> None:
    """Any readout record: accepted iff ``perm`` orders the 4 axes of [1, 40, 1, 10] and ``shape``
    holds its 400 elements; else one SchemaViolation naming the readout."""
    built = _tail_fp16()
    fits = sorted(perm) == [0, 1, 2, 3] and int(np.prod(shape)) == 400 and len(shape) > 0
    if fits:
        assert _with_readout(built, "y", {"perm": perm, "shape": shape}).trailer is not None
    else:
        with pytest.raises(SchemaViolation, match="readout"):
            _with_readout(built, "y", {"perm": perm, "shape": shape})


@functools.lru_cache(maxsize=1)
def _tail_fp16() -> ModelFile:
    return _build(rec_tail(), "fp16", np.zeros((1, 24, 1, 10), F32))[1]
