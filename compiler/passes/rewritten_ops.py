"""Ops that run on the NPU only as the layers a graph pass rewrites them into - Pad, Slice, Pow,
Sqrt, ReduceMean, Gather - : which forms the passes take, and the partition rule that names why one
was left as itself (a host step). LOWERING.md 20.3, 24, 32.

The predicates live here, not in the passes, so that the partition (which reads them for its
reasons) and the passes (which read the partition to check their new layers) do not import each
other: passes/pad_channels.py, channel_slice.py, pow_as_mul.py, reduce_mean_npu.py and
gather_index.py use them.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .constraints import Constraint
from .context import PassContext
from .match import const

PAD_MODES = ("reflect", "edge")
CHANNELS, PLANE = "channels", "plane"


def _float_map(graph: Graph, name: str) -> bool:
    tensor = graph.tensors[name]
    return not tensor.is_const and tensor.shape[:1] == (1,) and np.dtype(tensor.dtype).kind == "f"


def channel_pads(graph: Graph, node: Node) -> tuple[int, int] | None:
    """(before, after) of a reflect/edge Pad of only the channels of a [1, C] or [1, C, H, W] float map."""
    if node.op_type != "Pad" or node.fused or node.attrs["mode"] not in PAD_MODES:
        return None
    dims, pads = tuple(graph.tensors[node.inputs[0]].shape), [int(p) for p in node.attrs["pads"]]
    rank = len(dims)
    if not _float_map(graph, node.inputs[0]) or rank not in (2, 4):
        return None
    before, after = pads[1], pads[rank + 1]
    if any(p for i, p in enumerate(pads) if i not in (1, rank + 1)) or min(before, after) < 0 or before + after == 0:
        return None
    if node.attrs["mode"] == "reflect" and max(before, after) >= dims[1]:
        return None  # ONNX reflect pads are below the size
    return before, after


def channel_range(graph: Graph, node: Node) -> tuple[int, int] | None:
    """(start, end) of a step-1 Slice along the channels of a [1, C, H, W] float map, else None."""
    if node.op_type != "Slice" or node.fused or len(node.outputs) != 1:
        return None
    dims, attrs = graph.tensors[node.inputs[0]].shape, node.attrs
    if not _float_map(graph, node.inputs[0]) or len(dims) != 4 or list(attrs["axes"]) != [1] \
            or list(attrs["steps"]) != [1]:
        return None
    start, end = int(attrs["starts"][0]), int(attrs["ends"][0])
    return (start, end) if 0 <= start < end <= dims[1] else None


def pow_exponent(graph: Graph, node: Node) -> float | None:
    """The constant scalar exponent of a Pow of a feature map, else None."""
    if node.op_type != "Pow" or node.fused or len(node.inputs) != 2 or const(graph, node.inputs[0]) is not None:
        return None
    exponent = const(graph, node.inputs[1])
    return None if exponent is None or exponent.size != 1 else float(np.asarray(exponent).ravel()[0])


def reduction(graph: Graph, node: Node) -> str | None:
    """CHANNELS or PLANE for a ReduceMean reduce_mean_npu rewrites, else None."""
    if node.op_type != "ReduceMean" or node.fused or len(node.inputs) != 1 or not _float_map(graph, node.inputs[0]):
        return None
    dims, axes = graph.tensors[node.inputs[0]].shape, sorted(int(a) for a in node.attrs.get("axes") or ())
    if axes == [1] and len(dims) in (2, 4):
        return CHANNELS
    return PLANE if axes == [2, 3] and len(dims) == 4 else None


def gather_channels(graph: Graph, node: Node) -> list[int] | None:
    """The channels a Gather picks: constant 1-D indices (normalized) along axis 1 of a [1, C] or
    [1, C, H, W] float map; else None (a scalar index drops the axis: another layout)."""
    if node.op_type != "Gather" or node.fused or len(node.inputs) != 2 or int(node.attrs.get("axis", 0)) != 1:
        return None
    dims, indices = graph.tensors[node.inputs[0]].shape, const(graph, node.inputs[1])
    if not _float_map(graph, node.inputs[0]) or len(dims) not in (2, 4) or indices is None or indices.ndim != 1:
        return None
    picked = [int(i) + dims[1] if int(i) < 0 else int(i) for i in indices]
    return picked if picked and all(0 <= i < dims[1] for i in picked) else None


def _pad_reason(graph: Graph, node: Node, ctx: PassContext) -> str:
    dims, mode, pads = list(graph.tensors[node.inputs[0]].shape), node.attrs["mode"], node.attrs["pads"]
    if channel_pads(graph, node) is not None:
        return "its selection convs or Concat would be host steps"
    spatial = len(dims) == 4 and not any(pads[i] for i in (0, 1, 4, 5)) and min(pads) >= 0
    if mode == "constant" and float(node.attrs["value"]) == 0.0 and spatial:
        return "a zero pad of H/W before no conv: an identity conv at optimization level 3, within its pad and " \
               f"kernel fields (pads {pads})"
    return f"{mode} pads {pads} of {dims}"


def _slice_reason(graph: Graph, node: Node, ctx: PassContext) -> str:
    if channel_range(graph, node) is not None:
        return "its Split or selection conv would be a host step"
    attrs = node.attrs
    return (f"starts {attrs['starts']}, ends {attrs['ends']}, axes {attrs['axes']}, steps {attrs['steps']} of "
            f"{list(graph.tensors[node.inputs[0]].shape)}")


def _pow_reason(graph: Graph, node: Node, ctx: PassContext) -> str:
    exponent = pow_exponent(graph, node)
    if exponent in (2.0, -0.5):
        return f"exponent {exponent:g} on {list(graph.tensors[node.inputs[0]].shape)}: its layers would be host steps"
    return "a computed exponent" if exponent is None else f"exponent {exponent:g}"


def _sqrt_reason(graph: Graph, node: Node, ctx: PassContext) -> str:
    dims = list(graph.tensors[node.inputs[0]].shape)
    if ctx.element_bytes == 2:
        return f"its look-up tables would be host steps on {dims}"
    return f"an int8 Sqrt of {dims} that is not the root of a sum of squares"


def _mean_reason(graph: Graph, node: Node, ctx: PassContext) -> str:
    if reduction(graph, node) is not None:
        return "its conv or pool would be a host step"
    return f"axes {node.attrs.get('axes')} of {list(graph.tensors[node.inputs[0]].shape)}"


def _gather_reason(graph: Graph, node: Node, ctx: PassContext) -> str:
    if gather_channels(graph, node) is not None:
        return "its Slice or selection conv would be a host step"
    indices = graph.tensors[node.inputs[1]]
    what = f"indices {indices.data.tolist()}" if indices.is_const else "indices computed at run time"
    return f"{what} on axis {node.attrs.get('axis', 0)} of {list(graph.tensors[node.inputs[0]].shape)}"


_REASONS = {"Pad": _pad_reason, "Slice": _slice_reason, "Pow": _pow_reason, "Sqrt": _sqrt_reason,
            "ReduceMean": _mean_reason, "Gather": _gather_reason}


@Constraint
def rewritten_by_a_pass(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Pad, Slice, Pow, Sqrt, ReduceMean and Gather run on the NPU only as the layers graph passes
    rewrite them into (from optimization level 1; LOWERING.md 20.3, 24, 32): a zero Pad of H/W as conv
    padding, a reflect/edge Pad of the channels of a [1,C] or [1,C,H,W] map as selection convs and
    a Concat; a step-1 Slice of the channels of a [1,C,H,W] map as a Split or a selection conv;
    Pow(x, 2) as Mul(x, x); Pow(x, -0.5) and float16 Sqrt of a [1,C,H,W] map as look-up tables, an
    int8 Sqrt only as the root of a sum of squares (a float16 island); ReduceMean over the channels
    or the plane as a conv or a global pool; a Gather of constant 1-D indices along the channels of
    a [1,C] or [1,C,H,W] map as a channel Slice or a selection conv (a scalar index, which drops the
    axis, changes the layout); one left as itself is a host step."""
    if ctx.level < 1:
        return "the graph passes run from optimization level 1"
    return _REASONS[node.op_type](graph, node, ctx)


__all__ = ["CHANNELS", "PAD_MODES", "PLANE", "channel_pads", "channel_range", "gather_channels", "pow_exponent",
           "reduction", "rewritten_by_a_pass"]
