"""quantize_graph (compiler/quant/quantize.py, roles.py, sharing.py): what each tensor of a
graph gets - activations, weights, biases, operands, shared groups, fused nodes, float16 and
hybrid conversions - and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.ir import FusedOp, Graph, Node, Tensor
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.quant import convert_op
from npuemu.compiler.quant.affine import Range, affine_params, round_half_away
from npuemu.compiler.quant.calibrate import calibrate
from npuemu.compiler.quant.fake_quant import fake_quant_evaluate
from npuemu.compiler.quant.quantize import bias_values, float16_graph, layer_dtype, quantize_graph, stored_values
from npuemu.compiler.quant.roles import BIAS, constant_roles
from npuemu.compiler.quant.sharing import sharing_groups
from npuemu.isa.errors import CompileError

RNG = np.random.default_rng(11)


def weights(*shape: int, scale: float = 0.5) -> np.ndarray:
    return RNG.normal(0, scale, shape).astype(np.float32)


def samples(shape, count=4, low=-1.0, high=1.0):
    return [{"x": np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)} for seed in range(count)]


def calibrated(onnx_case, nodes, shape, outputs, inits, **kwargs):
    graph = import_onnx(onnx_case.model(nodes, {"x": shape}, outputs, inits))
    ranges = calibrate(graph, samples(shape), "normal", progress=False).ranges
    return graph, ranges, quantize_graph(graph, ranges, **kwargs)


def conv_node(name, x, w, b=None, out=None, **attrs):
    return helper.make_node("Conv", [x, w] + ([b] if b else []), [out or name], name=name, **attrs)


def test_conv_weights_per_channel_and_bias_in_accumulator_units(onnx_case):
    w, b = weights(4, 3, 3, 3), weights(4, scale=0.1)
    graph, ranges, _ = calibrated(onnx_case, [conv_node("conv", "x", "w", "b", "y", pads=[1, 1, 1, 1])],
                                  [1, 3, 6, 6], ["y"], {"w": w, "b": b})
    quant = graph.tensors["w"].quant
    assert quant.dtype == "int8" and quant.axis == 0 and quant.scale.shape == (4,)
    per_channel = w.reshape(4, -1)
    expected = (np.maximum(per_channel.max(1), 0) - np.minimum(per_channel.min(1), 0)) / 255
    assert np.allclose(quant.scale, expected.astype(np.float32))
    stored = stored_values(graph.tensors["w"])
    assert stored.dtype == np.int8 and stored.reshape(4, -1).min(1).tolist() == [-128] * 4  # full range per channel
    assert np.array_equal(stored, np.clip(round_half_away(w / quant.scale[:, None, None, None])
                                          + quant.zero_point[:, None, None, None], -128, 127))
    bias = graph.tensors["b"].quant
    s_in = np.float64(graph.tensors["x"].quant.scale)
    assert bias.dtype == "int32" and bias.axis == 0
    assert np.allclose(bias.scale, s_in * quant.scale.astype(np.float64))
    role = next(role for role in constant_roles(graph, graph.nodes[0]) if role.kind == BIAS)
    assert np.array_equal(bias_values(graph, graph.nodes[0], role), round_half_away(b / (s_in * quant.scale)))
    x_range = ranges["x"]
    assert (float(graph.tensors["x"].quant.scale), int(graph.tensors["x"].quant.zero_point)) == \
        affine_params(x_range.lo, x_range.hi)


def test_per_layer_weights(onnx_case):
    graph, _, result = calibrated(onnx_case, [conv_node("conv", "x", "w", "b", "y")], [1, 3, 4, 4], ["y"],
                                  {"w": weights(4, 3, 1, 1), "b": weights(4)}, per_channel=False)
    assert graph.tensors["w"].quant.axis is None and graph.tensors["b"].quant.axis is None
    assert "per-layer" in result.summary()


@pytest.mark.parametrize("group,weight_shape,axis", [(1, (3, 5, 2, 2), 1), (3, (3, 1, 2, 2), 0), (3, (3, 2, 2, 2), None)])
def test_conv_transpose_output_channel_axis(onnx_case, group, weight_shape, axis):
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], group=group)
    graph, _, _ = calibrated(onnx_case, [node], [1, 3, 4, 4], ["y"], {"w": weights(*weight_shape)})
    assert graph.tensors["w"].quant.axis == axis


@pytest.mark.parametrize("trans_b,shape,axis", [(0, (6, 5), 1), (1, (5, 6), 0)])
def test_gemm_weight_axis_and_bias_with_alpha_beta(onnx_case, trans_b, shape, axis):
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=trans_b, alpha=2.0, beta=0.5)
    graph, _, _ = calibrated(onnx_case, [node], [2, 6], ["y"], {"w": weights(*shape), "c": weights(5)})
    w, c, x = graph.tensors["w"].quant, graph.tensors["c"].quant, graph.tensors["x"].quant
    assert w.axis == axis and c.dtype == "int32"
    # alpha * s_in * s_w / beta: the unit in which beta * C adds to alpha * (A @ B)
    assert np.allclose(c.scale, np.float64(x.scale) * w.scale * 2.0 / 0.5)


def test_matmul_weight_per_output_column_and_operands(onnx_case):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "k"], ["y"])]
    graph, _, _ = calibrated(onnx_case, nodes, [1, 4, 6], ["y"], {"w": weights(6, 3), "k": np.float32([0.5, -2.0, 1.0])})
    assert graph.tensors["w"].quant.axis == 1
    operand = graph.tensors["k"].quant
    assert operand.dtype == "int16" and int(operand.zero_point) == 0 and np.isclose(operand.scale, 2.0 / 32767)
    assert stored_values(graph.tensors["k"]).tolist() == [8192, -32767, 16384]  # 0.5 / (2 / 32767) = 8191.75


def test_normalization_parameters_stay_float(onnx_case):
    params = {"s": np.float32([1.0, 2.0]), "b": np.float32([0.1, -0.1]), "m": np.float32([0.0, 1.0]),
              "v": np.float32([1.0, 0.5])}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])
    graph, _, _ = calibrated(onnx_case, [node], [1, 2, 3, 3], ["y"], params)
    assert all(graph.tensors[name].quant is None for name in params)
    assert graph.tensors["y"].quant.dtype == "int8"


def test_value_preserving_ops_share_their_input_parameters(onnx_case):
    nodes = [conv_node("conv", "x", "w", out="c"), helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["y"])]
    graph, _, result = calibrated(onnx_case, nodes, [1, 3, 5, 5], ["y"],
                                  {"w": weights(4, 3, 1, 1), "shape": np.array([1, -1], dtype=np.int64)})
    c, p, y = (graph.tensors[name].quant for name in ("c", "p", "y"))
    assert float(c.scale) == float(p.scale) == float(y.scale) and int(c.zero_point) == int(y.zero_point)
    assert result.anchors == {"c": "c", "p": "c", "y": "c"}


def test_global_average_pool_gets_its_own_scale(onnx_case):
    nodes = [conv_node("conv", "x", "w", out="c"), helper.make_node("GlobalAveragePool", ["c"], ["y"])]
    graph, _, _ = calibrated(onnx_case, nodes, [1, 3, 6, 6], ["y"], {"w": weights(4, 3, 1, 1)})
    assert float(graph.tensors["y"].quant.scale) < float(graph.tensors["c"].quant.scale)


def test_concat_unifies_similar_inputs_and_requantizes_a_narrow_one(onnx_case):
    nodes = [conv_node("a", "x", "wa"), conv_node("b", "x", "wb"), conv_node("n", "x", "wn"),
             helper.make_node("Concat", ["a", "b", "n", "k"], ["y"], axis=1)]
    wa = weights(2, 3, 1, 1)
    inits = {"wa": wa, "wb": wa * 1.1, "wn": wa * 0.01, "k": np.linspace(-0.01, 0.01, 16, dtype=np.float32).reshape(1, 1, 4, 4)}
    graph, ranges, result = calibrated(onnx_case, nodes, [1, 3, 4, 4], ["y"], inits)
    y = graph.tensors["y"].quant
    for name in ("a", "b"):  # unified: written by address
        assert float(graph.tensors[name].quant.scale) == float(y.scale), name
    for name in ("n", "k"):  # narrow: keep their own parameters, requantized into the output
        assert float(graph.tensors[name].quant.scale) < float(y.scale) / 10, name
    assert stored_values(graph.tensors["k"]).min() == -128
    assert result.anchors == {"a": "a", "b": "a", "y": "a"}
    assert result.ranges["y"].hi >= max(ranges[name].hi for name in ("a", "b", "y"))
    # without ranges every input is unified
    assert set(sharing_groups(graph, {node.name: "int8" for node in graph.nodes})) == {"a", "b", "n", "k", "y"}


def test_concat_with_a_constant_in_its_range_unifies_it(onnx_case):
    nodes = [helper.make_node("Concat", ["x", "k"], ["y"], axis=1)]
    graph, _, result = calibrated(onnx_case, nodes, [1, 2, 3], ["y"], {"k": np.float32([[[-0.9, 0.0, 0.8]]])})
    assert result.anchors == {"x": "x", "k": "x", "y": "x"}
    assert float(graph.tensors["k"].quant.scale) == float(graph.tensors["x"].quant.scale)


def fused_conv_graph() -> Graph:
    """x -> Conv (no bias) +bias_add(const [C,1,1]) +Relu +Add(residual r) -> y, one node."""
    graph = Graph("fused")
    for name, shape in (("x", (1, 2, 4, 4)), ("r", (1, 3, 4, 4)), ("y", (1, 3, 4, 4))):
        graph.add_tensor(Tensor(name, shape, "float32"))
    graph.add_constant("w", weights(3, 2, 1, 1))
    graph.add_constant("bias", weights(3, 1, 1, scale=0.2))
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
    graph.nodes = [Node("conv", "Conv", ["x", "w"], ["y"], attrs,
                        fused=[FusedOp("Add", inputs=["bias"], tag="bias_add"), FusedOp("Relu"),
                               FusedOp("Add", inputs=["r"])])]
    graph.inputs, graph.outputs = ["x", "r"], ["y"]
    graph.check()
    return graph


def fused_samples(count=4):
    return [{"x": np.random.default_rng(seed).normal(0, 1, (1, 2, 4, 4)).astype(np.float32),
             "r": np.random.default_rng(100 + seed).normal(0, 1, (1, 3, 4, 4)).astype(np.float32)} for seed in range(count)]


def test_fused_node_quantizes_only_its_output_and_reads_the_residual_int8():
    graph = fused_conv_graph()
    result = calibrate(graph, fused_samples(), "normal", progress=False)
    assert set(result.ranges) == {"x", "r", "y"}  # nothing inside the fused node
    quantize_graph(graph, result.ranges)
    assert graph.tensors["bias"].quant.dtype == "int32" and graph.tensors["bias"].quant.axis == 0  # [C,1,1]
    assert graph.tensors["r"].quant.dtype == "int8" and graph.tensors["y"].quant.dtype == "int8"
    sample = fused_samples(1)[0]
    simulated, reference = fake_quant_evaluate(graph, sample)["y"], evaluate(graph, sample)["y"]
    step = float(graph.tensors["y"].quant.scale)
    assert np.abs(simulated - reference).max() < 4 * step


def test_constant_needed_two_ways_is_copied(onnx_case):
    nodes = [conv_node("c1", "x", "w", out="a"), conv_node("c2", "a", "w", out="y")]
    graph = import_onnx(onnx_case.model(nodes, {"x": [1, 3, 4, 4]}, ["y"], {"w": weights(3, 3, 1, 1)}))
    ranges = calibrate(graph, samples([1, 3, 4, 4]), "normal", progress=False).ranges
    quantize_graph(graph, ranges, layer_dtypes={"c2": "float16"})
    first, second = graph.nodes[0].inputs[1], graph.nodes[-1].inputs[1]
    assert first == "w" and second != "w"
    assert graph.tensors[first].quant.dtype == "int8" and graph.tensors[second].quant.dtype == "float16"
    assert np.array_equal(graph.tensors[first].data, graph.tensors[second].data)


def test_hybrid_inserts_the_conversions_each_layer_needs(onnx_case):
    nodes = [conv_node("c1", "x", "w1", out="a"), helper.make_node("Relu", ["a"], ["b"], name="relu"),
             conv_node("c2", "b", "w2", out="c"), helper.make_node("Add", ["c", "a"], ["y"], name="add")]
    inits = {"w1": weights(3, 3, 1, 1), "w2": weights(3, 3, 1, 1)}
    graph = import_onnx(onnx_case.model(nodes, {"x": [1, 3, 4, 4]}, ["y"], inits))
    ranges = calibrate(graph, samples([1, 3, 4, 4]), "normal", progress=False).ranges
    reference = evaluate(graph, samples([1, 3, 4, 4], 1)[0])["y"]
    result = quantize_graph(graph, ranges, layer_dtypes={"relu": "float16", "c2": "float16"})
    converts = [node for node in graph.nodes if node.op_type == convert_op.OP_TYPE]
    # a (int8) -> float16 copy for relu; c (float16) -> int8 copy for add
    assert [(node.inputs[0], node.attrs["to"]) for node in converts] == [("a", "float16"), ("c", "int8")]
    assert result.conversions == [node.name for node in converts] and result.mode == "hybrid"
    by_name = {node.name: node for node in graph.nodes}
    assert by_name["relu"].inputs == ["a_float16"] and by_name["add"].inputs == ["c_int8", "a"]
    assert graph.tensors["c_int8"].quant.dtype == "int8" and graph.tensors["c"].quant.dtype == "float16"
    assert float(graph.tensors["c_int8"].quant.scale) == affine_params(ranges["c"].lo, ranges["c"].hi)[0]
    assert [layer_dtype(graph, by_name[name]) for name in ("c1", "relu", "c2", "add")] == ["int8", "float16", "float16", "int8"]
    assert graph.nodes.index(converts[0]) < graph.nodes.index(by_name["relu"])
    graph.check()
    assert np.allclose(evaluate(graph, samples([1, 3, 4, 4], 1)[0])["y"], reference)  # conversions are identities in float


def test_float16_mode_needs_no_ranges_and_keeps_bias_float(onnx_case):
    graph = import_onnx(onnx_case.model([conv_node("conv", "x", "w", "b", "y")], {"x": [1, 3, 4, 4]}, ["y"],
                                        {"w": weights(4, 3, 1, 1), "b": weights(4)}))
    result = float16_graph(graph)
    assert result.mode == "float16" and not result.conversions
    assert all(graph.tensors[name].quant.dtype == "float16" for name in ("x", "w", "y"))
    assert graph.tensors["b"].quant is None
    assert stored_values(graph.tensors["w"]).dtype == np.float16


def test_refusals(onnx_case):
    model = onnx_case.model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": [1, 4]}, ["y"])
    graph = import_onnx(model)
    with pytest.raises(CompileError, match="no quantization range for tensor\\(s\\) 'x', 'y'"):
        quantize_graph(graph, {})
    with pytest.raises(CompileError, match="no layer named 'nope'"):
        quantize_graph(graph, {"x": Range(-1, 1), "y": Range(0, 1)}, layer_dtypes={"nope": "float16"})
    with pytest.raises(CompileError, match="dtype 'int4'"):
        quantize_graph(graph, {"x": Range(-1, 1), "y": Range(0, 1)}, layer_dtypes={"relu": "int4"})
    quantize_graph(graph, {"x": Range(-1, 1), "y": Range(0, 1)})
    with pytest.raises(CompileError, match="already quantized"):
        quantize_graph(graph, {"x": Range(-1, 1), "y": Range(0, 1)})
    with pytest.raises(CompileError, match="not a quantized constant"):
        stored_values(graph.tensors["x"])
