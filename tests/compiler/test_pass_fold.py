"""Folding: BatchNormalization into Conv/ConvTranspose/FC (exact to float rounding), standalone
BN as a 1x1 depthwise scale+bias conv, per-channel Mul/Add folded into the layer before or
after them where exact, and where not."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.compiler.pass_cases import fused, ops, only, weights

RNG = np.random.default_rng(21)
F = np.float32


def _bn_inits(channels: int, prefix: str = "bn") -> dict[str, np.ndarray]:
    return {f"{prefix}_scale": RNG.uniform(0.5, 1.5, channels).astype(F),
            f"{prefix}_bias": RNG.uniform(-1, 1, channels).astype(F),
            f"{prefix}_mean": RNG.uniform(-1, 1, channels).astype(F),
            f"{prefix}_var": RNG.uniform(0.5, 2.0, channels).astype(F)}


def _bn(source: str, out: str = "y", prefix: str = "bn") -> object:
    return helper.make_node("BatchNormalization", [source, *(f"{prefix}_{k}" for k in ("scale", "bias", "mean", "var"))],
                            [out], name=prefix, epsilon=1e-3)


def _conv(op: str, **attrs) -> object:
    return helper.make_node(op, ["x", "w", "b"], ["c"], name="conv", **attrs)


CONVS = {  # node, weight shape, output channels
    "conv": (_conv("Conv", pads=[1, 1, 1, 1]), [6, 4, 3, 3], 6),
    "depthwise": (_conv("Conv", pads=[1, 1, 1, 1], group=4), [4, 1, 3, 3], 4),
    "grouped": (_conv("Conv", group=2), [6, 2, 1, 1], 6),
    "dilated": (_conv("Conv", dilations=[2, 2], pads=[2, 2, 2, 2]), [6, 4, 3, 3], 6),
    "transposed": (_conv("ConvTranspose", strides=[2, 2]), [4, 6, 3, 3], 6),
    "transposed-grouped": (_conv("ConvTranspose", strides=[2, 2], group=2, output_padding=[1, 1]), [4, 3, 2, 2], 6),
}


@pytest.mark.parametrize("kind", sorted(CONVS))
def test_batch_norm_folds_into_the_conv_before_it(onnx_case, rand, kind):
    conv, weight_shape, channels = CONVS[kind]
    inits = {"w": weights(RNG, weight_shape), "b": rand([channels], seed=3), **_bn_inits(channels)}
    model = onnx_case.model([conv, _bn("c")], {"x": [1, 4, 6, 6]}, ["y"], inits)
    graph = fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1)}, level=1)
    assert ops(graph) == [conv.op_type] and graph.nodes[0].name == "conv"


def test_batch_norm_folds_into_a_fully_connected_layer(onnx_case, rand):
    nodes = [helper.make_node("Gemm", ["x", "m"], ["g"], name="fc"), _bn("g")]
    model = onnx_case.model(nodes, {"x": [1, 12]}, ["y"], {"m": weights(RNG, [12, 5]), **_bn_inits(5)})
    assert ops(fused(onnx_case, model, {"x": rand([1, 12], seed=1)}, level=1)) == ["FullyConnected"]


def test_batch_norm_of_a_conv_read_elsewhere_becomes_a_depthwise_scale_bias_conv(onnx_case, rand):
    conv = helper.make_node("Conv", ["x", "w"], ["c"], name="conv")
    model = onnx_case.model([conv, _bn("c")], {"x": [1, 4, 6, 6]}, ["c", "y"], {"w": weights(RNG, [6, 4, 1, 1]),
                                                                                **_bn_inits(6)})
    graph = fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1)}, level=1)
    assert ops(graph) == ["Conv", "Conv"]
    scale_bias = graph.nodes[1]
    assert scale_bias.name == "bn" and scale_bias.attrs["group"] == 6 and scale_bias.attrs["kernel_shape"] == [1, 1]


def test_standalone_batch_norm_on_an_input(onnx_case, rand):
    model = onnx_case.model([_bn("x")], {"x": [1, 6, 4, 4]}, ["y"], _bn_inits(6))
    graph = fused(onnx_case, model, {"x": rand([1, 6, 4, 4], seed=1)}, level=1)
    assert ops(graph) == ["Conv"] and graph.nodes[0].target == "NPU"


def test_batch_norm_of_a_3d_tensor_stays(onnx_case, rand):
    model = onnx_case.model([_bn("x")], {"x": [1, 6, 10]}, ["y"], _bn_inits(6))
    assert ops(fused(onnx_case, model, {"x": rand([1, 6, 10], seed=1)}, level=1)) == ["BatchNormalization"]


# ---- per-channel Mul/Add ---------------------------------------------------------------------

def test_scale_and_shift_after_a_conv_fold_into_weights_and_bias_add(onnx_case, rand):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Mul", ["k", "c"], ["s"], name="scale"),
             helper.make_node("Add", ["s", "t"], ["a"], name="shift"), helper.make_node("Relu", ["a"], ["y"])]
    inits = {"w": weights(RNG, [6, 4, 3, 3]), "k": rand([6, 1, 1], 0.5, 2, seed=2), "t": rand([1, 6, 1, 1], seed=3)}
    model = onnx_case.model(nodes, {"x": [1, 4, 6, 6]}, ["y"], inits)
    graph = fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1)}, level=1)
    assert ops(graph) == ["Conv+Add+Relu"] and graph.nodes[0].layer_name == "conv_fuse_bias_add_relu"


def test_shift_then_scale_scales_the_bias_add_too(onnx_case, rand):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Sub", ["c", "t"], ["s"]), helper.make_node("Div", ["s", "k"], ["y"])]
    inits = {"w": weights(RNG, [6, 4, 1, 1]), "b": rand([6], seed=4), "k": rand([1, 6, 1, 1], 0.5, 2, seed=2),
             "t": F(0.75)}
    model = onnx_case.model(nodes, {"x": [1, 4, 6, 6]}, ["y"], inits)
    graph = fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1)}, level=1)
    assert ops(graph) == ["Conv+Add"]


@pytest.mark.parametrize("group", [1, 2])
def test_scale_before_a_padded_conv_folds_into_its_weights(onnx_case, rand, group):
    nodes = [helper.make_node("Mul", ["x", "k"], ["s"]),
             helper.make_node("Conv", ["s", "w"], ["y"], pads=[1, 1, 1, 1], group=group, name="conv")]
    inits = {"w": weights(RNG, [6, 4 // group, 3, 3]), "k": rand([1, 4, 1, 1], 0.5, 2, seed=2)}
    model = onnx_case.model(nodes, {"x": [1, 4, 6, 6]}, ["y"], inits)
    assert ops(fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1)}, level=1)) == ["Conv"]


def test_shift_before_an_unpadded_conv_folds_into_its_bias(onnx_case, rand):
    nodes = [helper.make_node("Add", ["x", "t"], ["s"]), helper.make_node("Conv", ["s", "w"], ["y"], name="conv")]
    inits = {"w": weights(RNG, [6, 4, 2, 2]), "t": rand([1, 4, 1, 1], seed=2)}
    model = onnx_case.model(nodes, {"x": [1, 4, 6, 6]}, ["y"], inits)
    graph = fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1)}, level=1)
    assert ops(graph) == ["Conv"] and len(graph.nodes[0].inputs) == 3


@pytest.mark.parametrize("conv", [
    helper.make_node("Conv", ["s", "w"], ["y"], pads=[1, 1, 1, 1], name="conv"),
    helper.make_node("ConvTranspose", ["s", "w"], ["y"], strides=[2, 2], name="conv"),
], ids=["padded-conv", "conv-transpose"])
def test_shift_before_a_padded_or_transposed_conv_stays(onnx_case, rand, conv):
    nodes = [helper.make_node("Add", ["x", "t"], ["s"]), conv]
    inits = {"w": weights(RNG, [4, 4, 3, 3]), "t": rand([1, 4, 1, 1], seed=2)}
    model = onnx_case.model(nodes, {"x": [1, 4, 6, 6]}, ["y"], inits)
    assert ops(fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1)}, level=1)) == ["Add", conv.op_type]


def test_scale_before_a_flattening_fully_connected_layer(onnx_case, rand):
    nodes = [helper.make_node("Mul", ["x", "k"], ["s"]), helper.make_node("Flatten", ["s"], ["f"]),
             helper.make_node("Gemm", ["f", "m"], ["y"], name="fc")]
    inits = {"k": rand([1, 4, 1, 1], 0.5, 2, seed=2), "m": weights(RNG, [36, 5])}
    model = onnx_case.model(nodes, {"x": [1, 4, 3, 3]}, ["y"], inits)
    graph = fused(onnx_case, model, {"x": rand([1, 4, 3, 3], seed=1)}, level=1)
    assert ops(graph) == ["FullyConnected"] and graph.nodes[0].inputs[0] == "x"


def test_scale_of_a_conv_read_twice_stays(onnx_case, rand):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Mul", ["c", "k"], ["y"]),
             helper.make_node("Relu", ["c"], ["z"])]
    inits = {"w": weights(RNG, [6, 4, 1, 1]), "k": rand([1, 6, 1, 1], seed=2)}
    model = onnx_case.model(nodes, {"x": [1, 4, 6, 6]}, ["y", "z"], inits)
    assert "Mul" in ops(fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1)}, level=1))


def test_affine_chain_becomes_one_scale_bias_conv_and_a_single_op_stays(onnx_case, rand):
    nodes = [helper.make_node("Mul", ["x", "k"], ["s"]), helper.make_node("Add", ["t", "s"], ["y"], name="shift")]
    inits = {"k": rand([1, 4, 1, 1], seed=2), "t": F(0.3)}
    model = onnx_case.model(nodes, {"x": [1, 4, 6, 6]}, ["y"], inits)
    graph = fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1)}, level=1)
    assert ops(graph) == ["Conv"] and only(graph, "Conv").name == "shift"
    single = onnx_case.model(nodes[:1], {"x": [1, 4, 6, 6]}, ["s"], inits)
    assert ops(fused(onnx_case, single, {"x": rand([1, 4, 6, 6], seed=1)}, level=1)) == ["Mul"]
