"""Tools for the subgraph fusions: read a tree of multiplications, and replace a matched
set of nodes by one node."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Graph, Node
from .match import const, producer, readers, scalar, sole_reader


@dataclass
class Product:
    """A product of tensors and a constant factor, read from a tree of Mul/Div nodes."""

    tensors: list[str] = field(default_factory=list)
    factor: float = 1.0
    nodes: list[Node] = field(default_factory=list)  # the Mul/Div/Pow nodes of the tree


def product_of(graph: Graph, name: str, root: Node | None = None) -> Product:
    """``name`` (or ``root``'s result) as a product: Mul and Div-by-constant nodes whose
    result only the tree reads are opened up, as is Pow(t, integer) of such a tensor; other
    tensors are leaves, scalar constants multiply the factor."""
    result = Product()
    _collect(graph, root or producer(graph, name), name, result, top=True)
    return result


def _collect(graph: Graph, node: Node | None, name: str, result: Product, top: bool) -> None:
    value = scalar(const(graph, name))
    if value is not None:
        result.factor *= value
        return
    inner = node is not None and (top or sole_reader(graph, name) is not None)
    if inner and node.op_type == "Mul" and len(node.inputs) == 2 and not node.fused:
        result.nodes.append(node)
        for operand in node.inputs:
            _collect(graph, producer(graph, operand), operand, result, top=False)
        return
    divisor = scalar(const(graph, node.inputs[1])) if inner and node.op_type == "Div" and not node.fused else None
    if divisor:
        result.nodes.append(node)
        result.factor /= divisor
        _collect(graph, producer(graph, node.inputs[0]), node.inputs[0], result, top=False)
        return
    exponent = scalar(const(graph, node.inputs[1])) if inner and node.op_type == "Pow" else None
    if exponent is not None and exponent == int(exponent) and 1 <= exponent <= 4:
        result.nodes.append(node)
        result.tensors += [node.inputs[0]] * int(exponent)
        return
    result.tensors.append(name)


def replace(graph: Graph, matched: list[Node], new: Node) -> None:
    """Put ``new`` in place of the ``matched`` nodes: at the position of the last of them
    (its inputs are defined before the first), keeping that one's name if ``new`` has none.
    Tensors only the matched nodes produced and read are dropped."""
    order = {id(node): index for index, node in enumerate(graph.nodes)}
    last = max(matched, key=lambda node: order[id(node)])
    position = order[id(last)]
    if not new.name:
        new.name = last.name
    dropped = {name for node in matched for name in node.outputs} - set(new.outputs)
    graph.nodes[position] = new
    for node in matched:
        if node is not last:
            graph.nodes.remove(node)
    for name in dropped:
        if not readers(graph, name) and name not in graph.outputs:
            graph.tensors.pop(name, None)


def only_inside(graph: Graph, matched: list[Node], keep: str) -> bool:
    """True if every result of the matched nodes but ``keep`` is read only inside the match
    (and none is a graph output): removing them loses nothing."""
    inside = {id(node) for node in matched}
    for node in matched:
        for name in node.outputs:
            if name == keep:
                continue
            if name in graph.outputs or any(id(reader) not in inside for reader in readers(graph, name)):
                return False
    return True
