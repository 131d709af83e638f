"""The YOLOX Focus block (four stride-2 Slices + Concat) as one 2x2 stride-2 selection conv
(compiler/passes/focus_as_conv.py; vendor fixture focus_slice_int8: ``Conv:Concat_26_2conv``).

The reference is numpy slicing of the input (``x[..., r::2, c::2]`` concatenated in the
model's order), written here, not the pass's weights: int8 builds must equal it exactly on the
stored bytes (the conv keeps the input's scale and zero point), float16 builds exactly on the
float16 input values.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.passes.focus_as_conv import SELECTION_ATTR
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine, onnxruntime_float

YOLOX_ORDER = ((0, 0), (1, 0), (0, 1), (1, 1))  # YOLOX: top-left, bottom-left, top-right, bottom-right
BIG = 2 ** 31 - 1  # exporters write INT_MAX as the end of an open slice


def _slice(nodes, inits, name, x, y, axes, starts, steps, ends=None):
    ends = ends or [BIG] * len(axes)
    for key, values in (("s", starts), ("e", ends), ("a", axes), ("t", steps)):
        inits.append(numpy_helper.from_array(np.asarray(values, np.int64), f"{name}_{key}"))
    nodes.append(helper.make_node("Slice", [x, f"{name}_s", f"{name}_e", f"{name}_a", f"{name}_t"], [y], name=name))


def focus_model(shape=(1, 3, 8, 12), order=YOLOX_ORDER, *, two_slices=True, step=2, head=False,
                extra_reader=False, ends=None, cat_axis=1, shared_rows=False, all_axes=False) -> onnx.ModelProto:
    """x -> Focus (phases in ``order``) -> 'cat' (the output), or -> a 3x3 conv 'y' with ``head``.
    ``shared_rows``: one H slice per row phase, read by two W slices (a CSE'd export);
    ``all_axes``: one Slice per phase listing N and C too (start 0, step 1)."""
    nodes, inits, cat_inputs = [], [], []
    for index, (row, col) in enumerate(order):
        out = f"p{index}"
        if shared_rows:
            if f"row{row}" not in [node.output[0] for node in nodes]:
                _slice(nodes, inits, f"sr{row}", "x", f"row{row}", [2], [row], [step])
            _slice(nodes, inits, f"sw{index}", f"row{row}", out, [3], [col], [step])
        elif all_axes:
            _slice(nodes, inits, f"s{index}", "x", out, [0, 1, 2, 3], [0, 0, row, col], [1, 1, step, step])
        elif two_slices:  # the torch export: x[..., r::2, :] then [..., c::2]
            _slice(nodes, inits, f"sh{index}", "x", f"h{index}", [2], [row], [step], ends and ends[:1])
            _slice(nodes, inits, f"sw{index}", f"h{index}", out, [3], [col], [step], ends and ends[1:])
        else:
            _slice(nodes, inits, f"s{index}", "x", out, [2, 3], [row, col], [step, step], ends)
        cat_inputs.append(out)
    nodes.append(helper.make_node("Concat", cat_inputs, ["cat"], name="focus_cat", axis=cat_axis))
    outputs = ["cat"]
    if extra_reader:  # an intermediate slice also read elsewhere: the block must stay
        nodes.append(helper.make_node("Relu", ["h0"], ["side"], name="side"))
        outputs.append("side")
    if head:
        rng = np.random.default_rng(3)
        weight = rng.normal(0, 0.3, (8, 4 * shape[1], 3, 3)).astype(np.float32)
        inits += [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.zeros(8, np.float32), "b")]
        nodes.append(helper.make_node("Conv", ["cat", "w", "b"], ["y"], name="head", kernel_shape=[3, 3], pads=[1] * 4))
        outputs = ["y"]
    graph = helper.make_graph(nodes, "focus", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def focus_reference(x: np.ndarray, order=YOLOX_ORDER) -> np.ndarray:
    return np.concatenate([x[:, :, row::2, col::2] for row, col in order], axis=1)


def _ops(graph) -> list[str]:
    return [node.op_type for node in graph.nodes]


# --- the pass ---------------------------------------------------------------------------------

@pytest.mark.parametrize("form", [dict(two_slices=True), dict(two_slices=False), dict(shared_rows=True),
                                  dict(all_axes=True)])
@pytest.mark.parametrize("order", [YOLOX_ORDER, ((0, 0), (0, 1), (1, 0), (1, 1)), ((1, 1), (0, 1), (1, 0), (0, 0))])
def test_focus_becomes_one_selection_conv(order, form) -> None:
    model = focus_model(order=order, **form)
    graph = prepare(model, "rk3588", CompileOptions(precision="float")).graph
    assert _ops(graph) == ["Conv"], _ops(graph)
    conv = graph.nodes[0]
    assert conv.attrs["kernel_shape"] == [2, 2] and conv.attrs["strides"] == [2, 2] and conv.attrs[SELECTION_ATTR]
    weight = graph.tensor(conv.inputs[1]).data
    assert weight.shape == (12, 3, 2, 2) and set(np.unique(weight)) == {0.0, 1.0} and weight.sum() == 12
    x = np.random.default_rng(0).normal(size=(1, 3, 8, 12)).astype(np.float32)
    assert np.array_equal(onnxruntime_float(model, x), focus_reference(x, order))


@pytest.mark.parametrize("case", [
    dict(step=3),                                             # not stride 2
    dict(order=((0, 0), (1, 0), (0, 1), (1, 0))),             # a phase twice, one missing
    dict(cat_axis=0),                                         # the phases stacked on the batch axis
    dict(ends=[6, 12]),                                       # the rows stop early
    dict(extra_reader=True),                                  # an intermediate slice read elsewhere
])
def test_near_misses_are_left_alone(case) -> None:
    graph = prepare(focus_model(**case), "rk3588", CompileOptions(precision="float")).graph
    assert "Slice" in _ops(graph) and not any(node.attrs.get(SELECTION_ATTR) for node in graph.nodes), _ops(graph)


def test_focus_rewrite_is_a_level_3_pass() -> None:
    graph = prepare(focus_model(), "rk3588", CompileOptions(precision="float", optimization_level=2)).graph
    assert _ops(graph).count("Slice") == 8 and "Concat" in _ops(graph)


# --- on the emulated NPU -----------------------------------------------------------------------

def _run(graph, x):
    built = build_graph(graph)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return built, runtime.output(graph.outputs[0], dequantize=False)


@pytest.mark.parametrize("shape", [(1, 3, 8, 12), (1, 3, 128, 128), (1, 5, 6, 20)])
def test_float16_focus_is_exact_on_the_npu(shape) -> None:
    model = focus_model(shape)
    graph = prepare(model, "rk3588", CompileOptions(precision="fp16")).graph
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    built, got = _run(graph, x)
    assert [step.kind for step in built.schedule()] == ["npu"]
    assert got.dtype == np.float16
    assert np.array_equal(got, focus_reference(x.astype(np.float16)))


@pytest.mark.parametrize("shape", [(1, 3, 8, 12), (1, 3, 128, 128)])
def test_int8_focus_keeps_the_input_quantization_and_is_exact(shape) -> None:
    model = focus_model(shape)
    rng = np.random.default_rng(2)
    samples = [{"x": rng.uniform(0, 1, size=shape).astype(np.float32)} for _ in range(3)]
    graph = prepare(model, "rk3588", CompileOptions(dataset=samples)).graph
    source, result = graph.tensor("x").quant, graph.tensor("cat").quant
    assert float(source.scale) == float(result.scale) and int(source.zero_point) == int(result.zero_point)
    stored = rng.integers(-128, 128, size=shape, dtype=np.int8)
    built, got = _run(graph, stored)
    assert [step.kind for step in built.schedule()] == ["npu"]
    assert got.dtype == np.int8 and np.array_equal(got, focus_reference(stored))


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_focus_then_conv_matches_onnxruntime(precision) -> None:
    """The fixture's block (Focus + 3x3 conv) end to end."""
    shape = (1, 3, 32, 32)
    model = focus_model(shape, head=True)
    rng = np.random.default_rng(4)
    options = CompileOptions(precision="fp16") if precision == "fp16" else \
        CompileOptions(dataset=[{"x": rng.uniform(0, 1, size=shape).astype(np.float32)} for _ in range(3)])
    graph = prepare(model, "rk3588", options).graph
    x = rng.uniform(0, 1, size=shape).astype(np.float32)
    built = build_graph(graph)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    assert [step.kind for step in built.schedule()] == ["npu"]
    assert cosine(runtime.output("y"), onnxruntime_float(model, x)) >= (0.99999 if precision == "fp16" else 0.999)
