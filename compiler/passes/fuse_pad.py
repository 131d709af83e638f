"""Pad+Conv: a constant zero Pad of the spatial axes before a Conv becomes the conv's own
padding, as long as the sum stays within the CNA's pad fields (``PAD_CON0``: 4 bits each
on RK3588; the right and bottom pads follow from the output size and are held to the same
limit). Reflect/edge pads, a non-zero fill, negative (cropping) pads and pads of the batch
or channel axes stay a separate Pad.

A Pad before the main op cannot be a fused part (those run after it), so this fusion shows
only in the conv's ``pads``, not in its layer name.
"""

from __future__ import annotations

from ..ir import Graph, Node
from .context import PassContext
from .match import sole_reader


def _spatial_pads(pad: Node, rank: int) -> list[int] | None:
    """ONNX [begins..., ends...] of the spatial axes, if the Pad only pads those with zeros."""
    pads = pad.attrs["pads"]
    if pad.attrs["mode"] != "constant" or pad.attrs["value"] != 0.0 or min(pads) < 0:
        return None
    if any(pads[axis] or pads[rank + axis] for axis in (0, 1)):
        return None
    return pads[2:rank] + pads[rank + 2:]


def fuse_pad_into_conv(graph: Graph, ctx: PassContext) -> int:
    """Pad+Conv: a constant zero Pad before a Conv becomes the conv's padding (within the pad-field limit)."""
    fused = 0
    for pad in [node for node in graph.nodes if node.op_type == "Pad"]:
        conv = sole_reader(graph, pad.outputs[0])
        rank = len(graph.tensors[pad.inputs[0]].shape)
        if conv is None or conv.op_type != "Conv" or conv.inputs[0] != pad.outputs[0] or rank != 4:
            continue
        extra = _spatial_pads(pad, rank)
        if extra is None:
            continue
        combined = [a + b for a, b in zip(conv.attrs["pads"], extra)]
        if max(combined) > ctx.limits.max_pad:
            continue
        conv.attrs = {**conv.attrs, "pads": combined}
        conv.inputs[0] = pad.inputs[0]
        graph.nodes.remove(pad)
        graph.tensors.pop(pad.outputs[0], None)
        fused += 1
    return fused
