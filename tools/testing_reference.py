"""Independent int8 references of the testing kit (``npuemu.tools.testing``): the NPU's
integer arithmetic (NUMERICS.md 1, 4, 6) and the int8 layer semantics built on it (NUMERICS.md
9: conv with per-channel weights, fused activation and residual add; pooling; element-wise
add/sub/mul/max/min), plus :func:`reference_graph`, which walks a compiled int8 graph node by node.

Written from the documented formulas, in Python integers and fractions: nothing here uses the
emulator's kernels or the compiler's register code (quant_regs), so the two are checked, not
restated. The project's own kernel tests import the shared pieces (tests/emulator/reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
import math
from typing import Any

import numpy as np

INT8 = (-128, 127)
INT32 = (-(2**31), 2**31 - 1)
BS_MUL_SHIFT = 14  # NUMERICS.md 9: MUL[c] = round(2^14 s_w[c] / max s_w), shift 14
SCALE_BITS = 15  # NUMERICS.md 9: OUT_CVT SCALE in [2^14, 2^15)
OUT_CVT_SHIFT_MAX = (1 << 12) - 1  # OUT_CVT_SHIFT is 12 bits (NUMERICS.md 4.5)
EW_CVT_SHIFT_MAX = (1 << 6) - 1  # EW_CVT_SHIFT is 6 bits (rknpu-isa.md 3, EW_CVT_SCALE_VALUE)
BS_SHIFT_MAX = (1 << 6) - 1  # BS_MUL_SHIFT_VALUE is 6 bits (rknpu-isa.md 3, BS_MUL_CFG)

# --- integer arithmetic (NUMERICS.md 1, 4) ------------------------------------------------------

def round_shift(value: int, shift: int, mode: str) -> int:
    """``value / 2^shift`` rounded: 'half_away', 'half_even', 'half_up' or 'floor'
    (NUMERICS.md 1); a negative shift counts as 0. Exact, on Python fractions."""
    exact = Fraction(int(value), 2 ** int(max(shift, 0)))
    low = math.floor(exact)
    if mode == "floor":
        return low
    distance = exact - low
    if distance < Fraction(1, 2):
        return low
    if distance > Fraction(1, 2):
        return low + 1
    if mode == "half_up":
        return low + 1
    if mode == "half_even":
        return low if low % 2 == 0 else low + 1
    if mode == "half_away":
        return low + 1 if exact > 0 else low
    raise ValueError(mode)


def round_half_away(value: float) -> int:
    """Compile-time rounding of a real number (NUMERICS.md 9: ``round`` is half away)."""
    exact = Fraction(value)
    magnitude = math.floor(abs(exact) + Fraction(1, 2))
    return magnitude if exact >= 0 else -magnitude


def clamp(value: int, bounds: tuple[int, int]) -> int:
    return min(max(value, bounds[0]), bounds[1])


def pool_average(total: int, recip_w: int, recip_h: int, bounds) -> int:
    """PPU average: ``total * RECIP_W * RECIP_H`` rounded half away by 2^32 (NUMERICS.md 6)."""
    return clamp(round_shift(total * recip_w * recip_h, 32, "half_away"), bounds)


def ppu_pool(x: np.ndarray, cfg: dict, bounds) -> np.ndarray:
    """PPU pooling of [C][H][W] from register-level settings (NUMERICS.md 6): ``cfg`` has
    method (0 average, 1 max, 2 min), kernel_h/w, stride_y/x, pad_top/left, out_h/w,
    pad_value and recip_w/h. Max/min skip padded positions; average counts them at pad_value."""
    channels, height, width = x.shape
    out = np.zeros((channels, cfg["out_h"], cfg["out_w"]), np.int64)
    for c in range(channels):
        for oy in range(cfg["out_h"]):
            for ox in range(cfg["out_w"]):
                inside, padding = [], 0
                for ky in range(cfg["kernel_h"]):
                    for kx in range(cfg["kernel_w"]):
                        y = oy * cfg["stride_y"] + ky - cfg["pad_top"]
                        xx = ox * cfg["stride_x"] + kx - cfg["pad_left"]
                        if 0 <= y < height and 0 <= xx < width:
                            inside.append(int(x[c, y, xx]))
                        else:
                            padding += 1
                if cfg["method"] == 0:
                    total = sum(inside) + padding * cfg["pad_value"]
                    out[c, oy, ox] = pool_average(total, cfg["recip_w"], cfg["recip_h"], bounds)
                elif not inside:
                    out[c, oy, ox] = clamp(cfg["pad_value"], bounds)
                else:
                    out[c, oy, ox] = max(inside) if cfg["method"] == 1 else min(inside)
    return out


def scale_shift(factor: float, max_shift: int) -> tuple[int, int]:
    """A positive real factor as SCALE * 2^-SHIFT with SCALE in [2^14, 2^15) (NUMERICS.md 9);
    a factor too small for ``max_shift`` keeps the largest shift and a smaller SCALE."""
    exact = Fraction(factor)
    shift = 0
    while exact * 2**shift < 2 ** (SCALE_BITS - 1):
        shift += 1
    while exact * 2**shift >= 2**SCALE_BITS:
        shift -= 1
    scale = round_half_away(exact * 2**shift)
    if scale == 2**SCALE_BITS:
        scale, shift = scale // 2, shift - 1
    if shift < 0:  # SHIFT fields are unsigned: the factor does not fit the register pair
        raise ValueError(f"factor {factor:g} needs a negative shift (SCALE is below 2^15)")
    if shift > max_shift:
        scale, shift = round_half_away(exact * 2**max_shift), max_shift
    return scale, shift


# --- references --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Quant:
    """``real = scale * (q - zero_point)``; per-channel when the arrays have one value per channel."""

    scale: Any
    zero_point: Any

    def per_channel(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        scale = np.broadcast_to(np.asarray(self.scale, np.float64).reshape(-1), (count,))
        zero = np.broadcast_to(np.asarray(self.zero_point, np.int64).reshape(-1), (count,))
        return scale, zero


def reference_conv(x: np.ndarray, weights: np.ndarray, bias: np.ndarray | None, *, input_quant: Quant,
                   weight_quant: Quant, output_quant: Quant, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1),
                   groups: int = 1, activation: str = "none", residual: np.ndarray | None = None,
                   residual_quant: Quant | None = None) -> np.ndarray:
    """int8 convolution [C, H, W] -> [O, OH, OW] (NUMERICS.md 3, 4.1, 4.5, 9).

    ``weights``: int8 [O, C/groups, KH, KW]; ``bias``: float [O] (real units, stored as
    round(b / (s_in s_w[c])) accumulator units). Padding is the input zero point. Per output:
    ``v = sum((x - zp_in)(w - zp_w)) + bias_q``, ``v = round_half_away(v * MUL[c] / 2^14)``
    with ``MUL[c] = round(2^14 s_w[c] / max s_w)``, the activation in those units (relu: max 0;
    relu6 also min round(6 / (s_in max s_w))), then OUT_CVT ``round_half_even(v * SCALE /
    2^SHIFT) + zp_out`` saturated to int8, SCALE 2^-SHIFT = s_in max s_w / s_out.

    ``residual`` (int8 [O, OH, OW], Conv+Add, vendor rep12): before the activation, add
    ``round_half_even((q_r - zp_r) * SCALE_r / 2^SHIFT_r)`` with SCALE_r 2^-SHIFT_r =
    s_r / (s_in max s_w) (the EW operand converter, 6-bit shift; NUMERICS.md 4.4, 9).
    """
    x = np.asarray(x, np.int64)
    w = np.asarray(weights, np.int64)
    channels, height, width = x.shape
    outputs, group_inputs, kh, kw = w.shape
    s_in, zp_in = float(np.float64(input_quant.scale)), int(input_quant.zero_point)
    s_w, zp_w = weight_quant.per_channel(outputs)
    s_out, zp_out = float(np.float64(output_quant.scale)), int(output_quant.zero_point)
    top, left, bottom, right = pads
    padded = np.full((channels, height + top + bottom, width + left + right), zp_in, np.int64)
    padded[:, top:top + height, left:left + width] = x
    out_h = (padded.shape[1] - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    out_w = (padded.shape[2] - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    s_max = float(s_w.max())
    scale, shift = scale_shift(s_in * s_max / s_out, OUT_CVT_SHIFT_MAX)
    six = round_half_away(6.0 / (s_in * s_max))
    if residual is not None:
        residual = np.asarray(residual, np.int64)
        r_scale, r_shift = scale_shift(float(np.float64(residual_quant.scale)) / (s_in * s_max), EW_CVT_SHIFT_MAX)
        r_zero = int(residual_quant.zero_point)
    result = np.zeros((outputs, out_h, out_w), np.int64)
    per_group = outputs // groups
    for o in range(outputs):
        first = (o // per_group) * group_inputs
        centred = padded[first:first + group_inputs] - zp_in
        taps = w[o] - zp_w[o]
        bias_q = round_half_away(float(bias[o]) / (s_in * float(s_w[o]))) if bias is not None else 0
        mul = round_half_away(2**BS_MUL_SHIFT * float(s_w[o]) / s_max)
        for oy in range(out_h):
            for ox in range(out_w):
                y0, x0 = oy * stride[0], ox * stride[1]
                window = centred[:, y0:y0 + (kh - 1) * dilation[0] + 1:dilation[0],
                                 x0:x0 + (kw - 1) * dilation[1] + 1:dilation[1]]
                v = int((window * taps).sum()) + bias_q
                v = clamp(round_shift(v * mul, BS_MUL_SHIFT, "half_away"), INT32)
                if residual is not None:
                    operand = clamp(round_shift((int(residual[o, oy, ox]) - r_zero) * r_scale, r_shift,
                                                "half_even"), INT32)
                    v = clamp(v + operand, INT32)
                if activation in ("relu", "relu6"):
                    v = max(v, 0)
                if activation == "relu6":
                    v = min(v, six)
                result[o, oy, ox] = clamp(round_shift(v * scale, shift, "half_even") + zp_out, INT8)
    return result.astype(np.int8)


def reference_pool(x: np.ndarray, *, method: str, kernel, stride, pads=(0, 0, 0, 0), zero_point: int = 0) -> np.ndarray:
    """int8 pooling [C, H, W] (NUMERICS.md 6); output quantization = input quantization.

    max skips padded positions; average sums the window (padding at ``zero_point``) and
    multiplies by RECIP_W * RECIP_H with RECIP = round(2^16 / k) (the compiler's documented
    choice, quant_regs.pool_reciprocal), rounding half away by 2^32."""
    channels, height, width = np.shape(x)
    top, left, bottom, right = pads
    cfg = {"method": 1 if method == "max" else 0, "kernel_h": kernel[0], "kernel_w": kernel[1],
           "stride_y": stride[0], "stride_x": stride[1], "pad_top": top, "pad_left": left,
           "out_h": (height + top + bottom - kernel[0]) // stride[0] + 1,
           "out_w": (width + left + right - kernel[1]) // stride[1] + 1, "pad_value": zero_point,
           "recip_h": round_half_away(2**16 / kernel[0]), "recip_w": round_half_away(2**16 / kernel[1])}
    return ppu_pool(np.asarray(x, np.int64), cfg, INT8).astype(np.int8)


def reference_eltwise(op: str, a: np.ndarray, b: np.ndarray, *, a_quant: Quant, b_quant: Quant,
                      output_quant: Quant) -> np.ndarray:
    """int8 element-wise layer on two tensors of one shape (NUMERICS.md 4.1, 4.4, 4.5, 9).

    add / sub / max / min (vendor rep09): BS maps the first operand to ``(q_a - zp_a) * 2^14``
    (ALU -zp_a, MUL 2^14, shift 0); the EW operand converter brings the second into the same
    units, ``round_half_even((q_b - zp_b) * SCALE / 2^SHIFT)`` with SCALE 2^-SHIFT = 2^14 s_b / s_a
    (6-bit shift); the EW ALU combines (sub = first minus second); OUT_CVT with
    s_a / (2^14 s_out). mul: plain ``(q_a - zp_a) * (q_b - zp_b)`` through the EW multiplier
    (truncate 0), OUT_CVT with s_a s_b / s_out. OUT_CVT rounds half even; saturated to int8.
    When s_b >= 2 s_a the unit is s_b / 2^14 instead: the converter multiplies by 2^14 and BS
    scales the first operand by SCALE 2^-SHIFT = 2^14 s_a / s_b, rounding half away.
    """
    s_a, zp_a = float(np.float64(a_quant.scale)), int(a_quant.zero_point)
    s_b, zp_b = float(np.float64(b_quant.scale)), int(b_quant.zero_point)
    s_out, zp_out = float(np.float64(output_quant.scale)), int(output_quant.zero_point)
    a_shift = 0
    if op == "mul":
        ew_scale, ew_shift, unit, a_factor = 1, 0, s_a * s_b, 1
    elif op in ("add", "sub", "max", "min") and s_b < 2 * s_a:
        ew_scale, ew_shift = scale_shift(2**BS_MUL_SHIFT * s_b / s_a, EW_CVT_SHIFT_MAX)
        unit, a_factor = s_a / 2**BS_MUL_SHIFT, 2**BS_MUL_SHIFT
    elif op in ("add", "sub", "max", "min"):  # the coarser second operand sets the unit
        ew_scale, ew_shift = 2**BS_MUL_SHIFT, 0
        unit = s_b / 2**BS_MUL_SHIFT
        a_factor, a_shift = scale_shift(2**BS_MUL_SHIFT * s_a / s_b, BS_SHIFT_MAX)
    else:
        raise ValueError(f"element-wise op {op!r}: expected add, sub, mul, max or min")
    out_scale, out_shift = scale_shift(unit / s_out, OUT_CVT_SHIFT_MAX)
    combine = {"add": lambda v, e: v + e, "sub": lambda v, e: v - e, "max": max, "min": min,
               "mul": lambda v, e: v * e}[op]
    flat_a, flat_b = np.asarray(a, np.int64).reshape(-1), np.asarray(b, np.int64).reshape(-1)
    result = np.zeros(flat_a.size, np.int64)
    for i, (qa, qb) in enumerate(zip(flat_a.tolist(), flat_b.tolist())):
        operand = clamp(round_shift((qb - zp_b) * ew_scale, ew_shift, "half_even"), INT32)
        first = clamp(round_shift((qa - zp_a) * a_factor, a_shift, "half_away"), INT32)
        v = clamp(combine(first, operand), INT32)
        result[i] = clamp(round_shift(v * out_scale, out_shift, "half_even") + zp_out, INT8)
    return result.reshape(np.shape(a)).astype(np.int8)


def reference_add(a: np.ndarray, b: np.ndarray, *, a_quant: Quant, b_quant: Quant, output_quant: Quant) -> np.ndarray:
    """:func:`reference_eltwise` for Add."""
    return reference_eltwise("add", a, b, a_quant=a_quant, b_quant=b_quant, output_quant=output_quant)


#: ONNX element-wise ops the NPU runs on two feature maps, and the reference's name for each.
ELTWISE_OPS = {"Add": "add", "Sub": "sub", "Mul": "mul", "Max": "max", "Min": "min"}
#: Shape-only ops: the bytes are reused as they are (the build aliases them).
VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def reference_graph(graph, stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of a fused, int8-quantized graph from int8 ``stored`` inputs, node by node
    with the references above (the graph is walked as compiled, so the vendor rewrites of
    optimization level 3 - FC as a 1x1 conv, identity convs before element-wise inputs - are
    followed). Values keep the graph's NCHW shapes. NotImplementedError names an op the kit
    has no reference for."""
    values = {name: np.asarray(stored[name]).reshape(graph.tensors[name].shape) for name in graph.inputs}
    for node in graph.nodes:
        output = node.outputs[0]
        shape = graph.tensors[output].shape
        if node.op_type in VIEW_OPS:
            values[output] = values[node.inputs[0]].reshape(shape)
        elif node.op_type == "Conv":
            values[output] = _conv_node(graph, node, values).reshape(shape)
        elif node.op_type in ELTWISE_OPS and not node.fused and len(node.inputs) == 2:
            a, b = (values[name][0] for name in node.inputs)
            values[output] = reference_eltwise(ELTWISE_OPS[node.op_type], a, b,
                                               a_quant=_quant(graph.tensors[node.inputs[0]]),
                                               b_quant=_quant(graph.tensors[node.inputs[1]]),
                                               output_quant=_quant(graph.tensors[output])).reshape(shape)
        elif node.op_type in ("MaxPool", "AveragePool") and not node.fused:
            values[output] = _pool_node(graph, node, values).reshape(shape)
        else:
            raise NotImplementedError(f"the testing kit has no reference for {node.display_op} (layer {node.name})")
    return values


