"""A wide strided conv over a one-channel signal that is stored as a channel vector, as one conv over
the signal's blocks, or one 1x1 conv per output frame joined by a FlatConcat (LOWERING.md 32).

An STFT front end (silero-vad: ``Pad -> [1, 640] -> Unsqueeze [1, 1, 640] -> Conv(258, 1, 256)
stride 128 -> [1, 258, 4]``) is a Conv1d whose kernel (256 taps) is far beyond the CNA's
(``max_kernel``, CNA WEIGHT_SIZE2), so its lifted 2-D form (passes/lift_1d.py) is a host step.
Output frame t is the dot product of the weights with the samples ``[s t, s t + k)``, and the
signal, a ``[1, L]`` vector, is stored as L channels of one pixel (isa.container_views.tensor_cube).

**Blocks** (preferred): cut the signal into B blocks of s samples, block b the channels
``[s b, s (b + 1))``, and lay them side by side as the pixels of ``X [1, s, 1, B]``. Frame t reads
blocks t .. t + ceil(k/s) - 1, so the conv is one conv over X:

    X = FlatConcat(Slice(v, s b .. s (b + 1)) for b < B)     one DPU copy per block (section 29)
    y = Conv(X, W'') kernel [1, ceil(k/s)], stride 1,  W''[o, c, 0, j] = W[o, 0, 0, j s + c] (0 past k)

It needs the blocks inside the signal (B s <= L, B = T - 1 + ceil(k/s)) and ceil(k/s) <= max_kernel.

**Frames** otherwise: each frame a 1x1 conv over its channel window (a fully connected layer):

    f_t = Conv1x1(Slice(v, s t .. s t + k), W')   for t < T,  W' = W (O, 1, 1, k) as (O, k, 1, 1)
    y = FlatConcat(f_0 .. f_(T-1))                 [1, O, 1, T]: one DPU copy per frame into its column

(every frame conv reads one weight constant, stored once, LOWERING.md 30.1, but streamed per frame).
``v`` is the signal as ``[1, L, 1, 1]`` (a Reshape of ``[1, L]``: the same bytes, by address); the
conv's bias and fused parts go on the new conv(s). Both forms sum the wide conv's products, in
another order. The channel windows are channel Slices (passes/channel_slice.py: by address when
they start and end on C2 surfaces - silero's blocks of 128 - else selection convs).

Taken when all hold (else the conv stays as it is): the conv's own form is not run on the NPU;
its input is a one-channel, one-row map ``[1, 1, 1, L]`` reached through reshapes from a
channel vector (``[1, L]`` or ``[1, L, 1, 1]``); group 1, dilation 1, no pads; at most
:data:`MAX_FRAMES` frames or blocks [C] (a copy each); the new conv fits the CNA (the partition's
rules).
"""

from __future__ import annotations

from copy import deepcopy

import numpy as np

from npuemu.isa.container_views import tensor_cube

from ..ir import Graph, Node
from .context import PassContext
from .flat_concat import FLAT_CONCAT
from .match import add_tensor_like, const, new_constant, producer
from .partition import decide

MAX_FRAMES = 64  # [C] the rewrite costs a conv and a copy per frame; past this the host step is kept
RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def signal_source(graph: Graph, name: str) -> str | None:
    """The channel vector ([1, L] or [1, L, 1, 1]) that reshapes make the one-channel row ``name``
    ([1, 1, L], [1, 1, 1, L]) from, else None."""
    length = int(np.prod(graph.tensors[name].shape))
    if tensor_cube(graph.tensors[name].shape) != (1, 1, length):
        return None
    current = name
    for _ in range(8):  # a chain of views is a few nodes long
        node = producer(graph, current)
        if node is None or node.op_type not in RESHAPES or node.fused:
            return None
        current = node.inputs[0]
        shape = graph.tensors[current].shape
        if len(shape) in (2, 4) and tensor_cube(shape) == (length, 1, 1):
            return current
    return None


def frame_geometry(graph: Graph, node: Node, ctx: PassContext) -> tuple[int, int, int] | None:
    """(frames T, stride s, taps k) of a 4-D conv over a [1, 1, 1, L] row this pass rewrites, else None."""
    if node.op_type != "Conv" or len(node.outputs) != 1 or const(graph, node.inputs[1]) is None:
        return None
    x, y, weight = (graph.tensors[name].shape for name in (node.inputs[0], node.outputs[0], node.inputs[1]))
    attrs = node.attrs
    if len(x) != 4 or x[:3] != (1, 1, 1) or len(y) != 4 or y[2] != 1 or weight[1:3] != (1, 1):
        return None
    if attrs["group"] != 1 or max(attrs["dilations"]) != 1 or any(attrs["pads"]) or attrs["strides"][0] != 1:
        return None
    frames, stride, taps = y[3], attrs["strides"][1], weight[3]
    limits = ctx.limits
    if frames > MAX_FRAMES or taps > limits.max_input_channels or y[1] > min(limits.max_kernels,
                                                                                limits.max_cube_channels):
        return None
    return frames, stride, taps


