"""Subgraph fusions: hard-swish (PyTorch and Paddle forms, HardSigmoid*x), SiLU, GELU (erf
and tanh), GLU and LayerNorm, each against onnxruntime, each with near misses that must
stay as they are."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

from tests.compiler.pass_cases import fused, ops, only, weights

F = np.float32
RNG = np.random.default_rng(5)


def _node(op, inputs, output, **attrs):
    return helper.make_node(op, inputs, [output], **attrs)


def _run(onnx_case, rand, nodes, inits, shape=(1, 4, 6, 6), outputs=("y",), low=-6.0, high=6.0, level=3, opset=13):
    model = onnx_case.model(nodes, {"x": list(shape)}, list(outputs), inits, opset=opset)
    return fused(onnx_case, model, {"x": rand(list(shape), low, high, seed=9)}, level=level)


def _subgraphs_only(onnx_case, rand, nodes, inits, shape, opset=13):
    """The graph after the "subgraphs" stage alone (pipeline.py), compared with onnxruntime: later
    stages may lower a LayerNormalization further (tokens_as_channels, LOWERING.md 21)."""
    from npuemu.compiler.onnx_import import import_onnx
    from npuemu.compiler.passes import PassContext
    from npuemu.compiler.passes.pipeline import STAGES
    from tests.compiler.pass_cases import same_as_ort

    model = onnx_case.model(nodes, {"x": list(shape)}, ["y"], inits, opset=opset)
    graph = import_onnx(model)
    ctx = PassContext.for_chip("rk3588", 3)
    for item in next(stage for stage in STAGES if stage.name == "subgraphs").passes:
        item(graph, ctx)
    graph.check()
    same_as_ort(onnx_case, model, graph, {"x": rand(list(shape), -3, 3, seed=9)})
    return graph


# ---- hard-swish ------------------------------------------------------------------------------

def _hard_swish_nodes(order: str, x: str = "x", three=3.0, clip_high=6.0):
    inits = {"three": F(three), "lo": F(0), "hi": F(clip_high), "six": F(6), "sixth": F(1 / 6)}
    head = [_node("Add", [x, "three"], "a", name="add"), _node("Clip", ["a", "lo", "hi"], "c", name="clip")]
    tails = {
        "mul_div": [_node("Mul", [x, "c"], "m", name="mul"), _node("Div", ["m", "six"], "y", name="div")],  # Paddle
        "div_mul": [_node("Div", ["c", "six"], "d", name="div"), _node("Mul", [x, "d"], "y", name="mul")],
        "mul_sixth": [_node("Mul", ["c", x], "m", name="mul"), _node("Mul", ["sixth", "m"], "y", name="scale")],
    }
    return head + tails[order], inits


@pytest.mark.parametrize("order", ["mul_div", "div_mul", "mul_sixth"])
def test_written_out_hard_swish_becomes_one_op(onnx_case, rand, order):
    nodes, inits = _hard_swish_nodes(order)
    assert ops(_run(onnx_case, rand, nodes, inits)) == ["HardSwish"]


def test_hard_swish_after_a_conv_fuses_into_it(onnx_case, rand):
    nodes, inits = _hard_swish_nodes("mul_div", x="v")
    nodes.insert(0, _node("Conv", ["x", "w"], "v", name="conv"))
    graph = _run(onnx_case, rand, nodes, {**inits, "w": weights(RNG, [4, 4, 1, 1], 2.0)})
    assert ops(graph) == ["Conv+HardSwish"] and graph.nodes[0].layer_name == "conv_fuse_hard_swish"


def test_hard_sigmoid_times_input_is_hard_swish(onnx_case, rand):
    nodes = [_node("HardSigmoid", ["x"], "g", alpha=1 / 6, beta=0.5), _node("Mul", ["g", "x"], "y")]
    assert ops(_run(onnx_case, rand, nodes, {})) == ["HardSwish"]


@pytest.mark.parametrize("change", ["clip_to_5", "add_2", "other_input", "clip_read_elsewhere"])
def test_hard_swish_near_misses_stay(onnx_case, rand, change):
    nodes, inits = _hard_swish_nodes("mul_div", three=2.0 if change == "add_2" else 3.0,
                                     clip_high=5.0 if change == "clip_to_5" else 6.0)
    outputs = ("y", "c") if change == "clip_read_elsewhere" else ("y",)
    if change == "other_input":
        nodes[2] = _node("Mul", ["c", "c"], "m", name="mul")
    graph = _run(onnx_case, rand, nodes, inits, outputs=outputs)
    assert "HardSwish" not in ops(graph) and "Clip" in ops(graph)


def test_paddle_hard_sigmoid_times_input_is_not_hard_swish(onnx_case, rand):
    nodes = [_node("HardSigmoid", ["x"], "g", alpha=0.2, beta=0.5), _node("Mul", ["x", "g"], "y")]
    assert ops(_run(onnx_case, rand, nodes, {})) == ["HardSigmoid", "Mul"]


# ---- SiLU ------------------------------------------------------------------------------------

def test_x_times_sigmoid_x_is_silu_and_fuses_into_a_conv(onnx_case, rand):
    nodes = [_node("Conv", ["x", "w"], "v", name="conv"), _node("Sigmoid", ["v"], "s"), _node("Mul", ["v", "s"], "y")]
    graph = _run(onnx_case, rand, nodes, {"w": weights(RNG, [4, 4, 1, 1])})
    assert ops(graph) == ["Conv+Silu"] and graph.nodes[0].layer_name == "conv_fuse_silu"


def test_silu_behind_a_multiply_by_one_needs_the_clean_up(onnx_case, rand):
    nodes = [_node("Mul", ["x", "one"], "u"), _node("Sigmoid", ["u"], "s"), _node("Mul", ["x", "s"], "y")]
    assert ops(_run(onnx_case, rand, nodes, {"one": F(1)}, level=2)) == ["Silu"]
    assert "Silu" not in ops(_run(onnx_case, rand, nodes, {"one": F(1)}, level=1))


def test_sigmoid_gate_of_another_tensor_is_not_silu(onnx_case, rand):
    nodes = [_node("Sigmoid", ["x"], "s"), _node("Mul", ["s", "z"], "y")]
    model = onnx_case.model(nodes, {"x": [1, 4, 6, 6], "z": [1, 4, 6, 6]}, ["y"])
    graph = fused(onnx_case, model, {"x": rand([1, 4, 6, 6], seed=1), "z": rand([1, 4, 6, 6], seed=2)})
    assert ops(graph) == ["Sigmoid", "Mul"]


# ---- GELU ------------------------------------------------------------------------------------

def _gelu_erf(grouping: str, one=1.0):
    inits = {"sqrt2": F(math.sqrt(2)), "one": F(one), "half": F(0.5), "rsqrt2": F(1 / math.sqrt(2))}
    head = [_node("Div", ["x", "sqrt2"], "u"), _node("Erf", ["u"], "e"), _node("Add", ["e", "one"], "p")]
    tails = {
        "x_then_half": [_node("Mul", ["x", "p"], "m"), _node("Mul", ["m", "half"], "y")],
        "half_x_first": [_node("Mul", ["x", "half"], "h"), _node("Mul", ["h", "p"], "y")],
        "half_p_first": [_node("Mul", ["half", "p"], "h"), _node("Mul", ["x", "h"], "y")],
    }
    if grouping == "rsqrt2":
        head[0] = _node("Mul", ["x", "rsqrt2"], "u")
        grouping = "x_then_half"
    return head + tails[grouping], inits


@pytest.mark.parametrize("grouping", ["x_then_half", "half_x_first", "half_p_first", "rsqrt2"])
def test_erf_gelu_becomes_gelu(onnx_case, rand, grouping):
    nodes, inits = _gelu_erf(grouping)
    graph = _run(onnx_case, rand, nodes, inits, low=-4, high=4)
    assert ops(graph) == ["Gelu"] and graph.nodes[0].attrs == {"approximate": "none"}


def _gelu_tanh(cube: str, coefficient=0.044715):
    inits = {"three": F(3), "k": F(coefficient), "c": F(math.sqrt(2 / math.pi)), "one": F(1), "half": F(0.5)}
    cubes = {
        "pow": [_node("Pow", ["x", "three"], "x3"), _node("Mul", ["x3", "k"], "q")],
        "muls": [_node("Mul", ["x", "x"], "x2"), _node("Mul", ["x2", "x"], "x3"), _node("Mul", ["k", "x3"], "q")],
    }
    tail = [_node("Add", ["x", "q"], "s"), _node("Mul", ["s", "c"], "t"), _node("Tanh", ["t"], "th"),
            _node("Add", ["th", "one"], "p"), _node("Mul", ["x", "p"], "m"), _node("Mul", ["m", "half"], "y")]
    return cubes[cube] + tail, inits


@pytest.mark.parametrize("cube", ["pow", "muls"])
def test_tanh_gelu_becomes_gelu(onnx_case, rand, cube):
    nodes, inits = _gelu_tanh(cube)
    graph = _run(onnx_case, rand, nodes, inits, low=-4, high=4)
    assert ops(graph) == ["Gelu"] and graph.nodes[0].attrs == {"approximate": "tanh"}


def test_gelu_near_misses_stay(onnx_case, rand):
    nodes, inits = _gelu_erf("x_then_half", one=2.0)
    assert "Gelu" not in ops(_run(onnx_case, rand, nodes, inits, low=-4, high=4))
    nodes, inits = _gelu_tanh("pow", coefficient=0.05)
    assert "Gelu" not in ops(_run(onnx_case, rand, nodes, inits, low=-4, high=4))


# ---- GLU -------------------------------------------------------------------------------------

def _glu(onnx_case, rand, split, gate_output=1, value_output=0, channels=8):
    outputs = [f"h{i}" for i in range(len(split))]
    nodes = [helper.make_node("Split", ["x", "split"], outputs, axis=1, name="split"),
             _node("Sigmoid", [outputs[gate_output]], "g", name="sigmoid"),
             _node("Mul", ["g", outputs[value_output]], "y", name="mul")]
    extra = outputs[2:]  # a third part stays an output so the model is valid
    model = onnx_case.model(nodes, {"x": [1, channels, 4, 4]}, ["y", *extra], {"split": np.array(split, dtype=np.int64)})
    return fused(onnx_case, model, {"x": rand([1, channels, 4, 4], seed=2)})


def test_split_sigmoid_mul_is_glu(onnx_case, rand):
    graph = _glu(onnx_case, rand, [4, 4])
    assert ops(graph) == ["Glu"] and graph.nodes[0].attrs == {"axis": 1} and graph.nodes[0].name == "mul"


@pytest.mark.parametrize("split, gate, value, channels", [
    ([3, 3, 3], 1, 0, 9),   # a Split into three
    ([1, 3], 1, 0, 4),      # unequal halves (the Mul broadcasts)
    ([4, 4], 0, 1, 8),      # the gate on the first half
], ids=["three-way", "unequal", "gate-first"])
def test_glu_near_misses_stay(onnx_case, rand, split, gate, value, channels):
    assert "Glu" not in ops(_glu(onnx_case, rand, split, gate, value, channels))


# ---- LayerNorm -------------------------------------------------------------------------------

def _layer_norm(axes=(-1,), second_axes=None, square="pow", eps_after_sqrt=False, affine=True, gamma_shape=(10,)):
    inits = {"two": F(2), "eps": F(1e-5), "gamma": RNG.uniform(0.5, 1.5, gamma_shape).astype(F),
             "beta": RNG.uniform(-1, 1, (10,)).astype(F)}
    nodes = [_node("ReduceMean", ["x"], "m", axes=list(axes)), _node("Sub", ["x", "m"], "d"),
             _node("Pow", ["d", "two"], "sq") if square == "pow" else _node("Mul", ["d", "d"], "sq"),
             _node("ReduceMean", ["sq"], "v", axes=list(second_axes or axes))]
    if eps_after_sqrt:
        nodes += [_node("Sqrt", ["v"], "r"), _node("Add", ["r", "eps"], "s")]
    else:
        nodes += [_node("Add", ["v", "eps"], "ve"), _node("Sqrt", ["ve"], "s")]
    nodes.append(_node("Div", ["d", "s"], "n" if affine else "y"))
    if affine:
        nodes += [_node("Mul", ["n", "gamma"], "g"), _node("Add", ["g", "beta"], "y")]
    return nodes, inits


@pytest.mark.parametrize("axes, square, affine", [((-1,), "pow", True), ((-1,), "mul", False), ((1, 2), "pow", True)],
                         ids=["last-axis", "mul-square-no-affine", "two-axes"])
def test_layer_norm_subgraph_becomes_layer_normalization(onnx_case, rand, axes, square, affine):
    nodes, inits = _layer_norm(axes, square=square, affine=affine, gamma_shape=(10,))
    graph = _subgraphs_only(onnx_case, rand, nodes, inits, shape=(1, 6, 10))
    node = only(graph, "LayerNormalization")
    assert ops(graph) == ["LayerNormalization"]
    assert node.attrs == {"axis": min(a % 3 for a in axes), "epsilon": float(F(1e-5)), "statistics_outputs": 0}
    assert len(node.inputs) == (3 if affine else 2)


@pytest.mark.parametrize("change", ["middle-axis", "different-axes", "eps-after-sqrt", "mean-read-elsewhere"])
def test_layer_norm_near_misses_stay(onnx_case, rand, change):
    axes = (1,) if change == "middle-axis" else (-1,)
    second = (1, 2) if change == "different-axes" else None
    nodes, inits = _layer_norm(axes, second, eps_after_sqrt=change == "eps-after-sqrt",
                               gamma_shape=(6, 1) if change == "middle-axis" else (10,))
    outputs = ("y", "m") if change == "mean-read-elsewhere" else ("y",)
    graph = _run(onnx_case, rand, nodes, inits, shape=(1, 6, 10), outputs=outputs, low=-3, high=3)
    assert "LayerNormalization" not in ops(graph)


def test_gamma_over_an_outer_axis_stays_outside_the_layer_norm(onnx_case, rand):
    nodes, inits = _layer_norm(gamma_shape=(6, 1))
    _run(onnx_case, rand, nodes, inits, shape=(1, 6, 10), low=-3, high=3)  # all passes: still onnxruntime's values
    # the subgraph pass alone (later passes turn the [1,T,C] region into NPU layers)
    from npuemu.compiler.onnx_import import import_onnx
    from npuemu.compiler.passes.context import PassContext
    from npuemu.compiler.passes.fuse_layer_norm import layer_norm_subgraph

    graph = import_onnx(onnx_case.model(nodes, {"x": [1, 6, 10]}, ["y"], inits))
    assert layer_norm_subgraph(graph, PassContext.for_chip("rk3588", 1)) == 1
    assert ops(graph) == ["LayerNormalization", "Mul", "Add"]


def test_onnx_layer_normalization_is_kept(onnx_case, rand):
    """The subgraph passes keep an ONNX LayerNormalization as it is; at -O3 on [1, T, C] graph I/O
    it then runs as a token region on the NPU: the runtime's readin and readout at its edges
    (LOWERING.md 33.4, 25) and the LayerNorm chain between them (21, 24), no host step."""
    node = _node("LayerNormalization", ["x", "gamma", "beta"], "y", axis=-1, epsilon=1e-3)
    inits = {"gamma": rand([10], seed=3), "beta": rand([10], seed=4)}
    assert ops(_subgraphs_only(onnx_case, rand, [node], inits, shape=(1, 6, 10), opset=17)) == ["LayerNormalization"]
    graph = _run(onnx_case, rand, [node], inits, shape=(1, 6, 10), opset=17)
    assert ops(graph)[0] == "Readin" and ops(graph)[-1] == "Readout" and "LayerNormalization" not in ops(graph)
    assert all(node.target == "NPU" for node in graph.nodes)
