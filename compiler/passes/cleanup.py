"""Clean-up: ops that pass their input through go, consecutive layout ops merge.

- identities: every op the registry calls a no-op for its shapes (Identity, Reshape to the
  same shape, identity Transpose, ...), and ``x*1``, ``x/1``, ``x+0``, ``x-0`` that do not
  broadcast ``x`` (an exported ``Mul(x, 1.0)`` hides ``x*Sigmoid(x)`` from the SiLU match);
- Reshape->Reshape: the second reshapes the first's input directly (Flatten, Squeeze and
  Unsqueeze count as reshapes), and goes if that gives the input's own shape;
- Transpose->Transpose: one Transpose with the composed permutation, none if they cancel;
- a Transpose that only moves size-1 axes keeps the element order: it becomes a Reshape.

A layout op whose input is also read elsewhere stays for those readers; only its use by the
next op is replaced.
"""

from __future__ import annotations

from ..ir import Graph, Node
from ..ops import REGISTRY, TensorInfo
from .context import PassContext
from .match import bypass, const, producer, readers, scalar

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
_NEUTRAL = {"Mul": 1.0, "Div": 1.0, "Add": 0.0, "Sub": 0.0}


def _info(graph: Graph, name: str) -> TensorInfo:
    tensor = graph.tensors[name]
    return TensorInfo(tensor.shape, tensor.dtype)


def _pass_through_source(graph: Graph, node: Node) -> str | None:
    """The input ``node`` passes through unchanged, if it does."""
    if len(node.outputs) != 1 or node.fused:
        return None
    out = _info(graph, node.outputs[0])
    neutral = _NEUTRAL.get(node.op_type)
    if neutral is not None and len(node.inputs) == 2:
        positions = (0, 1) if node.op_type in ("Mul", "Add") else (0,)
        for position in positions:
            source, other = node.inputs[position], node.inputs[1 - position]
            if scalar(const(graph, other)) == neutral and _info(graph, source) == out:
                return source
        return None
    op = REGISTRY.get(node.op_type)
    if op is None or op.is_noop is None or not node.inputs or _info(graph, node.inputs[0]) != out:
        return None
    return node.inputs[0] if op.is_noop(node.attrs, [_info(graph, name) for name in node.inputs], [out]) else None


def remove_identities(graph: Graph, ctx: PassContext) -> int:
    """Ops that pass their input through (Identity, same-shape Reshape, x*1, x+0...) are removed."""
    removed = 0
    for node in list(graph.nodes):
        source = _pass_through_source(graph, node)
        if source is not None and const(graph, source) is None and bypass(graph, node, source):
            removed += 1
    return removed


def _drop_if_unread(graph: Graph, node: Node) -> None:
    if node in graph.nodes and not readers(graph, node.outputs[0]) and node.outputs[0] not in graph.outputs:
        graph.nodes.remove(node)
        graph.tensors.pop(node.outputs[0], None)


def merge_reshapes(graph: Graph, ctx: PassContext) -> int:
    """Reshape->Reshape (and Flatten/Squeeze/Unsqueeze) become one Reshape, or none."""
    merged = 0
    for second in [node for node in graph.nodes if node.op_type in RESHAPES]:
        first = producer(graph, second.inputs[0])
        if second not in graph.nodes or first is None or first.op_type not in RESHAPES or first.fused or second.fused:
            continue
        source = first.inputs[0]
        second.op_type, second.inputs = "Reshape", [source]
        second.attrs = {"shape": list(graph.tensors[second.outputs[0]].shape)}
        if graph.tensors[source].shape == graph.tensors[second.outputs[0]].shape:
            bypass(graph, second, source)
        _drop_if_unread(graph, first)
        merged += 1
    return merged


def merge_transposes(graph: Graph, ctx: PassContext) -> int:
    """Transpose->Transpose becomes one Transpose with the composed permutation, or none if they cancel."""
    merged = 0
    for second in [node for node in graph.nodes if node.op_type == "Transpose"]:
        first = producer(graph, second.inputs[0])
        if second not in graph.nodes or first is None or first.op_type != "Transpose" or first.fused or second.fused:
            continue
        perm = [first.attrs["perm"][axis] for axis in second.attrs["perm"]]
        second.inputs, second.attrs = [first.inputs[0]], {"perm": perm}
        if perm == sorted(perm):
            bypass(graph, second, first.inputs[0])
        _drop_if_unread(graph, first)
        merged += 1
    return merged


def transpose_as_reshape(graph: Graph, ctx: PassContext) -> int:
    """A Transpose that only moves size-1 axes becomes a Reshape."""
    converted = 0
    for node in [node for node in graph.nodes if node.op_type == "Transpose" and not node.fused]:
        shape = graph.tensors[node.inputs[0]].shape
        moved = [axis for axis in node.attrs["perm"] if shape[axis] != 1]
        if moved == sorted(moved):
            node.op_type, node.attrs = "Reshape", {"shape": list(graph.tensors[node.outputs[0]].shape)}
            converted += 1
    return converted


def remove_dead_nodes(graph: Graph, ctx: PassContext) -> int:
    """Nodes whose results nothing reads are removed."""
    return graph.remove_dead()
