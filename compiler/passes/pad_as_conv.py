"""A standalone constant-zero Pad of H and W as a depthwise identity conv with padding.

A zero Pad before a Conv is fused into the conv's own padding (``fuse_pad``); one before
anything else (a pool, an add, a graph output) or whose padding does not fit beside the conv's
stayed a host step. Here it becomes a depthwise conv, one weight 1 per channel, no bias: the
CNA's padding supplies the zeros (the input's zero point in int8, so real 0), every other
output is its input value.

- The CNA computes no output row whose window starts below the input (the emulator refuses
  ``(out - 1) * stride - pad_top >= in_height``: CORE DATAOUT_SIZE_0 vs CNA DATA_SIZE0), so a
  1x1 kernel cannot make bottom/right padding. For pads (t, l, b, r) the kernel is
  (b + 1) x (r + 1) with its single 1 at the bottom-right tap (b, r), and the conv pads
  (t + b, l + r, b, r): output row o reads input row o - (t + b) + b = o - t, and the last
  window starts on the last input row. [I] Windows lying wholly in the top/left padding
  (t + b >= b + 1) are read as zeros like any padded tap; no fixture has one.
- int8: the conv carries ``focus_as_conv.SELECTION_ATTR`` (its output keeps the input's scale
  and zero point, quant/sharing.py, as the Pad's did), so the result is exact.
- Not rewritten (still a host step, reason in the partition report): reflect/edge modes, a
  non-zero fill, negative (cropping) pads, pads of N or C, t + b or l + r above the
  ``PAD_CON0`` field limit (``limits.max_pad``), b or r past the largest kernel.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .context import PassContext
from .focus_as_conv import SELECTION_ATTR
from .match import new_constant


def _conv_pads(graph: Graph, pad: Node, limit: int, kernel: int) -> list[int] | None:
    """[top, left, bottom, right] of a zero Pad of a 4-D float feature map's H and W, else None."""
    source = graph.tensors[pad.inputs[0]]
    if len(source.shape) != 4 or source.is_const or np.dtype(source.dtype).kind != "f" or pad.fused:
        return None
    pads = [int(v) for v in pad.attrs["pads"]]
    if pad.attrs["mode"] != "constant" or float(pad.attrs["value"]) != 0.0 or min(pads) < 0:
        return None
    if pads[0] or pads[1] or pads[4] or pads[5] or not any(pads):
        return None
    top, left, bottom, right = pads[2], pads[3], pads[6], pads[7]
    if max(top + bottom, left + right) > limit or max(bottom, right) + 1 > kernel:
        return None
    return [top, left, bottom, right]


def identity_tap_weights(channels: int, bottom: int, right: int) -> np.ndarray:
    """[C, 1, bottom + 1, right + 1]: one 1 per channel at the bottom-right tap."""
    weights = np.zeros((channels, 1, bottom + 1, right + 1), np.float32)
    weights[:, 0, bottom, right] = 1.0
    return weights


def pad_as_identity_conv(graph: Graph, ctx: PassContext) -> int:
    """A standalone zero Pad of H/W becomes a depthwise identity Conv with that padding (kernel
    (bottom + 1) x (right + 1), its one 1 at the bottom-right tap: identity_tap_weights)."""
    rewritten = 0
    for pad in [node for node in graph.nodes if node.op_type == "Pad"]:
        pads = _conv_pads(graph, pad, ctx.limits.max_pad, ctx.limits.max_kernel)
        if pads is None:
            continue
        top, left, bottom, right = pads
        channels = graph.tensors[pad.inputs[0]].shape[1]
        weight = new_constant(graph, f"{pad.name}_identity_weight", identity_tap_weights(channels, bottom, right))
        attrs = {"kernel_shape": [bottom + 1, right + 1], "strides": [1, 1],
                 "pads": [top + bottom, left + right, bottom, right], "dilations": [1, 1], "group": channels,
                 SELECTION_ATTR: 1}
        conv = Node(graph.unique_node_name(f"{pad.name}_2conv"), "Conv", [pad.inputs[0], weight], list(pad.outputs),
                    attrs)
        graph.nodes[graph.nodes.index(pad)] = conv
        rewritten += 1
    return rewritten


__all__ = ["identity_tap_weights", "pad_as_identity_conv"]
