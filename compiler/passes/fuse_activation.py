"""Conv+Activation: an activation reading a conv-type layer's result (and nothing else
reading it) becomes the layer's fused part, applied by the DPU on the way out.

Tags in the layer name: ``relu``, ``relu6`` (exactly Clip(0, 6)), ``clip`` (any other
bounds: its own part, with its bounds as attributes), ``leaky_relu``, ``prelu``, ``sigmoid``,
``tanh``, ``elu``, ``silu``, ``hard_swish``, ``hard_sigmoid``. PRelu fuses only with a
constant slope per output channel (or one slope). Which activations and in which position
is :mod:`fusion_rules`'s business (the platform's fusion patterns).
"""

from __future__ import annotations

from ..ir import FusedOp, Graph, Node
from .context import PassContext
from .fusion_rules import fusable_activations, may_append
from .match import absorb, channel_axis, const, per_channel, producer, sole_reader


def activation_tag(node: Node) -> str:
    """The layer-name tag of an activation part (empty: the op's own snake_case name)."""
    if node.op_type == "Clip":
        return "relu6" if (node.attrs["min"], node.attrs["max"]) == (0.0, 6.0) else "clip"
    return ""


def _slope_ok(graph: Graph, host: Node, act: Node) -> bool:
    if act.op_type != "PRelu":
        return True
    shape = graph.tensors[host.outputs[0]].shape
    return per_channel(const(graph, act.inputs[1]), shape, channel_axis(host, graph)) is not None


def fuse_activation(graph: Graph, ctx: PassContext) -> int:
    """Conv+Act: an activation after a conv-type layer becomes its fused part (relu, relu6, clip, prelu, sigmoid...)."""
    fused = 0
    for act in list(graph.nodes):
        if act not in graph.nodes or len(act.outputs) != 1 or act.op_type not in fusable_activations(ctx):
            continue
        host = producer(graph, act.inputs[0])
        if host is None or sole_reader(graph, host.outputs[0]) is not act or not may_append(ctx, graph, host, act.op_type):
            continue
        if not _slope_ok(graph, host, act):
            continue
        part = FusedOp(act.op_type, dict(act.attrs), list(act.inputs[1:]), 0, act.name, activation_tag(act))
        absorb(graph, host, act, part)
        fused += 1
    return fused
