"""A channel Split with an output that does not start on a C2 surface, as 1x1 selection convs.

The NPU's channel Split is one DPU copy per output reading its channel range of the input
(``build_adapt.split_channels``, ``lower_eltwise.lower_slice``), which must start on an
NC1HWC2 surface: C2 = 16 int8, 8 float16 on rk3588 [V] hardware.md 3. Any other start was a
compile error ("the slice starts at channel 3, not on a 8-channel surface").

Here every output of such a Split becomes a 1x1 conv from all C input channels to its ``size``
channels whose weight is 1 at ``[i, start + i]`` and 0 elsewhere. The CNA reads the whole
input and each output channel is one input value, so float16 is exact, and in int8 the conv
carries ``focus_as_conv.SELECTION_ATTR``: its output keeps the input's scale and zero point (as
the Split's outputs did, quant/sharing.py), which makes it exact too. [I] The DPU copy stays for
Splits whose outputs all start on surfaces (existing builds unchanged).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .concat_as_convs import element_c2
from .context import PassContext
from .focus_as_conv import SELECTION_ATTR
from .match import new_constant


def _channel_starts(graph: Graph, node: Node) -> list[int] | None:
    """The output start channels of a 4-D channel Split of a float feature map, else None."""
    if node.op_type != "Split" or node.fused or not node.inputs:
        return None
    source = graph.tensors[node.inputs[0]]
    if len(source.shape) != 4 or source.is_const or np.dtype(source.dtype).kind != "f" \
            or int(node.attrs.get("axis", 0)) % 4 != 1:
        return None
    sizes = [graph.tensors[name].shape[1] for name in node.outputs]
    return [int(start) for start in np.cumsum([0, *sizes[:-1]])]


def channel_selection_weights(channels: int, start: int, size: int) -> np.ndarray:
    """[size, channels, 1, 1]: output channel i is input channel start + i."""
    weights = np.zeros((size, channels, 1, 1), np.float32)
    weights[np.arange(size), start + np.arange(size), 0, 0] = 1.0
    return weights


def split_as_selection_convs(graph: Graph, ctx: PassContext) -> int:
    """A channel Split with an output off a C2 boundary becomes one 1x1 selection Conv per output."""
    c2 = element_c2(ctx)
    rewritten = 0
    for split in [node for node in graph.nodes if node.op_type == "Split"]:
        starts = _channel_starts(graph, split)
        if starts is None or not any(start % c2 for start in starts):
            continue
        source = split.inputs[0]
        channels = graph.tensors[source].shape[1]
        convs = []
        for index, (output, start) in enumerate(zip(split.outputs, starts)):
            size = graph.tensors[output].shape[1]
            weight = new_constant(graph, f"{split.name}_select{index}_weight",
                                  channel_selection_weights(channels, start, size))
            attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
                     "group": 1, SELECTION_ATTR: 1}
            convs.append(Node(graph.unique_node_name(f"{split.name}_select{index}"), "Conv", [source, weight],
                              [output], attrs))
        index = graph.nodes.index(split)
        graph.nodes[index:index + 1] = convs
        rewritten += 1
    return rewritten


__all__ = ["channel_selection_weights", "split_as_selection_convs"]
