"""The float evaluator: intermediates, fused parts, the tensor hook, input checks."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npuemu.compiler.float_eval import evaluate, run_node
from npuemu.compiler.ir import FusedOp, Graph, Node, QuantParams, Tensor
from npuemu.compiler.onnx_import import import_onnx
from npuemu.isa.errors import InputError


def _conv_relu_add(onnx_case, rand, outputs=("y",)):
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "x"], ["a"], name="add"),
        helper.make_node("Sigmoid", ["a"], ["y"], name="sigmoid"),
    ]
    inits = {"w": rand([3, 3, 3, 3], -0.5, 0.5, seed=1), "b": rand([3], seed=2)}
    return onnx_case.model(nodes, {"x": [1, 3, 5, 5]}, list(outputs), inits)


def _fuse_relu_add(graph: Graph) -> None:
    """What a fusion pass will do: Conv -> Relu -> Add(residual) becomes one node."""
    conv, relu, add = graph.nodes[:3]
    conv.fused = [FusedOp("Relu", source=relu.name), FusedOp("Add", inputs=["x"], source=add.name)]
    conv.outputs = add.outputs
    graph.nodes[:3] = [conv]
    for name in ("c", "r"):
        del graph.tensors[name]
    graph.check()


def test_return_all_gives_every_intermediate(onnx_case, rand):
    x = rand([1, 3, 5, 5])
    everything = evaluate(import_onnx(_conv_relu_add(onnx_case, rand)), {"x": x}, return_all=True)
    assert set(everything) == {"x", "c", "r", "a", "y"}
    # each intermediate equals onnxruntime's (asked for as extra graph outputs)
    reference = onnx_case.ort(_conv_relu_add(onnx_case, rand, outputs=("c", "r", "a", "y")), {"x": x})
    for name, value in reference.items():
        np.testing.assert_allclose(everything[name], value, rtol=1e-5, atol=1e-5)


def test_fused_parts_apply_in_order(onnx_case, rand):
    model = _conv_relu_add(onnx_case, rand)
    x = rand([1, 3, 5, 5])
    unfused = import_onnx(model)
    expected = evaluate(unfused, {"x": x})["y"]
    fused = import_onnx(model)
    _fuse_relu_add(fused)
    assert [node.display_op for node in fused.nodes] == ["Conv+Relu+Add", "Sigmoid"]
    np.testing.assert_array_equal(evaluate(fused, {"x": x})["y"], expected)
    # order matters: Add then Relu is a different function
    fused.nodes[0].fused.reverse()
    assert not np.allclose(evaluate(fused, {"x": x})["y"], expected)


def test_carry_index_places_the_running_value():
    graph = Graph("g", inputs=["x"], outputs=["y"])
    graph.add_tensor(Tensor("x", (4,), "float32"))
    graph.add_constant("ten", np.full(4, 10.0, np.float32))
    graph.add_tensor(Tensor("y", (4,), "float32"))
    # y = 10 - relu(x): the running value is operand 1 of Sub
    graph.nodes = [Node("n", "Relu", ["x"], ["y"], fused=[FusedOp("Sub", inputs=["ten"], carry_index=1)])]
    graph.check()
    x = np.array([-1, 0, 2, 3], np.float32)
    np.testing.assert_array_equal(evaluate(graph, {"x": x})["y"], [10, 10, 8, 7])
    fetched = run_node(graph.nodes[0], lambda name: {"x": x, "ten": graph.tensors["ten"].data}[name])
    np.testing.assert_array_equal(fetched[0], [10, 10, 8, 7])


def test_tensor_hook_sees_constants_and_outputs(onnx_case, rand):
    graph = import_onnx(_conv_relu_add(onnx_case, rand))
    graph.tensors["w"].quant = QuantParams("int8", np.float32(0.01), np.int32(0))
    seen = []

    def fake_quant(tensor: Tensor, value: np.ndarray) -> np.ndarray:
        seen.append(tensor.name)
        if tensor.quant is None:
            return value
        scale = float(tensor.quant.scale)
        return (np.clip(np.round(value / scale), -128, 127) * scale).astype(value.dtype)

    x = rand([1, 3, 5, 5])
    plain = evaluate(graph, {"x": x})["y"]
    hooked = evaluate(graph, {"x": x}, tensor_hook=fake_quant)["y"]
    assert set(seen) == {"x", "w", "b", "c", "r", "a", "y"} and seen.count("w") == 1
    assert not np.array_equal(plain, hooked)
    np.testing.assert_allclose(plain, hooked, atol=0.05)


def test_values_still_needed_are_kept(onnx_case, rand):
    """Memory release must not drop a value read again later or a graph output."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Tanh", ["c"], ["d"])]
    model = onnx_case.model(nodes, {"x": [3]}, ["a", "d"])
    onnx_case.check(model, {"x": rand([3])})


@pytest.mark.parametrize("feeds, message", [
    ({}, "missing \\['x'\\]"),
    ({"x": np.zeros((1, 3, 5, 5), np.float32), "z": np.zeros(1)}, "unknown \\['z'\\]"),
    ({"x": np.zeros((1, 3, 5, 4), np.float32)}, "has shape \\[1, 3, 5, 4\\], the graph expects \\[1, 3, 5, 5\\]"),
    ({"x": np.zeros((1, 3, 5, 5), np.complex64)}, "has dtype complex64"),
])
def test_input_errors(onnx_case, rand, feeds, message):
    graph = import_onnx(_conv_relu_add(onnx_case, rand))
    with pytest.raises(InputError, match=message):
        evaluate(graph, feeds)


def test_float64_and_int_inputs_are_cast(onnx_case, rand):
    graph = import_onnx(_conv_relu_add(onnx_case, rand))
    x = rand([1, 3, 5, 5])
    np.testing.assert_array_equal(evaluate(graph, {"x": x.astype(np.float64)})["y"], evaluate(graph, {"x": x})["y"])


def test_runtime_data_errors_name_the_node(onnx_case, rand):
    nodes = [helper.make_node("Gather", ["x", "i"], ["y"], axis=0, name="pick")]
    model = onnx_case.model(nodes, {"x": [3], "i": ([2], np.int64)}, ["y"])
    graph = import_onnx(model)
    with pytest.raises(InputError, match="node 'pick' \\(Gather\\)"):
        evaluate(graph, {"x": rand([3]), "i": np.array([0, 7], np.int64)})
