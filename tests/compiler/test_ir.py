"""Graph IR: names of fused layers, quantization fields, graph edits and the health check."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.ir import FusedOp, Graph, Node, QuantParams, Tensor, fused_layer_name
from npuemu.isa.errors import CompileError


def _chain() -> Graph:
    """x -> Relu -> a -> Sigmoid -> y"""
    graph = Graph("g", inputs=["x"], outputs=["y"])
    for name in ("x", "a", "y"):
        graph.add_tensor(Tensor(name, (1, 4), "float32"))
    graph.nodes = [Node("relu", "Relu", ["x"], ["a"]), Node("sigmoid", "Sigmoid", ["a"], ["y"])]
    graph.check()
    return graph


def test_fused_layer_names_follow_the_vendor_convention():
    assert fused_layer_name("conv1", ["bias_add", "relu"]) == "conv1_fuse_bias_add_relu"
    assert fused_layer_name("conv1", []) == "conv1"
    node = Node("conv1", "Conv", ["x", "w"], ["y"], fused=[
        FusedOp("Add", inputs=["b"], tag="bias_add"), FusedOp("HardSwish"), FusedOp("PRelu", inputs=["s"]),
        FusedOp("LeakyRelu"), FusedOp("Add", inputs=["r"])])
    assert node.layer_name == "conv1_fuse_bias_add_hard_swish_prelu_leaky_relu_add"
    assert node.display_op == "Conv+Add+HardSwish+PRelu+LeakyRelu+Add"
    assert node.all_inputs == ["x", "w", "b", "s", "r"]


def test_quant_params_per_tensor_and_per_channel():
    per_tensor = QuantParams("int8", 0.5, -3)
    assert not per_tensor.per_channel and per_tensor.scale.dtype == np.float32
    per_channel = QuantParams("int8", np.ones(4), np.zeros(4), axis=0)
    assert per_channel.per_channel and per_channel.zero_point.dtype == np.int32
    with pytest.raises(CompileError, match="same shape"):
        QuantParams("int8", np.ones(4), np.zeros(3), axis=0)
    with pytest.raises(CompileError, match="need an axis"):
        QuantParams("int8", np.ones(4), np.zeros(4))


def test_tensor_normalizes_shape_and_dtype():
    tensor = Tensor("t", [np.int64(2), 3], np.float32)
    assert tensor.shape == (2, 3) and tensor.dtype == "float32" and not tensor.is_const and tensor.size == 6


def test_bypass_reconnects_users_and_keeps_output_names():
    graph = _chain()
    assert graph.bypass(graph.node("sigmoid"))  # output node: its input takes the output's name
    assert [(n.name, n.outputs) for n in graph.nodes] == [("relu", ["y"])]
    graph.check()
    graph = _chain()
    assert graph.bypass(graph.node("relu"))
    assert graph.nodes[0].inputs == ["x"] and "a" not in graph.tensors
    graph.check()


def test_bypass_refuses_to_merge_input_and_output():
    graph = Graph("g", inputs=["x"], outputs=["y"])
    graph.add_tensor(Tensor("x", (2,), "float32"))
    graph.add_tensor(Tensor("y", (2,), "float32"))
    graph.nodes = [Node("id", "Identity", ["x"], ["y"])]
    assert not graph.bypass(graph.nodes[0]) and len(graph.nodes) == 1


def test_remove_dead_drops_unused_nodes_and_tensors():
    graph = _chain()
    graph.add_tensor(Tensor("unused", (1, 4), "float32"))
    graph.add_constant("weight", np.zeros(3, np.float32))
    graph.nodes.append(Node("dead", "Tanh", ["a"], ["unused"]))
    assert graph.remove_dead() == 1
    assert "unused" not in graph.tensors and "weight" not in graph.tensors


def test_health_check_finds_broken_graphs():
    graph = _chain()
    graph.nodes.reverse()
    with pytest.raises(CompileError, match="reads 'a' before it is defined"):
        graph.check()
    graph = _chain()
    graph.nodes[1].name = "relu"
    with pytest.raises(CompileError, match="not unique"):
        graph.check()
    graph = _chain()
    graph.outputs.append("ghost")
    with pytest.raises(CompileError, match="never defined"):
        graph.check()


def test_unique_names_and_rename():
    graph = _chain()
    assert graph.unique_node_name("relu") == "relu_1" and graph.unique_tensor_name("z") == "z"
    graph.rename_tensor("a", "hidden")
    assert graph.nodes[0].outputs == ["hidden"] and graph.nodes[1].inputs == ["hidden"]
    graph.check()
    with pytest.raises(CompileError, match="no tensor named"):
        graph.tensor("a")
