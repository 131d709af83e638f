"""Clean-up (level 2): identities removed, Reshape and Transpose chains merged or cancelled,
a Transpose of size-1 axes turned into a Reshape; graph outputs keep their names."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.compiler.pass_cases import fused, ops

F = np.float32
I64 = np.int64


def _run(onnx_case, rand, nodes, inits=None, shape=(1, 4, 6, 6), outputs=("y",), level=2):
    model = onnx_case.model(nodes, {"x": list(shape)}, list(outputs), inits or {})
    return fused(onnx_case, model, {"x": rand(list(shape), seed=1)}, level=level)


def _reshape(source, out, shape_name):
    return helper.make_node("Reshape", [source, shape_name], [out])


def test_reshape_chain_becomes_one_reshape(onnx_case, rand):
    nodes = [_reshape("x", "a", "s1"), _reshape("a", "y", "s2")]
    inits = {"s1": np.array([1, 4, 36], I64), "s2": np.array([1, 144], I64)}
    graph = _run(onnx_case, rand, nodes, inits)
    assert ops(graph) == ["Reshape"] and graph.nodes[0].attrs == {"shape": [1, 144]}
    assert ops(_run(onnx_case, rand, nodes, inits, level=1)) == ["Reshape", "Reshape"]


def test_reshapes_that_cancel_disappear(onnx_case, rand):
    nodes = [_reshape("x", "a", "s1"), _reshape("a", "b", "s2"), helper.make_node("Relu", ["b"], ["y"])]
    inits = {"s1": np.array([1, 144], I64), "s2": np.array([1, 4, 6, 6], I64)}
    graph = _run(onnx_case, rand, nodes, inits)
    assert ops(graph) == ["Relu"] and graph.nodes[0].inputs == ["x"]


def test_flatten_and_unsqueeze_merge_as_reshapes(onnx_case, rand):
    nodes = [helper.make_node("Flatten", ["x"], ["a"]), helper.make_node("Unsqueeze", ["a", "axes"], ["y"])]
    graph = _run(onnx_case, rand, nodes, {"axes": np.array([0], I64)})
    assert ops(graph) == ["Reshape"] and graph.nodes[0].attrs == {"shape": [1, 1, 144]}


def test_reshape_whose_result_is_also_an_output_stays_for_it(onnx_case, rand):
    nodes = [_reshape("x", "a", "s1"), _reshape("a", "y", "s2")]
    inits = {"s1": np.array([1, 4, 36], I64), "s2": np.array([1, 144], I64)}
    graph = _run(onnx_case, rand, nodes, inits, outputs=("a", "y"))
    assert [node.inputs for node in graph.nodes] == [["x"], ["x"]]


@pytest.mark.parametrize("perms, expected", [
    (([0, 2, 3, 1], [0, 3, 1, 2]), ["Relu"]),
    (([0, 2, 3, 1], [0, 2, 3, 1]), ["Transpose", "Relu"]),
], ids=["cancel", "compose"])
def test_transpose_pairs(onnx_case, rand, perms, expected):
    nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=perms[0]),
             helper.make_node("Transpose", ["a"], ["b"], perm=perms[1]), helper.make_node("Relu", ["b"], ["y"])]
    graph = _run(onnx_case, rand, nodes)
    assert ops(graph) == expected
    if expected[0] == "Transpose":
        assert graph.nodes[0].attrs["perm"] == [0, 3, 1, 2] and graph.nodes[0].inputs == ["x"]


def test_transpose_of_size_one_axes_is_a_reshape(onnx_case, rand):
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1, 3])]
    graph = _run(onnx_case, rand, nodes, shape=(1, 4, 1, 6))
    assert ops(graph) == ["Reshape"] and graph.nodes[0].attrs == {"shape": [1, 1, 4, 6]}


def test_arithmetic_identities_go(onnx_case, rand):
    nodes = [helper.make_node("Mul", ["one", "x"], ["a"]), helper.make_node("Add", ["a", "zero"], ["b"]),
             helper.make_node("Div", ["b", "one"], ["c"]), helper.make_node("Sub", ["c", "zero"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    graph = _run(onnx_case, rand, nodes, {"one": F(1), "zero": np.zeros((1, 4, 1, 1), F)})
    assert ops(graph) == ["Relu"]


def test_identity_that_broadcasts_stays(onnx_case, rand):
    nodes = [helper.make_node("Mul", ["x", "ones"], ["y"])]
    graph = _run(onnx_case, rand, nodes, {"ones": np.ones((1, 4, 6, 6), F)}, shape=(1, 4, 1, 1))
    assert ops(graph) == ["Mul"]


def test_identity_before_a_graph_output_keeps_the_output_name(onnx_case, rand):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Mul", ["r", "one"], ["y"])]
    graph = _run(onnx_case, rand, nodes, {"one": F(1)})
    assert ops(graph) == ["Relu"] and graph.nodes[0].outputs == ["y"] and graph.outputs == ["y"]


def test_identity_between_graph_input_and_output_stays(onnx_case, rand):
    graph = _run(onnx_case, rand, [helper.make_node("Mul", ["x", "one"], ["y"])], {"one": F(1)})
    assert ops(graph) == ["Mul"] and graph.inputs == ["x"] and graph.outputs == ["y"]
