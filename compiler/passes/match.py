"""Small helpers the passes share to read and edit a graph: who produces and who reads a
tensor, constant values, per-channel constants, and the one edit every fusion makes (a
node absorbs the node after it)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .. import op_table
from ..ir import FusedOp, Graph, Node, Tensor

#: Main ops a post-op (bias, activation, residual add) can be fused into: the CNA convolution
#: family, whose results pass through the DPU before they are written back (the op table's
#: fusion role ``conv``: Conv, ConvTranspose, FullyConnected).
CONV_TYPES = op_table.fusion_role("conv")
BIAS_TAG = "bias_add"


def const(graph: Graph, name: str) -> np.ndarray | None:
    """The value of tensor ``name`` if it is a constant, else None."""
    tensor = graph.tensors.get(name)
    return None if tensor is None else tensor.data


def producer(graph: Graph, name: str) -> Node | None:
    for node in graph.nodes:
        if name in node.outputs:
            return node
    return None


def readers(graph: Graph, name: str) -> list[Node]:
    """Nodes that read ``name`` (main inputs or fused-part inputs), each once."""
    # Node.all_inputs without building its list (passes call this ~1,000 times a compile, issue 20)
    return [node for node in graph.nodes
            if name in node.inputs or (node.fused and any(name in part.inputs for part in node.fused))]


def sole_reader(graph: Graph, name: str) -> Node | None:
    """The one node reading ``name`` exactly once, if the tensor is not also a graph output;
    an intermediate that may disappear inside a fusion must pass this test."""
    if name in graph.outputs:
        return None
    found = readers(graph, name)
    if len(found) != 1 or found[0].all_inputs.count(name) != 1:
        return None
    return found[0]


def only_read_by(graph: Graph, name: str, nodes: Iterable[Node]) -> bool:
    """True if ``name`` is no graph output and is read by exactly the given nodes."""
    expected = {id(node) for node in nodes}
    return name not in graph.outputs and {id(node) for node in readers(graph, name)} == expected


def other_input(node: Node, name: str) -> str | None:
    """The other operand of a two-input node, given one of them (None if it reads ``name``
    twice or has not two inputs)."""
    if len(node.inputs) != 2 or node.inputs.count(name) != 1:
        return None
    return node.inputs[1 - node.inputs.index(name)]


def scalar(value: np.ndarray | None) -> float | None:
    """A constant holding one value (any shape of size 1, or all elements equal) as float."""
    if value is None or value.size == 0 or not np.issubdtype(value.dtype, np.floating):
        return None
    flat = value.reshape(-1)
    return float(flat[0]) if np.all(flat == flat[0]) else None


def is_close(value: float | None, expected: float, rtol: float = 1e-6) -> bool:
    """``value`` equals ``expected`` to float32 precision (constants are stored in float32)."""
    return value is not None and abs(value - expected) <= rtol * abs(expected)


def per_channel(value: np.ndarray | None, shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """If ``value`` broadcasts to ``shape`` without growing it and varies only along ``axis``
    (a scalar, [C,1,1], [1,C,1,1], [N] for the last axis...), the float64 vector of its
    ``shape[axis]`` values; else None."""
    if value is None or not np.issubdtype(value.dtype, np.floating) or value.ndim > len(shape):
        return None
    try:
        if np.broadcast_shapes(value.shape, shape) != tuple(shape):
            return None
    except ValueError:
        return None
    padded = value.reshape((1,) * (len(shape) - value.ndim) + value.shape)
    if any(size != 1 for i, size in enumerate(padded.shape) if i != axis):
        return None
    return np.broadcast_to(padded.reshape(-1).astype(np.float64), (shape[axis],)).copy()


def channel_axis(node: Node, graph: Graph) -> int:
    """Axis of a conv-type node's output that holds its output channels (units for FC)."""
    return len(graph.tensors[node.outputs[0]].shape) - 1 if node.op_type == "FullyConnected" else 1


def add_tensor_like(graph: Graph, base: str, shape: tuple[int, ...], dtype: str) -> str:
    """A new non-constant tensor with a unique name derived from ``base``; returns its name."""
    return graph.add_tensor(Tensor(graph.unique_tensor_name(base), shape, dtype)).name


def reshape_node(graph: Graph, source: str, target: str) -> Node:
    """A Reshape of ``source`` into the existing tensor ``target`` (named after it)."""
    return Node(graph.unique_node_name(f"{target}_reshape"), "Reshape", [source], [target],
                {"shape": list(graph.tensors[target].shape)})


def new_constant(graph: Graph, base: str, data: np.ndarray, dtype: str = "float32") -> str:
    """A new constant (never an edit of an existing one: constants may be shared)."""
    return graph.add_constant(base, np.asarray(data, dtype=dtype)).name


def absorb(graph: Graph, host: Node, absorbed: Node, part: FusedOp | None) -> None:
    """``host`` takes over ``absorbed`` (which reads the host's only output): optionally
    appends ``part`` to the host's fused list, takes the absorbed node's outputs and its
    place in the order (so every extra operand is defined before it), and drops the
    intermediate tensor."""
    intermediate = host.outputs[0]
    if part is not None:
        host.fused.append(part)
    host.outputs = list(absorbed.outputs)
    move_to(graph, host, absorbed)
    graph.nodes.remove(absorbed)
    if not readers(graph, intermediate) and intermediate not in graph.outputs:
        graph.tensors.pop(intermediate, None)


def move_to(graph: Graph, node: Node, anchor: Node) -> None:
    """Move ``node`` to just before ``anchor`` if it sits earlier (legal when ``node``'s
    inputs are all defined before ``anchor``, which holds for the fusions here)."""
    nodes = graph.nodes
    if nodes.index(node) < nodes.index(anchor):
        nodes.remove(node)
        nodes.insert(nodes.index(anchor), node)


def bias_parts_only(node: Node) -> bool:
    """True if every fused part of ``node`` is a constant bias add (linear: scales and
    shifts may still be folded through it)."""
    return all(part.tag == BIAS_TAG for part in node.fused)


def bypass(graph: Graph, node: Node, source: str) -> bool:
    """Remove ``node``, whose only output equals tensor ``source`` in value: its readers read
    ``source`` instead. A graph output keeps its name (``source`` is renamed to it), which is
    impossible when ``source`` is a graph input or output or a constant: then the node stays
    and the result is False."""
    target = node.outputs[0]
    if len(node.outputs) != 1:
        return False
    if target in graph.outputs:
        if producer(graph, source) is None or source in graph.outputs or source in graph.inputs:
            return False
        graph.nodes.remove(node)
        del graph.tensors[target]
        graph.rename_tensor(source, target)
        return True
    graph.nodes.remove(node)
    graph.replace_uses(target, source)
    graph.tensors.pop(target, None)
    return True
