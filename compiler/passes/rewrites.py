"""Vendor rewrites (vendor-corpus README §3.3): graph changes the vendor compiler makes so
that the NPU can run an op at all, or better. All run at optimization level 3 only; each
keeps the float result (up to rounding). Input-channel tiling of convs too large for the
CBUF is in ``rewrite_channel_tiling``.

- **FC as conv**: a FullyConnected with one row becomes a Conv on ``[1, K, 1, 1]`` (1x1; or,
  when its input is ``[1, C, H, W]`` flattened at the channel axis, an HxW conv on that input,
  which avoids a reshape), with Reshapes around it where the shapes differ; its bias and
  activation parts move to the conv. The vendor shows ``Reshape -> 1x1 Conv -> Reshape``.
- **GlobalAveragePool as depthwise convs**: the vendor splits it into 2-3 depthwise convs
  (``_2conv0/1/2``; 75x75 -> 7x7 s7 pad 1 -> 11x11 -> 7x7 s7 -> 2x2 -> 2x2 -> 1x1). Each
  non-final conv has kernel = stride = at most the largest CNA stride (3-bit field: 7), zero
  padded up to a multiple (pad split top/left = total // 2); the final conv's kernel is the
  remaining plane (at most 7x7, well within the 5-bit weight width/height fields). Weights:
  1/area for every non-final conv, and for the final conv the value that makes the product
  1/(H*W) (the padded zeros add nothing, so this is the exact mean).
- **Input identity conv**: a graph input whose H*W (> 1) is not a multiple of 4 read by a non-conv
  op (pool, add, mul, sigmoid, concat) gets a 1x1 depthwise identity Conv in front of those
  readers (weight ``Pre_weight<input>``, all ones), as the vendor inserts one.
"""

from __future__ import annotations

import numpy as np

from ..ir import FusedOp, Graph, Node
from . import composite_ops
from .context import PassContext
from .match import CONV_TYPES, add_tensor_like, const, new_constant, per_channel, readers


# ---- FC as conv ------------------------------------------------------------------------------

def _conv_part(graph: Graph, fc: Node, part: FusedOp, out_shape: tuple[int, ...]) -> FusedOp | None:
    """``part`` for the conv's [1, N, 1, 1] output, or None if it cannot move (a residual)."""
    if not part.inputs:
        return FusedOp(part.op_type, dict(part.attrs), [], part.carry_index, part.source, part.tag)
    vector = per_channel(const(graph, part.inputs[0]), out_shape, len(out_shape) - 1)
    if vector is None:
        return None
    name = new_constant(graph, f"{fc.name}_{part.tag or part.op_type.lower()}", vector.reshape(-1, 1, 1))
    return FusedOp(part.op_type, dict(part.attrs), [name], part.carry_index, part.source, part.tag)


