"""IR printing: one stable line per node with shapes, dtypes, attributes, fusion, quantization."""

from __future__ import annotations

import numpy as np
from onnx import helper

from npuemu.compiler.ir import FusedOp, QuantParams
from npuemu.compiler.ir_text import format_graph, format_tensor
from npuemu.compiler.onnx_import import import_onnx


def _model(onnx_case, rand):
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[0, 1, 0, 1], strides=[1, 2], name="conv1"),
        helper.make_node("Relu", ["c"], ["r"], name="relu1"),
        helper.make_node("Mul", ["r", "half"], ["m"], name="scale"),
        helper.make_node("GlobalAveragePool", ["m"], ["y"], name="gap"),
    ]
    inits = {"w": rand([8, 3, 3, 3], seed=1), "b": rand([8], seed=2), "half": np.array(0.5, np.float32)}
    return onnx_case.model(nodes, {"x": ["N", 3, 6, 6]}, ["y"], inits)


def test_one_line_per_node_with_shapes_and_attributes(onnx_case, rand):
    text = format_graph(import_onnx(_model(onnx_case, rand), {"x": [1, 3, 6, 6]}))
    lines = text.splitlines()
    assert lines[0].startswith("graph 'test'  opset 13")
    assert lines[1] == "inputs:  x f32[1,3,6,6]"
    assert lines[2] == "outputs: y f32[1,8,1,1]"
    assert lines[3].startswith("constants: 3 tensors, 9")
    assert lines[4] == ("0 Conv  conv1  (x f32[1,3,6,6], w const f32[8,3,3,3], b const f32[8]) -> (c f32[1,8,4,3])"
                        "  kernel_shape=[3,3] strides=[1,2] pads=[0,1,0,1] dilations=[1,1] group=1")
    assert lines[6] == "2 Mul  scale  (r f32[1,8,4,3], half const f32[]=0.5) -> (m f32[1,8,4,3])"
    assert len(lines) == 4 + 4


def test_fused_parts_and_quantization_are_shown(onnx_case, rand):
    graph = import_onnx(_model(onnx_case, rand), {"x": [1, 3, 6, 6]})
    conv, relu, mul = graph.nodes[:3]
    conv.fused = [FusedOp("Relu", source=relu.name), FusedOp("Mul", inputs=["half"], source=mul.name)]
    conv.outputs = ["m"]
    graph.nodes[:3] = [conv]
    graph.remove_dead()
    graph.tensors["x"].quant = QuantParams("int8", 0.0078125, -1)
    graph.tensors["w"].quant = QuantParams("int8", np.linspace(0.01, 0.02, 8), np.zeros(8), axis=0)
    conv.target = "NPU"
    line = format_graph(graph).splitlines()[4]
    assert line.startswith("0 Conv+Relu+Mul  conv1  (x f32[1,3,6,6] q=i8(s=0.0078125,zp=-1), "
                           "w const f32[8,3,3,3] q=i8(axis=0,8 scales in [0.01,0.02]), b const f32[8]) -> (m f32[1,8,4,3])")
    assert line.endswith("group=1  +Relu  +Mul(half const f32[]=0.5)  on NPU")


def test_text_is_stable(onnx_case, rand):
    model = _model(onnx_case, rand)
    assert format_graph(import_onnx(model, {"x": [1, 3, 6, 6]})) == format_graph(import_onnx(model, {"x": [1, 3, 6, 6]}))


def test_long_lists_are_shortened(onnx_case, rand):
    graph = import_onnx(_model(onnx_case, rand), {"x": [1, 3, 6, 6]})
    graph.nodes[0].attrs["pads"] = list(range(12))
    assert "pads=[0,1,2,3,4,5,6,7,...(12)]" in format_graph(graph)
    assert format_tensor(graph.tensors["b"]) == "b const f32[8]"
