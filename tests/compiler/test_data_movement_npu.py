"""Data movement on the NPU (compiler/LOWERING.md section 20): channel Concats whose inputs do not
start on C2 surfaces as placement convs chained by residual adds (passes/concat_as_convs.py).

References are numpy concatenations written here: float16 builds equal them exactly; int8
builds equal the concatenation of the dequantized inputs requantized to the output's scale
(the partial results share the output's parameters, so each input is
rounded once and the residual adds pass stored values through).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.passes.concat_as_convs import placement_weights
from npuemu.emulator.runtime import Runtime

HEIGHT, WIDTH = 6, 10


def concat_model(channels: tuple[int, ...]) -> onnx.ModelProto:
    names = [f"x{index}" for index in range(len(channels))]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, count, HEIGHT, WIDTH])
              for name, count in zip(names, channels)]
    node = helper.make_node("Concat", names, ["y"], name="cat", axis=1)
    graph = helper.make_graph([node], "cat", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _inputs(channels, seed):
    rng = np.random.default_rng(seed)  # different ranges per input: different int8 scales
    return {f"x{i}": rng.normal(0, 1 + 2 * i, size=(1, c, HEIGHT, WIDTH)).astype(np.float32)
            for i, c in enumerate(channels)}


def _options(precision, channels, level=3):
    if precision == "fp16":
        return CompileOptions(precision="fp16", optimization_level=level)
    return CompileOptions(dataset=[_inputs(channels, seed) for seed in range(3)], optimization_level=level)


def _run(graph, feeds):
    built = build_graph(graph)
    runtime = Runtime(built)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return built, runtime


YOLOX_HEAD = (4, 1, 1)  # box, objectness, one class: common_det's head at each scale


def test_placement_weights_put_each_channel_at_its_offset() -> None:
    weights = placement_weights(3, 5, 9)[:, :, 0, 0]
    want = np.zeros((9, 3))
    want[5, 0] = want[6, 1] = want[7, 2] = 1
    assert np.array_equal(weights, want)


@pytest.mark.parametrize("channels", [YOLOX_HEAD, (3, 5), (1, 8, 2), (7, 9, 17)])
def test_float16_unaligned_concat_is_exact_on_the_npu(channels) -> None:
    graph = prepare(concat_model(channels), "rk3588", _options("fp16", channels)).graph
    assert "Concat" not in [node.op_type for node in graph.nodes]
    feeds = _inputs(channels, 7)
    built, runtime = _run(graph, feeds)
    assert [step.kind for step in built.schedule()] == ["npu"]
    got = runtime.output("y", dequantize=False)
    want = np.concatenate([feeds[f"x{i}"].astype(np.float16) for i in range(len(channels))], axis=1)
    assert got.dtype == np.float16 and np.array_equal(got, want)
    assert len([info for info in built.layers() if info.target == "NPU"]) == len(channels)


@settings(max_examples=8, deadline=None)
@given(channels=st.lists(st.integers(1, 20), min_size=2, max_size=4).map(tuple))
def test_float16_concat_of_any_channels_is_exact(channels) -> None:
    """Any channel counts (aligned or not) in float16: a copy or placement convs, always exact."""
    graph = prepare(concat_model(channels), "rk3588", _options("fp16", channels)).graph
    feeds = _inputs(channels, 13)
    built, runtime = _run(graph, feeds)
    want = np.concatenate([feeds[f"x{i}"].astype(np.float16) for i in range(len(channels))], axis=1)
    assert np.array_equal(runtime.output("y", dequantize=False), want)


@pytest.mark.parametrize("channels", [YOLOX_HEAD, (8, 3), (5, 16, 2)])
def test_int8_unaligned_concat_rounds_each_input_once(channels) -> None:
    graph = prepare(concat_model(channels), "rk3588", _options("int8", channels)).graph
    feeds = _inputs(channels, 11)
    built, runtime = _run(graph, feeds)
    assert [step.kind for step in built.schedule()] == ["npu"]
    stored = runtime.output("y", dequantize=False).astype(np.int64)
    dequantized = []
    for i in range(len(channels)):  # the inputs as the NPU holds them (stored int8, dequantized)
        quant = graph.tensor(f"x{i}").quant
        q = np.clip(np.rint(feeds[f"x{i}"] / float(quant.scale)) + int(quant.zero_point), -128, 127)
        dequantized.append(float(quant.scale) * (q - int(quant.zero_point)))
    out = graph.tensor("y").quant
    want = np.clip(np.rint(np.concatenate(dequantized, axis=1) / float(out.scale)) + int(out.zero_point), -128, 127)
    partials = [node.outputs[0] for node in graph.nodes]
    assert len({(float(graph.tensor(n).quant.scale), int(graph.tensor(n).quant.zero_point)) for n in partials}) == 1
    assert np.array_equal(stored, want), f"{np.mean(stored == want):.4f} equal, max {np.abs(stored - want).max()}"


def _far_apart(seed):
    """YOLOX's head: box offsets in the hundreds beside scores in [0, 1]."""
    rng = np.random.default_rng(seed)
    return {"x0": rng.normal(0, 300, size=(1, 4, HEIGHT, WIDTH)).astype(np.float32),
            "x1": rng.uniform(0, 1, size=(1, 1, HEIGHT, WIDTH)).astype(np.float32),
            "x2": rng.uniform(0, 1, size=(1, 1, HEIGHT, WIDTH)).astype(np.float32)}


