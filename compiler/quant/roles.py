"""What each constant input of a node is to the quantizer: weight, bias, operand or parameter.

- **weight**: the second operand of a convolution-type op (Conv, ConvTranspose, Gemm, MatMul,
  FullyConnected): int8, per output channel along ``axis`` (or per tensor);
- **bias**: added to that op's accumulator: int32 in units of ``s_in * s_w[c]`` (times
  ``factor`` for Gemm's alpha / beta). A constant ``Add`` fused right after the main op with
  the passes' ``bias_add`` tag is a bias too;
- **operand**: any other float constant an op combines with an activation (Mul by a
  per-channel scale, Add of 3 in a written-out hard-swish, a PRelu slope): int16 symmetric
  per tensor, as the vendor stores them (vendor-corpus ``tensors.csv``: the per-channel Mul
  constant is INT16 with zero point 0 and scale max|c| / 32767);
- **parameter**: normalization statistics (BatchNormalization, LayerNormalization,
  InstanceNormalization): left in float, because the NPU folds them into per-channel
  multipliers and offsets of its DPU stages (15+ bit operands) rather than storing them;
- **shared**: a constant concatenated with activations: stored with the Concat's int8
  parameters.

Non-float constants (indices, shapes) have no role.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Graph, Node

WEIGHT, BIAS, OPERAND, PARAMETER, SHARED = "weight", "bias", "operand", "parameter", "shared"
NORMALIZATION_OPS = ("BatchNormalization", "LayerNormalization", "InstanceNormalization")
BIAS_TAG = "bias_add"  # the passes' tag of a constant add folded into a conv-type node


@dataclass(frozen=True)
class Slot:
    """Where a node reads a tensor: main input ``index`` (part None) or fused part ``part``'s
    extra input ``index``."""

    part: int | None
    index: int

    def read(self, node: Node) -> str:
        return node.inputs[self.index] if self.part is None else node.fused[self.part].inputs[self.index]

    def write(self, node: Node, name: str) -> None:
        if self.part is None:
            node.inputs[self.index] = name
        else:
            node.fused[self.part].inputs[self.index] = name


@dataclass(frozen=True)
class ConstantRole:
    slot: Slot
    kind: str
    axis: int | None = None  # weight: output-channel axis; bias: its channel axis
    activation: str | None = None  # weight/bias: the activation input multiplied by the weight
    weight: str | None = None  # bias: the weight it belongs to
    factor: float = 1.0  # bias: accumulator unit = s_in * s_w * factor


def _is_float_const(graph: Graph, name: str) -> bool:
    tensor = graph.tensors.get(name)
    return tensor is not None and tensor.is_const and np.dtype(tensor.dtype).kind == "f"


def _is_const(graph: Graph, name: str) -> bool:
    tensor = graph.tensors.get(name)
    return tensor is not None and tensor.is_const


def constant_roles(graph: Graph, node: Node) -> list[ConstantRole]:
    """Roles of the node's float constant inputs (main op first, then fused parts)."""
    roles = _main_roles(graph, node)
    weight_role = next((role for role in roles if role.kind == WEIGHT), None)
    bias_allowed = weight_role is not None
    for part_index, part in enumerate(node.fused):
        is_bias_add = part.tag == BIAS_TAG and part.op_type == "Add"
        for index, name in enumerate(part.inputs):
            if not _is_float_const(graph, name):
                continue
            slot = Slot(part_index, index)
            if is_bias_add and bias_allowed and _bias_fits(graph, name, weight_role, node):
                roles.append(ConstantRole(slot, BIAS, None, weight_role.activation, weight_role.slot.read(node)))
            elif part.op_type in NORMALIZATION_OPS:
                roles.append(ConstantRole(slot, PARAMETER))
            else:
                roles.append(ConstantRole(slot, OPERAND))
        bias_allowed = bias_allowed and is_bias_add
    return roles


