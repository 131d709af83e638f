"""ONNX import: constant folding, dynamic dims, clean-up, names, and the errors users see."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npuemu.compiler.onnx_import import import_onnx, onnx_input_names, parse_shape_spec
from npuemu.isa.errors import CompileError, ModelFileError, NpuemuError, UnsupportedOpError


def i64(values) -> np.ndarray:
    return np.array(values, np.int64)


def _flatten_by_shape_chain(onnx_case, batch="N"):
    """x[N,C,H,W] -> Reshape(x, Concat(Gather(Shape(x), 0), [-1])): the PyTorch flatten export."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus_one"], ["new_shape"], axis=0),
        helper.make_node("Cast", ["new_shape"], ["new_shape64"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["x", "new_shape64"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    inits = {"zero": i64(0), "axes0": i64([0]), "minus_one": i64([-1])}
    return onnx_case.model(nodes, {"x": [batch, 3, 4, 5]}, ["y"], inits, opset=13)


def test_shape_gather_concat_chain_folds_once_dims_are_fixed(onnx_case, rand):
    model = _flatten_by_shape_chain(onnx_case)
    graph = onnx_case.check(model, {"x": rand([2, 3, 4, 5])}, input_shapes={"x": [2, 3, 4, 5]})
    assert [node.op_type for node in graph.nodes] == ["Reshape", "Relu"]
    assert graph.nodes[0].attrs["shape"] == [2, 60]
    assert graph.nodes[0].inputs == ["x"]
    assert not any(name in graph.tensors for name in ("shape", "batch", "new_shape"))  # folded away


def test_constant_nodes_of_every_kind_fold(onnx_case, rand):
    """Paddle exports keep weights in Constant nodes."""
    weight = rand([4, 3, 1, 1], seed=3)
    nodes = [
        helper.make_node("Constant", [], ["w"], value=onnx.numpy_helper.from_array(weight)),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Constant", [], ["bias"], value_floats=[1.0, 2.0, 3.0, 4.0]),
        helper.make_node("Constant", [], ["shape"], value_ints=[1, -1]),
        helper.make_node("Constant", [], ["one"], value_int=1),
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Mul", ["c", "half"], ["m"]),
        helper.make_node("Reshape", ["m", "shape"], ["r"]),
        helper.make_node("Cast", ["one"], ["one_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["r", "one_f"], ["y"]),
    ]
    model = onnx_case.model(nodes, {"x": [1, 3, 2, 2]}, ["y"], opset=13)
    graph = onnx_case.check(model, {"x": rand([1, 3, 2, 2])})
    assert [node.op_type for node in graph.nodes] == ["Conv", "Mul", "Reshape", "Add"]
    assert graph.tensors["w"].is_const and graph.tensors["half"].data.item() == 0.5
    assert "bias" not in graph.tensors  # unused constants are dropped


def test_constant_subgraph_on_weights_folds(onnx_case, rand):
    """Transpose(weights) * 2 is computed at import; only the Conv stays."""
    nodes = [
        helper.make_node("Transpose", ["w_t"], ["w_half"], perm=[1, 0, 2, 3]),
        helper.make_node("Mul", ["w_half", "two"], ["w"]),
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = {"w_t": rand([3, 4, 3, 3], seed=1), "two": np.array(2.0, np.float32)}
    graph = onnx_case.check(onnx_case.model(nodes, {"x": [1, 3, 5, 5]}, ["y"], inits), {"x": rand([1, 3, 5, 5])})
    assert [node.op_type for node in graph.nodes] == ["Conv"]
    assert graph.tensors[graph.nodes[0].inputs[1]].shape == (4, 3, 3, 3)


def test_fold_only_ops_fold_in_shape_subgraphs(onnx_case, rand):
    """ConstantOfShape/Range/Equal/Where/Expand chains (exporter boilerplate) fold away."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Shape", ["s"], ["rank"]),
        helper.make_node("ConstantOfShape", ["rank"], ["ones"], value=helper.make_tensor("v", TensorProto.INT64, [1], [1])),
        helper.make_node("Equal", ["ones", "minus"], ["eq"]),
        helper.make_node("Where", ["eq", "ones", "s"], ["target"]),
        helper.make_node("Range", ["r0", "r1", "r2"], ["idx"]),
        helper.make_node("Expand", ["x", "target"], ["e"]),
        helper.make_node("Gather", ["e", "idx"], ["y"], axis=1),
    ]
    inits = {"minus": i64([-1, -1, -1]), "r0": i64(0), "r1": i64(3), "r2": i64(2)}
    graph = onnx_case.check(onnx_case.model(nodes, {"x": [2, 3, 4]}, ["y"], inits), {"x": rand([2, 3, 4])})
    assert [node.op_type for node in graph.nodes] == ["Gather"]


def test_negative_dim_values_are_dynamic_dims(onnx_case, rand):
    """Paddle exports write a dynamic batch as dim_value -1."""
    model = onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": [-1, 3]}, ["y"])
    with pytest.raises(CompileError, match="input 'x' dim 0 \\('\\?'\\) is dynamic"):
        import_onnx(model)
    assert import_onnx(model, {"x": [5, 3]}).tensors["y"].shape == (5, 3)


def test_dynamic_dims_need_a_shape_and_the_error_names_them(onnx_case):
    model = onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["batch", 3, "height", 8]}, ["y"])
    with pytest.raises(CompileError) as caught:
        import_onnx(model)
    message = str(caught.value)
    assert "input 'x' dim 0 ('batch') is dynamic" in message
    assert "input 'x' dim 2 ('height') is dynamic" in message
    assert "--input-shape x=<dim0>,3,<dim2>,8" in message
    graph = import_onnx(model, {"x": [2, 3, 16, 8]})
    assert graph.tensors["x"].shape == (2, 3, 16, 8) and graph.tensors["y"].shape == (2, 3, 16, 8)


@pytest.mark.parametrize("shapes, expected", [
    ({"nope": [1, 3, 4, 4]}, "no graph input named 'nope'"),
    ({"x": [1, 3, 4]}, "has rank 4, the given shape"),
    ({"x": [1, 5, 4, 4]}, "dim 1 is fixed at 3"),
])
def test_bad_input_shapes(onnx_case, shapes, expected):
    model = onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", 3, 4, 4]}, ["y"])
    with pytest.raises(CompileError, match=expected):
        import_onnx(model, shapes)


def test_static_model_outputs_are_reinferred_for_new_batch(onnx_case, rand):
    model = _flatten_by_shape_chain(onnx_case, batch=1)
    model.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    graph = onnx_case.check(model, {"x": rand([3, 3, 4, 5])}, input_shapes={"x": [3, 3, 4, 5]})
    assert graph.tensors["y"].shape == (3, 60)


def test_unsupported_error_lists_every_bad_node(onnx_case):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("NonMaxSuppression", ["a", "a"], ["b"], name="nms"),
        helper.make_node("Sin", ["x"], ["c"]),
        helper.make_node("MyOp", ["x"], ["d"], domain="com.vendor", name="custom"),
        helper.make_node("Sin", ["x"], ["e"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in "bcde"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.vendor", 1)])
    model.ir_version = 8
    with pytest.raises(UnsupportedOpError) as caught:
        import_onnx(model)
    lines = str(caught.value).splitlines()
    assert "4 unsupported nodes" in lines[0]
    assert "node 'nms': NonMaxSuppression (domain ai.onnx, opset 13)" in lines[1]
    assert "node 'Sin_2': Sin" in lines[2] and "node 'Sin_4': Sin" in lines[4]
    assert "node 'custom': MyOp (domain com.vendor, opset 1): custom domain" in lines[3]
    assert lines[-1].startswith("supported ops: ") and "Conv" in lines[-1]


def test_unsupported_variants_are_listed_together(onnx_case):
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["a"], mode="area", name="area"),
        helper.make_node("Abs", ["x"], ["b"], name="abs"),  # supported: not in the list
        helper.make_node("Pad", ["x", "pads"], ["c"], mode="symmetric_nonsense", name="pad"),
    ]
    model = onnx_case.model(nodes, {"x": [1, 1, 2, 2]}, ["a", "b"],
                            {"scales": np.array([1, 1, 2, 2], np.float32), "pads": i64([0] * 8)}, opset=13)
    with pytest.raises(UnsupportedOpError) as caught:
        import_onnx(model)
    message = str(caught.value)
    assert "2 unsupported nodes" in message and "'abs'" not in message
    assert "'area': Resize" in message and "Resize mode 'area'" in message
    assert "Pad mode 'symmetric_nonsense'" in message


def test_unsupported_errors_are_user_errors():
    assert issubclass(UnsupportedOpError, NpuemuError)


def test_malformed_onnx_files(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\xff\x13 this is not protobuf \x99" * 4)
    with pytest.raises(ModelFileError, match="garbage.onnx"):
        import_onnx(garbage)
    with pytest.raises(ModelFileError, match="no such ONNX file"):
        import_onnx(tmp_path / "missing.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty.onnx: not a valid ONNX model"):
        import_onnx(empty)


def test_model_failing_the_checker(onnx_case):
    model = onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 2]}, ["y"])
    model.graph.node[0].input[0] = "undefined_tensor"
    with pytest.raises(ModelFileError, match="not a valid ONNX model"):
        import_onnx(model)


@pytest.mark.parametrize("opset", [7, 22])
def test_opset_out_of_range(onnx_case, opset):
    model = onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 2]}, ["y"], opset=opset)
    with pytest.raises(CompileError, match=f"opset {opset} is not supported"):
        import_onnx(model)


def test_identity_and_dropout_are_removed_even_before_an_output(onnx_case, rand):
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Dropout", ["b"], ["c"]),
        helper.make_node("Identity", ["c"], ["y"]),
    ]
    graph = onnx_case.check(onnx_case.model(nodes, {"x": [2, 3]}, ["y"]), {"x": rand([2, 3])})
    assert [(node.op_type, node.inputs, node.outputs) for node in graph.nodes] == [("Relu", ["x"], ["y"])]
    assert set(graph.tensors) == {"x", "y"}


def test_other_inference_noops_are_removed(onnx_case, rand):
    nodes = [
        helper.make_node("Reshape", ["x", "same_shape"], ["a"]),
        helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["b"], ["c"], perm=[0, 1, 2]),
        helper.make_node("Slice", ["c", "starts", "ends"], ["d"]),
        helper.make_node("Pad", ["d", "zero_pads"], ["e"]),
        helper.make_node("Concat", ["e"], ["f"], axis=0),
        helper.make_node("Sigmoid", ["f"], ["y"]),
    ]
    inits = {"same_shape": i64([2, 3, 4]), "starts": i64([0]), "ends": i64([100]), "zero_pads": i64([0] * 6)}
    graph = onnx_case.check(onnx_case.model(nodes, {"x": [2, 3, 4]}, ["y"], inits), {"x": rand([2, 3, 4])})
    assert [node.op_type for node in graph.nodes] == ["Sigmoid"]


def test_passthrough_graph_keeps_a_node_between_input_and_output(onnx_case, rand):
    graph = onnx_case.check(onnx_case.model([helper.make_node("Identity", ["x"], ["y"])], {"x": [2]}, ["y"]),
                            {"x": rand([2])})
    assert [node.op_type for node in graph.nodes] == ["Identity"]


def test_node_names_are_unique_and_stable(onnx_case):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="act"),
        helper.make_node("Relu", ["a"], ["b"], name="act"),
        helper.make_node("Sigmoid", ["b"], ["c"]),
        helper.make_node("Tanh", ["c"], ["y"], name="Sigmoid_2"),
    ]
    model = onnx_case.model(nodes, {"x": [1, 2]}, ["y"])
    names = [node.name for node in import_onnx(model).nodes]
    assert names == ["act", "act_1", "Sigmoid_2", "Sigmoid_2_1"]
    assert names == [node.name for node in import_onnx(model).nodes]


def test_model_proto_is_not_modified(onnx_case):
    model = onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", 2]}, ["y"])
    before = model.SerializeToString()
    import_onnx(model, {"x": [4, 2]})
    assert model.SerializeToString() == before


def test_graph_output_that_folds_to_a_constant(onnx_case, rand):
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Relu", ["x"], ["y"])]
    graph = onnx_case.check(onnx_case.model(nodes, {"x": [2, 3]}, ["s", "y"]), {"x": rand([2, 3])})
    assert graph.tensors["s"].data.tolist() == [2, 3]


def test_initializers_listed_as_inputs_are_constants(onnx_case, rand):
    model = onnx_case.model([helper.make_node("Add", ["x", "b"], ["y"])], {"x": [2, 3]}, ["y"],
                            {"b": rand([3], seed=1)})
    model.graph.input.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [3]))  # IR < 4 style
    graph = import_onnx(model)
    assert graph.inputs == ["x"] and graph.tensors["b"].is_const
    assert onnx_input_names(model) == ["x"]


def test_parse_shape_spec():
    assert parse_shape_spec("x=1,3,224,224") == ("x", [1, 3, 224, 224])
    assert parse_shape_spec("1,3,48,192") == (None, [1, 3, 48, 192])
    assert parse_shape_spec("in:0=2x3") == ("in:0", [2, 3])
    for bad in ("x=", "x=1,a", "x=-1,3"):
        with pytest.raises(CompileError, match="input shape"):
            parse_shape_spec(bad)


def test_model_local_functions_are_inlined(onnx_case, rand):
    swish = helper.make_function("local", "Swish", ["X"], ["Y"], [helper.make_node("Sigmoid", ["X"], ["s"]),
                                 helper.make_node("Mul", ["X", "s"], ["Y"])], [helper.make_opsetid("", 13)])
    graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)],
                              functions=[swish], ir_version=8)
    imported = onnx_case.check(model, {"x": rand([2, 3])})
    assert [node.op_type for node in imported.nodes] == ["Sigmoid", "Mul"]
