"""Conv+Add (residual): an Add of a conv-type layer's result and another tensor of exactly
the same shape becomes the layer's fused ``add`` part (the DPU's EW stage reads the other
tensor by DMA). Also after an activation (Conv+Act+Add, the vendor's ConvReluAdd), and a
Relu after the add fuses too (Conv+Add+Relu, the vendor's ConvAddRelu); which sequences are
allowed is the platform's (``fusion_rules``; int8 builds for a chip with a vendor register layout
keep an Add after a LUT activation apart, as the vendor does: LOWERING.md 53).

An Add whose other operand broadcasts (a per-channel tensor, a row...) is not a residual and
stays; one whose other operand is a constant is a bias (``fold_const_affine``).
"""

from __future__ import annotations

from ..ir import FusedOp, Graph, Node
from .context import PassContext
from .fusion_rules import may_append
from .match import absorb, const, producer, sole_reader


def _residual_host(graph: Graph, ctx: PassContext, add: Node) -> tuple[Node, str] | None:
    """The layer that may absorb ``add`` and the Add's other operand; the later layer in the
    order when both operands qualify."""
    shape = graph.tensors[add.outputs[0]].shape
    if len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
        return None
    if any(const(graph, name) is not None or graph.tensors[name].shape != shape for name in add.inputs):
        return None
    candidates = []
    for index, name in enumerate(add.inputs):
        host = producer(graph, name)
        if host is not None and sole_reader(graph, name) is add and may_append(ctx, graph, host, "Add"):
            candidates.append((graph.nodes.index(host), host, add.inputs[1 - index]))
    if not candidates:
        return None
    _, host, residual = max(candidates, key=lambda item: item[0])
    return host, residual


def fuse_residual_add(graph: Graph, ctx: PassContext) -> int:
    """Conv+Add: a residual Add of a conv-type layer's result and a same-shape tensor becomes its fused add part."""
    fused = 0
    for add in [node for node in graph.nodes if node.op_type == "Add"]:
        if add not in graph.nodes:
            continue
        found = _residual_host(graph, ctx, add)
        if found is None:
            continue
        host, residual = found
        carry = add.inputs.index(host.outputs[0])
        absorb(graph, host, add, FusedOp("Add", inputs=[residual], carry_index=carry, source=add.name))
        fused += 1
    return fused
