"""Activation subgraphs written out with elementwise ops, recognised as one activation so
they can run as one DPU look-up table and fuse into the conv before them:

- hard-swish ``x * relu6(x + 3) / 6`` as exporters write it: Add(x, 3) -> Clip(0, 6), then
  Mul by x and Div by 6 (or Mul by 1/6) in either order (PyTorch, and Paddle as in the rapidocr
  cls model), and ``x * HardSigmoid(x)`` with alpha 1/6, beta 1/2 -> HardSwish;
- SiLU ``x * Sigmoid(x)`` -> Silu;
- GELU, erf form ``0.5 * x * (1 + erf(x / sqrt 2))`` and tanh form
  ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``, the products in any grouping
  -> Gelu (approximate none / tanh).

Each match needs exactly its constants (to float32 precision) and intermediates read only
inside the match; anything else (a Clip that is not (0, 6), a HardSigmoid with Paddle's
alpha 0.2, x*Sigmoid(y)...) is left as it is. All replacements compute the same function,
so the float evaluator's result only moves by rounding.
"""

from __future__ import annotations

import math

from ..ir import Graph, Node
from . import composite_ops
from .context import PassContext
from .match import const, is_close, other_input, producer, scalar, sole_reader
from .subgraph import only_inside, product_of, replace


def _scaled_by(graph: Graph, node: Node, name: str, factor: float) -> bool:
    """``node`` computes ``name * factor`` (Mul by factor or Div by 1/factor)."""
    other = other_input(node, name)
    value = None if other is None else scalar(const(graph, other))
    if node.op_type == "Mul":
        return is_close(value, factor)
    return node.op_type == "Div" and node.inputs[0] == name and is_close(value, 1.0 / factor)


def _hard_swish_end(graph: Graph, x: str, clip: Node) -> list[Node] | None:
    """The nodes after ``clip`` that finish ``x * clip / 6``, in order, or None."""
    first = sole_reader(graph, clip.outputs[0])
    if first is None:
        return None
    if first.op_type == "Mul" and other_input(first, clip.outputs[0]) == x:
        last = sole_reader(graph, first.outputs[0])
        return [first, last] if last is not None and _scaled_by(graph, last, first.outputs[0], 1 / 6) else None
    if _scaled_by(graph, first, clip.outputs[0], 1 / 6):
        last = sole_reader(graph, first.outputs[0])
        return [first, last] if last is not None and last.op_type == "Mul" and other_input(last, first.outputs[0]) == x else None
    return None


def hard_swish_subgraph(graph: Graph, ctx: PassContext) -> int:
    """x*relu6(x+3)/6 written with Add/Clip/Mul/Div becomes HardSwish."""
    found = 0
    for clip in [node for node in graph.nodes if node.op_type == "Clip"]:
        if clip not in graph.nodes or (clip.attrs["min"], clip.attrs["max"]) != (0.0, 6.0):
            continue
        add = producer(graph, clip.inputs[0])
        if add is None or add.op_type != "Add" or sole_reader(graph, add.outputs[0]) is not clip:
            continue
        x = next((name for name in add.inputs if const(graph, name) is None), None)
        if x is None or not is_close(scalar(const(graph, other_input(add, x) or "")), 3.0):
            continue
        end = _hard_swish_end(graph, x, clip)
        if end is None or not _same_shape(graph, x, end[-1].outputs[0]):
            continue
        matched = [add, clip, *end]
        if only_inside(graph, matched, end[-1].outputs[0]):
            replace(graph, matched, Node("", "HardSwish", [x], list(end[-1].outputs)))
            found += 1
    return found


def hard_sigmoid_times_input(graph: Graph, ctx: PassContext) -> int:
    """x*HardSigmoid(x) with alpha 1/6 and beta 1/2 becomes HardSwish."""
    found = 0
    for gate in [node for node in graph.nodes if node.op_type == "HardSigmoid"]:
        if not (is_close(gate.attrs["alpha"], 1 / 6) and is_close(gate.attrs["beta"], 0.5)):
            continue
        x, mul = gate.inputs[0], sole_reader(graph, gate.outputs[0])
        if mul is None or mul.op_type != "Mul" or other_input(mul, gate.outputs[0]) != x:
            continue
        if _same_shape(graph, x, mul.outputs[0]):
            replace(graph, [gate, mul], Node("", "HardSwish", [x], list(mul.outputs)))
            found += 1
    return found


def silu_subgraph(graph: Graph, ctx: PassContext) -> int:
    """x*Sigmoid(x) becomes Silu."""
    found = 0
    for gate in [node for node in graph.nodes if node.op_type == "Sigmoid"]:
        x, mul = gate.inputs[0], sole_reader(graph, gate.outputs[0])
        if mul is None or mul.op_type != "Mul" or other_input(mul, gate.outputs[0]) != x:
            continue
        if _same_shape(graph, x, mul.outputs[0]):
            replace(graph, [gate, mul], Node("", composite_ops.SILU, [x], list(mul.outputs)))
            found += 1
    return found


