"""Multiplications and additions by per-channel constants, folded into conv-type layers.

An *affine op* here is ``Mul``/``Div``/``Add``/``Sub`` of a non-constant tensor and a
constant that is a scalar or varies only along the channel axis (so it neither grows the
tensor nor mixes positions). Where one sits next to a Conv, ConvTranspose or FullyConnected,
it folds away:

- after the layer (the layer's result read by nothing else): a scale goes into the weights
  and bias; a shift becomes the layer's ``bias_add`` fused part (Conv+BiasAdd, the
  ``..._fuse_bias_add`` of the vendor's layer names);
- before the layer (the op's result read only by the layer): a scale goes into the weights
  along their input channels (exact even with zero padding, since 0*k = 0); a shift goes
  into the bias, but only when the layer pads nothing (a padded zero would not be shifted)
  and is not a ConvTranspose (whose outputs do not all see every weight).

Chains of two or more affine ops left over on a 4-D tensor merge into one 1x1 depthwise
conv, the same scale+bias layer a standalone BatchNormalization becomes (``fold_bn``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import FusedOp, Graph, Node
from .context import PassContext
from .conv_weights import (bias_shaped, has_constant_weights, input_axis, scale_inputs, scale_outputs,
                           shift_inputs)
from .fold_bn import make_scale_bias_conv
from .match import (BIAS_TAG, CONV_TYPES, absorb, bias_parts_only, channel_axis, const, new_constant, per_channel,
                    producer, sole_reader)

_AFFINE_OPS = ("Mul", "Div", "Add", "Sub")


@dataclass(frozen=True)
class Affine:
    """``node`` computes ``source * scale + shift`` per channel (float64 vectors)."""

    node: Node
    source: str
    scale: np.ndarray
    shift: np.ndarray

    @property
    def is_scale(self) -> bool:
        return not np.any(self.shift)

    @property
    def is_shift(self) -> bool:
        return bool(np.all(self.scale == 1.0))


def affine_of(graph: Graph, node: Node, axis: int | None = 1) -> Affine | None:
    """The per-channel affine map ``node`` computes along ``axis`` of its input, if any."""
    if node.op_type not in _AFFINE_OPS or len(node.inputs) != 2 or node.fused or axis is None:
        return None
    constants = [const(graph, name) for name in node.inputs]
    if (constants[0] is None) == (constants[1] is None):
        return None
    position = 0 if constants[0] is None else 1
    source = node.inputs[position]
    shape = graph.tensors[source].shape
    if not 0 <= axis < len(shape) or graph.tensors[source].dtype != graph.tensors[node.outputs[0]].dtype:
        return None
    vector = per_channel(constants[1 - position], shape, axis)
    if vector is None:
        return None
    ones, zeros = np.ones_like(vector), np.zeros_like(vector)
    if node.op_type == "Mul":
        return Affine(node, source, vector, zeros)
    if node.op_type == "Add":
        return Affine(node, source, ones, vector)
    if node.op_type == "Sub":
        return Affine(node, source, ones, -vector) if position == 0 else Affine(node, source, -ones, vector)
    if position == 0 and np.all(vector != 0):  # Div: only x / k
        return Affine(node, source, 1.0 / vector, zeros)
    return None


def _host_of(graph: Graph, node: Node) -> Node | None:
    """The conv-type layer whose result only ``node`` reads, if it may take more folding."""
    host = producer(graph, node.inputs[0]) or (producer(graph, node.inputs[1]) if len(node.inputs) > 1 else None)
    if host is None or host.op_type not in CONV_TYPES or not bias_parts_only(host):
        return None
    if sole_reader(graph, host.outputs[0]) is not node or not has_constant_weights(graph, host):
        return None
    return host


def fold_bias_add(graph: Graph, ctx: PassContext) -> int:
    """Conv+BiasAdd: an Add (or Sub) of a per-channel constant after a conv-type layer becomes its ``bias_add`` part."""
    folded = 0
    for node in [node for node in graph.nodes if node.op_type in ("Add", "Sub")]:
        host = _host_of(graph, node)
        if host is None or host.outputs[0] not in node.inputs:
            continue
        affine = affine_of(graph, node, channel_axis(host, graph))
        if affine is None or affine.source != host.outputs[0] or not affine.is_shift:
            continue
        shift = affine.shift
        existing = [part for part in host.fused if part.tag == BIAS_TAG]
        out_shape = graph.tensors[host.outputs[0]].shape
        if existing:  # one bias_add part per layer: the second one merges into it
            shift = shift + per_channel(const(graph, existing[0].inputs[0]), out_shape, channel_axis(host, graph))
            host.fused.remove(existing[0])
        bias = new_constant(graph, f"{host.name}_bias_add", bias_shaped(graph, host, shift))
        carry = node.inputs.index(host.outputs[0]) if node.op_type == "Add" else 0
        absorb(graph, host, node, FusedOp("Add", inputs=[bias], carry_index=carry, source=node.name, tag=BIAS_TAG))
        folded += 1
    return folded


def fold_scale_into_producer(graph: Graph, ctx: PassContext) -> int:
    """A Mul (or Div) by a per-channel constant after a conv-type layer: folded into its weights and bias."""
    folded = 0
    for node in [node for node in graph.nodes if node.op_type in ("Mul", "Div")]:
        host = _host_of(graph, node)
        if host is None:
            continue
        affine = affine_of(graph, node, channel_axis(host, graph))
        if affine is None or affine.source != host.outputs[0] or not affine.is_scale:
            continue
        scale_outputs(graph, host, affine.scale)
        absorb(graph, host, node, None)
        folded += 1
    return folded


def _consumer_of(graph: Graph, node: Node) -> Node | None:
    """The conv-type layer that alone reads ``node``'s result, as its data input."""
    reader = sole_reader(graph, node.outputs[0])
    if reader is None or reader.op_type not in CONV_TYPES or reader.inputs[0] != node.outputs[0]:
        return None
    return reader if has_constant_weights(graph, reader) else None


