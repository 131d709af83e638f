"""SpaceToDepth as one 0/1-weight convolution with kernel = stride = blocksize (LOWERING.md 33).

SpaceToDepth (blocksize b) puts input channel c at pixel ``(b*y + i, b*x + j)`` into output channel
``(i*b + j)*C + c`` at pixel (y, x) (ONNX: reshape [N, C, H/b, b, W/b, b], transpose
(0, 3, 5, 1, 2, 4)). A conv with kernel = stride = b and no pads sees exactly the b x b block of
output pixel (y, x), tap (i, j) at input pixel (b*y + i, b*x + j); weight
``W[(i*b + j)*C + c, c, i, j] = 1`` and 0 elsewhere makes it SpaceToDepth. This is the vendor's
rewrite of the Focus block (four stride-2 Slices + Concat as ``Concat_26_2conv``, a 2x2 stride-2
conv 3 -> 12 channels [V] rknn-fixtures-ops/focus_slice_int8 librknnc_tables.txt), which is
SpaceToDepth b=2 up to the order of its output channels (passes/focus_as_conv.py).

Exact: every output is one input value times 1 (no bias). In int8 the node carries
``SELECTION_ATTR`` so quantization gives input and output one scale and zero point
(quant/sharing.py, as for focus_as_conv / depth_to_space), and the requantization of a weight
stored as 127 with scale 1/127 rounds back to the input value. In fp16 a product by 1.0 summed
with zeros is exact.

Rewritten only where the conv fits the CNA's fields (kernel and stride <= the chip's limits,
b*b*C output kernels); otherwise the SpaceToDepth stays a host step and the partition's rule
(:func:`space_to_depth_rewritten`) names the limit.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .constraints import Constraint
from .context import PassContext
from .focus_as_conv import SELECTION_ATTR
from .match import new_constant


def space_to_depth_weights(channels: int, block: int) -> np.ndarray:
    """The [C*b*b, C, b, b] 0/1 conv weights of SpaceToDepth (blocksize b)."""
    weights = np.zeros((channels * block * block, channels, block, block), np.float32)
    for i in range(block):
        for j in range(block):
            for c in range(channels):
                weights[(i * block + j) * channels + c, c, i, j] = 1.0
    return weights


def _limit(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Why this SpaceToDepth's conv would not be a 4-D batch-1 float conv the CNA fields hold, else None."""
    shape = graph.tensors[node.inputs[0]].shape
    block, limits = int(node.attrs["blocksize"]), ctx.limits
    if node.fused or len(node.outputs) != 1 or len(shape) != 4 or shape[0] != 1:
        return f"input {list(shape)}: a batch-1 4-D map with one output, nothing fused"
    if block < 2 or np.dtype(graph.tensors[node.inputs[0]].dtype).kind != "f":
        return f"blocksize {block} on a {graph.tensors[node.inputs[0]].dtype} tensor: nothing to rearrange on the NPU"
    if block > min(limits.max_kernel, limits.max_stride):
        return (f"blocksize {block} > {min(limits.max_kernel, limits.max_stride)} (the conv's kernel and stride: "
                f"CNA WEIGHT_SIZE2, CONV_CON3)")
    if shape[1] * block * block > limits.max_kernels:
        return f"{shape[1] * block * block} output channels > {limits.max_kernels} (CNA WEIGHT_SIZE2 kernels)"
    return None


@Constraint
def space_to_depth_rewritten(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """SpaceToDepth runs on the NPU only as the 0/1 conv (kernel = stride = blocksize) it is
    rewritten into at optimization level 3 (LOWERING.md 33.1); one left as itself is a host step."""
    if ctx.level < 3:
        return "rewritten as a conv from optimization level 3 (the vendor rewrites)"
    return _limit(graph, node, ctx) or "not rewritten"


def space_to_depth_as_conv(graph: Graph, ctx: PassContext) -> int:
    """SpaceToDepth becomes one 0/1 conv with kernel = stride = blocksize (the vendor's Focus rewrite)."""
    rewritten = 0
    for node in [node for node in graph.nodes if node.op_type == "SpaceToDepth"]:
        if _limit(graph, node, ctx) is not None:
            continue
        block = int(node.attrs["blocksize"])
        channels = graph.tensors[node.inputs[0]].shape[1]
        weight = new_constant(graph, f"{node.name}_s2d_weight", space_to_depth_weights(channels, block))
        attrs = {"kernel_shape": [block, block], "strides": [block, block], "pads": [0, 0, 0, 0],
                 "dilations": [1, 1], "group": 1, SELECTION_ATTR: 1}
        graph.nodes[graph.nodes.index(node)] = Node(graph.unique_node_name(f"{node.name}_conv"), "Conv",
                                                    [node.inputs[0], weight], list(node.outputs), attrs)
        rewritten += 1
    return rewritten


__all__ = ["space_to_depth_as_conv", "space_to_depth_rewritten", "space_to_depth_weights"]
