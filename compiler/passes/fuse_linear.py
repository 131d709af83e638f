"""Fully connected layers: Gemm and MatMul with constant weights become ``FullyConnected``
(see ``composite_ops``), which the partition runs as a 1x1 conv and the FC-as-conv rewrite
(level 3) turns into one. A bias Add after it is folded like a conv's (``fold_const_affine``:
MatMul+Add -> FullyConnected with a ``bias_add`` part).

Reshape/Flatten+Gemm: when the FC's input is a Reshape (or Flatten/Squeeze/Unsqueeze) that
only flattens ``[d0..dn]`` into rows and features at some axis, the FC reads the unflattened
tensor directly (its ``axis`` says where to flatten) and the reshape goes. Like Pad+Conv this
is a pre-op fusion: it shows in the FC's inputs, not in its layer name.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from . import composite_ops
from .context import PassContext
from .match import const, new_constant, per_channel, producer

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def gemm_as_fully_connected(graph: Graph, ctx: PassContext) -> int:
    """Gemm with constant B (and a per-unit or absent C) becomes FullyConnected."""
    converted = 0
    for node in [node for node in graph.nodes if node.op_type == "Gemm"]:
        b = const(graph, node.inputs[1])
        if b is None or node.attrs["transA"] or const(graph, node.inputs[0]) is not None:
            continue
        bias = None
        if len(node.inputs) > 2:
            bias = per_channel(const(graph, node.inputs[2]), graph.tensors[node.outputs[0]].shape, 1)
            if bias is None:
                continue
        weight = (b if node.attrs["transB"] else b.T).astype(np.float64) * node.attrs["alpha"]
        inputs = [node.inputs[0], new_constant(graph, f"{node.name}_weight", weight)]
        if bias is not None:
            inputs.append(new_constant(graph, f"{node.name}_bias", bias * node.attrs["beta"]))
        _become_fully_connected(node, inputs, axis=1)
        converted += 1
    return converted


def matmul_as_fully_connected(graph: Graph, ctx: PassContext) -> int:
    """MatMul of a tensor by a constant 2-D matrix becomes FullyConnected."""
    converted = 0
    for node in [node for node in graph.nodes if node.op_type == "MatMul"]:
        b = const(graph, node.inputs[1])
        rank = len(graph.tensors[node.inputs[0]].shape)
        if b is None or b.ndim != 2 or rank < 2 or const(graph, node.inputs[0]) is not None:
            continue
        weight = new_constant(graph, f"{node.name}_weight", b.T)
        _become_fully_connected(node, [node.inputs[0], weight], axis=rank - 1)
        converted += 1
    return converted


def _become_fully_connected(node: Node, inputs: list[str], axis: int) -> None:
    node.op_type = composite_ops.FULLY_CONNECTED
    node.inputs = inputs
    node.attrs = {"axis": axis}


def flatten_into_fully_connected(graph: Graph, ctx: PassContext) -> int:
    """Reshape/Flatten+Gemm: a FullyConnected reads the tensor before a flattening reshape directly."""
    fused = 0
    for fc in [node for node in graph.nodes if node.op_type == composite_ops.FULLY_CONNECTED]:
        reshape = producer(graph, fc.inputs[0])
        if reshape is None or reshape.op_type not in RESHAPES:
            continue
        flat = graph.tensors[fc.inputs[0]].shape
        axis = _flatten_axis(graph.tensors[reshape.inputs[0]].shape, flat, fc.attrs["axis"])
        if axis is None:
            continue
        fc.inputs[0] = reshape.inputs[0]
        fc.attrs = {**fc.attrs, "axis": axis}
        if not _read(graph, reshape.outputs[0]):
            graph.nodes.remove(reshape)
            graph.tensors.pop(reshape.outputs[0], None)
        fused += 1
    return fused


def _read(graph: Graph, name: str) -> bool:
    return name in graph.outputs or any(name in node.all_inputs for node in graph.nodes)


def _flatten_axis(source: tuple[int, ...], flat: tuple[int, ...], axis: int) -> int | None:
    """The axis of ``source`` at which flattening gives the rows and features ``flat`` has at
    ``axis`` (None if no axis does); the smallest such axis keeps the channel axis whole. The
    leading dims must be ``flat``'s own: the FC's output is ``X.shape[:axis] + (N,)``, so a reshape
    that also regroups the rows ([1, 16, 4, 5] -> [1, 64, 5]) cannot go."""
    features = int(np.prod(flat[axis:], dtype=np.int64))
    for candidate in range(1, len(source) + 1):
        if tuple(source[:candidate]) == tuple(flat[:axis]) and \
                int(np.prod(source[candidate:], dtype=np.int64)) == features:
            return candidate
    return None
