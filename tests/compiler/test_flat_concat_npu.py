"""A detector's tail on the NPU (LOWERING.md 29): per-head Reshape to [1, C, L], Concat along L,
Transpose to the graph output [1, N, C] (YOLOX's) as one FlatConcat - a DPU copy per head into
its columns of a [1, C, 1, N] map - and the runtime's NHWC readout of that map.

Checked: the rewrite (no host layer, the graph's nodes and the output record's readout); the
stored output bit for bit equal to the heads' stored values (decoded from the memory image here,
NC1HWC2 as NUMERICS.md 8.1 describes) joined in numpy - float16 copied, int8 requantized as
tools.testing_reference.reference_copy - over several surfaces and heads whose H*W is not a
multiple of 4; a small YOLOX-like model against onnxruntime in int8 and float16; the float graph
against onnxruntime; tails the rewrite must leave alone."""

from __future__ import annotations

import types

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.float_eval import evaluate
from npuemu.emulator.runtime import Runtime
from npuemu.tools.testing_reference import reference_copy
from tests.compiler.test_build_e2e import cosine

F32 = np.float32
HEADS = ((5, 5), (3, 3), (2, 6))  # 25 + 9 + 12 = 46 columns: no head a multiple of 4 pixels


def reference_flat_concat(attrs: dict, *x: np.ndarray) -> np.ndarray:
    """FlatConcat: each [1, C, H, W] input as [1, C, 1, H*W], joined along the last axis."""
    return np.concatenate([np.reshape(v, (1, v.shape[1], 1, -1)) for v in x], axis=-1)


def _tail(nodes: list, heads: list[str], channels: int, sizes, inputs, inits, output: str = "y"):
    """``heads`` -> Reshape [1, C, H*W] each -> Concat(axis 2) -> Transpose(0, 2, 1) -> ``output``."""
    total = sum(h * w for h, w in sizes)
    for index, (name, (h, w)) in enumerate(zip(heads, sizes)):
        inits.append(numpy_helper.from_array(np.array([1, channels, h * w], np.int64), f"shape{index}"))
        nodes.append(helper.make_node("Reshape", [name, f"shape{index}"], [f"flat{index}"], name=f"reshape{index}"))
    nodes += [helper.make_node("Concat", [f"flat{i}" for i in range(len(heads))], ["joined"], axis=2, name="concat"),
              helper.make_node("Transpose", ["joined"], [output], perm=[0, 2, 1], name="transpose")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT,
                                                                                  [1, total, channels])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def heads_model(channels: int, sizes=HEADS):
    """The tail alone, its heads graph inputs (their stored values are what the copies read)."""
    inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, channels, h, w])
              for i, (h, w) in enumerate(sizes)]
    return _tail([], [f"x{i}" for i in range(len(sizes))], channels, sizes, inputs, [])