def fold_scale_into_consumer(graph: Graph, ctx: PassContext) -> int:
    """A Mul (or Div) by a per-channel constant before a conv-type layer: folded into its weights."""
    folded = 0
    for node in [node for node in graph.nodes if node.op_type in ("Mul", "Div")]:
        layer = _consumer_of(graph, node)
        affine = None if layer is None else affine_of(graph, node, input_axis(graph, layer))
        if affine is None or not affine.is_scale:
            continue
        scale_inputs(graph, layer, affine.scale)
        _remove_affine(graph, node, layer, affine.source)
        folded += 1
    return folded


def fold_shift_into_consumer(graph: Graph, ctx: PassContext) -> int:
    """An Add (or Sub) of a per-channel constant before an unpadded Conv or a FullyConnected: folded into its bias."""
    folded = 0
    for node in [node for node in graph.nodes if node.op_type in ("Add", "Sub")]:
        layer = _consumer_of(graph, node)
        if layer is None or layer.op_type == "ConvTranspose" or any(layer.attrs.get("pads", [])):
            continue
        affine = affine_of(graph, node, input_axis(graph, layer))
        if affine is None or not affine.is_shift:
            continue
        shift_inputs(graph, layer, affine.shift)
        _remove_affine(graph, node, layer, affine.source)
        folded += 1
    return folded


def _remove_affine(graph: Graph, node: Node, layer: Node, source: str) -> None:
    intermediate = node.outputs[0]
    layer.inputs[0] = source
    graph.nodes.remove(node)
    graph.tensors.pop(intermediate, None)


def affine_chain_as_depthwise_conv(graph: Graph, ctx: PassContext) -> int:
    """Two or more per-channel affine ops in a row on a 4-D tensor: merged into one 1x1 depthwise Conv (scale+bias layer)."""
    merged = 0
    for node in list(graph.nodes):
        if node not in graph.nodes:
            continue
        chain = _chain_from(graph, node)
        if len(chain) < 2:
            continue
        scale, shift = chain[0].scale, chain[0].shift
        for link in chain[1:]:
            scale, shift = scale * link.scale, shift * link.scale + link.shift
        last = chain[-1].node
        for link in chain[:-1]:
            graph.nodes.remove(link.node)
            graph.tensors.pop(link.node.outputs[0], None)
        make_scale_bias_conv(graph, last, chain[0].source, scale, shift)
        merged += 1
    return merged


def _chain_from(graph: Graph, node: Node) -> list[Affine]:
    """The affine ops starting at ``node`` (which must not continue a chain), each the sole
    reader of the previous one's result."""
    first = _affine_4d(graph, node)
    if first is None:
        return []
    before = producer(graph, first.source)
    if before is not None and _affine_4d(graph, before) is not None and sole_reader(graph, before.outputs[0]) is node:
        return []  # ``node`` is inside a chain that starts earlier
    chain = [first]
    while True:
        reader = sole_reader(graph, chain[-1].node.outputs[0])
        link = None if reader is None else _affine_4d(graph, reader)
        if link is None or link.source != chain[-1].node.outputs[0]:
            return chain
        chain.append(link)


def _affine_4d(graph: Graph, node: Node) -> Affine | None:
    if node.op_type not in _AFFINE_OPS or len(graph.tensors[node.outputs[0]].shape) != 4:
        return None
    return affine_of(graph, node, 1)