def fully_connected_as_conv(graph: Graph, ctx: PassContext) -> int:
    """FC as conv: a one-row FullyConnected becomes a Conv on [1,K,1,1] (or HxW on its 4-D input)."""
    converted = 0
    for fc in [node for node in graph.nodes if node.op_type == composite_ops.FULLY_CONNECTED]:
        x_shape, out_shape = graph.tensors[fc.inputs[0]].shape, graph.tensors[fc.outputs[0]].shape
        weight = const(graph, fc.inputs[1])
        if weight is None or int(np.prod(x_shape[:fc.attrs["axis"]])) != 1:
            continue
        parts = [_conv_part(graph, fc, part, out_shape) for part in fc.fused]
        if any(part is None for part in parts):
            continue
        units = weight.shape[0]
        spatial = x_shape[2:] if len(x_shape) == 4 and fc.attrs["axis"] == 1 else (1, 1)
        if max(spatial) > ctx.limits.max_kernel:
            spatial = (1, 1)
        index = graph.nodes.index(fc)
        source = fc.inputs[0]
        conv_in_shape = (1, weight.shape[1] // (spatial[0] * spatial[1]), *spatial)
        if x_shape != conv_in_shape:
            source = _reshape(graph, index, f"{fc.name}_to_4d", source, conv_in_shape)
            index += 1
        kernel = new_constant(graph, f"{fc.name}_weight", weight.reshape(units, -1, *spatial))
        inputs = [source, kernel] + ([new_constant(graph, f"{fc.name}_bias", const(graph, fc.inputs[2]))]
                                     if len(fc.inputs) > 2 else [])
        conv_out = fc.outputs[0]
        if out_shape != (1, units, 1, 1):
            conv_out = add_tensor_like(graph, f"{fc.outputs[0]}_4d", (1, units, 1, 1), graph.tensors[fc.outputs[0]].dtype)
            graph.nodes.insert(index + 1, Node(graph.unique_node_name(f"{fc.name}_from_4d"), "Reshape", [conv_out],
                                               [fc.outputs[0]], {"shape": list(out_shape)}))
        fc.op_type, fc.inputs, fc.outputs, fc.fused = "Conv", inputs, [conv_out], parts
        fc.attrs = {"kernel_shape": list(spatial), "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
                    "group": 1}
        converted += 1
    return converted


def _reshape(graph: Graph, index: int, name: str, source: str, shape: tuple[int, ...]) -> str:
    """Insert a Reshape of ``source`` to ``shape`` at ``index``; returns its output."""
    out = add_tensor_like(graph, f"{source}_{'x'.join(map(str, shape))}", shape, graph.tensors[source].dtype)
    graph.nodes.insert(index, Node(graph.unique_node_name(name), "Reshape", [source], [out], {"shape": list(shape)}))
    return out


# ---- GlobalAveragePool as depthwise convs ----------------------------------------------------

def average_plan(height: int, width: int, window: int) -> list[tuple[list[int], list[int], list[int]]]:
    """(kernel, strides, pads) of the depthwise convs that average an HxW plane; every
    kernel and stride is at most ``window``."""
    stages = []
    while height > window or width > window:
        kernel = [min(window, height), min(window, width)]
        outs = [-(-height // kernel[0]), -(-width // kernel[1])]
        totals = [outs[0] * kernel[0] - height, outs[1] * kernel[1] - width]
        pads = [totals[0] // 2, totals[1] // 2, totals[0] - totals[0] // 2, totals[1] - totals[1] // 2]
        stages.append((kernel, list(kernel), pads))
        height, width = outs
    stages.append(([height, width], [1, 1], [0, 0, 0, 0]))
    return stages


def global_average_pool_as_depthwise_convs(graph: Graph, ctx: PassContext) -> int:
    """GlobalAveragePool becomes 1-3 depthwise convs (kernel = stride <= 7, then the remainder)."""
    converted = 0
    for pool in [node for node in graph.nodes if node.op_type == "GlobalAveragePool"]:
        shape = graph.tensors[pool.inputs[0]].shape
        if len(shape) != 4 or shape[2] * shape[3] == 1:
            continue
        window = min(ctx.limits.max_stride, ctx.limits.max_kernel)
        plan = average_plan(shape[2], shape[3], window)
        index, source, applied = graph.nodes.index(pool), pool.inputs[0], 1.0
        graph.nodes.remove(pool)
        height, width = shape[2:]
        for stage, (kernel, strides, pads) in enumerate(plan):
            last = stage == len(plan) - 1
            area = kernel[0] * kernel[1]
            value = 1.0 / (shape[2] * shape[3] * applied) if last else 1.0 / area
            applied *= value if not last else 1.0
            height = (height + pads[0] + pads[2] - kernel[0]) // strides[0] + 1
            width = (width + pads[1] + pads[3] - kernel[1]) // strides[1] + 1
            out = pool.outputs[0] if last else add_tensor_like(graph, f"{pool.outputs[0]}_2conv{stage}",
                                                               (shape[0], shape[1], height, width), graph.tensors[source].dtype)
            weight = new_constant(graph, f"{pool.name}_2conv{stage}_weight", np.full((shape[1], 1, *kernel), value))
            attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": [1, 1], "group": shape[1]}
            graph.nodes.insert(index + stage, Node(graph.unique_node_name(f"{pool.name}_2conv{stage}"), "Conv",
                                                   [source, weight], [out], attrs))
            source = out
        converted += 1
    return converted


# ---- identity conv on a graph input ----------------------------------------------------------

def input_identity_conv(graph: Graph, ctx: PassContext) -> int:
    """A graph input with H*W not a multiple of 4 read by a non-conv op gets a 1x1 depthwise identity Conv."""
    inserted = 0
    for name in list(graph.inputs):
        shape = graph.tensors[name].shape
        if len(shape) != 4 or shape[2] * shape[3] == 1 or shape[2] * shape[3] % 4 == 0 \
                or graph.tensors[name].dtype != "float32":
            continue
        # a Readin is the runtime's permuted store of the input itself (LOWERING.md 33.4, 37)
        others = [node for node in readers(graph, name) if node.op_type not in (*CONV_TYPES, "Readin")]
        if not others:
            continue
        out = add_tensor_like(graph, f"{name}_pre", shape, "float32")
        weight = new_constant(graph, f"Pre_weight{name}", np.ones((shape[1], 1, 1, 1)))
        attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": shape[1]}
        for node in others:
            node.inputs = [out if item == name else item for item in node.inputs]
            for part in node.fused:
                part.inputs = [out if item == name else item for item in part.inputs]
        graph.nodes.insert(0, Node(graph.unique_node_name(f"Pre_{name}"), "Conv", [name, weight], [out], attrs))
        inserted += 1
    return inserted


__all__ = ["average_plan", "fully_connected_as_conv", "global_average_pool_as_depthwise_convs",
           "input_identity_conv"]
