"""Model pruning (guide 5.8, ``--prune`` / ``CompileOptions(prune=True)``; off by default):
output channels of a convolution that are exactly zero are removed, with the matching input
channels of the layers that read them.

A channel is removable when its weights are all zero and its bias is zero (or absent): then
its output is 0 everywhere, padding included. A zero weight with a non-zero bias is a constant
plane, which the next conv's zero padding makes position-dependent: kept. The zero channels
are followed through the readers of the conv's output; every reader must allow the removal,
else nothing is removed:

- a zero-preserving activation (``f(0) = 0``: Relu, LeakyRelu, Clip around 0, Tanh, Silu,
  HardSwish, Gelu, Elu): passed through, its output loses the channels too;
- BatchNormalization whose output at 0 is 0 for those channels (beta = mean * gamma /
  sqrt(var + eps)): its parameters lose them, its output too;
- a depthwise conv with zero bias on those channels: its weights, bias and group lose them;
- a conv with group 1: the input channels of its weights are dropped (the end of the walk).

A graph output or any other reader stops the pruning of that conv. Each removal is logged
(conv, channels, the layers adjusted); the pass log counts the removed channels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ..ir import Graph, Node
from .context import PassContext

log = logging.getLogger(__name__)

_ZERO_PRESERVING = {"Relu", "LeakyRelu", "Tanh", "Silu", "HardSwish", "Gelu", "Elu"}


@dataclass
class _Plan:
    """What removing ``channels`` from a conv's output changes downstream."""

    channels: np.ndarray  # the removed channel indices
    tensors: list[str] = field(default_factory=list)  # activations whose channel axis shrinks
    edits: list[tuple[Node, str]] = field(default_factory=list)  # (reader, how: bn / depthwise / conv)


def prune_zero_channels(graph: Graph, ctx: PassContext) -> int:
    """Pruning: all-zero conv output channels removed with the matching inputs downstream (off unless --prune)."""
    if not ctx.prune:
        return 0
    removed = 0
    for node in list(graph.nodes):
        if node in graph.nodes and node.op_type == "Conv" and node.attrs.get("group", 1) == 1:
            removed += _prune_conv(graph, node)
    return removed


def _const(graph: Graph, node: Node, index: int) -> np.ndarray | None:
    if index >= len(node.inputs):
        return None
    return graph.tensors[node.inputs[index]].data


def _zero_channels(graph: Graph, conv: Node) -> np.ndarray:
    weight, bias = _const(graph, conv, 1), _const(graph, conv, 2)
    if weight is None or (len(conv.inputs) > 2 and bias is None):
        return np.zeros(0, np.int64)
    zero = ~np.any(weight.reshape(weight.shape[0], -1) != 0, axis=1)
    if bias is not None:
        zero &= bias.reshape(-1) == 0
    return np.flatnonzero(zero) if zero.sum() < zero.size else np.zeros(0, np.int64)  # keep one channel


def _prune_conv(graph: Graph, conv: Node) -> int:
    channels = _zero_channels(graph, conv)
    if channels.size == 0:
        return 0
    plan = _Plan(channels)
    if not _walk(graph, conv.outputs[0], plan):
        return 0
    _slice_input(graph, conv, 1, 0, channels)
    _slice_input(graph, conv, 2, 0, channels)
    for name in plan.tensors:
        shape = list(graph.tensors[name].shape)
        shape[1] -= channels.size
        graph.tensors[name].shape = tuple(shape)
    for reader, how in plan.edits:
        _apply(graph, reader, how, channels)
    log.info("pruning: conv '%s': %d all-zero output channel(s) removed %s; readers adjusted: %s", conv.name,
             channels.size, channels.tolist(), ", ".join(f"{node.name} ({how})" for node, how in plan.edits))
    return int(channels.size)


def _walk(graph: Graph, name: str, plan: _Plan) -> bool:
    """Whether every reader of ``name`` (and onwards) allows the removal; fills ``plan``."""
    if name in graph.outputs or name in graph.inputs:
        return False
    plan.tensors.append(name)
    readers = [node for node in graph.nodes if name in node.all_inputs]
    for node in readers:
        if node.fused or node.inputs[0] != name or name in node.inputs[1:]:
            return False
        how = _reader_kind(graph, node, plan.channels)
        if how is None:
            return False
        if how != "conv":
            if how != "activation":
                plan.edits.append((node, how))
            if len(node.outputs) != 1 or not _walk(graph, node.outputs[0], plan):
                return False
        else:
            plan.edits.append((node, how))
    return bool(readers)


def _reader_kind(graph: Graph, node: Node, channels: np.ndarray) -> str | None:
    if node.op_type in _ZERO_PRESERVING or (node.op_type == "Clip" and node.attrs.get("min", -np.inf) <= 0
                                            <= node.attrs.get("max", np.inf)):
        return "activation" if len(node.inputs) == 1 else None  # PRelu-like slopes are not sliced
    if node.op_type == "BatchNormalization" and _bn_zero_at_zero(graph, node, channels):
        return "bn"
    if node.op_type != "Conv" or _const(graph, node, 1) is None:
        return None
    group = node.attrs.get("group", 1)
    if group == 1:
        return "conv"
    weight, bias = _const(graph, node, 1), _const(graph, node, 2)
    if len(node.inputs) > 2 and bias is None:
        return None  # a bias computed at run time
    depthwise = group == weight.shape[0] and weight.shape[1] == 1
    if depthwise and (bias is None or not np.any(bias.reshape(-1)[channels])):
        return "depthwise"  # its pruned channels stay zero: they go on downstream
    return None


def _bn_zero_at_zero(graph: Graph, node: Node, channels: np.ndarray) -> bool:
    params = [_const(graph, node, index) for index in range(1, 5)]
    if any(value is None for value in params):
        return False
    scale, bias, mean, var = (np.asarray(value, np.float64).reshape(-1) for value in params)
    at_zero = bias - mean * scale / np.sqrt(var + node.attrs["epsilon"])
    return not np.any(at_zero[channels])


def _slice_input(graph: Graph, node: Node, index: int, axis: int, channels: np.ndarray) -> None:
    """The node's constant input without ``channels`` along ``axis`` (a new constant: another
    node may read the old one)."""
    data = _const(graph, node, index)
    if data is None:
        return
    kept = np.delete(np.asarray(data), channels, axis=axis)
    node.inputs[index] = graph.add_constant(graph.unique_tensor_name(f"{node.inputs[index]}_pruned"), kept).name


def _apply(graph: Graph, node: Node, how: str, channels: np.ndarray) -> None:
    if how == "conv":
        _slice_input(graph, node, 1, 1, channels)
    elif how == "bn":
        for index in range(1, 5):
            _slice_input(graph, node, index, 0, channels)
    elif how == "depthwise":
        _slice_input(graph, node, 1, 0, channels)
        _slice_input(graph, node, 2, 0, channels)
        node.attrs["group"] = node.attrs["group"] - channels.size
