"""Conv and ConvTranspose against onnxruntime (rtol = atol = 1e-5 on sums of at most a few
hundred products of values in [-1, 1])."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper


@st.composite
def conv_cases(draw):
    group = draw(st.sampled_from([1, 2, 3]))
    depthwise = draw(st.booleans())
    in_per_group = 1 if depthwise else draw(st.integers(1, 3))
    out_per_group = draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    padding = draw(st.sampled_from(["pads", "SAME_UPPER", "SAME_LOWER", "VALID", "none"]))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    size = [draw(st.integers(e, e + 6)) for e in extent]
    attrs = {"group": group, "strides": strides, "dilations": dilations}
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    if padding == "pads":
        attrs["pads"] = pads
    elif padding != "none":
        attrs["auto_pad"] = padding
        if padding.startswith("SAME"):  # onnxruntime has no dilated SAME padding
            attrs["dilations"] = dilations = [1, 1]
            extent = kernel
    x_shape = [draw(st.integers(1, 2)), group * in_per_group, *size]
    w_shape = [group * out_per_group, in_per_group, *kernel]
    return attrs, x_shape, w_shape, draw(st.booleans())


@given(case=conv_cases())
def test_conv_2d(onnx_case, rand, case):
    attrs, x_shape, w_shape, bias = case
    inits = {"w": rand(w_shape, -1, 1, seed=1)}
    if bias:
        inits["b"] = rand([w_shape[0]], -1, 1, seed=2)
    node = helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["y"], **attrs)
    graph = onnx_case.check_node(node, {"x": rand(x_shape, -1, 1)}, initializers=inits)
    conv = graph.nodes[0]
    assert len(conv.attrs["pads"]) == 4 and "auto_pad" not in conv.attrs


@pytest.mark.parametrize("dims, attrs", [
    (1, {"pads": [1, 2], "strides": [2]}),
    (3, {"pads": [1, 0, 1, 0, 1, 1], "group": 2}),
])
def test_conv_1d_and_3d(onnx_case, rand, dims, attrs):
    spatial = [6] * dims
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    group = attrs.get("group", 1)
    onnx_case.check_node(node, {"x": rand([1, 2, *spatial], -1, 1)},
                         initializers={"w": rand([4, 2 // group, *[3] * dims], -1, 1, seed=1)})


@st.composite
def conv_transpose_cases(draw):
    group = draw(st.sampled_from([1, 2]))
    in_per_group, out_per_group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    size = [draw(st.integers(1, 5)), draw(st.integers(1, 5))]
    attrs = {"group": group, "strides": strides, "dilations": dilations}
    mode = draw(st.sampled_from(["pads", "output_padding", "output_shape", "SAME_UPPER", "SAME_LOWER", "none"]))
    if mode in ("pads", "output_padding"):
        attrs["pads"] = [draw(st.integers(0, (k - 1) * d // 2)) for k, d in zip(kernel * 2, dilations * 2)]
    if mode == "output_padding":
        # onnxruntime needs output_padding smaller than the stride
        attrs["output_padding"] = [draw(st.integers(0, s - 1)) for s in strides]
    if mode == "output_shape":
        full = [s * (n - 1) + (k - 1) * d + 1 for s, n, k, d in zip(strides, size, kernel, dilations)]
        attrs["output_shape"] = [draw(st.integers(max(1, f - 2), f)) for f in full]
    if mode.startswith("SAME"):
        attrs["auto_pad"] = mode
    x_shape = [1, group * in_per_group, *size]
    w_shape = [group * in_per_group, out_per_group, *kernel]
    return attrs, x_shape, w_shape, draw(st.booleans())


@given(case=conv_transpose_cases())
def test_conv_transpose_2d(onnx_case, rand, case):
    attrs, x_shape, w_shape, bias = case
    inits = {"w": rand(w_shape, -1, 1, seed=1)}
    if bias:
        inits["b"] = rand([w_shape[1] * attrs["group"]], -1, 1, seed=2)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"] if bias else ["x", "w"], ["y"], **attrs)
    onnx_case.check_node(node, {"x": rand(x_shape, -1, 1)}, initializers=inits)


def test_conv_transpose_2x2_stride_2_upsampler(onnx_case, rand):
    """The DBNet neck: ConvTranspose 2x2 stride 2 with bias."""
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    onnx_case.check_node(node, {"x": rand([1, 8, 5, 7])},
                         initializers={"w": rand([8, 4, 2, 2], seed=1), "b": rand([4], seed=2)})
