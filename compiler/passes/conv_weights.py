"""Edits of a conv-type node's (Conv, ConvTranspose, FullyConnected) weights and bias that
fold a per-channel affine map into it, exactly in real arithmetic:

- per output channel, after the node: ``y*k`` -> weights and bias (and constant bias-add
  parts) times ``k``; ``y + c`` -> bias plus ``c``;
- per input channel, before the node: ``conv(x*k)`` -> weights times ``k`` along their
  input-channel axis; ``conv(x + c)`` -> bias plus the weights' sum times ``c`` (only
  without padding: padded zeros are not shifted).

New constants are always made (a weight tensor may be shared by several nodes).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .match import BIAS_TAG, channel_axis, const, new_constant, per_channel


def out_channels(graph: Graph, node: Node) -> int:
    return graph.tensors[node.outputs[0]].shape[channel_axis(node, graph)]


def _weight(graph: Graph, node: Node) -> np.ndarray:
    return np.asarray(const(graph, node.inputs[1]), dtype=np.float64)


def _set_weight(graph: Graph, node: Node, weight: np.ndarray) -> None:
    node.inputs[1] = new_constant(graph, f"{node.name}_weight", weight)


def _bias(graph: Graph, node: Node) -> np.ndarray:
    if len(node.inputs) > 2:
        return np.asarray(const(graph, node.inputs[2]), dtype=np.float64)
    return np.zeros(out_channels(graph, node))


def _set_bias(graph: Graph, node: Node, bias: np.ndarray) -> None:
    name = new_constant(graph, f"{node.name}_bias", bias)
    if len(node.inputs) > 2:
        node.inputs[2] = name
    else:
        node.inputs.append(name)


def has_constant_weights(graph: Graph, node: Node) -> bool:
    return all(const(graph, name) is not None for name in node.inputs[1:])


def _output_scale_shape(node: Node, weight: np.ndarray) -> tuple[int, ...]:
    """Shape that broadcasts a per-output-channel vector over the weight array."""
    if node.op_type == "ConvTranspose":  # [IC, OC/group, kh, kw], output channel g*OC/g + j
        return (node.attrs["group"], 1, weight.shape[1], *[1] * (weight.ndim - 2))
    return (weight.shape[0], *[1] * (weight.ndim - 1))


def scale_outputs(graph: Graph, node: Node, factor: np.ndarray) -> None:
    """Multiply the node's result by ``factor`` per output channel (bias-add parts included)."""
    weight = _weight(graph, node)
    if node.op_type == "ConvTranspose":
        group = node.attrs["group"]
        grouped = weight.reshape(group, weight.shape[0] // group, *weight.shape[1:])
        scaled = (grouped * factor.reshape(_output_scale_shape(node, weight))).reshape(weight.shape)
    else:
        scaled = weight * factor.reshape(_output_scale_shape(node, weight))
    _set_weight(graph, node, scaled)
    if len(node.inputs) > 2:
        _set_bias(graph, node, _bias(graph, node) * factor)
    out_shape = graph.tensors[node.outputs[0]].shape
    for part in node.fused:
        if part.tag == BIAS_TAG:
            vector = per_channel(const(graph, part.inputs[0]), out_shape, channel_axis(node, graph))
            part.inputs[0] = new_constant(graph, f"{node.name}_bias_add", bias_shaped(graph, node, vector * factor))


def bias_shaped(graph: Graph, node: Node, vector: np.ndarray) -> np.ndarray:
    """A per-output-channel vector shaped to broadcast over the node's output ([C,1,1] for a
    4-D conv output, [N] for FC)."""
    rank = len(graph.tensors[node.outputs[0]].shape)
    axis = channel_axis(node, graph)
    return np.asarray(vector).reshape([-1 if i == axis else 1 for i in range(axis, rank)])


def shift_outputs(graph: Graph, node: Node, shift: np.ndarray) -> None:
    """Add ``shift`` per output channel to the node's bias input (made if missing)."""
    _set_bias(graph, node, _bias(graph, node) + shift)


def input_axis(graph: Graph, node: Node) -> int | None:
    """Axis of the node's input along which a per-input-channel factor can be folded: 1 for
    convs; for an FC the feature axis when the features are that one axis, or axis 1 of an
    input flattened at axis 1 (each channel repeated over the spatial positions); else None."""
    if node.op_type != "FullyConnected":
        return 1
    rank, axis = len(graph.tensors[node.inputs[0]].shape), node.attrs["axis"]
    return axis if axis == rank - 1 else 1 if axis == 1 else None


def input_vector_per_weight(graph: Graph, node: Node, vector: np.ndarray) -> np.ndarray:
    """A per-input-channel ``vector`` broadcast to the node's weight shape."""
    weight_shape = graph.tensors[node.inputs[1]].shape
    if node.op_type == "FullyConnected":
        repeats = weight_shape[1] // len(vector)  # spatial positions per channel (1: features)
        return np.broadcast_to(np.repeat(vector, repeats).reshape(1, -1), weight_shape)
    if node.op_type == "ConvTranspose":  # [IC, OC/group, k...]
        return np.broadcast_to(vector.reshape(-1, *[1] * (len(weight_shape) - 1)), weight_shape)
    group = node.attrs["group"]  # Conv [OC, IC/group, k...]: output channel o reads group o // (OC/group)
    per_group = vector.reshape(group, -1)
    rows = np.repeat(per_group, weight_shape[0] // group, axis=0)
    return rows.reshape(weight_shape[0], weight_shape[1], *[1] * (len(weight_shape) - 2)) * np.ones(weight_shape)


def scale_inputs(graph: Graph, node: Node, factor: np.ndarray) -> None:
    """Fold ``conv(x * factor)`` (per input channel) into the weights."""
    _set_weight(graph, node, _weight(graph, node) * input_vector_per_weight(graph, node, factor))


def shift_inputs(graph: Graph, node: Node, shift: np.ndarray) -> None:
    """Fold ``conv(x + shift)`` (per input channel) into the bias: each output adds the
    weights it applies times the shift. Only exact when nothing is padded (the caller checks)."""
    weighted = _weight(graph, node) * input_vector_per_weight(graph, node, shift)
    if node.op_type == "ConvTranspose":
        raise ValueError("a ConvTranspose output does not see every weight: no input shift folding")
    added = weighted.reshape(weighted.shape[0], -1).sum(axis=1)
    shift_outputs(graph, node, added)
