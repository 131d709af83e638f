"""Quantizing the (fused) graph: a storage type and parameters for every tensor.

``quantize_graph`` takes the activation ranges (from calibration or a quant config) and the
dtype of each layer (int8 or float16) and annotates the IR in place:

- **activations** (graph inputs and node outputs, float tensors only): stored in their
  producer layer's type. int8: ``QuantParams("int8", s, z)`` per tensor from the range
  (affine.py); tensors that must share parameters (sharing.py) get their group's. float16:
  ``QuantParams("float16", 1, 0)``. A graph input is stored int8 unless every layer reading it
  is float16.
- **conversions**: where a layer reads a tensor stored in the other type, a ``DataConvert``
  node (convert_op.py) is inserted just before the first such reader and every reader of
  that type reads the converted copy ``<tensor>_<dtype>``. So each int8 layer reads int8 and
  each float16 layer reads float16; the converted int8 copy carries the tensor's own
  calibrated parameters.
- **constants** by role (roles.py): int8 weights per output channel (or per tensor with
  ``per_channel=False``), asymmetric over the full range like the vendor's; int32 biases in
  units of ``s_in * s_w[c]``; int16 symmetric operands; float normalization parameters;
  float16 for everything a float16 layer reads (its bias stays float32: the fp16 DPU path
  adds fp32 operands, NUMERICS.md 4.6). A constant two layers need differently is copied.

``QuantParams`` keeps float values in ``Tensor.data``; ``stored_values`` gives the integers
the NPU holds (what weight packing needs).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from npuemu.isa.errors import CompileError

from ..ir import Graph, Node, QuantParams, Tensor
from . import convert_op
from .affine import INT16, INT32, QRANGES, Range, affine_params, affine_params_array, quantize, round_half_away, symmetric_scale
from .calibrate import activation_tensors, is_float_tensor
from .clipping import mmse_weight_ranges, weight_ranges
from .islands import island_dtype
from .roles import BIAS, PARAMETER, SHARED, WEIGHT, ConstantRole, Slot, bias_axis, constant_roles
from .sharing import sharing_groups

log = logging.getLogger(__name__)

INT8, FLOAT16 = "int8", "float16"
LAYER_DTYPES = (INT8, FLOAT16)
WEIGHT_CLIPPING = ("minmax", "mmse")
FLOAT16_STORAGE = QuantParams(FLOAT16, 1.0, 0)


@dataclass
class QuantizationResult:
    """What quantize_graph decided, beyond the annotations it left in the IR."""

    layer_dtypes: dict[str, str]  # node name -> int8 | float16 (conversions included)
    ranges: dict[str, Range]  # int8 activation tensor -> the range its parameters come from
    anchors: dict[str, str]  # tensor -> the tensor whose range its sharing group uses
    conversions: list[str]  # names of the DataConvert nodes inserted
    per_channel: bool = True
    weight_clipping: str = "minmax"
    algorithm: str | None = None  # calibration algorithm, when known
    preprocess: dict = field(default_factory=dict)  # input name -> InputPreprocess
    observed: dict[str, Range] = field(default_factory=dict)  # calibration min/max, when known

    @property
    def mode(self) -> str:
        kinds = {dtype for name, dtype in self.layer_dtypes.items() if name not in self.conversions}
        return kinds.pop() if len(kinds) == 1 else "hybrid" if kinds else INT8

    def summary(self) -> str:
        counts = {dtype: sum(1 for name, value in self.layer_dtypes.items()
                             if value == dtype and name not in self.conversions) for dtype in LAYER_DTYPES}
        text = f"{self.mode}: {counts[INT8]} int8 layer(s), {counts[FLOAT16]} float16 layer(s)"
        if self.conversions:
            text += f", {len(self.conversions)} conversion(s)"
        if counts[INT8]:
            text += f", weights {'per-channel' if self.per_channel else 'per-layer'}"
            if self.algorithm:
                text += f", calibration {self.algorithm}"
        return text


def quantize_graph(graph: Graph, ranges: Mapping[str, Range] | None = None, *,
                   layer_dtypes: Mapping[str, str] | None = None, default_dtype: str = INT8,
                   per_channel: bool = True, weight_clipping: str = "minmax",
                   fixed: Mapping[str, QuantParams] | None = None) -> QuantizationResult:
    """Annotate ``graph`` in place (see the module docstring); returns the decisions.

    ``fixed``: int8 parameters given by the model itself (a QDQ model, quant/qdq.py), by tensor
    name; they replace the ones ``ranges`` would give for those activations and weights."""
    _check_unquantized(graph)
    if weight_clipping not in WEIGHT_CLIPPING:
        raise CompileError(f"weight clipping '{weight_clipping}' is not one of {', '.join(WEIGHT_CLIPPING)}")
    dtypes = _layer_dtypes(graph, layer_dtypes or {}, default_dtype)
    anchors = sharing_groups(graph, dtypes, ranges)
    storage = _storage(graph, dtypes)
    int8_ranges = _int8_ranges(graph, ranges or {}, anchors, _needs_int8(graph, dtypes, storage))
    params = {name: _activation_params(r) for name, r in int8_ranges.items()}
    _apply_fixed(params, anchors, fixed or {})
    for name, dtype in storage.items():
        graph.tensors[name].quant = params[name] if dtype == INT8 else FLOAT16_STORAGE
    conversions = _insert_conversions(graph, dtypes, storage, params)
    _quantize_constants(graph, dtypes, anchors, params, per_channel, weight_clipping, fixed or {})
    graph.check()
    result = QuantizationResult(dtypes, int8_ranges, anchors, conversions, per_channel, weight_clipping)
    log.info("quantized graph '%s': %s", graph.name, result.summary())
    return result


def float16_graph(graph: Graph) -> QuantizationResult:
    """The fp16 build: every layer computes and stores float16 (no calibration needed)."""
    return quantize_graph(graph, None, default_dtype=FLOAT16)


def layer_dtype(graph: Graph, node: Node) -> str | None:
    """int8 / float16 of a quantized node (from its first float output), None if not quantized."""
    for name in node.outputs:
        quant = graph.tensors[name].quant
        if quant is not None:
            return quant.dtype
    return None


# ---- layers and activations -----------------------------------------------------------------

def _check_unquantized(graph: Graph) -> None:
    quantized = [name for name, tensor in graph.tensors.items() if tensor.quant is not None]
    if quantized or any(node.op_type == convert_op.OP_TYPE for node in graph.nodes):
        raise CompileError(f"graph '{graph.name}' is already quantized (tensor '{quantized[0] if quantized else '?'}' "
                           "has parameters); quantize the float graph once")


def _layer_dtypes(graph: Graph, given: Mapping[str, str], default: str) -> dict[str, str]:
    if default not in LAYER_DTYPES:
        raise CompileError(f"layer dtype '{default}' is not one of {', '.join(LAYER_DTYPES)}")
    names = {node.name for node in graph.nodes}
    for name, dtype in given.items():
        if name not in names:
            raise CompileError(f"no layer named '{name}' in graph '{graph.name}'")
        if dtype not in LAYER_DTYPES:
            raise CompileError(f"layer '{name}': dtype '{dtype}' is not one of {', '.join(LAYER_DTYPES)}")
    # an NPU layer that exists in float16 only is a float16 island of an int8 build (islands.py)
    return {node.name: given.get(node.name, island_dtype(node) or default) for node in graph.nodes}


def _storage(graph: Graph, dtypes: Mapping[str, str]) -> dict[str, str]:
    """Activation tensor -> the type it is stored in."""
    readers: dict[str, set[str]] = {}
    for node in graph.nodes:
        for name in node.all_inputs:
            readers.setdefault(name, set()).add(dtypes[node.name])
    storage = {}
    for name in activation_tensors(graph):
        if name in graph.inputs:
            kinds = readers.get(name, set())
            storage[name] = FLOAT16 if kinds == {FLOAT16} else INT8
    for node in graph.nodes:
        for name in node.outputs:
            if is_float_tensor(graph.tensors[name]):
                storage[name] = dtypes[node.name]
    return storage


def _activation_slots(graph: Graph, node: Node) -> list[Slot]:
    slots = [Slot(None, index) for index in range(len(node.inputs))]
    slots += [Slot(part, index) for part, fused in enumerate(node.fused) for index in range(len(fused.inputs))]
    result = []
    for slot in slots:
        tensor = graph.tensors[slot.read(node)]
        if not tensor.is_const and is_float_tensor(tensor):
            result.append(slot)
    return result


def _needs_int8(graph: Graph, dtypes: Mapping[str, str], storage: Mapping[str, str]) -> set[str]:
    needed = {name for name, dtype in storage.items() if dtype == INT8}
    for node in graph.nodes:
        if dtypes[node.name] == INT8:
            needed.update(slot.read(node) for slot in _activation_slots(graph, node))
    return needed


def _int8_ranges(graph: Graph, ranges: Mapping[str, Range], anchors: Mapping[str, str],
                 needed: set[str]) -> dict[str, Range]:
    """The range of every tensor that needs int8 parameters: its group's union of ranges."""
    members: dict[str, list[str]] = {}
    for name, anchor in anchors.items():
        members.setdefault(anchor, []).append(name)
    result, missing = {}, []
    order = {name: index for index, name in enumerate(graph.tensors)}
    for name in sorted(needed, key=order.__getitem__):
        group = members.get(anchors.get(name, name), [name])
        known = [ranges[member] for member in group if member in ranges]
        known += [_constant_range(graph.tensors[member]) for member in group
                  if graph.tensors[member].is_const and member not in ranges]
        if not known:
            missing.append(name)
            continue
        union = known[0]
        for other in known[1:]:
            union = union.union(other)
        result[name] = union.including_zero()
    if missing:
        shown = ", ".join(f"'{name}'" for name in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CompileError(f"no quantization range for tensor(s) {shown}: calibrate with a dataset or give their "
                           "min/max in the quant config")
    return result


def _constant_range(tensor: Tensor) -> Range:
    data = np.asarray(tensor.data, dtype=np.float64)
    return Range(float(data.min()), float(data.max())) if data.size else Range(0.0, 0.0)


def _activation_params(value: Range) -> QuantParams:
    scale, zero_point = affine_params(value.lo, value.hi)
    return QuantParams(INT8, scale, zero_point)


def _apply_fixed(params: dict[str, QuantParams], anchors: Mapping[str, str],
                 fixed: Mapping[str, QuantParams]) -> None:
    """The model's own activation parameters replace the range-derived ones. A sharing group
    (tensors the NPU stores alike, sharing.py) is one storage: it takes its anchor's, else its
    first member's; a member the model quantized otherwise is requantized by no layer here."""
    groups: dict[str, list[str]] = {}
    for name in params:
        groups.setdefault(anchors.get(name, name), []).append(name)
    for anchor, members in groups.items():
        given = [fixed[name] for name in (anchor, *members) if name in fixed and fixed[name].axis is None]
        if not given:
            continue
        for name in members:
            if name in fixed and not _same(fixed[name], given[0]):
                log.warning("tensor '%s': its own parameters (scale %g) give way to its sharing group's (scale %g)",
                            name, float(fixed[name].scale), float(given[0].scale))
            params[name] = given[0]


def _insert_conversions(graph: Graph, dtypes: dict[str, str], storage: Mapping[str, str],
                        params: Mapping[str, QuantParams]) -> list[str]:
    converted: dict[tuple[str, str], str] = {}
    nodes: list[Node] = []
    taken = {node.name for node in graph.nodes}
    for node in graph.nodes:
        want = dtypes[node.name]
        for slot in _activation_slots(graph, node):
            name = slot.read(node)
            if storage.get(name, want) == want:
                continue
            if (name, want) not in converted:
                source = graph.tensors[name]
                copy = graph.add_tensor(Tensor(graph.unique_tensor_name(f"{name}_{want}"), source.shape, source.dtype,
                                               quant=params[name] if want == INT8 else FLOAT16_STORAGE))
                node_name = _unique(f"{name}_to_{want}", taken)
                # runs where its first reader runs (a DPU pass before an NPU layer)
                nodes.append(Node(node_name, convert_op.OP_TYPE, [name], [copy.name], {"to": want}, target=node.target))
                dtypes[node_name] = want
                converted[(name, want)] = copy.name
            slot.write(node, converted[(name, want)])
        nodes.append(node)
    graph.nodes = nodes
    return [node.name for node in nodes if node.op_type == convert_op.OP_TYPE]


def _unique(base: str, taken: set[str]) -> str:
    name, index = base, 1
    while name in taken:
        name, index = f"{base}_{index}", index + 1
    taken.add(name)
    return name


# ---- constants ------------------------------------------------------------------------------

def _quantize_constants(graph: Graph, dtypes: Mapping[str, str], anchors: Mapping[str, str],
                        params: Mapping[str, QuantParams], per_channel: bool, weight_clipping: str,
                        fixed: Mapping[str, QuantParams]) -> None:
    assigned: dict[str, QuantParams | None] = {}
    for node in graph.nodes:
        if node.op_type == convert_op.OP_TYPE:
            continue
        dtype = dtypes[node.name]
        roles = constant_roles(graph, node)
        bias = next((role for role in roles if role.kind == BIAS), None)
        for role in roles:
            name = role.slot.read(node)
            if name in anchors:
                role = ConstantRole(role.slot, SHARED)
            quant = _fixed_weight(graph, node, role, fixed) if dtype == INT8 and role.kind == WEIGHT else None
            if quant is None:
                quant = _constant_quant(graph, node, role, dtype, params, anchors, per_channel, weight_clipping)
            if role.kind == WEIGHT and quant is not None and quant.dtype == INT8:
                quant = _placement_headroom(graph, node, _bias_headroom(graph, node, role, bias, quant))
            _assign(graph, node, role.slot, quant, assigned)


def _fixed_weight(graph: Graph, node: Node, role: ConstantRole,
                  fixed: Mapping[str, QuantParams]) -> QuantParams | None:
    """A weight's own parameters (a QDQ model's), where they fit the layer: per tensor, or per
    channel along the layer's output-channel axis; None: derive them from the data."""
    tensor = graph.tensors[role.slot.read(node)]
    given = fixed.get(tensor.name)
    if given is None or given.axis is None:
        return given
    if given.axis == role.axis and tensor.shape[given.axis] == given.scale.size:
        return given
    log.info("weight '%s': its per-channel parameters (axis %d) do not fit the layer; derived from the data instead",
             tensor.name, given.axis)
    return None


def _constant_quant(graph: Graph, node: Node, role: ConstantRole, dtype: str, params: Mapping[str, QuantParams],
                    anchors: Mapping[str, str], per_channel: bool, weight_clipping: str) -> QuantParams | None:
    tensor = graph.tensors[role.slot.read(node)]
    if role.kind == PARAMETER or (dtype == FLOAT16 and role.kind == BIAS):
        return None
    if dtype == FLOAT16:
        return FLOAT16_STORAGE
    if role.kind == WEIGHT:
        return weight_params(tensor.data, role.axis if per_channel else None, weight_clipping)
    if role.kind == BIAS:
        return _bias_params(graph, node, role, tensor)
    if role.kind == SHARED:  # a Concat input: its group's parameters, or its own if requantized
        anchor = anchors.get(tensor.name)
        return params[anchor] if anchor in params else _activation_params(_constant_range(tensor))
    max_abs = float(np.max(np.abs(tensor.data))) if tensor.size else 0.0
    return QuantParams("int16", symmetric_scale(max_abs, INT16), 0)


#: smallest per-channel weight scale relative to the layer's largest: the BS multiplier is
#: 2^14 s_w[c] / max(s_w) (quant_regs), so this keeps it >= 16 (relative error <= 3 %) instead
#: of rounding to 0 for channels whose weights are almost all zero (real models have them)
MIN_WEIGHT_SCALE_RATIO = 2.0 ** -10
INT8_RANGE = (-128, 127)


def weight_params(weights: np.ndarray, axis: int | None, clipping: str = "minmax") -> QuantParams:
    """int8 asymmetric parameters of a weight tensor, per channel along ``axis`` or per tensor.

    A channel of zeros takes the largest scale of the others (any scale stores 0 exactly, and
    this one does not become the layer's largest weight scale, which sets the BS multiplier
    precision of every other channel, quant_regs).
    """
    lo, hi = (mmse_weight_ranges if clipping == "mmse" else weight_ranges)(weights, axis)
    scale, zero_point = affine_params_array(lo, hi)
    empty = (np.minimum(lo, 0) == np.maximum(hi, 0))
    if empty.any() and not empty.all():
        scale[empty] = scale[~empty].max()
        zero_point[empty] = 0
    floor = np.float32(scale.max() * MIN_WEIGHT_SCALE_RATIO)
    tiny = scale < floor
    if tiny.any():  # near-dead channels: a coarser grid, so their BS multiplier is not ~0
        scale[tiny] = floor
        low = np.broadcast_to(np.minimum(np.asarray(lo, np.float64), 0.0), scale.shape)[tiny]
        zero_point[tiny] = np.clip(INT8_RANGE[0] - round_half_away(low / np.float64(floor)), *INT8_RANGE)
    if axis is None:
        return QuantParams(INT8, scale[0], zero_point[0])
    return QuantParams(INT8, scale, zero_point, axis)


BIAS_HEADROOM = 2.0 ** 30  # |bias| in accumulator units, leaving 2^30 for -zp_in * sum(w_q - zp_w)


def _bias_magnitude(graph: Graph, node: Node, bias_role: ConstantRole | None, channels: int) -> np.ndarray:
    """|bias| per output channel as the build adds it up: the bias input (times the role's
    factor) plus the constants of fused bias Adds (build_adapt)."""
    total = np.zeros(channels)
    parts = [(bias_role.slot.read(node), abs(bias_role.factor))] if bias_role is not None else []
    parts += [(part.inputs[0], 1.0) for part in node.fused if part.tag == "bias_add" and len(part.inputs) == 1]
    for name, factor in parts:
        data = graph.tensors[name].data
        if data is None:
            continue
        values = np.abs(np.asarray(data, np.float64)).reshape(-1) * factor
        if values.size in (1, channels):
            total = total + values
    return total


def _bias_headroom(graph: Graph, node: Node, weight_role: ConstantRole, bias_role: ConstantRole | None,
                   quant: QuantParams) -> QuantParams:
    """Weight scales large enough that the bias fits the int32 BS ALU operand with room for
    the zero-point term (quant_regs.conv_requant). A channel whose weights are near zero but
    whose bias is not (dead channels of real models: PP-OCRv4 det) would otherwise need a bias
    beyond int32 in units of s_in * s_w[c]; such channels get the symmetric scale
    max(|b| / (s_in 2^30), max|w| / 127) and zero point 0."""
    activation = graph.tensors[weight_role.activation].quant if weight_role.activation else None
    if activation is None or activation.dtype != INT8:
        return quant
    weights = np.asarray(graph.tensors[weight_role.slot.read(node)].data, np.float64)
    scale = np.asarray(quant.scale, np.float64).reshape(-1)
    channels = weights.shape[weight_role.axis] if weight_role.axis is not None else 1  # output channels
    floor = _bias_magnitude(graph, node, bias_role, channels) / (np.float64(activation.scale) * BIAS_HEADROOM)
    if quant.axis is None:
        floor = np.asarray([floor.max(initial=0.0)])
    elif floor.size != scale.size:
        return quant
    short = floor > scale
    if not short.any():
        return quant
    axis = quant.axis
    per_channel = np.moveaxis(weights, axis, 0).reshape(scale.size, -1) if axis is not None else weights.reshape(1, -1)
    symmetric = np.abs(per_channel).max(axis=1) / 127.0
    new_scale = np.where(short, np.maximum(floor, symmetric), scale).astype(np.float32)
    new_zero = np.where(short, 0, np.asarray(quant.zero_point).reshape(-1)).astype(np.int32)
    log.info("layer '%s': %d weight channel(s) rescaled so the bias fits the int32 ALU operand",
             node.name, int(short.sum()))
    if axis is None:
        return QuantParams(INT8, new_scale[0], new_zero[0])
    return QuantParams(INT8, new_scale, new_zero, axis)


def _placement_headroom(graph: Graph, node: Node, quant: QuantParams) -> QuantParams:
    """The 0/1 weights of a Concat placement conv (passes/concat_as_convs.py, attribute
    ``placement``) stored as q (1..127) with scale 1/q - still exact - with the largest q for which
    the residual converter fits: the partial concatenation (scale s_r) enters the EW stage in
    accumulator units s_in * s_w, a 15-bit scale with a non-negative shift (quant_regs
    ``residual_convert``: s_r / (s_in * s_w) < 2^15). An input whose range is far below the
    concatenation's (YOLOX's sigmoid scores beside its box offsets) needs q < 127."""
    if not node.attrs.get("placement") or not node.fused or quant.dtype != INT8:
        return quant
    residual = graph.tensors[node.fused[0].inputs[0]].quant
    activation = graph.tensors[node.inputs[0]].quant
    if residual is None or activation is None or activation.dtype != INT8:
        return quant
    fits = 32767 * 0.999 * float(activation.scale) / float(residual.scale)  # margin: the scale's rounding
    ones = int(min(127, math.floor(fits)))
    if ones >= 127 or ones < 1:  # fits as it is, or cannot fit (the lowering says so)
        return quant
    count = np.asarray(quant.scale).size
    scale = np.full(count, 1.0 / ones, np.float32)
    zeros = np.zeros(count, np.int32)
    log.info("layer '%s': placement weights stored as %d (scale 1/%d) so the residual converter fits",
             node.name, ones, ones)
    if quant.axis is None:
        return QuantParams(INT8, scale[0], zeros[0])
    return QuantParams(INT8, scale, zeros, quant.axis)


def _bias_params(graph: Graph, node: Node, role: ConstantRole, tensor: Tensor) -> QuantParams:
    scale = bias_scale(graph, node, role)
    if scale.size > 1:
        axis = bias_axis(tensor.shape, scale.size)
        return QuantParams("int32", scale.astype(np.float32), np.zeros(scale.size, np.int32), axis)
    return QuantParams("int32", np.float32(scale.reshape(-1)[0]), 0)


def bias_scale(graph: Graph, node: Node, role: ConstantRole) -> np.ndarray:
    """The accumulator unit ``s_in * s_w[c] * factor`` in float64, from the float32 parameters
    of the layer's input and weight (the product quant_regs.conv_requant divides the bias by)."""
    activation = graph.tensors[role.activation]
    weight = graph.tensors[role.weight]
    if activation.quant is None or activation.quant.dtype != INT8 or weight.quant is None:
        raise CompileError(f"layer '{node.name}': bias '{role.slot.read(node)}' needs an int8 input and weight")
    s_in = np.float64(activation.quant.scale)
    return s_in * np.asarray(weight.quant.scale, dtype=np.float64).reshape(-1) * role.factor


def _same(a: QuantParams | None, b: QuantParams | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.dtype == b.dtype and a.axis == b.axis and np.array_equal(a.scale, b.scale)
            and np.array_equal(a.zero_point, b.zero_point))


def _assign(graph: Graph, node: Node, slot: Slot, quant: QuantParams | None,
            assigned: dict[str, QuantParams | None]) -> None:
    name = slot.read(node)
    if name not in assigned:
        assigned[name] = quant
        graph.tensors[name].quant = quant
        return
    if _same(assigned[name], quant):
        return
    copy = graph.add_constant(f"{name}_{node.name}", np.array(graph.tensors[name].data))
    copy.quant = quant
    assigned[copy.name] = quant
    slot.write(node, copy.name)
    log.debug("constant '%s' is quantized differently for layer '%s': copied to '%s'", name, node.name, copy.name)


def stored_values(tensor: Tensor) -> np.ndarray:
    """The values the NPU stores for a quantized constant: int8/int16/int32 integers (weights,
    operands and biases round half away from zero, saturating), or float16."""
    if tensor.data is None or tensor.quant is None:
        raise CompileError(f"tensor '{tensor.name}' is not a quantized constant")
    quant = tensor.quant
    if quant.dtype == FLOAT16:
        return np.asarray(tensor.data, dtype=np.float32).astype(np.float16)
    if quant.dtype not in QRANGES:
        raise CompileError(f"tensor '{tensor.name}': no integer storage for dtype '{quant.dtype}'")
    values = quantize(tensor.data, quant.scale, quant.zero_point, QRANGES[quant.dtype], quant.axis, half_even=False)
    return values.astype(np.dtype(quant.dtype))


def bias_values(graph: Graph, node: Node, role: ConstantRole) -> np.ndarray:
    """int32 bias of an int8 layer with the exact float64 accumulator unit (see bias_scale)."""
    tensor = graph.tensors[role.slot.read(node)]
    data = np.asarray(tensor.data, dtype=np.float64)
    scale = bias_scale(graph, node, role)
    if scale.size > 1:
        shape = [1] * data.ndim
        shape[bias_axis(tensor.shape, scale.size)] = scale.size
        scale = scale.reshape(shape)
    units = round_half_away(data / (scale if scale.size > 1 else scale[0]))
    return np.clip(units, INT32[0], INT32[1]).astype(np.int32)
