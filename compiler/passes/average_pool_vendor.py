"""fp16 average pools as depthwise convs on chips with a vendor register layout (compiler/LOWERING.md 51.2).

The vendor's rk3576 toolkit never puts an fp16 average pool on the PPU: it writes a depthwise conv whose
weights are 1 / (kernel area) in fp16 (REGISTER_SEMANTICS.md 50.3 [V ORC]), and its rk3576 PPU words are known
for int8 average and int8 / fp16 max pools only (isa/rknn/rk3576_ppu.py). npuemu's own fp16 rk3576 builds do the
same, so they can be written in the vendor's layout: an AveragePool whose padding is counted (or that has none),
and a GlobalAveragePool over one element (larger ones are already depthwise convs at -O3:
rewrites.global_average_pool_as_depthwise_convs). Other chips and int8 builds keep the PPU pool.
"""

from __future__ import annotations

import numpy as np

from npuemu.isa.rknn.rk3576_pack import VENDOR_LAYOUT_OF

from ..ir import Graph, Node
from .context import PassContext
from .match import new_constant


def _plan(node: Node, shape, ctx: PassContext) -> tuple[list[int], list[int], list[int]] | None:
    """(kernel, strides, pads) of the depthwise conv that is the pool, or None (the PPU keeps it)."""
    if node.op_type == "GlobalAveragePool":
        return ([1, 1], [1, 1], [0, 0, 0, 0]) if shape[2] * shape[3] == 1 else None
    kernel = list(node.attrs.get("kernel_shape", []))
    strides = list(node.attrs.get("strides", [1, 1]))
    pads = list(node.attrs.get("pads", [0, 0, 0, 0]))
    if (len(kernel) != 2 or node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET")
            or node.attrs.get("ceil_mode", 0) or any(pads) and not node.attrs.get("count_include_pad", 0)
            or any(d != 1 for d in node.attrs.get("dilations", [1, 1]))
            or max(kernel) > ctx.limits.max_kernel or max(strides) > ctx.limits.max_stride
            or max(pads, default=0) > ctx.limits.max_pad):
        return None
    return kernel, strides, pads


def average_pool_as_depthwise_conv(graph: Graph, ctx: PassContext) -> int:
    """fp16 average pools become depthwise convs of weight 1 / area on chips with a vendor layout (rk3576)."""
    if ctx.element_bytes != 2 or ctx.platform.name not in VENDOR_LAYOUT_OF:
        return 0
    converted = 0
    for node in [n for n in graph.nodes if n.op_type in ("AveragePool", "GlobalAveragePool") and not n.fused]:
        shape = graph.tensors[node.inputs[0]].shape
        plan = _plan(node, shape, ctx) if len(shape) == 4 else None
        if plan is None:
            continue
        kernel, strides, pads = plan
        weight = new_constant(graph, f"{node.name}_dw_weight",
                              np.full((shape[1], 1, *kernel), 1.0 / (kernel[0] * kernel[1])))
        attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": [1, 1], "group": shape[1]}
        index = graph.nodes.index(node)
        graph.nodes[index] = Node(graph.unique_node_name(f"{node.name}_dw"), "Conv", [node.inputs[0], weight],
                                  list(node.outputs), attrs)
        converted += 1
    return converted


__all__ = ["average_pool_as_depthwise_conv"]