def _conv_node(graph, node, values) -> np.ndarray:
    activation, residual = "none", None
    for part in node.fused:
        if part.op_type == "Relu":
            activation = "relu"
        elif part.op_type == "Clip" and part.attrs.get("min") == 0.0 and part.attrs.get("max") == 6.0:
            activation = "relu6"
        elif part.op_type == "Add" and activation == "none" and residual is None:
            residual = part.inputs[0]
        else:
            raise NotImplementedError(f"the testing kit has no reference for the fused {part.op_type} of {node.name}")
    weight = graph.tensors[node.inputs[1]]
    bias = graph.tensors[node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else None
    attrs = node.attrs
    return reference_conv(values[node.inputs[0]][0], _weights(weight),
                          None if bias is None else np.asarray(bias.data, np.float64).reshape(-1),
                          input_quant=_quant(graph.tensors[node.inputs[0]]), weight_quant=_quant(weight),
                          output_quant=_quant(graph.tensors[node.outputs[0]]), stride=tuple(attrs["strides"]),
                          pads=tuple(attrs["pads"]), dilation=tuple(attrs["dilations"]), groups=int(attrs["group"]),
                          activation=activation,
                          residual=None if residual is None else values[residual][0],
                          residual_quant=None if residual is None else _quant(graph.tensors[residual]))


def _pool_node(graph, node, values) -> np.ndarray:
    source, output = _quant(graph.tensors[node.inputs[0]]), _quant(graph.tensors[node.outputs[0]])
    if (float(source.scale), int(source.zero_point)) != (float(output.scale), int(output.zero_point)):
        raise NotImplementedError(f"{node.name}: pooling with different input and output quantization")
    attrs = node.attrs
    return reference_pool(values[node.inputs[0]][0], method="max" if node.op_type == "MaxPool" else "average",
                          kernel=tuple(attrs["kernel_shape"]), stride=tuple(attrs["strides"]),
                          pads=tuple(attrs["pads"]), zero_point=int(source.zero_point))


def _quant(tensor) -> Quant:
    return Quant(np.asarray(tensor.quant.scale, np.float64), np.asarray(tensor.quant.zero_point, np.int64))


def _weights(tensor) -> np.ndarray:
    """int8 weights as stored: round half away of w / s_w[c], plus zp_w[c], saturated (NUMERICS.md 9)."""
    data = np.asarray(tensor.data, np.float64)
    quant = tensor.quant
    scale = np.asarray(quant.scale, np.float64)
    zero = np.asarray(quant.zero_point, np.int64)
    if quant.axis is not None:
        shape = [1] * data.ndim
        shape[quant.axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    ratio = data / scale
    rounded = np.sign(ratio) * np.floor(np.abs(ratio) + 0.5)
    return np.clip(rounded + zero, *INT8).astype(np.int64)
