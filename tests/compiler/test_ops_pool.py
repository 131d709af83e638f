"""MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool against onnxruntime
(rtol = atol = 1e-5)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from onnx import helper


@st.composite
def pool_cases(draw, op):
    kernel = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    attrs = {"kernel_shape": kernel, "strides": strides, "ceil_mode": draw(st.integers(0, 1))}
    dilations = [1, 1]
    if op == "MaxPool" or draw(st.booleans()):
        dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    padding = draw(st.sampled_from(["pads", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if padding == "pads":
        # onnxruntime needs each pad smaller than the kernel extent
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = padding
        dilations = [1, 1]  # no dilated SAME pooling in onnxruntime
        # onnxruntime computes negative SAME pads when the stride exceeds the kernel
        attrs["strides"] = [min(s, k) for s, k in zip(strides, kernel)]
    if dilations != [1, 1]:
        attrs["dilations"] = dilations
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    size = [draw(st.integers(e, e + 5)) for e in extent]
    return attrs, [1, 2, *size]


@given(case=pool_cases("MaxPool"))
def test_max_pool(onnx_case, rand, case):
    attrs, shape = case
    onnx_case.check_node(helper.make_node("MaxPool", ["x"], ["y"], **attrs), {"x": rand(shape)}, opset=13)


@given(case=pool_cases("AveragePool"))
def test_average_pool(onnx_case, rand, case):
    attrs, shape = case
    # dilated AveragePool exists since opset 19
    opset = 19 if "dilations" in attrs else 13
    assume(not (attrs.get("auto_pad", "").startswith("SAME") and attrs["ceil_mode"]))
    onnx_case.check_node(helper.make_node("AveragePool", ["x"], ["y"], **attrs), {"x": rand(shape)}, opset=opset)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
])
def test_average_pool_ceil_mode_divisors(onnx_case, rand, attrs):
    """Windows that reach past the explicit pads in ceil mode divide by the cells they cover."""
    onnx_case.check_node(helper.make_node("AveragePool", ["x"], ["y"], **attrs), {"x": rand([1, 3, 6, 7])})


def test_max_pool_2x2_stride_2(onnx_case, rand):
    graph = onnx_case.check_node(helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
                                 {"x": rand([1, 4, 48, 192])})
    assert graph.tensors["y"].shape == (1, 4, 24, 96)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [[1, 3, 7, 5], [2, 4, 1, 1], [1, 2, 9]])
def test_global_pools(onnx_case, rand, op, shape):
    onnx_case.check_node(helper.make_node(op, ["x"], ["y"]), {"x": rand(shape)})


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices_match_onnxruntime(onnx_case, rand, storage_order):
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 3], strides=[2, 1], pads=[1, 0, 0, 1],
                            storage_order=storage_order)
    model = onnx_case.model([node], {"x": [2, 3, 5, 6]}, ["y", "i"])
    onnx_case.check(model, {"x": rand([2, 3, 5, 6])})