def yolox_like(channels: int = 6, seed: int = 0):
    """An image, a conv per head at strides 1, 2, 4 with a sigmoid, then YOLOX's tail."""
    rng = np.random.default_rng(seed)
    nodes, inits, heads, sizes = [], [], [], []
    for index, stride in enumerate((1, 2, 4)):
        inits += [numpy_helper.from_array(rng.normal(0, 0.4, (channels, 3, 3, 3)).astype(F32), f"w{index}"),
                  numpy_helper.from_array(rng.normal(0, 0.2, channels).astype(F32), f"b{index}")]
        nodes += [helper.make_node("Conv", ["x", f"w{index}", f"b{index}"], [f"c{index}"], pads=[1, 1, 1, 1],
                                   strides=[stride, stride], name=f"conv{index}"),
                  helper.make_node("Sigmoid", [f"c{index}"], [f"h{index}"], name=f"sigmoid{index}")]
        heads.append(f"h{index}")
        sizes.append((20 // stride, 20 // stride))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 20, 20])]
    return _tail(nodes, heads, channels, sizes, inputs, inits)


def _ort(model, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _build(model, precision: str, feeds: dict):
    dataset = None if precision == "fp16" else [{k: v * s for k, v in feeds.items()} for s in (1.0, -0.7, 0.5)]
    front = prepare(model, "rk3588", CompileOptions(precision=precision, dataset=dataset))
    return front, build_graph(front.graph)


def _run(built, feeds: dict) -> Runtime:
    runtime = Runtime(built)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return runtime


def _stored(runtime: Runtime, name: str) -> np.ndarray:
    """A tensor's stored values [1, C, H, W] from the memory image: element (c, h, w) at atom
    (c // C2) * surface + h * W + w, lane c % C2 (NUMERICS.md 8.1)."""
    info = runtime.tensor_info(name)
    _, c1, height, width, c2 = info["native_shape"]
    dtype = np.dtype(np.float16 if info["dtype"] == "float16" else np.int8)
    surface = info.get("surface_stride", height * width)
    raw = runtime.machine.memory.dump(int(info["address"]), c1 * surface * c2 * dtype.itemsize).view(dtype)
    atoms = raw.reshape(c1, surface, c2)[:, :height * width].reshape(c1, height, width, c2)
    return atoms.transpose(0, 3, 1, 2).reshape(c1 * c2, height, width)[:info["shape"][1]][None]


def _quant(runtime: Runtime, name: str):
    record = runtime.tensor_info(name)["quantization"]
    return types.SimpleNamespace(scale=float(record["scale"]), zero_point=int(record["zero_point"]))


def _joined(front) -> list[str]:
    """The tensors the FlatConcat reads (a graph input, or the identity conv -O3 puts after an odd-sized one)."""
    return next(node for node in front.graph.nodes if node.op_type == "FlatConcat").inputs


def _feeds(channels: int, sizes=HEADS, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {f"x{i}": rng.normal(0, 1, (1, channels, h, w)).astype(np.float16).astype(F32)
            for i, (h, w) in enumerate(sizes)}


@pytest.mark.parametrize("channels", [6, 8, 20])
def test_float16_tail_copies_the_heads_bit_for_bit(channels) -> None:
    model, feeds = heads_model(channels), _feeds(channels)
    front, built = _build(model, "fp16", feeds)
    assert front.partition.count("CPU") == 0
    assert [node.op_type for node in front.graph.nodes][-2:] == ["FlatConcat", "Readout"]
    record = next(t for t in built.trailer["tensors"] if t["name"] == "y")
    assert record["shape"] == [1, channels, 1, 46] and record["readout"] == {"perm": [0, 2, 3, 1],
                                                                              "shape": [1, 46, channels]}
    runtime = _run(built, feeds)
    heads = [_stored(runtime, name) for name in _joined(front)]
    want = reference_flat_concat({}, *heads).transpose(0, 2, 3, 1).reshape(1, 46, channels)
    got = runtime.output("y", dequantize=False)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(_stored(runtime, "y").view(np.uint16), reference_flat_concat({}, *heads).view(np.uint16))
    assert cosine(got.astype(F32), _ort(model, feeds)) >= 0.9999


@pytest.mark.parametrize("channels", [6, 20])
def test_int8_tail_requantizes_each_head_as_a_copy(channels) -> None:
    model, feeds = heads_model(channels), _feeds(channels, seed=2)
    front, built = _build(model, "int8", feeds)
    assert front.partition.count("CPU") == 0
    runtime = _run(built, feeds)
    out = _quant(runtime, "y")
    heads = [reference_copy(_stored(runtime, name), input_quant=_quant(runtime, name), output_quant=out)
             for name in _joined(front)]
    want = reference_flat_concat({}, *heads)
    np.testing.assert_array_equal(_stored(runtime, "y"), want)
    np.testing.assert_array_equal(runtime.output("y", dequantize=False), want.transpose(0, 2, 3, 1).reshape(1, 46, channels))
    assert cosine(runtime.output("y"), _ort(model, feeds)) >= 0.999


@pytest.mark.parametrize("precision, bound", [("fp16", 0.9999), ("int8", 0.995)])
def test_yolox_like_model_matches_onnxruntime(precision, bound) -> None:
    model = yolox_like()
    feeds = {"x": np.random.default_rng(3).normal(0, 1, (1, 3, 20, 20)).astype(F32)}
    front, built = _build(model, precision, feeds)
    assert front.partition.count("CPU") == 0
    assert [node.op_type for node in front.graph.nodes][-2:] == ["FlatConcat", "Readout"]
    got, want = _run(built, feeds).output("y"), _ort(model, feeds)
    assert got.shape == want.shape == (1, 400 + 100 + 25, 6)
    assert cosine(got, want) >= bound


def test_float_graph_matches_onnxruntime() -> None:
    model, feeds = heads_model(20), _feeds(20, seed=4)
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    np.testing.assert_allclose(evaluate(front.graph, feeds)["y"], _ort(model, feeds), rtol=0, atol=0)


def test_tails_the_rewrite_leaves_alone() -> None:
    """A Transpose that is not the graph output's, or a flattened head read elsewhere too, keep
    their host steps (the Concat then names its rank-3 shape in the partition report)."""
    model = heads_model(6)
    extra = helper.make_tensor_value_info("flat0", TensorProto.FLOAT, [1, 6, 25])
    model.graph.output.append(extra)  # the first head's flattened form is also a graph output
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    ops = [node.op_type for node in front.graph.nodes]
    assert "FlatConcat" not in ops and "Transpose" in ops
    assert front.partition.count("CPU") >= 2
