"""Broadcasting arithmetic and unary math against onnxruntime (rtol = atol = 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper


@st.composite
def broadcast_pairs(draw):
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4))
    return shapes.input_shapes


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@given(shapes=broadcast_pairs(), constant_second=st.booleans())
def test_binary_broadcasting(onnx_case, rand, op, shapes, constant_second):
    a = rand(shapes[0], seed=1)
    b = rand(shapes[1], 0.5, 2.0, seed=2) * np.where(rand(shapes[1], seed=3) < 0, -1, 1).astype(np.float32)
    node = helper.make_node(op, ["a", "b"], ["y"])
    if constant_second:
        onnx_case.check_node(node, {"a": a}, initializers={"b": b})
    else:
        onnx_case.check_node(node, {"a": a, "b": b})


@pytest.mark.parametrize("exponent", [np.float32(2.0), np.float32(0.5), np.array([1.0, 2.0, 3.0], np.float32)])
def test_pow(onnx_case, rand, exponent):
    node = helper.make_node("Pow", ["x", "e"], ["y"])
    onnx_case.check_node(node, {"x": rand((2, 3), 0.1, 3)}, initializers={"e": np.asarray(exponent)})


@pytest.mark.parametrize("op, low, high", [("Sqrt", 0.0, 9.0), ("Exp", -10.0, 10.0), ("Erf", -4.0, 4.0)])
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3))
def test_unary_math(onnx_case, rand, op, low, high, shape):
    onnx_case.check_node(helper.make_node(op, ["x"], ["y"]), {"x": rand(shape, low, high)})


@pytest.mark.parametrize("folded", [False, True])
def test_integer_div_truncates_toward_zero(onnx_case, folded):
    a = np.array([7, -7, 7, -7], np.int64)
    b = np.array([2, 2, -2, -2], np.int64)
    node = helper.make_node("Div", ["a", "b"], ["y"])
    if folded:
        graph = onnx_case.check_node(node, {}, initializers={"a": a, "b": b})
        assert not graph.nodes and graph.tensors["y"].data.tolist() == [3, -3, -3, 3]
    else:
        onnx_case.check_node(node, {"a": a, "b": b})
