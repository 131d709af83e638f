"""``Pow(x, 2)`` as ``Mul(x, x)`` (LOWERING.md 32).

A square is one multiply: IEEE ``x * x`` is the exactly rounded square, which is what ONNX Pow
with exponent 2 computes (numpy's ``power(x, 2)`` is ``x * x``), so the rewrite changes no float
value. Both operands of the DPU's element-wise Mul are then the same tensor (read twice), so the
square runs on the NPU wherever the partition takes the Mul; elsewhere the Pow stays a host step.
Other exponents are left as they are (Pow(x, -0.5) is 1/sqrt, passes/lower_rsqrt.py).
"""

from __future__ import annotations

from ..ir import Graph, Node
from .context import PassContext
from .partition import decide
from .rewritten_ops import pow_exponent


def _squared(graph: Graph, node: Node) -> bool:
    """A Pow of a feature map by the constant 2 that keeps its shape."""
    same_shape = graph.tensors[node.inputs[0]].shape == graph.tensors[node.outputs[0]].shape
    return pow_exponent(graph, node) == 2.0 and same_shape


def pow_square_as_mul(graph: Graph, ctx: PassContext) -> int:
    """Pow(x, 2) becomes Mul(x, x) where the partition runs the Mul on the NPU."""
    rewritten = 0
    for index, node in enumerate(graph.nodes):
        if not _squared(graph, node):
            continue
        square = Node(node.name, "Mul", [node.inputs[0], node.inputs[0]], list(node.outputs))
        if decide(graph, square, ctx).target == "NPU":
            graph.nodes[index] = square
            rewritten += 1
    return rewritten


__all__ = ["pow_square_as_mul"]
