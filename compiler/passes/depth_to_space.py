"""DepthToSpace as a ConvTranspose of 0/1 weights, so that its r*r phases run on the NPU.

DepthToSpace (blocksize r) puts input channel ``i(c, ry, rx)`` at output pixel ``(r*y + ry, r*x + rx)``
of channel c, with ``i = (ry*r + rx)*C + c`` (mode DCR) or ``c*r*r + ry*r + rx`` (mode CRD), C the
output depth. That is a ConvTranspose with kernel = stride = r, no pads, C*r*r -> C channels and
weight ``W[i, c, ry, rx] = 1`` where i is that channel, 0 elsewhere: output pixel
``(r*y + ry, r*x + rx)`` of a kernel-equals-stride ConvTranspose sees input pixel (y, x) and tap
(ry, rx) only. The build then splits it into r*r 1x1 channel-selecting phase convs that write their
pixels interleaved into the output (build_adapt.split_conv_transpose, LOWERING.md 13 and 28): no
host step.

Exact: each output is one input value times 1. In int8 the node carries ``SELECTION_ATTR`` so that
quantization gives input and output one scale and zero point (quant/sharing.py, as the other 0/1
convs of focus_as_conv / split_as_convs); the requantization multiplier is then 1/127 of a weight
stored as 127, which rounds back to the input value. In fp16 a product by 1.0 is exact.

Rewritten only where the interleaved write takes it (a phase at least 2 pixels wide, in column
chunks and 32-channel groups where needed, ``deconv_phases.interleave_chunks``): otherwise the
DepthToSpace stays a host step rather than becoming a stacked NPU conv followed by a host
DepthToSpace anyway.
"""

from __future__ import annotations

import numpy as np

from ..deconv_crop import phase_atoms_addressable  # RK356x atoms (LOWERING.md 40)
from ..deconv_phases import GROUP_CHANNELS, interleave_chunks
from ..ir import Graph, Node
from .context import PassContext
from .focus_as_conv import SELECTION_ATTR
from .match import new_constant


def depth_to_space_weights(depth: int, block: int, mode: str) -> np.ndarray:
    """The [depth*r*r, depth, r, r] ConvTranspose weights of DepthToSpace (``mode`` DCR or CRD)."""
    weights = np.zeros((depth * block * block, depth, block, block), np.float32)
    for ry in range(block):
        for rx in range(block):
            for c in range(depth):
                source = (ry * block + rx) * depth + c if mode == "DCR" else (c * block + ry) * block + rx
                weights[source, c, ry, rx] = 1.0
    return weights


def _fits(graph: Graph, node: Node, ctx: PassContext) -> bool:
    """A 4-D batch-1 float DepthToSpace whose r*r phases the interleaved write can place."""
    if node.fused or len(node.outputs) != 1:
        return False
    shape = graph.tensors[node.inputs[0]].shape
    block = int(node.attrs["blocksize"])
    if len(shape) != 4 or shape[0] != 1 or block < 2 or np.dtype(graph.tensors[node.inputs[0]].dtype).kind != "f":
        return False
    depth, width = shape[1] // (block * block), shape[3]
    if not phase_atoms_addressable(ctx.platform, ctx.element_bytes == 2):
        return False  # RK356x: a phase write would start at an odd 8-byte atom (deconv_crop.py)
    pass_kernels = 16 if ctx.element_bytes == 2 else 32  # build_adapt._interleaved_phases' rule
    # more than 32 channels: written in 32-channel groups (build_adapt._interleaved_phases)
    return interleave_chunks(width, min(depth, GROUP_CHANNELS), pass_kernels) is not None


def depth_to_space_as_conv_transpose(graph: Graph, ctx: PassContext) -> int:
    """DepthToSpace (DCR or CRD) becomes a 0/1 ConvTranspose whose phases write interleaved on the NPU."""
    rewritten = 0
    for node in [node for node in graph.nodes if node.op_type == "DepthToSpace"]:
        if not _fits(graph, node, ctx):
            continue
        block, mode = int(node.attrs["blocksize"]), node.attrs["mode"]
        depth = graph.tensors[node.inputs[0]].shape[1] // (block * block)
        weight = new_constant(graph, f"{node.name}_d2s_weight", depth_to_space_weights(depth, block, mode))
        attrs = {"kernel_shape": [block, block], "strides": [block, block], "pads": [0, 0, 0, 0],
                 "dilations": [1, 1], "group": 1, "output_padding": [0, 0], SELECTION_ATTR: 1}
        graph.nodes[graph.nodes.index(node)] = Node(graph.unique_node_name(f"{node.name}_phases"), "ConvTranspose",
                                                    [node.inputs[0], weight], list(node.outputs), attrs)
        rewritten += 1
    return rewritten


__all__ = ["depth_to_space_as_conv_transpose", "depth_to_space_weights"]