def test_int8_concat_of_far_apart_ranges_fits_the_residual_converter() -> None:
    # s_out / s_in ~ 2000: with the ones stored as 127 the EW converter's ratio s_r / (s_in s_w)
    # would pass 2^15; the placement weights are stored as q < 127 with scale 1/q (quantize.py
    # _placement_headroom), still exact
    options = CompileOptions(dataset=[_far_apart(seed) for seed in range(3)])
    graph = prepare(concat_model(YOLOX_HEAD), "rk3588", options).graph
    placed = [node for node in graph.nodes if node.attrs.get("placement") and node.fused]
    ones = {round(1 / float(np.asarray(graph.tensor(node.inputs[1]).quant.scale).reshape(-1)[0])) for node in placed}
    assert placed and max(ones) < 127
    feeds = _far_apart(11)
    built, runtime = _run(graph, feeds)
    assert [step.kind for step in built.schedule()] == ["npu"]
    stored = runtime.output("y", dequantize=False).astype(np.int64)
    dequantized = []
    for name in ("x0", "x1", "x2"):
        quant = graph.tensor(name).quant
        q = np.clip(np.rint(feeds[name] / float(quant.scale)) + int(quant.zero_point), -128, 127)
        dequantized.append(float(quant.scale) * (q - int(quant.zero_point)))
    out = graph.tensor("y").quant
    want = np.clip(np.rint(np.concatenate(dequantized, axis=1) / float(out.scale)) + int(out.zero_point), -128, 127)
    assert np.array_equal(stored, want), f"{np.mean(stored == want):.4f} equal, max {np.abs(stored - want).max()}"


@pytest.mark.parametrize("precision, channels", [("fp16", (8, 3)), ("int8", (16, 5)), ("int8", (32, 16, 7))])
def test_aligned_concats_stay_copies(precision, channels) -> None:
    """Inputs on C2 boundaries (8 float16, 16 int8; the last may be partial): the DPU copy, unchanged."""
    graph = prepare(concat_model(channels), "rk3588", _options(precision, channels)).graph
    assert [node.op_type for node in graph.nodes] == ["Concat"]


def test_below_level_3_the_unaligned_concat_is_a_host_step() -> None:
    channels = YOLOX_HEAD
    graph = prepare(concat_model(channels), "rk3588", _options("fp16", channels, level=2)).graph
    built, runtime = _run(graph, _inputs(channels, 3))
    assert [getattr(step, "op", None) for step in built.schedule()] == ["Concat"]


# --- channel Split off C2 boundaries: 1x1 selection convs (passes/split_as_convs.py) -------------

