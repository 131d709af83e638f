"""Split+Sigmoid+Mul -> GLU (the guide's §8.5.3 subgraph match): a Split into exactly two
equal halves ``a, b`` along one axis, ``Sigmoid(b)``, and ``Mul(a, Sigmoid(b))`` (operands in
either order), each intermediate read only by the next node. A Split into three, unequal
halves, or the gate on the first half (``b * Sigmoid(a)``) is not this GLU and stays.
"""

from __future__ import annotations

from ..ir import Graph, Node
from . import composite_ops
from .context import PassContext
from .match import other_input, sole_reader
from .subgraph import only_inside, replace


def glu_subgraph(graph: Graph, ctx: PassContext) -> int:
    """Split into two halves + Sigmoid of the second + Mul becomes Glu."""
    found = 0
    for split in [node for node in graph.nodes if node.op_type == "Split"]:
        sizes = split.attrs["split"]
        if len(sizes) != 2 or sizes[0] != sizes[1]:
            continue
        value, gate_input = split.outputs
        gate = sole_reader(graph, gate_input)
        mul = None if gate is None or gate.op_type != "Sigmoid" else sole_reader(graph, gate.outputs[0])
        if mul is None or mul.op_type != "Mul" or other_input(mul, gate.outputs[0]) != value:
            continue
        matched = [split, gate, mul]
        if sole_reader(graph, value) is mul and only_inside(graph, matched, mul.outputs[0]):
            attrs = {"axis": split.attrs["axis"]}
            replace(graph, matched, Node("", composite_ops.GLU, [split.inputs[0]], list(mul.outputs), attrs))
            found += 1
    return found
