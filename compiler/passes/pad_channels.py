"""A reflect or edge Pad along the channels, as selection convs and a channel Concat (LOWERING.md 32).

A ``[1, L]`` vector is stored as L channels of one pixel (isa.container_views.tensor_cube), so an
audio front end's reflect Pad of ``[1, 576]`` to ``[1, 640]`` (silero-vad) pads the channels.
Every padded channel is a copy of one input channel: reflect ``p -> -p`` before the start and
``C - 1 - (p - C + 1)`` past the end (the edge not repeated), edge the first or last channel.
So the Pad is

    head = Conv1x1(x, S_head)   [1, b, H, W]   (b channels before, if any)
    tail = Conv1x1(x, S_tail)   [1, e, H, W]   (e channels after, if any)
    y = Concat(head, x, tail) along the channels

with ``S`` 0/1 selection weights (one 1 per output channel at its source channel; each conv reads
only the C2-aligned channel window its sources lie in, a channel Slice by address), exact in
float16, and in int8 exact too: the convs carry ``focus_as_conv.SELECTION_ATTR`` (their output
keeps the input's scale and zero point, quant/sharing.py). A ``[1, C]`` vector is reshaped to
``[1, C, 1, 1]`` and back (the same bytes: by address). The Concat is a DPU copy per input or
no copy at all (LOWERING.md 10.1); an input off a C2 boundary becomes placement convs at -O3
(LOWERING.md 20.2).

Left as host steps ("no NPU lowering for Pad"): pads of H or W with reflect/edge (each padded
row or column would be a copy of its own), constant pads of the channels, several padded axes,
a rank-3 map (its [c, h, w] is stored c x h x w, but a rank-3 -> 4-D Reshape is a host step,
LOWERING.md 18), reflect pads of C or more channels (ONNX requires fewer).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .concat_as_convs import element_c2
from .context import PassContext
from .focus_as_conv import SELECTION_ATTR
from .match import add_tensor_like, new_constant, reshape_node
from .replace_on_npu import replace_each
from .rewritten_ops import channel_pads

def source_channel(mode: str, channel: int, position: int) -> int:
    """The input channel output ``position`` (relative to the first input channel) copies."""
    if mode == "edge":
        return min(max(position, 0), channel - 1)
    if position < 0:
        return -position
    return 2 * (channel - 1) - position if position >= channel else position


def _selection(graph: Graph, name: str, x4: str, mode: str, positions: range, plane: tuple[int, int],
               c2: int) -> list[Node]:
    """The selection conv of the padded ``positions``, reading only the C2-aligned window of the
    channels it copies (a channel Slice: by address, passes/channel_slice.py) when that is not all."""
    channels = graph.tensors[x4].shape[1]
    sources = [source_channel(mode, channels, position) for position in positions]
    low, high = min(sources) // c2 * c2, min(channels, -(-(max(sources) + 1) // c2) * c2)
    nodes, window = [], x4
    if (low, high) != (0, channels):
        window = add_tensor_like(graph, f"{name}_window", (1, high - low, *plane), graph.tensors[x4].dtype)
        nodes.append(Node(graph.unique_node_name(f"{name}_window"), "Slice", [x4], [window],
                          {"starts": [low], "ends": [high], "axes": [1], "steps": [1]}))
    weights = np.zeros((len(positions), high - low, 1, 1), np.float32)
    weights[np.arange(len(positions)), np.array(sources) - low, 0, 0] = 1.0
    out = add_tensor_like(graph, name, (1, len(positions), *plane), graph.tensors[x4].dtype)
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
             SELECTION_ATTR: 1}
    weight = new_constant(graph, f"{name}_weight", weights)
    return [*nodes, Node(graph.unique_node_name(name), "Conv", [window, weight], [out], attrs)]


def _reshaped(graph: Graph, source: str, shape: tuple[int, ...], target: str | None = None) -> Node:
    if target is None:
        target = add_tensor_like(graph, f"{source}_4d", shape, graph.tensors[source].dtype)
    return reshape_node(graph, source, target)


def _pad_nodes(graph: Graph, node: Node, before: int, after: int, c2: int) -> list[Node]:
    x, y = node.inputs[0], node.outputs[0]
    dims, mode = tuple(graph.tensors[x].shape), node.attrs["mode"]
    nodes = [] if len(dims) == 4 else [_reshaped(graph, x, (1, dims[1], 1, 1))]
    x4 = nodes[0].outputs[0] if nodes else x
    channels, plane = dims[1], tuple(graph.tensors[x4].shape[2:])
    parts = [x4]
    if before:
        nodes += _selection(graph, f"{node.name}_head", x4, mode, range(-before, 0), plane, c2)
        parts.insert(0, nodes[-1].outputs[0])
    if after:
        nodes += _selection(graph, f"{node.name}_tail", x4, mode, range(channels, channels + after), plane, c2)
        parts.append(nodes[-1].outputs[0])
    joined = y if len(dims) == 4 else add_tensor_like(graph, f"{y}_4d", (1, channels + before + after, *plane),
                                                      graph.tensors[y].dtype)
    nodes.append(Node(graph.unique_node_name(f"{node.name}_concat"), "Concat", parts, [joined], {"axis": 1}))
    if len(dims) != 4:
        nodes.append(_reshaped(graph, joined, tuple(graph.tensors[y].shape), y))
    return nodes


def pad_channels_as_copies(graph: Graph, ctx: PassContext) -> int:
    """A reflect/edge Pad of a map's channels becomes selection convs and a channel Concat."""
    def replacement(node: Node) -> list[Node] | None:
        pads = channel_pads(graph, node)
        return None if pads is None else _pad_nodes(graph, node, *pads, element_c2(ctx))

    # e.g. more channels than the CNA reads: the Pad stays
    return replace_each(graph, ctx, "Pad", replacement, exempt=("Slice",))


__all__ = ["pad_channels_as_copies", "source_channel"]
