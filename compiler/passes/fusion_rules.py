"""Which post-ops a conv-type layer may carry, from the platform's ``fusion`` group.

The platform lists the fused layer shapes the hardware runs (``Conv+Act``, ``Conv+Add``,
``Conv+Act+Add``, ``Conv+Add+Relu``) and the activations ``Act`` stands for. A layer's fused
parts, bias adds left out, must always spell one of those patterns, so fusions are added
one part at a time and each step is checked. Besides the platform's activations, hard-swish
and hard-sigmoid fuse too: the guide's list "Conv+Sigmoid(Tanh/Elu/Silu...)" is open-ended
(§8.4.2), both are DPU look-up-table functions like Sigmoid, and the vendor's profiles name
a ``ConvExSwish`` layer (hardware.md §4). Those extras are the op table's rows with fusion role
``activation_always`` (compiler/op_table.py).

One exception follows the vendor's own rule rather than the hardware's: int8 builds for a chip
whose tasks are written in a vendor register layout (rk3576) never fuse a residual Add after a
look-up-table activation. The vendor's builds run the conv with its activation (``ConvExSwish``)
and then a DPU-only Add, so its layout has no word for the fused form; left apart, calibration
sees the activation's output and the Add is an ordinary int8 Add layer (LOWERING.md 53).
"""

from __future__ import annotations

from npuemu.isa.rknn.rk3576_pack import VENDOR_LAYOUT_OF

from .. import op_table
from ..ir import FusedOp, Graph, Node
from .context import PassContext
from .match import BIAS_TAG, CONV_TYPES, const

LUT_EXTRAS = op_table.fusion_role("activation_always")  # ("HardSwish", "HardSigmoid")
_LUT_ACTIVATIONS = frozenset(op_table.onnx_lut_kinds())  # activations the DPU's LUT computes
_ACT, _ADD = "Act", "Add"


def fusable_activations(ctx: PassContext) -> tuple[str, ...]:
    return (*ctx.platform.fusion.activations, *LUT_EXTRAS)


def part_kind(graph: Graph, part: FusedOp) -> str | None:
    """``Add`` for a residual add, the op type for an activation, None for a bias add."""
    if part.tag == BIAS_TAG:
        return None
    if part.op_type == "Add" and all(const(graph, name) is None for name in part.inputs):
        return _ADD
    return part.op_type


def may_append(ctx: PassContext, graph: Graph, host: Node, op_type: str) -> bool:
    """True if ``host`` with one more post-op ``op_type`` (an activation, or ``Add`` for a
    residual) still matches one of the platform's fusion patterns."""
    if host.op_type not in CONV_TYPES:
        return False
    kinds = [kind for kind in (part_kind(graph, part) for part in host.fused) if kind is not None] + [op_type]
    if _vendor_refuses(ctx, kinds):
        return False
    activations = fusable_activations(ctx)
    for pattern in ctx.platform.fusion.patterns:
        tokens = pattern.split("+")[1:]
        if len(tokens) == len(kinds) and all(_token_matches(token, kind, activations) for token, kind in zip(tokens, kinds)):
            return True
    return False


def _vendor_refuses(ctx: PassContext, kinds: list[str]) -> bool:
    """A residual Add after a LUT activation in an int8 build for a chip with a vendor layout: the vendor
    never fuses it [V ORC Conv + SiLU + Add: ConvExSwish, then a DPU-only Add; LOWERING.md 46.1, 53]."""
    return (kinds[-1] == _ADD and ctx.element_bytes == 1 and ctx.platform.name in VENDOR_LAYOUT_OF
            and any(kind in _LUT_ACTIVATIONS for kind in kinds[:-1]))


def _token_matches(token: str, kind: str, activations: tuple[str, ...]) -> bool:
    if token == _ACT:
        return kind in activations
    return token == kind
