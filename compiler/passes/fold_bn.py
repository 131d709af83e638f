"""BatchNormalization: folded into the conv-type layer before it, or made a scale+bias layer.

Inference BatchNormalization is ``y = x*s + t`` per channel with ``s = gamma/sqrt(var+eps)``
and ``t = beta - mean*s``. After a Conv, ConvTranspose or FullyConnected whose result nothing
else reads, ``s`` scales the weights (per output channel) and bias, and ``t`` adds to the
bias: exact in real arithmetic, and the same for every output position (ConvTranspose
positions no input reaches hold the bias, which is folded the same way).

A BatchNormalization that cannot be folded becomes a **1x1 depthwise Conv** with weights
``s`` and bias ``t`` (a scale+bias layer). Chosen over a DPU-only BN-stage layer because the
depthwise conv is a layer kind the lowering already has (CNA depthwise mode with the DPU's
per-channel bias and requantization), the vendor uses the same shape for its own inserted
identity layers (vendor-corpus README §3.3), and it then takes fused activations like any conv.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .context import PassContext
from .conv_weights import has_constant_weights, scale_outputs, shift_outputs
from .match import CONV_TYPES, absorb, bias_parts_only, channel_axis, const, new_constant, producer, sole_reader


def batch_norm_factors(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) per channel of an inference BatchNormalization with constant statistics."""
    values = [const(graph, name) for name in node.inputs[1:5]]
    if any(value is None for value in values):
        return None
    gamma, beta, mean, var = (np.asarray(value, dtype=np.float64).reshape(-1) for value in values)
    scale = gamma / np.sqrt(var + node.attrs["epsilon"])
    return scale, beta - mean * scale


def fold_batch_norm(graph: Graph, ctx: PassContext) -> int:
    """BatchNormalization after a Conv/ConvTranspose/FullyConnected: folded into its weights and bias."""
    folded = 0
    for bn in [node for node in graph.nodes if node.op_type == "BatchNormalization"]:
        host = producer(graph, bn.inputs[0])
        factors = batch_norm_factors(graph, bn)
        if host is None or factors is None or not _can_take_affine(graph, host, bn):
            continue
        scale_outputs(graph, host, factors[0])
        shift_outputs(graph, host, factors[1])
        absorb(graph, host, bn, None)
        folded += 1
    return folded


def _can_take_affine(graph: Graph, host: Node, follower: Node) -> bool:
    """A conv-type host whose only reader is ``follower``, with constant weights, no fused
    parts but bias adds, and channels on axis 1 (where BatchNormalization scales)."""
    return (host.op_type in CONV_TYPES and sole_reader(graph, host.outputs[0]) is follower
            and bias_parts_only(host) and has_constant_weights(graph, host) and channel_axis(host, graph) == 1)


def batch_norm_as_depthwise_conv(graph: Graph, ctx: PassContext) -> int:
    """A BatchNormalization left over (4-D input) becomes a 1x1 depthwise Conv (scale+bias layer)."""
    converted = 0
    for bn in [node for node in graph.nodes if node.op_type == "BatchNormalization"]:
        factors = batch_norm_factors(graph, bn)
        if factors is None or len(graph.tensors[bn.inputs[0]].shape) != 4:
            continue
        make_scale_bias_conv(graph, bn, bn.inputs[0], *factors)
        converted += 1
    return converted


def make_scale_bias_conv(graph: Graph, node: Node, source: str, scale: np.ndarray, shift: np.ndarray) -> None:
    """Turn ``node`` (in place, keeping its name and output) into ``source*scale + shift`` per
    channel as a 1x1 depthwise Conv."""
    channels = scale.shape[0]
    weight = new_constant(graph, f"{node.name}_scale", scale.reshape(channels, 1, 1, 1))
    bias = new_constant(graph, f"{node.name}_shift", shift)
    node.op_type = "Conv"
    node.inputs = [source, weight, bias]
    node.attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
                  "group": channels}
    node.fused = []