def _same_shape(graph: Graph, a: str, b: str) -> bool:
    first, second = graph.tensors[a], graph.tensors[b]
    return first.shape == second.shape and first.dtype == second.dtype


# ---- GELU ----------------------------------------------------------------------------------

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _one_plus(graph: Graph, node: Node) -> Node | None:
    """The ``Add(node's result, 1)`` that alone reads it."""
    add = sole_reader(graph, node.outputs[0])
    if add is None or add.op_type != "Add" or not is_close(scalar(const(graph, other_input(add, node.outputs[0]) or "")), 1.0):
        return None
    return add


def _half_x_times(graph: Graph, x: str, one_plus: Node) -> tuple[Node, list[Node]] | None:
    """The node ending ``0.5 * x * one_plus`` (products in any grouping) and the tree's nodes."""
    current = sole_reader(graph, one_plus.outputs[0])
    while current is not None and current.op_type in ("Mul", "Div"):
        product = product_of(graph, current.outputs[0], current)
        if sorted(product.tensors) == sorted([x, one_plus.outputs[0]]) and is_close(product.factor, 0.5):
            return current, product.nodes
        current = sole_reader(graph, current.outputs[0])
    return None


def _erf_argument(graph: Graph, erf: Node) -> tuple[str, Node] | None:
    """(x, node) when the Erf reads ``x / sqrt 2`` made by that node alone."""
    node = producer(graph, erf.inputs[0])
    if node is None or sole_reader(graph, node.outputs[0]) is not erf:
        return None
    x = next((name for name in node.inputs if const(graph, name) is None), None)
    if x is None or not _scaled_by(graph, node, x, 1 / math.sqrt(2.0)):
        return None
    return x, node


def gelu_erf_subgraph(graph: Graph, ctx: PassContext) -> int:
    """0.5*x*(1+erf(x/sqrt2)) becomes Gelu."""
    found = 0
    for erf in [node for node in graph.nodes if node.op_type == "Erf"]:
        argument = _erf_argument(graph, erf)
        one_plus = None if argument is None else _one_plus(graph, erf)
        end = None if one_plus is None else _half_x_times(graph, argument[0], one_plus)
        if end is None:
            continue
        matched = [argument[1], erf, one_plus, *end[1]]
        if only_inside(graph, matched, end[0].outputs[0]) and _same_shape(graph, argument[0], end[0].outputs[0]):
            replace(graph, matched, Node("", "Gelu", [argument[0]], list(end[0].outputs), {"approximate": "none"}))
            found += 1
    return found


def _tanh_argument(graph: Graph, tanh: Node) -> tuple[str, list[Node]] | None:
    """(x, nodes) when the Tanh reads ``sqrt(2/pi) * (x + 0.044715 x^3)`` made only for it."""
    scale = product_of(graph, tanh.inputs[0])
    if len(scale.tensors) != 1 or not is_close(scale.factor, _SQRT_2_OVER_PI, 1e-5) or not scale.nodes:
        return None
    inner = producer(graph, scale.tensors[0])
    if inner is None or inner.op_type != "Add" or sole_reader(graph, inner.outputs[0]) is None:
        return None
    for x in inner.inputs:
        cube = producer(graph, other_input(inner, x) or "")
        if cube is None or sole_reader(graph, cube.outputs[0]) is not inner:
            continue
        product = product_of(graph, cube.outputs[0], cube)
        if product.tensors == [x] * 3 and is_close(product.factor, 0.044715, 1e-5):
            return x, [*scale.nodes, inner, *product.nodes]
    return None


def gelu_tanh_subgraph(graph: Graph, ctx: PassContext) -> int:
    """0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) becomes Gelu(approximate=tanh)."""
    found = 0
    for tanh in [node for node in graph.nodes if node.op_type == "Tanh"]:
        argument = _tanh_argument(graph, tanh)
        one_plus = None if argument is None else _one_plus(graph, tanh)
        end = None if one_plus is None else _half_x_times(graph, argument[0], one_plus)
        if end is None:
            continue
        matched = [*argument[1], tanh, one_plus, *end[1]]
        if only_inside(graph, matched, end[0].outputs[0]) and _same_shape(graph, argument[0], end[0].outputs[0]):
            replace(graph, matched, Node("", "Gelu", [argument[0]], list(end[0].outputs), {"approximate": "tanh"}))
            found += 1
    return found


__all__ = ["gelu_erf_subgraph", "gelu_tanh_subgraph", "hard_sigmoid_times_input", "hard_swish_subgraph",
           "silu_subgraph"]
