"""Hardware fusions: Conv+BiasAdd, Conv+activation, Conv+Add (residual), Pad+Conv and fully
connected layers. Each builds the ONNX subgraph, runs import + passes, checks the fused IR
(ops, fused parts, layer name) and that the float IR still equals onnxruntime; each has
near misses that must not fuse."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.compiler.pass_cases import fused, ops, only, weights

RNG = np.random.default_rng(11)
W = weights(RNG, [4, 3, 3, 3])


def _conv(out: str = "c", name: str = "conv", x: str = "x", weight: str = "w", **attrs) -> object:
    return helper.make_node("Conv", [x, weight], [out], name=name, pads=[1, 1, 1, 1], **attrs)


def _x(rand, shape=(1, 3, 6, 6)):
    return {"x": rand(list(shape), seed=3)}


# ---- Conv+BiasAdd ----------------------------------------------------------------------------

def test_conv_bias_add_relu_is_one_layer_named_like_the_vendor(onnx_case, rand):
    nodes = [_conv(), helper.make_node("Add", ["c", "b"], ["a"], name="bias"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    model = onnx_case.model(nodes, {"x": [1, 3, 6, 6]}, ["y"], {"w": W, "b": rand([1, 4, 1, 1], seed=4)})
    graph = fused(onnx_case, model, _x(rand))
    conv = only(graph, "Conv")
    assert ops(graph) == ["Conv+Add+Relu"]
    assert [part.label for part in conv.fused] == ["bias_add", "relu"]
    assert conv.layer_name == "conv_fuse_bias_add_relu"
    assert [part.source for part in conv.fused] == ["bias", "relu"]


def test_add_varying_along_width_is_no_bias(onnx_case, rand):
    nodes = [_conv(), helper.make_node("Add", ["c", "b"], ["y"], name="add")]
    model = onnx_case.model(nodes, {"x": [1, 3, 6, 6]}, ["y"], {"w": W, "b": rand([1, 1, 1, 6], seed=4)})
    assert ops(fused(onnx_case, model, _x(rand))) == ["Conv", "Add"]


# ---- Conv+activation -------------------------------------------------------------------------

ACTIVATIONS = [
    ("Relu", {}, {}, "relu"),
    ("Clip", {}, {"lo": np.float32(0), "hi": np.float32(6)}, "relu6"),
    ("Clip", {}, {"lo": np.float32(0), "hi": np.float32(5)}, "clip"),
    ("Clip", {}, {"lo": np.float32(-1), "hi": np.float32(1)}, "clip"),
    ("LeakyRelu", {"alpha": 0.1}, {}, "leaky_relu"),
    ("PRelu", {}, {"slope": np.linspace(0.1, 0.4, 4, dtype=np.float32).reshape(4, 1, 1)}, "prelu"),
    ("Sigmoid", {}, {}, "sigmoid"),
    ("Tanh", {}, {}, "tanh"),
    ("Elu", {"alpha": 0.7}, {}, "elu"),
    ("HardSwish", {}, {}, "hard_swish"),
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, {}, "hard_sigmoid"),
]


def _activation(op: str, attrs: dict, extra: dict, source: str = "c", out: str = "y") -> object:
    return helper.make_node(op, [source, *extra], [out], name="act", **attrs)


@pytest.mark.parametrize("op, attrs, extra, tag", ACTIVATIONS, ids=[case[3] + "_" + case[0] for case in ACTIVATIONS])
def test_conv_activation_fuses_with_its_tag(onnx_case, rand, op, attrs, extra, tag):
    model = onnx_case.model([_conv(), _activation(op, attrs, extra)], {"x": [1, 3, 6, 6]}, ["y"], {"w": W, **extra},
                            opset=14)
    graph = fused(onnx_case, model, _x(rand))
    assert ops(graph) == [f"Conv+{op}"]
    assert only(graph, "Conv").layer_name == f"conv_fuse_{tag}"


def test_clip_keeps_its_bounds_as_a_part(onnx_case, rand):
    extra = {"lo": np.float32(-0.5), "hi": np.float32(0.25)}
    model = onnx_case.model([_conv(), _activation("Clip", {}, extra)], {"x": [1, 3, 6, 6]}, ["y"], {"w": W, **extra})
    part = only(fused(onnx_case, model, _x(rand)), "Conv").fused[0]
    assert (part.op_type, part.attrs, part.tag) == ("Clip", {"min": -0.5, "max": 0.25}, "clip")


def test_activation_of_a_conv_read_elsewhere_does_not_fuse(onnx_case, rand):
    model = onnx_case.model([_conv(), _activation("Relu", {}, {})], {"x": [1, 3, 6, 6]}, ["c", "y"], {"w": W})
    assert ops(fused(onnx_case, model, _x(rand))) == ["Conv", "Relu"]


def test_prelu_with_a_slope_per_position_does_not_fuse(onnx_case, rand):
    extra = {"slope": rand([4, 6, 6], 0, 0.5, seed=5)}
    model = onnx_case.model([_conv(), _activation("PRelu", {}, extra)], {"x": [1, 3, 6, 6]}, ["y"], {"w": W, **extra})
    assert ops(fused(onnx_case, model, _x(rand))) == ["Conv", "PRelu"]


def test_activation_outside_the_fusion_list_stays(onnx_case, rand):
    model = onnx_case.model([_conv(), _activation("Softplus", {}, {})], {"x": [1, 3, 6, 6]}, ["y"], {"w": W})
    assert ops(fused(onnx_case, model, _x(rand))) == ["Conv", "Softplus"]


# ---- Conv+Add (residual) ---------------------------------------------------------------------

def _residual(onnx_case, rand, tail: list, outputs=("y",), other_shape=(1, 4, 6, 6)):
    nodes = [_conv(), *tail]
    model = onnx_case.model(nodes, {"x": [1, 3, 6, 6], "r": list(other_shape)}, list(outputs), {"w": W})
    return fused(onnx_case, model, {**_x(rand), "r": rand(list(other_shape), seed=6)})


def test_conv_add_of_a_same_shape_tensor_fuses(onnx_case, rand):
    graph = _residual(onnx_case, rand, [helper.make_node("Add", ["r", "c"], ["y"], name="add")])
    conv = only(graph, "Conv")
    assert ops(graph) == ["Conv+Add"] and conv.layer_name == "conv_fuse_add"
    assert conv.fused[0].inputs == ["r"] and conv.fused[0].carry_index == 1


def test_conv_add_relu_is_the_vendors_conv_add_relu(onnx_case, rand):
    graph = _residual(onnx_case, rand, [helper.make_node("Add", ["c", "r"], ["a"], name="add"),
                                        helper.make_node("Relu", ["a"], ["y"], name="relu")])
    assert ops(graph) == ["Conv+Add+Relu"] and only(graph, "Conv").layer_name == "conv_fuse_add_relu"


def test_conv_relu_add_fuses_activation_then_add(onnx_case, rand):
    graph = _residual(onnx_case, rand, [helper.make_node("Relu", ["c"], ["a"], name="relu"),
                                        helper.make_node("Add", ["a", "r"], ["y"], name="add")])
    assert ops(graph) == ["Conv+Relu+Add"]


def test_only_relu_may_follow_the_add(onnx_case, rand):
    graph = _residual(onnx_case, rand, [helper.make_node("Add", ["c", "r"], ["a"], name="add"),
                                        helper.make_node("Sigmoid", ["a"], ["y"], name="sigmoid")])
    assert ops(graph) == ["Conv+Add", "Sigmoid"]


def test_no_activation_after_activation_and_add(onnx_case, rand):
    graph = _residual(onnx_case, rand, [helper.make_node("Relu", ["c"], ["a"], name="relu"),
                                        helper.make_node("Add", ["a", "r"], ["b"], name="add"),
                                        helper.make_node("Relu", ["b"], ["y"], name="relu2")])
    assert ops(graph) == ["Conv+Relu+Add", "Relu"]


def test_add_whose_other_operand_broadcasts_does_not_fuse(onnx_case, rand):
    graph = _residual(onnx_case, rand, [helper.make_node("Add", ["c", "r"], ["y"], name="add")],
                      other_shape=(1, 4, 1, 1))
    assert ops(graph) == ["Conv", "Add"]


def test_add_after_an_activation_read_elsewhere_does_not_fuse(onnx_case, rand):
    graph = _residual(onnx_case, rand, [helper.make_node("Relu", ["c"], ["a"], name="relu"),
                                        helper.make_node("Add", ["a", "r"], ["y"], name="add")], outputs=("a", "y"))
    assert ops(graph) == ["Conv+Relu", "Add"]


def test_sum_of_two_convs_goes_into_the_later_one(onnx_case, rand):
    nodes = [_conv("c1", "conv1"), _conv("c2", "conv2", weight="w2"), helper.make_node("Add", ["c1", "c2"], ["y"])]
    model = onnx_case.model(nodes, {"x": [1, 3, 6, 6]}, ["y"], {"w": W, "w2": weights(RNG, [4, 3, 3, 3])})
    graph = fused(onnx_case, model, _x(rand))
    assert ops(graph) == ["Conv", "Conv+Add"]
    assert graph.nodes[1].name == "conv2" and graph.nodes[1].fused[0].inputs == ["c1"]


# ---- Pad+Conv --------------------------------------------------------------------------------

def _pad_conv(onnx_case, rand, pads, mode="constant", value=None, conv_pads=(1, 1, 1, 1)):
    inputs = ["x", "pads"] + (["value"] if value is not None else [])
    nodes = [helper.make_node("Pad", inputs, ["p"], name="pad", mode=mode),
             helper.make_node("Conv", ["p", "w"], ["y"], name="conv", pads=list(conv_pads))]
    inits = {"w": W, "pads": np.array(pads, dtype=np.int64)}
    if value is not None:
        inits["value"] = np.float32(value)
    model = onnx_case.model(nodes, {"x": [1, 3, 6, 6]}, ["y"], inits)
    return fused(onnx_case, model, _x(rand))


def test_zero_pad_becomes_conv_padding(onnx_case, rand):
    graph = _pad_conv(onnx_case, rand, [0, 0, 1, 2, 0, 0, 3, 0])
    assert ops(graph) == ["Conv"]
    assert graph.nodes[0].attrs["pads"] == [2, 3, 4, 1] and graph.nodes[0].inputs[0] == "x"


@pytest.mark.parametrize("pads, mode, value, conv_pads, first", [
    ([0, 0, 1, 1, 0, 0, 1, 1], "reflect", None, (1, 1, 1, 1), "Pad"),
    ([0, 0, 1, 1, 0, 0, 1, 1], "constant", 1.0, (1, 1, 1, 1), "Pad"),
    ([1, 0, 0, 0, 0, 0, 0, 0], "constant", None, (1, 1, 1, 1), "Pad"),
    # 15 + 1 > the 4-bit pad field: a zero pad of H that stays a layer of its own, which level 3
    # runs as a depthwise conv (passes/pad_as_conv.py, LOWERING.md 20)
    ([0, 0, 15, 0, 0, 0, 0, 0], "constant", None, (1, 1, 1, 1), "Conv"),
], ids=["reflect", "nonzero-fill", "batch-pad", "beyond-pad-field"])
def test_pads_the_conv_cannot_take_stay(onnx_case, rand, pads, mode, value, conv_pads, first):
    graph = _pad_conv(onnx_case, rand, pads, mode, value, conv_pads)
    assert ops(graph)[0] == first and len(graph.nodes) == 2  # not folded into the conv
    assert graph.nodes[-1].attrs["pads"] == list(conv_pads)


# ---- fully connected -------------------------------------------------------------------------

def test_matmul_add_is_a_fully_connected_layer_with_bias(onnx_case, rand):
    nodes = [helper.make_node("MatMul", ["x", "m"], ["t"], name="fc"), helper.make_node("Add", ["t", "b"], ["y"])]
    model = onnx_case.model(nodes, {"x": [1, 16]}, ["y"], {"m": weights(RNG, [16, 5]), "b": rand([5], seed=2)})
    feeds = {"x": rand([1, 16], seed=1)}
    level1 = fused(onnx_case, model, feeds, level=1)
    assert ops(level1) == ["FullyConnected+Add"] and level1.nodes[0].layer_name == "fc_fuse_bias_add"
    level3 = fused(onnx_case, model, feeds, level=3)
    assert ops(level3) == ["Reshape", "Conv+Add", "Reshape"]  # the vendor's Reshape -> 1x1 Conv -> Reshape
    assert only(level3, "Conv").layer_name == "fc_fuse_bias_add"


def test_gemm_with_alpha_beta_and_transposed_weights(onnx_case, rand):
    node = helper.make_node("Gemm", ["x", "m", "b"], ["y"], name="gemm", alpha=0.5, beta=2.0, transB=1)
    model = onnx_case.model([node], {"x": [1, 16]}, ["y"], {"m": weights(RNG, [5, 16]), "b": rand([5], seed=2)})
    graph = fused(onnx_case, model, {"x": rand([1, 16], seed=1)}, level=1)
    assert ops(graph) == ["FullyConnected"] and graph.nodes[0].attrs == {"axis": 1}


@pytest.mark.parametrize("flatten", ["Flatten", "Reshape"])
def test_flatten_then_gemm_reads_the_feature_map(onnx_case, rand, flatten):
    inputs = ["x"] if flatten == "Flatten" else ["x", "shape"]
    nodes = [helper.make_node(flatten, inputs, ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "m", "b"], ["y"], name="gemm")]
    inits = {"m": weights(RNG, [32, 5]), "b": rand([5], seed=2), "shape": np.array([1, 32], dtype=np.int64)}
    model = onnx_case.model(nodes, {"x": [1, 8, 2, 2]}, ["y"], inits)
    feeds = {"x": rand([1, 8, 2, 2], seed=1)}
    level1 = fused(onnx_case, model, feeds, level=1)
    assert ops(level1) == ["FullyConnected"] and level1.nodes[0].inputs[0] == "x"
    level3 = fused(onnx_case, model, feeds, level=3)
    assert ops(level3) == ["Conv", "Reshape"]
    assert only(level3, "Conv").attrs["kernel_shape"] == [2, 2]  # the FC as a 2x2 conv on the map itself


def test_reshape_chain_then_matmul_add_reads_the_map_at_level_1(onnx_case, rand):
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s2"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["t"], name="fc"), helper.make_node("Add", ["t", "b"], ["y"])]
    inits = {"s1": np.array([1, 8, 4], np.int64), "s2": np.array([1, 32], np.int64), "m": weights(RNG, [32, 5]),
             "b": rand([5], seed=2)}
    model = onnx_case.model(nodes, {"x": [1, 8, 2, 2]}, ["y"], inits)
    graph = fused(onnx_case, model, {"x": rand([1, 8, 2, 2], seed=1)}, level=1)
    assert ops(graph) == ["FullyConnected+Add"] and graph.nodes[0].inputs[0] == "x"


@pytest.mark.parametrize("source, flat", [([1, 16, 4, 5], [1, 64, 5]), ([1, 3, 4], [3, 4])])
def test_a_reshape_that_regroups_the_rows_stays(onnx_case, rand, source, flat):
    # the FC's output is X.shape[:axis] + (N,): reading [1, 16, 4, 5] directly would give
    # [1, 16, 4, 7] where the model says [1, 64, 7] (a compile error at stage 'folding' before)
    nodes = [helper.make_node("Reshape", ["x", "s"], ["f"]), helper.make_node("MatMul", ["f", "m"], ["y"], name="fc")]
    model = onnx_case.model(nodes, {"x": source}, ["y"], {"s": np.array(flat, np.int64), "m": weights(RNG, [flat[-1], 7])})
    graph = fused(onnx_case, model, {"x": rand(source, seed=1)}, level=1)
    # the regrouping Reshape stays the only reader of x; the FC after it is a FullyConnected, or,
    # over rows (M > 1), the token region's 1x1 conv behind an NPU Transpose (LOWERING.md 21, 35)
    assert ops(graph)[0] == "Reshape" and [node for node in graph.nodes if "x" in node.inputs] == graph.nodes[:1]
    assert ops(graph)[1:] in (["FullyConnected"], ["Transpose", "Reshape", "Conv", "Readout"]), ops(graph)


def test_gemm_whose_c_varies_by_row_stays(onnx_case, rand):
    node = helper.make_node("Gemm", ["x", "m", "b"], ["y"], name="gemm")
    model = onnx_case.model([node], {"x": [2, 16]}, ["y"], {"m": weights(RNG, [16, 5]), "b": rand([2, 5], seed=2)})
    assert ops(fused(onnx_case, model, {"x": rand([2, 16], seed=1)})) == ["Gemm"]


def test_matmul_of_two_tensors_stays(onnx_case, rand):
    node = helper.make_node("MatMul", ["x", "z"], ["y"], name="mm")
    model = onnx_case.model([node], {"x": [1, 4, 8], "z": [1, 8, 3]}, ["y"])
    graph = fused(onnx_case, model, {"x": rand([1, 4, 8], seed=1), "z": rand([1, 8, 3], seed=2)})
    assert ops(graph) == ["MatMul"]