def _main_roles(graph: Graph, node: Node) -> list[ConstantRole]:
    op, inputs = node.op_type, node.inputs
    floats = [index for index, name in enumerate(inputs) if _is_float_const(graph, name)]
    if not floats:
        return []
    if op in NORMALIZATION_OPS:
        return [ConstantRole(Slot(None, index), PARAMETER) for index in floats if index > 0] + \
               [ConstantRole(Slot(None, 0), OPERAND) for index in floats if index == 0]
    if op == "Concat":
        return [ConstantRole(Slot(None, index), SHARED) for index in floats]
    weight = _weight_role(graph, node)
    roles = [] if weight is None else [weight]
    for index in floats:
        if weight is not None and index == weight.slot.index:
            continue
        bias = _bias_role(graph, node, index, weight)
        roles.append(bias if bias is not None else ConstantRole(Slot(None, index), OPERAND))
    return roles


def _weight_role(graph: Graph, node: Node) -> ConstantRole | None:
    op, inputs = node.op_type, node.inputs
    if op in ("Conv", "FullyConnected") and len(inputs) > 1 and _is_float_const(graph, inputs[1]):
        return ConstantRole(Slot(None, 1), WEIGHT, 0, inputs[0])
    if op == "ConvTranspose" and len(inputs) > 1 and _is_float_const(graph, inputs[1]):
        shape, group = graph.tensors[inputs[1]].shape, int(node.attrs.get("group", 1))
        axis = 1 if group == 1 else 0 if shape[1] == 1 else None  # (C_in, C_out/group, kh, kw)
        return ConstantRole(Slot(None, 1), WEIGHT, axis, inputs[0])
    if op == "Gemm":
        if _is_float_const(graph, inputs[1]) and not _is_const(graph, inputs[0]):
            return ConstantRole(Slot(None, 1), WEIGHT, 0 if node.attrs.get("transB", 0) else 1, inputs[0])
        if _is_float_const(graph, inputs[0]) and not _is_const(graph, inputs[1]):
            return ConstantRole(Slot(None, 0), WEIGHT, None, inputs[1])
    if op == "MatMul":
        if _is_float_const(graph, inputs[1]) and not _is_const(graph, inputs[0]):
            rank = len(graph.tensors[inputs[1]].shape)
            return ConstantRole(Slot(None, 1), WEIGHT, rank - 1 if rank >= 2 else None, inputs[0])
        if _is_float_const(graph, inputs[0]) and not _is_const(graph, inputs[1]):
            return ConstantRole(Slot(None, 0), WEIGHT, None, inputs[1])
    return None


def _bias_role(graph: Graph, node: Node, index: int, weight: ConstantRole | None) -> ConstantRole | None:
    if weight is None or index != 2 or node.op_type not in ("Conv", "ConvTranspose", "FullyConnected", "Gemm"):
        return None
    factor = 1.0
    if node.op_type == "Gemm":
        alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
        if beta == 0 or alpha == 0:
            return None
        factor = alpha / beta
    if not _bias_fits(graph, node.inputs[index], weight, node):
        return None
    return ConstantRole(Slot(None, index), BIAS, None, weight.activation, weight.slot.read(node), factor)


def _bias_fits(graph: Graph, name: str, weight: ConstantRole | None, node: Node) -> bool:
    """A bias holds one value per output channel along a single axis (its other dims are 1,
    e.g. [C] or the passes' [C, 1, 1]), so it can take the per-channel accumulator scale; a
    per-tensor weight takes any shape."""
    if weight is None:
        return False
    if weight.axis is None:
        return True
    channels = graph.tensors[weight.slot.read(node)].shape[weight.axis]
    return bias_axis(graph.tensors[name].shape, channels) is not None


def bias_axis(shape: tuple[int, ...], channels: int) -> int | None:
    """The axis of a bias of ``shape`` that runs over ``channels`` output channels (the last
    such axis when channels is 1), None if the shape is not one value per channel."""
    if int(np.prod(shape, dtype=np.int64)) != channels or not shape:
        return None
    sized = [axis for axis, size in enumerate(shape) if size == channels]
    return sized[0] if channels > 1 else len(shape) - 1
