"""ONNX import without re-serializing large weights (issue 20: compile time): the checker reads
a model file itself, shape inference gets the model with its large initializers' values left
out. Verdicts, messages and inferred shapes stay those of the whole model."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler import onnx_import
from npuemu.compiler.onnx_import import import_onnx
from npuemu.isa.errors import ModelFileError

BIG = onnx_import.WITHHELD_ELEMENTS  # elements of the weight that shape inference gets without values


def _model(output_shape=(1, BIG // 64)) -> onnx.ModelProto:
    """x (1, 64) -> MatMul with a (64, BIG/64) weight -> Reshape to a shape held in a small
    initializer (shape inference reads its values) -> Relu."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(0, 0.1, (64, BIG // 64)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 4, -1], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None if output_shape is None else [1, 4, BIG // 256])
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])], [out],
                              [weight, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_shape_inference_without_the_weights_infers_the_same_shapes():
    model = _model()
    light = onnx_import._without_weights(model)
    withheld = {init.name: init for init in light.graph.initializer}
    assert not withheld["w"].HasField("raw_data") and list(withheld["w"].dims) == [64, BIG // 64]
    assert withheld["shape"] == model.graph.initializer[1]  # small: its values stay (Reshape's target)
    assert len(model.graph.initializer[0].raw_data) == 4 * BIG  # the caller's model is untouched

    def shapes(m):
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
        return {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output]}

    assert shapes(light) == shapes(model)
    assert onnx_import._onnx_shapes(model, "test")["r"] == (1, 4, BIG // 256)


def test_a_model_without_large_weights_goes_to_shape_inference_as_it_is():
    model = _model()
    del model.graph.initializer[0]
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, BIG // 64]))
    assert onnx_import._without_weights(model) is model


@pytest.mark.parametrize("output_shape", [(1, 4), None])
def test_file_and_in_memory_imports_agree(tmp_path, caplog, output_shape):
    model = _model(output_shape)
    path = tmp_path / "big.onnx"
    onnx.save(model, str(path))
    with caplog.at_level(logging.WARNING):
        from_file, in_memory = import_onnx(path), import_onnx(model)
    assert not [r for r in caplog.records if "shape inference" in r.getMessage()]  # cross-checked, agreeing
    assert [n.op_type for n in from_file.nodes] == [n.op_type for n in in_memory.nodes]
    assert np.array_equal(from_file.tensors["w"].data, in_memory.tensors["w"].data)


def test_the_checker_reading_the_file_refuses_what_it_refuses_in_memory(tmp_path):
    model = _model()
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]  # one value short
    path = tmp_path / "short.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelFileError) as from_file:
        import_onnx(path)
    with pytest.raises(ModelFileError) as in_memory:
        import_onnx(model)
    reason = "raw_data size (65532 bytes) is too small for the declared shape and type (65536 bytes required)"
    assert str(from_file.value) == f"{path}: not a valid ONNX model: TensorProto (tensor name: w) {reason}."
    assert str(in_memory.value) == f"model 'big': not a valid ONNX model: TensorProto (tensor name: w) {reason}."


def test_external_data_is_loaded_and_checked_as_before(tmp_path):
    model = _model()
    weight = numpy_helper.to_array(model.graph.initializer[0])
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="ext.bin", size_threshold=0)
    graph = import_onnx(path)
    assert np.array_equal(graph.tensors["w"].data, weight)
    (tmp_path / "ext.bin").unlink()
    with pytest.raises(ModelFileError, match="not a readable ONNX model"):
        import_onnx(path)
