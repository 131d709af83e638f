"""Activations: import + float evaluation against onnxruntime (rtol = atol = 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@pytest.mark.parametrize("op, attrs", [
    ("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Softplus", {}), ("HardSwish", {}),
    ("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Elu", {}), ("Elu", {"alpha": 0.5}),
    ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.1, "beta": 0.6}),
])
@given(shape=shapes)
def test_unary_activation(onnx_case, rand, op, attrs, shape):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = onnx_case.check_node(node, {"x": rand(shape, -8, 8)}, opset=14)
    assert [n.op_type for n in graph.nodes] == [op]


def test_sigmoid_and_softplus_saturate_without_overflow(onnx_case):
    x = np.array([-1000.0, -80.0, 0.0, 80.0, 1000.0], np.float32)
    for op in ("Sigmoid", "Softplus", "Elu", "Tanh"):
        onnx_case.check_node(helper.make_node(op, ["x"], ["y"]), {"x": x})


@pytest.mark.parametrize("opset, low, high", [
    (13, 0.0, 6.0), (13, -1.5, None), (13, None, 0.5), (13, None, None), (11, 0.0, 6.0), (12, -2.0, 2.0),
])
def test_clip_bounds_as_inputs(onnx_case, rand, opset, low, high):
    inputs = ["x", "min" if low is not None else "", "max" if high is not None else ""]
    while inputs[-1] == "":
        inputs.pop()
    inits = {name: np.array(value, np.float32) for name, value in (("min", low), ("max", high)) if value is not None}
    node = helper.make_node("Clip", inputs, ["y"])
    graph = onnx_case.check_node(node, {"x": rand((2, 3, 4), -8, 8)}, opset=opset, initializers=inits)
    clip = graph.nodes[0]
    assert clip.inputs == ["x"]  # min/max became attributes
    assert clip.attrs["min"] == (low if low is not None else -np.inf)
    assert clip.attrs["max"] == (high if high is not None else np.inf)


@pytest.mark.parametrize("attrs", [{"min": 0.0, "max": 6.0}, {"min": -1.0}, {"max": 1.0}, {}])
def test_clip_bounds_as_attributes_before_opset_11(onnx_case, rand, attrs):
    node = helper.make_node("Clip", ["x"], ["y"], **attrs)
    graph = onnx_case.check_node(node, {"x": rand((2, 5), -8, 8)}, opset=10)
    assert graph.nodes[0].attrs["min"] == attrs.get("min", -float(np.finfo(np.float32).max))


@pytest.mark.parametrize("slope_shape", [(1,), (3, 1, 1), (1, 3, 1, 1), (4,)])
def test_prelu_broadcasts_slope(onnx_case, rand, slope_shape):
    node = helper.make_node("PRelu", ["x", "slope"], ["y"])
    onnx_case.check_node(node, {"x": rand((2, 3, 5, 4))}, initializers={"slope": rand(slope_shape, 0, 1, seed=1)})


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_opset_20(onnx_case, rand, approximate):
    node = helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)
    onnx_case.check_node(node, {"x": rand((3, 7), -5, 5)}, opset=20)
