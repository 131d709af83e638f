"""MatMul, Gemm, BatchNormalization, LayerNormalization, Softmax against onnxruntime
(rtol = atol = 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4, 3)), ((2, 3, 4), (4,)),
    ((4,), (4,)), ((1, 197, 64), (1, 64, 197)),
])
@pytest.mark.parametrize("constant_b", [False, True])
def test_matmul(onnx_case, rand, a_shape, b_shape, constant_b):
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    a, b = rand(a_shape, -1, 1), rand(b_shape, -1, 1, seed=1)
    if constant_b:
        onnx_case.check_node(node, {"a": a}, initializers={"b": b})
    else:
        onnx_case.check_node(node, {"a": a, "b": b})


@given(m=st.integers(1, 4), k=st.integers(1, 6), n=st.integers(1, 5), trans_a=st.integers(0, 1),
       trans_b=st.integers(0, 1), alpha=st.sampled_from([1.0, 0.5, -2.0]), beta=st.sampled_from([1.0, 0.25]),
       c_kind=st.sampled_from(["none", "scalar", "row", "column", "full"]))
def test_gemm(onnx_case, rand, m, k, n, trans_a, trans_b, alpha, beta, c_kind):
    c_shapes = {"scalar": (), "row": (n,), "column": (m, 1), "full": (m, n)}
    inits = {"b": rand((n, k) if trans_b else (k, n), -1, 1, seed=1)}
    inputs = ["a", "b"]
    if c_kind != "none":
        inits["c"] = rand(c_shapes[c_kind], -1, 1, seed=2)
        inputs.append("c")
    node = helper.make_node("Gemm", inputs, ["y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    onnx_case.check_node(node, {"a": rand((k, m) if trans_a else (m, k), -1, 1)}, initializers=inits)


@pytest.mark.parametrize("opset", [9, 13, 15])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 4), (2, 3, 6)])
def test_batch_normalization(onnx_case, rand, opset, shape):
    channels = shape[1]
    inits = {"scale": rand([channels], 0.5, 2, seed=1), "bias": rand([channels], seed=2),
             "mean": rand([channels], seed=3), "var": rand([channels], 0.1, 3, seed=4)}
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3)
    onnx_case.check_node(node, {"x": rand(shape)}, opset=opset, initializers=inits)


@pytest.mark.parametrize("axis", [-1, -2, 1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_normalization(onnx_case, rand, axis, with_bias):
    shape = (2, 3, 8)
    norm_shape = shape[axis:]
    inits = {"scale": rand(norm_shape, 0.5, 2, seed=1)}
    if with_bias:
        inits["bias"] = rand(norm_shape, seed=2)
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"] if with_bias else ["x", "scale"], ["y"],
                            axis=axis, epsilon=1e-5)
    onnx_case.check_node(node, {"x": rand(shape, -3, 3)}, opset=17, initializers=inits)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_softmax_axis_semantics_per_opset(onnx_case, rand, opset, axis):
    """Before opset 13 Softmax flattens to 2-D at ``axis`` (default 1); since 13 it works
    along ``axis`` (default -1)."""
    attrs = {} if axis is None else {"axis": axis}
    graph = onnx_case.check_node(helper.make_node("Softmax", ["x"], ["y"], **attrs),
                                 {"x": rand((2, 3, 4), -5, 5)}, opset=opset)
    effective = (1 if opset < 13 else 2) if axis is None else axis % 3
    assert graph.nodes[0].attrs == {"axis": effective, "flatten_2d": int(opset < 13 and effective != 2)}


def test_softmax_large_logits_are_stable(onnx_case):
    x = np.array([[1000.0, 999.0, -1000.0]], np.float32)
    onnx_case.check_node(helper.make_node("Softmax", ["x"], ["y"]), {"x": x})
