"""ReduceMean, ReduceMax, ReduceSum and ArgMax against onnxruntime (rtol = atol = 1e-5),
with axes as attribute (before opset 18; ReduceSum before 13) or input."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

SHAPE = (2, 3, 4, 5)


def _reduce_node(op: str, opset: int, axes: list[int] | None, keepdims: int, **extra):
    axes_as_input = opset >= (13 if op == "ReduceSum" else 18)
    if axes_as_input:
        inputs = ["x", "axes"] if axes is not None else ["x"]
        inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
        return helper.make_node(op, inputs, ["y"], keepdims=keepdims, **extra), inits
    attrs = {"axes": axes} if axes is not None else {}
    return helper.make_node(op, ["x"], ["y"], keepdims=keepdims, **attrs), {}


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceSum"])
@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axes", [None, [1], [-1, -2], [0, 2, 3]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce(onnx_case, rand, op, opset, axes, keepdims):
    node, inits = _reduce_node(op, opset, axes, keepdims)
    graph = onnx_case.check_node(node, {"x": rand(SHAPE)}, opset=opset, initializers=inits)
    assert graph.nodes[0].attrs["axes"] == (sorted(a % 4 for a in axes) if axes else [0, 1, 2, 3])


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
def test_reduce_noop_with_empty_axes_is_removed(onnx_case, rand, op):
    node = helper.make_node(op, ["x"], ["r"], keepdims=1, noop_with_empty_axes=1)
    relu = helper.make_node("Relu", ["r"], ["y"])
    model = onnx_case.model([node, relu], {"x": SHAPE}, ["y"], opset=18)
    graph = onnx_case.check(model, {"x": rand(SHAPE)})
    assert [n.op_type for n in graph.nodes] == ["Relu"]


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("select_last_index", [0, 1])
def test_argmax(onnx_case, axis, keepdims, select_last_index):
    x = np.random.default_rng(0).integers(0, 3, size=(3, 4, 5)).astype(np.float32)  # many ties
    node = helper.make_node("ArgMax", ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=select_last_index)
    onnx_case.check_node(node, {"x": x})
