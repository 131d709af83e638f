"""A Slice of a feature map's channels, as the data movement the NPU already has (LOWERING.md 32).

ONNX ``Slice`` along axis 1 of a ``[1, C, H, W]`` float map with step 1 picks channels
``[start, end)``. Where the map is a conv's output that only channel Slices read (silero-vad's
STFT conv, cut into its real and imaginary halves), each Slice becomes the conv with only its
kernels (weights and bias rows ``[start, end)``: the same sums), and the whole conv goes.
Otherwise, in NC1HWC2 (C2 = 16 int8, 8 float16 on rk3588 [V] hardware.md 3), the Slice is:

- both ends on C2 surfaces (``start % C2 == 0`` and ``end % C2 == 0`` or ``end == C``): a channel
  ``Split`` into ``[0, start)``, ``[start, end)``, ``[end, C)`` (only the parts that are not
  empty). Each part is a view of the input with no task (memory_plan.fold_views, LOWERING.md
  10.1), or a DPU copy of whole surfaces where it cannot be one (a graph input's parts, the
  unread ones too: a small copy, e.g. 1.5 us for silero's 504 channels).
- otherwise: one 1x1 selection conv from all C channels, weight 1 at ``[i, start + i]``
  (``split_as_convs.channel_selection_weights``; the ``selection`` attribute keeps the int8 scale,
  quant/sharing.py), exact in both precisions, as split_as_convs does for a Split off C2.

Any other Slice (another axis, a step other than 1, several axes, rank other than 4, N > 1) is
left as it is: a host step (its reason: passes/rewritten_ops.py).
"""

from __future__ import annotations

from copy import deepcopy

from ..ir import Graph, Node
from .concat_as_convs import element_c2
from .context import PassContext
from .focus_as_conv import SELECTION_ATTR
from .match import add_tensor_like, const, new_constant, producer, readers
from .partition import decide
from .rewritten_ops import channel_range
from .split_as_convs import channel_selection_weights


def _conv_kernels(graph: Graph, node: Node, start: int, end: int) -> Node | None:
    """The conv producing the Slice's map with only kernels [start, end), where only channel Slices
    read that map and no fused part holds a per-channel constant; else None."""
    conv = producer(graph, node.inputs[0])
    if conv is None or conv.op_type != "Conv" or conv.attrs["group"] != 1 or node.inputs[0] in graph.outputs:
        return None
    if any(channel_range(graph, reader) is None for reader in readers(graph, node.inputs[0])):
        return None
    if any(const(graph, name) is None or const(graph, name).size != 1 for part in conv.fused for name in part.inputs):
        return None
    weight = const(graph, conv.inputs[1])
    inputs = [conv.inputs[0], new_constant(graph, f"{conv.inputs[1]}_{start}_{end}", weight[start:end],
                                           weight.dtype.name)]
    if len(conv.inputs) > 2:
        bias = const(graph, conv.inputs[2])
        inputs.append(new_constant(graph, f"{conv.inputs[2]}_{start}_{end}", bias[start:end], bias.dtype.name))
    return Node(graph.unique_node_name(f"{conv.name}_{start}_{end}"), "Conv", inputs, list(node.outputs),
                deepcopy(conv.attrs), deepcopy(conv.fused))


def _split(graph: Graph, node: Node, start: int, end: int) -> Node:
    """The Slice as the middle output of a channel Split (unread parts get tensors of their own)."""
    source = graph.tensors[node.inputs[0]]
    channels, (_, _, height, width) = source.shape[1], source.shape
    outputs, sizes = [], []
    for low, high in ((0, start), (start, end), (end, channels)):
        if high <= low:
            continue
        if (low, high) == (start, end):
            outputs.append(node.outputs[0])
        else:
            outputs.append(add_tensor_like(graph, f"{node.outputs[0]}_rest{low}", (1, high - low, height, width),
                                           source.dtype))
        sizes.append(high - low)
    return Node(graph.unique_node_name(f"{node.name}_split"), "Split", [node.inputs[0]], outputs,
                {"axis": 1, "split": sizes})


def _selection(graph: Graph, node: Node, start: int, end: int) -> Node:
    channels = graph.tensors[node.inputs[0]].shape[1]
    weight = new_constant(graph, f"{node.name}_select_weight", channel_selection_weights(channels, start, end - start))
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
             SELECTION_ATTR: 1}
    return Node(graph.unique_node_name(f"{node.name}_select"), "Conv", [node.inputs[0], weight],
                list(node.outputs), attrs)


def slice_channels(graph: Graph, ctx: PassContext) -> int:
    """A step-1 Slice of a map's channels becomes a channel Split (ends on C2) or a 1x1 selection Conv."""
    c2 = element_c2(ctx)
    rewritten = 0
    for node in [node for node in graph.nodes if node.op_type == "Slice"]:
        found = channel_range(graph, node)
        if found is None:
            continue
        start, end = found
        channels = graph.tensors[node.inputs[0]].shape[1]
        aligned = start % c2 == 0 and (end % c2 == 0 or end == channels)
        index = graph.nodes.index(node)
        new = _conv_kernels(graph, node, start, end)
        if new is None or decide(graph, new, ctx).target != "NPU":
            new = _split(graph, node, start, end) if aligned else _selection(graph, node, start, end)
        if decide(graph, new, ctx).target != "NPU":  # e.g. a selection conv over more channels than the CNA reads
            continue  # the Slice stays a host step; graph.remove_dead drops the unused weight and parts
        graph.nodes[index] = new
        rewritten += 1
    return rewritten


__all__ = ["slice_channels"]
