"""ReduceMean over the channels or over the plane, as a conv or a global average pool (LOWERING.md 32).

- **Channels** (axes ``[1]`` of ``[1, C]`` or ``[1, C, H, W]``): a 1x1 conv to one channel with
  every weight ``1/C`` (the CNA sums the C products in float32 and the DPU rounds once, as any
  conv; C = 1 or a power of two gives the weights exactly). A ``[1, C]`` vector is reshaped to
  ``[1, C, 1, 1]`` first (the same bytes: by address).
- **The plane** (axes ``[2, 3]`` of ``[1, C, H, W]``): ``GlobalAveragePool`` - the same value by
  definition - which the PPU runs or, at -O3, depthwise convs (rewrites.global_average_pool_as_depthwise_convs).

With ``keepdims = 0`` a Reshape to the output shape follows; ``[1, C, 1, 1] -> [1, C]`` is by
address, a rank-1 or rank-3 result is a host Reshape unless the clean-up merges it with the
next reshape (silero-vad's ``ReduceMean -> [1] -> Unsqueeze -> [1, 1]`` becomes one by-address
Reshape at -O2 and above). Any other ReduceMean (the batch axis, channels together with the
plane, rank 3) stays a host step ("no NPU lowering for ReduceMean").
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .context import PassContext
from .match import add_tensor_like, new_constant, reshape_node
from .replace_on_npu import replace_each
from .rewritten_ops import CHANNELS, reduction

def _channel_mean(graph: Graph, node: Node, x4: str) -> Node:
    channels, plane = graph.tensors[x4].shape[1], tuple(graph.tensors[x4].shape[2:])
    weight = new_constant(graph, f"{node.name}_weight", np.full((1, channels, 1, 1), 1.0 / channels, np.float32))
    out = add_tensor_like(graph, f"{node.outputs[0]}_4d", (1, 1, *plane), graph.tensors[x4].dtype)
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
    return Node(graph.unique_node_name(f"{node.name}_conv"), "Conv", [x4, weight], [out], attrs)


def _mean_nodes(graph: Graph, node: Node, kind: str) -> list[Node]:
    x, y = node.inputs[0], node.outputs[0]
    nodes = []
    if kind == CHANNELS:
        if len(graph.tensors[x].shape) == 2:
            x4 = add_tensor_like(graph, f"{x}_4d", (1, graph.tensors[x].shape[1], 1, 1), graph.tensors[x].dtype)
            nodes.append(reshape_node(graph, x, x4))
            x = x4
        nodes.append(_channel_mean(graph, node, x))
    else:
        pooled = add_tensor_like(graph, f"{y}_4d", (*graph.tensors[x].shape[:2], 1, 1), graph.tensors[x].dtype)
        nodes.append(Node(graph.unique_node_name(f"{node.name}_pool"), "GlobalAveragePool", [x], [pooled]))
    result = nodes[-1].outputs[0]
    if graph.tensors[result].shape == graph.tensors[y].shape:
        nodes[-1].outputs = [y]
        graph.tensors.pop(result)
    else:
        nodes.append(reshape_node(graph, result, y))
    return nodes


def reduce_mean_on_npu(graph: Graph, ctx: PassContext) -> int:
    """ReduceMean over the channels becomes a 1x1 conv of weights 1/C, over the plane a GlobalAveragePool."""
    def replacement(node: Node) -> list[Node] | None:
        kind = reduction(graph, node)
        return None if kind is None else _mean_nodes(graph, node, kind)

    # a host Reshape at the end may merge later
    return replace_each(graph, ctx, "ReduceMean", replacement, exempt=("Reshape",))


__all__ = ["reduce_mean_on_npu"]