def _frame_nodes(graph: Graph, node: Node, vector: str, geometry: tuple[int, int, int]) -> list[Node]:
    frames, stride, taps = geometry
    out = graph.tensors[node.outputs[0]]
    weight = const(graph, node.inputs[1])
    flat = new_constant(graph, f"{node.inputs[1]}_frames", weight.reshape(weight.shape[0], taps, 1, 1),
                        weight.dtype.name)
    nodes, columns = [], []
    for t in range(frames):
        window = add_tensor_like(graph, f"{node.name}_window{t}", (1, taps, 1, 1), out.dtype)
        nodes.append(Node(graph.unique_node_name(f"{node.name}_window{t}"), "Slice", [vector], [window],
                          {"starts": [stride * t], "ends": [stride * t + taps], "axes": [1], "steps": [1]}))
        column = add_tensor_like(graph, f"{node.name}_frame{t}", (1, out.shape[1], 1, 1), out.dtype)
        attrs = deepcopy(node.attrs) | {"kernel_shape": [1, 1], "strides": [1, 1]}
        nodes.append(Node(graph.unique_node_name(f"{node.name}_frame{t}"), "Conv", [window, flat, *node.inputs[2:]],
                          [column], attrs, deepcopy(node.fused)))
        columns.append(column)
    nodes.append(Node(graph.unique_node_name(f"{node.name}_frames"), FLAT_CONCAT, columns, list(node.outputs)))
    return nodes


def block_taps(graph: Graph, node: Node, geometry: tuple[int, int, int], ctx: PassContext) -> int | None:
    """Taps per row ``ceil(k / s)`` of the block form, None where it does not apply: the blocks the
    frames read must lie inside the signal and the kernel fit the CNA."""
    frames, stride, taps = geometry
    per_window = -(-taps // stride)
    blocks = frames - 1 + per_window
    length = graph.tensors[node.inputs[0]].shape[3]
    if blocks * stride > length or per_window > ctx.limits.max_kernel or blocks > MAX_FRAMES:
        return None
    return per_window


def _block_nodes(graph: Graph, node: Node, vector: str, geometry: tuple[int, int, int], per_window: int) -> list[Node]:
    """The signal's blocks of s samples as the pixels of [1, s, 1, B] (channel slices joined by a
    FlatConcat), then one conv (O, s, 1, ceil(k / s)) of stride 1 over them."""
    frames, stride, taps = geometry
    out = graph.tensors[node.outputs[0]]
    weight = const(graph, node.inputs[1])[:, 0, 0, :]
    padded = np.zeros((weight.shape[0], per_window * stride), weight.dtype)
    padded[:, :taps] = weight  # taps past k multiply the next block by 0
    blocked = padded.reshape(weight.shape[0], per_window, stride).transpose(0, 2, 1)[:, :, None, :]
    kernel = new_constant(graph, f"{node.inputs[1]}_blocks", blocked, weight.dtype.name)
    nodes, blocks = [], []
    for b in range(frames - 1 + per_window):
        block = add_tensor_like(graph, f"{node.name}_block{b}", (1, stride, 1, 1), out.dtype)
        nodes.append(Node(graph.unique_node_name(f"{node.name}_block{b}"), "Slice", [vector], [block],
                          {"starts": [stride * b], "ends": [stride * (b + 1)], "axes": [1], "steps": [1]}))
        blocks.append(block)
    row = add_tensor_like(graph, f"{node.name}_blocks", (1, stride, 1, len(blocks)), out.dtype)
    nodes.append(Node(graph.unique_node_name(f"{node.name}_blocks"), FLAT_CONCAT, blocks, [row]))
    attrs = deepcopy(node.attrs) | {"kernel_shape": [1, per_window], "strides": [1, 1]}
    nodes.append(Node(graph.unique_node_name(f"{node.name}_blocked"), "Conv", [row, kernel, *node.inputs[2:]],
                      list(node.outputs), attrs, deepcopy(node.fused)))
    return nodes


def conv_as_frames(graph: Graph, ctx: PassContext) -> int:
    """A wide conv over a one-channel row read from a channel vector becomes a conv over its blocks or frame convs.

    The block form (one conv over the signal's blocks of s samples) where :func:`block_taps` allows,
    else one 1x1 conv per frame and a FlatConcat (module docstring)."""
    rewritten = 0
    for node in [node for node in graph.nodes if node.op_type == "Conv"]:
        geometry = frame_geometry(graph, node, ctx)
        source = None if geometry is None else signal_source(graph, node.inputs[0])
        if source is None or decide(graph, node, ctx).target == "NPU":
            continue
        vector = source
        prelude = []
        if len(graph.tensors[source].shape) == 2:  # [1, L] -> [1, L, 1, 1]: the same bytes (a view)
            length = graph.tensors[source].shape[1]
            vector = add_tensor_like(graph, f"{source}_4d", (1, length, 1, 1), graph.tensors[source].dtype)
            prelude.append(Node(graph.unique_node_name(f"{source}_4d"), "Reshape", [source], [vector],
                                {"shape": [1, length, 1, 1]}))
        per_window = block_taps(graph, node, geometry, ctx)
        nodes = None if per_window is None else _block_nodes(graph, node, vector, geometry, per_window)
        if nodes is None or any(decide(graph, item, ctx).target != "NPU" for item in nodes[-2:]):
            nodes = _frame_nodes(graph, node, vector, geometry)
            if decide(graph, nodes[1], ctx).target != "NPU":
                continue  # the frame conv does not fit the CNA: keep the conv (remove_dead drops the new tensors)
        index = graph.nodes.index(node)
        graph.nodes[index:index + 1] = prelude + nodes
        rewritten += 1
    return rewritten


__all__ = ["MAX_FRAMES", "block_taps", "conv_as_frames", "frame_geometry", "signal_source"]
