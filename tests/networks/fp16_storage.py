"""An fp16-storage model of a network, independent of npuemu's compiler and emulator: the ONNX
model with BatchNormalization folded into its convolutions by hand, then run by onnxruntime
(fp32 arithmetic) with float16 rounding (Cast to float16 and back, round to nearest even) of
the folded weights and of every tensor a layer stores - the outputs of layers as the NPU fuses
them (Conv+BN+Relu/Clip, Conv+BN+Add are one layer: no rounding inside). Biases stay fp32, as
the fp16 DPU's BS operand is fp32 (emulator/NUMERICS.md 4.6).

Used to tell fp16 storage loss from emulator error (tests/networks/test_whole_networks.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: ops whose only consumer fuses into the producing conv's task (the conv output is not stored)
FUSED_AFTER_CONV = ("Relu", "Clip", "Add")


def _fold_batchnorm(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """Conv -> BatchNormalization pairs as one Conv: w' = w s / sqrt(v + eps), b' = beta - m s / sqrt(v + eps)."""
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in graph.initializer}
    norms = {node.input[0]: node for node in graph.node if node.op_type == "BatchNormalization"}
    nodes, kept = [], {}
    for node in graph.node:
        if node.op_type == "BatchNormalization":
            continue
        if node.op_type == "Conv" and node.output[0] in norms and len(node.input) == 2:
            norm = norms[node.output[0]]
            scale, beta, mean, var = (inits[name] for name in norm.input[1:])
            eps = next((a.f for a in norm.attribute if a.name == "epsilon"), 1e-5)
            factor = scale / np.sqrt(var + eps)
            kept[node.input[1]] = inits[node.input[1]] * factor[:, None, None, None]
            kept[f"{node.input[1]}_folded_bias"] = beta - mean * factor
            folded = helper.make_node("Conv", [node.input[0], node.input[1], f"{node.input[1]}_folded_bias"],
                                      [norm.output[0]], name=node.name)
            folded.attribute.extend(node.attribute)
            nodes.append(folded)
            continue
        kept |= {name: inits[name] for name in node.input if name in inits}
        nodes.append(node)
    return nodes, kept


def fp16_storage_model(model: onnx.ModelProto, *, weights: bool = True, activations: bool = True) -> onnx.ModelProto:
    """``model`` folded, with fp16 rounding of the weights and/or the stored activations."""
    nodes, inits = _fold_batchnorm(model)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    fused = {node.output[0] for node in nodes if node.op_type == "Conv" and len(consumers.get(node.output[0], ())) == 1
             and consumers[node.output[0]][0].op_type in FUSED_AFTER_CONV}
    out_nodes: list[onnx.NodeProto] = []

    def stored(name: str) -> str:
        if not activations:
            return name
        out_nodes.append(helper.make_node("Cast", [name], [f"{name}_f16"], to=TensorProto.FLOAT16))
        out_nodes.append(helper.make_node("Cast", [f"{name}_f16"], [f"{name}_stored"], to=TensorProto.FLOAT))
        return f"{name}_stored"

    inputs = [value.name for value in model.graph.input]
    read = {name: stored(name) for name in inputs}
    for node in nodes:
        copy = helper.make_node(node.op_type, [read.get(name, name) for name in node.input], list(node.output),
                                name=node.name)
        copy.attribute.extend(node.attribute)
        out_nodes.append(copy)
        out = node.output[0]
        read[out] = out if out in fused or node.op_type == "Flatten" else stored(out)
    tensors = []
    for name, value in inits.items():
        if weights and value.ndim >= 2:  # conv and FC weights; biases (1-D) stay fp32
            value = value.astype(np.float16)
        tensors.append(numpy_helper.from_array(value.astype(np.float32), name))
    output = model.graph.output[0].name
    graph = helper.make_graph(out_nodes, "fp16_storage", list(model.graph.input),
                              [helper.make_tensor_value_info(read[output], TensorProto.FLOAT, None)], tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