def split_model(sizes: tuple[int, ...]) -> onnx.ModelProto:
    outputs = [f"y{index}" for index in range(len(sizes))]
    split = helper.make_tensor("sizes", TensorProto.INT64, [len(sizes)], list(sizes))
    node = helper.make_node("Split", ["x", "sizes"], outputs, name="split", axis=1)
    graph = helper.make_graph([node], "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, sum(sizes), HEIGHT, WIDTH])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
                              [split])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _split_options(precision, sizes):
    if precision == "fp16":
        return CompileOptions(precision="fp16")
    rng = np.random.default_rng(5)
    return CompileOptions(dataset=[{"x": rng.normal(size=(1, sum(sizes), HEIGHT, WIDTH)).astype(np.float32)}
                                   for _ in range(3)])


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("sizes", [(3, 5), (4, 1, 1), (5, 16, 3)])
def test_unaligned_split_is_exact_on_the_npu(precision, sizes) -> None:
    """Every output is the input's channel range: float16 values as fed, int8 stored bytes as fed
    (the selection convs keep the input's scale and zero point)."""
    graph = prepare(split_model(sizes), "rk3588", _split_options(precision, sizes)).graph
    assert "Split" not in [node.op_type for node in graph.nodes]
    rng = np.random.default_rng(9)
    shape = (1, sum(sizes), HEIGHT, WIDTH)
    x = rng.normal(size=shape).astype(np.float16) if precision == "fp16" else \
        rng.integers(-128, 128, size=shape, dtype=np.int8)
    built, runtime = _run(graph, {"x": x.astype(np.float32) if precision == "fp16" else x})
    assert [step.kind for step in built.schedule()] == ["npu"]
    for index, start in enumerate(np.cumsum([0, *sizes[:-1]])):
        got = runtime.output(f"y{index}", dequantize=False)
        assert got.dtype == x.dtype and np.array_equal(got, x[:, start:start + sizes[index]]), index


@pytest.mark.parametrize("precision, sizes", [("fp16", (8, 3)), ("int8", (16, 5))])
def test_aligned_splits_stay_copies(precision, sizes) -> None:
    graph = prepare(split_model(sizes), "rk3588", _split_options(precision, sizes)).graph
    assert [node.op_type for node in graph.nodes] == ["Split"]


# --- standalone zero Pad: a 1x1 depthwise identity conv with that padding (passes/pad_as_conv.py) --

def pad_model(pads, mode="constant", value=0.0, channels=5) -> onnx.ModelProto:
    inits = [helper.make_tensor("pads", TensorProto.INT64, [8], list(pads)),
             helper.make_tensor("value", TensorProto.FLOAT, [], [value])]
    node = helper.make_node("Pad", ["x", "pads", "value"], ["y"], name="pad", mode=mode)
    graph = helper.make_graph([node], "pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           [1, channels, HEIGHT, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _pad_options(precision):
    if precision == "fp16":
        return CompileOptions(precision="fp16")
    rng = np.random.default_rng(6)
    return CompileOptions(dataset=[{"x": rng.normal(size=(1, 5, HEIGHT, WIDTH)).astype(np.float32)} for _ in range(3)])


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("pads", [(0, 0, 1, 1, 0, 0, 1, 1), (0, 0, 0, 2, 0, 0, 3, 0), (0, 0, 15, 0, 0, 0, 0, 6),
                                  (0, 0, 4, 0, 0, 0, 4, 7)])
def test_zero_pad_is_exact_on_the_npu(precision, pads) -> None:
    graph = prepare(pad_model(pads), "rk3588", _pad_options(precision)).graph
    assert [node.op_type for node in graph.nodes] == ["Conv"]
    rng = np.random.default_rng(8)
    shape = (1, 5, HEIGHT, WIDTH)
    x = rng.normal(size=shape).astype(np.float16) if precision == "fp16" else \
        rng.integers(-128, 128, size=shape, dtype=np.int8)
    built, runtime = _run(graph, {"x": x.astype(np.float32) if precision == "fp16" else x})
    assert [step.kind for step in built.schedule()] == ["npu"]
    fill = 0 if precision == "fp16" else int(graph.tensor("x").quant.zero_point)  # real 0 in int8
    want = np.pad(x, [(0, 0), (0, 0), (pads[2], pads[6]), (pads[3], pads[7])], constant_values=fill)
    got = runtime.output("y", dequantize=False)
    assert got.dtype == x.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("case", [
    dict(pads=(0, 0, 1, 1, 0, 0, 1, 1), mode="reflect"),
    dict(pads=(0, 0, 1, 1, 0, 0, 1, 1), value=1.5),
    dict(pads=(0, 1, 0, 0, 0, 1, 0, 0)),          # channels padded
    dict(pads=(0, 0, 16, 0, 0, 0, 0, 0)),         # above the 4-bit PAD_CON0 field
    dict(pads=(0, 0, 9, 0, 0, 0, 7, 0)),          # t + b above the field
    dict(pads=(0, 0, -1, 0, 0, 0, 0, 0)),         # a crop
])
def test_other_pads_stay_host_steps(case) -> None:
    graph = prepare(pad_model(**case), "rk3588", _pad_options("fp16")).graph
    assert [(node.op_type, node.target) for node in graph.nodes] == [("Pad", "CPU")]
