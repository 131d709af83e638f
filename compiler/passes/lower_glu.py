"""The fused Glu on the NPU (LOWERING.md 22.1): ``a * sigmoid(b)`` over the channel halves of
X, built as the vendor's exGlu is - the halves read by address, one DPU LUT task for the
sigmoid of ``b`` into an intermediate tensor, one DPU element-wise task multiplying ``a`` by
that intermediate through the ERDMA ([V] rknn-fixtures-ops glu_int8 regcmd: task 1 reads
SRC_BASE_ADDR = the second half of x through the LUT into x_exSecondary, task 2 reads the
first half with ERDMA_DATA_MODE 1 on x_exSecondary, EW MUL).

At build stage 5 (``layer_records``) an NPU Glu node becomes a channel Split into the two
halves (ChannelSlice nodes: no task where the halves are views, ``memory_plan.fold_views``),
a Sigmoid node and a Mul node - records of kinds the build already lowers, so the tasks are
those of the unfused graph. The int8 gate is stored with scale 1/255 and zero point -128, the
whole int8 range over sigmoid's [0, 1] ([C]; the vendor's task 1 also writes the gate with
OUT_CVT_OFFSET -128).
"""

from __future__ import annotations

import dataclasses

from ..ir import Graph, Node, QuantParams, Tensor
from .composite_ops import GLU

#: the int8 gate's quantization: sigmoid's [0, 1] over all 256 codes
GATE_SCALE, GATE_ZERO_POINT = 1.0 / 255.0, -128


def gate_quant(input_quant: QuantParams | None) -> QuantParams | None:
    """The gate tensor's quantization for a Glu whose input has ``input_quant``."""
    if input_quant is None or input_quant.dtype != "int8":
        return input_quant  # float16 (or unquantized): the gate is stored like the input
    return QuantParams("int8", GATE_SCALE, GATE_ZERO_POINT)


def expand_glu(graph: Graph, node: Node) -> tuple[list[Tensor], list[Node]] | None:
    """(new tensors, nodes) of an NPU Glu node: Split into halves, Sigmoid, Mul; None for any
    other node. A Glu whose input and output are stored in different precisions (a hybrid
    boundary) stays one host step."""
    if node.op_type != GLU or node.target != "NPU":
        return None
    source, output = graph.tensor(node.inputs[0]), graph.tensor(node.outputs[0])
    in_quant, out_quant = source.quant, output.quant
    if (in_quant is None) != (out_quant is None) or (in_quant is not None and in_quant.dtype != out_quant.dtype):
        return [], [dataclasses.replace(node, target="CPU")]
    half_shape = tuple(output.shape)
    base = node.outputs[0]
    value = Tensor(f"{base}_glu_value", half_shape, source.dtype, quant=in_quant)
    gate_in = Tensor(f"{base}_glu_gate_in", half_shape, source.dtype, quant=in_quant)
    gate = Tensor(f"{base}_glu_gate", half_shape, source.dtype, quant=gate_quant(in_quant))
    split = Node(f"{node.name}_split", "Split", [source.name], [value.name, gate_in.name],
                 {"axis": 1, "split": [half_shape[1], half_shape[1]]}, [], "NPU")
    sigmoid = Node(f"{node.name}_sigmoid", "Sigmoid", [gate_in.name], [gate.name], {}, [], "NPU")
    mul = Node(node.name, "Mul", [value.name, gate.name], [output.name], {}, list(node.fused), "NPU")
    return [value, gate_in, gate], [split, sigmoid, mul]


__all__ = ["GATE_SCALE", "GATE_ZERO_POINT", "expand_glu", "gate_quant"]
