"""A Gather of constant channels, as a channel Slice or a selection conv (LOWERING.md 32).

``Gather(x, indices, axis=1)`` with constant 1-D indices on a ``[1, C, H, W]`` map (or a ``[1, C]``
vector, stored as C channels of one pixel) picks channels: output channel j is input channel
``indices[j]``. Consecutive ascending indices ``a, a+1, .., b-1`` are the channel Slice ``[a, b)``
(passes/channel_slice.py: by address on C2 surfaces, else a selection conv); any other list (a
permutation, repeats) is one 1x1 selection conv, weight 1 at ``[j, indices[j]]`` - exact in both
precisions (the ``selection`` attribute keeps the int8 scale). A ``[1, C]`` vector goes through
``[1, C, 1, 1]`` and back (the same bytes: by address).

Left as host steps (their reason: passes/rewritten_ops.py): a scalar index - it drops the axis,
so ``Gather(state [2, 1, 128], 0) -> [1, 128]`` (silero-vad's LSTM state) turns a 128-wide row into
128 channels, a transpose in NC1HWC2 -; other axes; indices computed at run time.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .context import PassContext
from .focus_as_conv import SELECTION_ATTR
from .match import add_tensor_like, new_constant, reshape_node
from .replace_on_npu import replace_each
from .rewritten_ops import gather_channels


def _picked(graph: Graph, node: Node, x4: str, picked: list[int], out: str) -> Node:
    """The channel Slice (consecutive channels) or the selection conv writing ``out``."""
    start = picked[0]
    if picked == list(range(start, start + len(picked))):
        return Node(graph.unique_node_name(f"{node.name}_slice"), "Slice", [x4], [out],
                    {"starts": [start], "ends": [start + len(picked)], "axes": [1], "steps": [1]})
    weights = np.zeros((len(picked), graph.tensors[x4].shape[1], 1, 1), np.float32)
    weights[np.arange(len(picked)), picked, 0, 0] = 1.0
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
             SELECTION_ATTR: 1}
    weight = new_constant(graph, f"{node.name}_select_weight", weights)
    return Node(graph.unique_node_name(f"{node.name}_select"), "Conv", [x4, weight], [out], attrs)


def _gather_nodes(graph: Graph, node: Node, picked: list[int]) -> list[Node]:
    x, y = node.inputs[0], node.outputs[0]
    if len(graph.tensors[x].shape) == 4:
        return [_picked(graph, node, x, picked, y)]
    dtype = graph.tensors[x].dtype
    x4 = add_tensor_like(graph, f"{x}_4d", (1, graph.tensors[x].shape[1], 1, 1), dtype)  # [1, C]: the same bytes
    y4 = add_tensor_like(graph, f"{y}_4d", (1, len(picked), 1, 1), dtype)
    return [reshape_node(graph, x, x4), _picked(graph, node, x4, picked, y4), reshape_node(graph, y4, y)]


def gather_as_channel_pick(graph: Graph, ctx: PassContext) -> int:
    """A Gather of constant 1-D channel indices becomes a channel Slice or a 1x1 selection Conv."""
    def replacement(node: Node) -> list[Node] | None:
        picked = gather_channels(graph, node)
        return None if picked is None else _gather_nodes(graph, node, picked)

    # a Slice is the channel Slice pass's to decide
    return replace_each(graph, ctx, "Gather", replacement, exempt=("Slice",))


__all__ = ["gather_as_channel_pick"]
