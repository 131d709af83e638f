"""Independent int8 references of the testing kit (``npuemu.tools.testing``): the NPU's
integer arithmetic (NUMERICS.md 1, 4, 6) and the int8 layer semantics built on it (NUMERICS.md
9: conv with per-channel weights, fused activation and residual add; pooling; element-wise
add/sub/mul/max/min; DPU LUT and plain activations), plus :func:`reference_graph`, which walks a
compiled int8 graph node by node, host steps included, and :func:`reference_model`, the same
walk on a built model (what the build decided read from its file): the tests' statement of
the exact int8 network, next to the emulator's (compiler/QUANTIZATION.md 7.1).

Written from the documented formulas: the scalar helpers in Python integers and fractions, the
layer references vectorized over int64 arrays (exact: accumulators through float64 matrix
products stay below 2^53, products of a 32-bit value and a 16-bit factor below 2^47). Nothing
here uses the emulator's kernels or the compiler's register code (quant_regs), so the two are
checked, not restated. One thing is taken from the compiler as data: the contents of a LUT
activation's tables (lower/lut.py's choice, LOWERING.md 4.1); the arithmetic around them (BN
map, interpolation, priorities, OUT_CVT) is this module's. And :func:`reference_model` runs
host steps the kit does not state with the compiler's float ONNX ops (float_eval.run_node):
ONNX semantics, no NPU arithmetic. The project's own kernel tests
import the shared pieces (tests/emulator/reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
import math
from typing import Any

import numpy as np

from npuemu.compiler import op_table
from npuemu.tools.testing_convert import float16_island, island_output, reference_convert

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


def round_shift_array(values, shift, mode: str) -> np.ndarray:
    """:func:`round_shift` over int64 arrays (``shift`` a scalar or an array that broadcasts).
    Shifts above 62 act as 62: every value used here is below 2^61 in magnitude, so the result
    rounds to 0 (or -1 for 'floor') either way."""
    v = np.asarray(values, np.int64)
    s = np.clip(np.asarray(shift, np.int64), 0, 62)
    low = v >> s
    if mode == "floor":
        return low
    twice_rest, one = 2 * (v - (low << s)), np.left_shift(np.int64(1), s)
    if mode == "half_up":
        tie_up = np.ones_like(low, bool)
    elif mode == "half_even":
        tie_up = (low & 1) == 1
    elif mode == "half_away":
        tie_up = low >= 0
    else:
        raise ValueError(mode)
    return low + ((twice_rest > one) | ((twice_rest == one) & tie_up))


def round_half_away_array(values) -> np.ndarray:
    """:func:`round_half_away` of float64 arrays, exactly (the fraction ``a - floor(a)`` of a
    float is exact, unlike ``floor(a + 0.5)``)."""
    magnitude = np.abs(np.asarray(values, np.float64))
    low = np.floor(magnitude)
    return (np.sign(values) * (low + (magnitude - low >= 0.5))).astype(np.int64)


def clamp_array(values, bounds) -> np.ndarray:
    return np.clip(np.asarray(values, np.int64), bounds[0], bounds[1])


def ppu_pool(x: np.ndarray, cfg: dict, bounds) -> np.ndarray:
    """PPU pooling of [C][H][W] from register-level settings (NUMERICS.md 6): ``cfg`` has
    method (0 average, 1 max, 2 min), kernel_h/w, stride_y/x, pad_top/left, out_h/w,
    pad_value and recip_w/h. Max/min skip padded positions; average counts them at pad_value."""
    x = np.asarray(x, np.int64)
    channels, height, width = x.shape
    out_h, out_w = cfg["out_h"], cfg["out_w"]
    total = np.zeros((channels, out_h, out_w), np.int64)
    best = np.full((channels, out_h, out_w), np.iinfo(np.int64).min if cfg["method"] == 1 else np.iinfo(np.int64).max)
    seen = np.zeros((out_h, out_w), np.int64)
    ys = np.arange(out_h) * cfg["stride_y"] - cfg["pad_top"]
    xs = np.arange(out_w) * cfg["stride_x"] - cfg["pad_left"]
    for ky in range(cfg["kernel_h"]):
        for kx in range(cfg["kernel_w"]):
            y, xx = ys + ky, xs + kx
            inside = ((y >= 0) & (y < height))[:, None] & ((xx >= 0) & (xx < width))[None, :]
            taps = x[:, np.clip(y, 0, height - 1)][:, :, np.clip(xx, 0, width - 1)]
            total += np.where(inside, taps, cfg["pad_value"])
            seen += inside
            pick = np.maximum if cfg["method"] == 1 else np.minimum
            best = np.where(inside, pick(best, taps), best)
    if cfg["method"] == 0:
        return clamp_array(round_shift_array(total * cfg["recip_w"] * cfg["recip_h"], 32, "half_away"), bounds)
    return clamp_array(np.where(seen > 0, best, cfg["pad_value"]), bounds)


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


@dataclass(frozen=True)
class LutTables:
    """A DPU LUT activation as programmed (LOWERING.md 4.1): LE over LUT inputs [-16384, 0],
    LO over [0, 16384], 513 int16 entries each, index select 5; ``input_step`` is the real
    value of one LUT input step, ``output_unit`` of one table unit."""

    le: np.ndarray
    lo: np.ndarray
    input_step: float
    output_unit: float


LUT_SPAN, LUT_INDEX_SELECT, BN_SHIFT_MAX = 16384, 5, (1 << 6) - 1  # rep10 (LOWERING.md 4.1); BN shift 6 bits


def lut_lookup(x: np.ndarray, tables: LutTables) -> np.ndarray:
    """NUMERICS.md 5 with the registers of LOWERING.md 4.1: slopes 0 (an out-of-range input
    reads the end entry), hybrid and overflow priority LO, underflow priority LE."""
    x = np.asarray(x, np.int64)

    def one(table, start, end):
        table = np.asarray(table, np.int64)
        offset = np.clip(x - start, 0, end - start)
        index = offset >> LUT_INDEX_SELECT
        fraction = offset - (index << LUT_INDEX_SELECT)
        upper = table[np.minimum(index + 1, table.size - 1)]
        hit = table[index] + round_shift_array((upper - table[index]) * fraction, LUT_INDEX_SELECT, "half_away")
        return np.where(x < start, table[0], np.where(x > end, table[-1], hit)), x < start, x > end

    le, le_under, le_over = one(tables.le, -LUT_SPAN, 0)
    lo, lo_under, lo_over = one(tables.lo, 0, LUT_SPAN)
    le_hit, lo_hit = ~(le_under | le_over), ~(lo_under | lo_over)
    pick_le = (le_hit & ~lo_hit) | (le_under & lo_under)  # one hit: that table; both under: LE; else LO
    return np.where(pick_le, le, lo)


#: Activations the DPU runs without the LUT (BN or EW stage: ReLU, RELUX, ALU max, MUL_PRELU)
DPU_ACTIVATIONS = ("none", "relu", "relu6", "clip", "leaky_relu")


def dpu_activation(v: np.ndarray, activation: str, unit: float, *, bounds=None, alpha: float | None = None) -> np.ndarray:
    """A non-LUT activation on int32 DPU values of real ``unit`` each (NUMERICS.md 4.2-4.4,
    LOWERING.md 4 BN_CFG): relu ``max(v, 0)``; relu6 and clip ``max(v, round(low / unit))`` then
    ``min(v, round(high / unit))`` (bounds rounded half away, saturated to int32);
    leaky_relu the multiplier with MUL_PRELU, negative values only:
    ``round_half_away(v * SCALE / 2^SHIFT)``, SCALE 2^-SHIFT = alpha with a 6-bit shift."""
    v = np.asarray(v, np.int64)
    if activation == "leaky_relu":
        scale, shift = scale_shift(float(alpha), BN_SHIFT_MAX)
        return np.where(v >= 0, v, clamp_array(round_shift_array(v * scale, shift, "half_away"), INT32))
    low, high = {"relu": (0.0, None), "relu6": (0.0, 6.0), "clip": bounds}.get(activation) or (None, None)
    if low is not None:
        v = np.maximum(v, clamp(round_half_away(low / unit), INT32))
    if high is not None:
        v = np.minimum(v, clamp(round_half_away(high / unit), INT32))
    return v


def reference_conv(x: np.ndarray, weights: np.ndarray, bias: np.ndarray | None, *, input_quant: Quant,
                   weight_quant: Quant, output_quant: Quant, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1),
                   groups: int = 1, activation: str = "none", residual: np.ndarray | None = None,
                   residual_quant: Quant | None = None, bias_units: np.ndarray | None = None,
                   lut: LutTables | None = None, bounds: tuple[float, float] | None = None,
                   alpha: float | None = None, residual_after_activation: bool = False) -> np.ndarray:
    """int8 convolution [C, H, W] -> [O, OH, OW] (NUMERICS.md 3, 4.1, 4.5, 9).

    ``weights``: int8 [O, C/groups, KH, KW]; ``bias``: float [O] (real units, stored as
    round(b / (s_in s_w[c])) accumulator units), or ``bias_units`` already in those units.
    Padding is the input zero point. Per output:
    ``v = sum((x - zp_in)(w - zp_w)) + bias_q``, ``v = round_half_away(v * MUL[c] / 2^14)``
    with ``MUL[c] = round(2^14 s_w[c] / max s_w)``, the activation in those units (relu: max 0;
    relu6 also min round(6 / (s_in max s_w))), then OUT_CVT ``round_half_even(v * SCALE /
    2^SHIFT) + zp_out`` saturated to int8, SCALE 2^-SHIFT = s_in max s_w / s_out.

    ``residual`` (int8 [O, OH, OW], Conv+Add, vendor rep12): before the activation, add
    ``round_half_even((q_r - zp_r) * SCALE_r / 2^SHIFT_r)`` with SCALE_r 2^-SHIFT_r =
    s_r / (s_in max s_w) (the EW operand converter, 6-bit shift; NUMERICS.md 4.4, 9).

    ``activation`` "clip" takes ``bounds`` (low, high), "leaky_relu" its slope ``alpha``:
    :func:`dpu_activation`, in BS units. ``residual_after_activation`` (Conv+Act+Add, the
    vendor's ConvReluAdd): the activation runs in BN, before the EW stage's add.

    ``lut`` (a LUT ``activation``, LOWERING.md 4.1): BN maps the BS units onto LUT inputs,
    ``round_half_away(v * S / 2^T)`` with S 2^-T = s_in max s_w / input_step (6-bit shift),
    the LUT (:func:`lut_lookup`), then a ``residual`` in table units (converter factor
    s_r / output_unit: the add after the activation) and OUT_CVT with output_unit / s_out.
    """
    x = np.asarray(x, np.int64)
    w = np.asarray(weights, np.int64)
    channels, height, width = x.shape
    outputs, group_inputs, kh, kw = w.shape
    s_in, zp_in = float(np.float64(input_quant.scale)), int(input_quant.zero_point)
    s_w, zp_w = weight_quant.per_channel(outputs)
    s_out, zp_out = float(np.float64(output_quant.scale)), int(output_quant.zero_point)
    s_max = float(s_w.max())
    v = _accumulate(x - zp_in, w - zp_w.reshape(-1, 1, 1, 1), stride, pads, dilation, groups)
    if bias_units is not None:
        v += np.asarray(bias_units, np.int64).reshape(-1, 1, 1)
    elif bias is not None:
        v += round_half_away_array(np.asarray(bias, np.float64) / (s_in * s_w)).reshape(-1, 1, 1)
    mul = np.array([round_half_away(2**BS_MUL_SHIFT * float(c) / s_max) for c in s_w], np.int64).reshape(-1, 1, 1)
    v = clamp_array(round_shift_array(v * mul, BS_MUL_SHIFT, "half_away"), INT32)
    unit = s_in * s_max  # real value of one BS unit
    if lut is not None:
        to_lut = scale_shift(unit / lut.input_step, BN_SHIFT_MAX)
        v = clamp_array(round_shift_array(v * to_lut[0], to_lut[1], "half_away"), INT32)
        v = lut_lookup(v, lut)
        unit = lut.output_unit
    elif activation not in DPU_ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: a LUT activation needs its tables (lut=)")
    if lut is None and (residual is None or residual_after_activation):
        v = dpu_activation(v, activation, unit, bounds=bounds, alpha=alpha)  # BN
    if residual is not None:
        r_scale, r_shift = scale_shift(float(np.float64(residual_quant.scale)) / unit, EW_CVT_SHIFT_MAX)
        operand = round_shift_array((np.asarray(residual, np.int64) - int(residual_quant.zero_point)) * r_scale,
                                    r_shift, "half_even")
        v = clamp_array(v + clamp_array(operand, INT32), INT32)
        if lut is None and not residual_after_activation:
            v = dpu_activation(v, activation, unit, bounds=bounds, alpha=alpha)  # EW ReLU / RELUX after the add
    scale, shift = scale_shift(unit / s_out, OUT_CVT_SHIFT_MAX)
    return clamp_array(round_shift_array(v * scale, shift, "half_even") + zp_out, INT8).astype(np.int8)


def _accumulate(centred: np.ndarray, taps: np.ndarray, stride, pads, dilation, groups: int) -> np.ndarray:
    """``sum(centred * taps)`` per output [O, OH, OW] with zero (= the input zero point before
    centring) padding, as a float64 matrix product per group: exact, every partial sum of
    products of 9-bit values stays far below 2^53."""
    channels, height, width = centred.shape
    outputs, group_inputs, kh, kw = taps.shape
    top, left, bottom, right = pads
    padded = np.zeros((channels, height + top + bottom, width + left + right), np.float64)
    padded[:, top:top + height, left:left + width] = centred
    out_h = (padded.shape[1] - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    out_w = (padded.shape[2] - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    columns = np.empty((channels, kh, kw, out_h, out_w), np.float64)
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dilation[0], kx * dilation[1]
            columns[:, ky, kx] = padded[:, y0:y0 + (out_h - 1) * stride[0] + 1:stride[0],
                                        x0:x0 + (out_w - 1) * stride[1] + 1:stride[1]]
    columns = columns.reshape(groups, group_inputs * kh * kw, out_h * out_w)
    product = np.matmul(taps.reshape(groups, outputs // groups, -1).astype(np.float64), columns)
    return np.rint(product).astype(np.int64).reshape(outputs, out_h, out_w)


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
                      output_quant: Quant, activation: str = "none", bounds=None, gate_first: bool = False) -> np.ndarray:
    """int8 element-wise layer on two tensors of one shape, or ``b`` broadcasting to ``a``'s
    (numpy rules: a [C, 1, 1] gate, LOWERING.md 17) (NUMERICS.md 4.1, 4.4, 4.5, 9).

    add / sub / max / min (vendor rep09): BS maps the first operand to ``(q_a - zp_a) * 2^14``
    (ALU -zp_a, MUL 2^14, shift 0); the EW operand converter brings the second into the same
    units, ``round_half_even((q_b - zp_b) * SCALE / 2^SHIFT)`` with SCALE 2^-SHIFT = 2^14 s_b / s_a
    (6-bit shift); the EW ALU combines (sub = first minus second); OUT_CVT with
    s_a / (2^14 s_out). mul: plain ``(q_a - zp_a) * (q_b - zp_b)`` through the EW multiplier
    (truncate 0), OUT_CVT with s_a s_b / s_out. OUT_CVT rounds half even; saturated to int8.
    When s_b >= 2 s_a the unit is s_b / 2^14 instead: the converter multiplies by 2^14 and BS
    scales the first operand by SCALE 2^-SHIFT = 2^14 s_a / s_b, rounding half away.
    A fused relu / relu6 / clip(0, hi) (``activation``, ``bounds``) follows the combination in
    the EW stage, in its units (:func:`dpu_activation`). ``gate_first`` (sub of a [C, 1, 1] gate
    ``b`` minus the map ``a``, compiler/LOWERING.md 33.2): BS negates the first operand (its
    half-away rounding is symmetric) and the EW ALU adds.
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
    combine = {"add": np.add, "sub": np.subtract, "max": np.maximum, "min": np.minimum, "mul": np.multiply}[op]
    operand = clamp_array(round_shift_array((np.asarray(b, np.int64) - zp_b) * ew_scale, ew_shift, "half_even"), INT32)
    first = clamp_array(round_shift_array((np.asarray(a, np.int64) - zp_a) * a_factor, a_shift, "half_away"), INT32)
    if gate_first:
        first, combine = -first, np.add
    v = dpu_activation(clamp_array(combine(first, operand), INT32), activation, unit, bounds=bounds)
    return clamp_array(round_shift_array(v * out_scale, out_shift, "half_even") + zp_out, INT8).astype(np.int8)


def reference_copy(x: np.ndarray, *, input_quant: Quant, output_quant: Quant) -> np.ndarray:
    """A requantizing DPU copy (NPU Concat slices; NUMERICS.md 4.1, 4.5): BS ``(q - zp_in) * 2^14``,
    OUT_CVT with s_in / (2^14 s_out), rounded half even, + zp_out, saturated."""
    s_in, s_out = float(np.float64(input_quant.scale)), float(np.float64(output_quant.scale))
    scale, shift = scale_shift(s_in / (2**BS_MUL_SHIFT * s_out), OUT_CVT_SHIFT_MAX)
    v = (np.asarray(x, np.int64) - int(input_quant.zero_point)) * 2**BS_MUL_SHIFT
    return clamp_array(round_shift_array(v * scale, shift, "half_even") + int(output_quant.zero_point),
                       INT8).astype(np.int8)


def reference_transpose(x: np.ndarray, perm) -> np.ndarray:
    """An NPU Transpose (LOWERING.md 35): the stored values moved, input and output sharing one
    quantization (int8) or both float16 - numpy's transpose of the stored tensor."""
    return np.transpose(np.asarray(x), perm)


def reference_activation(x: np.ndarray, activation: str, *, input_quant: Quant, output_quant: Quant, bounds=None,
                         alpha: float | None = None, lut: LutTables | None = None) -> np.ndarray:
    """A standalone int8 activation, one DPU-only task (LOWERING.md 4 and 4.1).

    Without the LUT: the requantizing copy of :func:`reference_copy` (BS ``(q - zp_in) * 2^14``,
    unit s_in / 2^14) with :func:`dpu_activation` in BN between BS and OUT_CVT. A LUT kind
    (``lut``): BS bypassed, BN ``round_half_away((q - zp_in) * S / 2^T)`` with S 2^-T =
    s_in / input_step (6-bit shift), :func:`lut_lookup`, OUT_CVT output_unit / s_out. OUT_CVT
    rounds half even, + zp_out, saturated to int8."""
    s_in, zp_in = float(np.float64(input_quant.scale)), int(input_quant.zero_point)
    centred = np.asarray(x, np.int64) - zp_in
    if lut is not None:
        to_lut = scale_shift(s_in / lut.input_step, BN_SHIFT_MAX)
        v = lut_lookup(clamp_array(round_shift_array(centred * to_lut[0], to_lut[1], "half_away"), INT32), lut)
        unit = lut.output_unit
    elif activation in DPU_ACTIVATIONS:
        unit = s_in / 2**BS_MUL_SHIFT
        v = dpu_activation(centred * 2**BS_MUL_SHIFT, activation, unit, bounds=bounds, alpha=alpha)
    else:
        raise ValueError(f"activation {activation!r}: a LUT activation needs its tables (lut=)")
    scale, shift = scale_shift(unit / float(np.float64(output_quant.scale)), OUT_CVT_SHIFT_MAX)
    return clamp_array(round_shift_array(v * scale, shift, "half_even") + int(output_quant.zero_point),
                       INT8).astype(np.int8)


def reference_add(a: np.ndarray, b: np.ndarray, *, a_quant: Quant, b_quant: Quant, output_quant: Quant) -> np.ndarray:
    """:func:`reference_eltwise` for Add."""
    return reference_eltwise("add", a, b, a_quant=a_quant, b_quant=b_quant, output_quant=output_quant)


#: ONNX element-wise ops the NPU runs on two feature maps, and the reference's name for each.
ELTWISE_OPS = op_table.eltwise_ops()  # the ops only: each operation is written below, independently
#: Host steps :func:`reference_host` states (ONNX semantics, written here)
HOST_OPS = (*ELTWISE_OPS, "Concat", "Softmax", "Relu", "Sigmoid", "HardSigmoid", "HardSwish", "DepthToSpace", "Resize")
#: Pooling ops (the PPU)
POOL_OPS = ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool")
#: Shape-only ops: the bytes are reused as they are (the build aliases them).
VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
#: ONNX LUT activations and the compiler's name for their tables (LOWERING.md 4.1)
LUT_OPS = op_table.onnx_lut_kinds()  # the names only: each function is written below, independently


def reference_graph(graph, stored: dict[str, np.ndarray], *, layer_inputs=None, host_layers=(),
                    float_tensors=(), host_fallback=None) -> dict[str, np.ndarray]:
    """Every tensor of a fused, int8-quantized graph from int8 ``stored`` inputs, node by node
    with the references above (the graph is walked as compiled, so the vendor rewrites of
    optimization level 3 - FC as a 1x1 conv, identity convs before element-wise inputs - are
    followed). Values keep the graph's NCHW shapes. NotImplementedError names an op the kit
    has no reference for.

    ``layer_inputs`` (tensor name -> stored int8 values, e.g. the runtime's own tensors): each
    node reads its inputs from there instead of from this walk, so every layer is checked on
    its own and a difference does not spread. Nodes the partition sent to the CPU, broadcasting
    element-wise nodes and the layers named in ``host_layers`` (the build's host steps, e.g. a
    Concat whose slices are not C2-aligned) are host steps: :func:`reference_host`; the
    tensors named in ``float_tensors`` are stored as real values, not quantized (the build's
    host-only tensors, isa/CONTAINER.md 3.3).

    ``host_fallback`` (``run_node(node, fetch) -> outputs``, the signature of
    compiler/float_eval.py): the float ONNX op of a host step the kit states no reference for
    (another op, fused parts, constant operands, several outputs), inside the same host
    convention (:func:`reference_host`). Host steps are float ONNX ops, not NPU arithmetic.
    """
    values = {name: np.asarray(stored[name]).reshape(graph.tensors[name].shape) for name in graph.inputs}

    def read(name: str) -> np.ndarray:
        if layer_inputs is not None and name in layer_inputs:
            return np.asarray(layer_inputs[name]).reshape(graph.tensors[name].shape)
        return values[name]

    for node in graph.nodes:
        output = node.outputs[0]
        shape = graph.tensors[output].shape
        inputs = [name for name in node.inputs if name and not graph.tensors[name].is_const]
        if node.op_type in VIEW_OPS:
            values[output] = read(node.inputs[0]).reshape(shape)
        elif node.op_type in ("Readout", "Readin") or _npu_transpose(graph, node, host_layers):  # LOWERING 25, 33.4, 35
            values[output] = reference_transpose(read(node.inputs[0]), node.attrs["perm"]).reshape(shape)
        elif _on_host(graph, node, host_layers):
            if host_fallback is not None and not _kit_host_step(graph, node):
                values.update(_fallback_host_node(graph, node, read, float_tensors, host_fallback))
                continue
            if node.fused:
                raise NotImplementedError(f"the testing kit has no reference for the fused host layer {node.name}")
            values[output] = reference_host(node.op_type, node.attrs, [read(name) for name in inputs],
                                            [_quant(graph.tensors[name]) for name in inputs],
                                            None if output in float_tensors else _quant(graph.tensors[output]),
                                            shape, graph.tensors[output].dtype)
        elif node.op_type == "Conv":
            values[output] = _conv_node(graph, node, read).reshape(shape)
        elif node.op_type == "ConvTranspose":  # NPU phase conv, then DepthToSpace / crop host steps
            values[output] = _conv_transpose_node(graph, node, read).reshape(shape)
            if output in float_tensors:  # the host step writes a host-only tensor: real values
                values[output] = host_real(values[output], _quant(graph.tensors[output])).astype(
                    graph.tensors[output].dtype)
        elif node.op_type in ELTWISE_OPS and len(inputs) == 2 and len(node.fused) <= 1:
            values[output] = _eltwise_node(graph, node, inputs, read).reshape(shape)
        elif node.op_type == "Concat" and not node.fused and int(node.attrs.get("axis", 1)) in (1, -3):
            out_quant = _quant(graph.tensors[output])
            values[output] = np.concatenate([reference_copy(read(name), input_quant=_quant(graph.tensors[name]),
                                                            output_quant=out_quant) for name in inputs], axis=1)
        elif node.op_type == "Split" and not node.fused and int(node.attrs.get("axis", 0)) in (1, -3):
            values.update(_split_node(graph, node, read))  # requantizing DPU copies of channel slices
        elif node.op_type in (*PLAIN_ACTIVATIONS, *LUT_OPS) and not node.fused and len(inputs) == 1:
            values[output] = _activation_node(graph, node, read).reshape(shape)
        elif node.op_type in POOL_OPS and not node.fused:
            values[output] = _pool_node(graph, node, read).reshape(shape)
        elif node.op_type == "Resize" and not node.fused and len(inputs) == 1:
            # NPU nearest Resize (DPU unpooling, compiler/LOWERING.md 19): a gather of stored values
            # between tensors sharing their quantization, so the host convention gives the same bytes
            q = _quant(graph.tensors[output])
            values[output] = reference_host("Resize", node.attrs, [read(inputs[0])], [_quant(graph.tensors[inputs[0]])],
                                            None if output in float_tensors else q, shape, graph.tensors[output].dtype)
        elif node.op_type == "DataConvert":  # an NPU int8 <-> fp16 task (testing_convert, LOWERING.md 26)
            side = graph.tensors[output if node.attrs["to"] == "int8" else inputs[0]].quant
            values[output] = reference_convert(read(inputs[0]), float(side.scale), int(side.zero_point),
                                               node.attrs["to"]).reshape(shape)
        elif float16_island(graph, node):  # a float16 NPU layer of an int8 graph: the caller's stored values
            values[output] = island_output(graph, node, layer_inputs)
        else:
            raise NotImplementedError(f"the testing kit has no reference for {node.display_op} (layer {node.name})")
    return values


def _kit_host_step(graph, node) -> bool:
    """Whether :func:`reference_host` states this host step: a known op, one output, no fused
    parts, and for an element-wise op no constant operand (the others take theirs as attributes)."""
    constant = any(name and graph.tensors[name].is_const for name in node.inputs)
    return (node.op_type in HOST_OPS and not node.fused and len(node.outputs) == 1
            and not (constant and node.op_type in ELTWISE_OPS))


def _fallback_host_node(graph, node, read, float_tensors, host_fallback) -> dict[str, np.ndarray]:
    """A host step through ``host_fallback``: int8 inputs dequantized to float32 (then float64),
    constants as their real data, others as they are; each int8 output quantized half even,
    the others stored in their dtype (:func:`reference_host`'s convention)."""
    def fetch(name: str) -> np.ndarray:
        tensor = graph.tensors[name]
        if tensor.is_const:
            return np.asarray(tensor.data)
        value = np.asarray(read(name))
        if _is_int8(tensor, float_tensors):
            return host_real(value, _quant(tensor)).astype(np.float64)
        return value.astype(np.float64) if value.dtype.kind == "f" else value

    stored = {}
    for name, result in zip(node.outputs, host_fallback(node, fetch)):
        tensor = graph.tensors[name]
        result = np.asarray(result).reshape(tensor.shape)
        if _is_int8(tensor, float_tensors):
            quant = _quant(tensor)
            quantized = np.rint(result.astype(np.float64) / float(np.float64(quant.scale))) + int(quant.zero_point)
            stored[name] = np.clip(quantized, *INT8).astype(np.int8)
        else:
            stored[name] = result.astype(tensor.dtype)
    return stored


def _is_int8(tensor, float_tensors) -> bool:
    return tensor.quant is not None and tensor.quant.dtype == "int8" and tensor.name not in float_tensors


def reference_model(graph, model, inputs, *, layer_inputs=None) -> dict[str, np.ndarray]:
    """:func:`reference_graph` of the int8 ``graph`` as the ``model`` built from it runs it: the
    stored value of every tensor, to compare with the runtime's (``output(name,
    dequantize=False)``). What the build decided is read from the model's trailer
    (isa/CONTAINER.md): the layers whose outputs its CPU steps write are host steps, its
    tensors stored without quantization are host-only float tensors. ``inputs``: real values,
    quantized as the runtime quantizes a graph input (:func:`quantize_input`), or int8 stored
    values taken as they are. ``layer_inputs`` as for :func:`reference_graph`. Host steps the
    kit has no reference for run the compiler's float ONNX op (``host_fallback``: float_eval's
    run_node, the ONNX semantics fake quant uses; no NPU arithmetic)."""
    from npuemu.compiler.float_eval import run_node

    records = {record["name"]: record for record in model.trailer.get("tensors", ())}
    cpu_outputs = {output for step in model.schedule() if step.kind == "cpu" for output in step.outputs}
    host = {node.name for node in graph.nodes if node.outputs[0] in cpu_outputs}
    floats = {name for name, record in records.items()
              if record.get("quantization") is None and str(record.get("dtype", "")).startswith("float")}
    stored = {name: quantize_input(inputs[name], _quant(graph.tensors[name])) for name in graph.inputs}
    return reference_graph(graph, stored, layer_inputs=layer_inputs, host_layers=host, float_tensors=floats,
                           host_fallback=run_node)


def quantize_input(values, quant: Quant) -> np.ndarray:
    """A graph input as the runtime stores it: int8 values as they are, real values
    ``clip(round_half_even(x / s) + zp)`` (the host's quantization, as :func:`reference_host`)."""
    values = np.asarray(values)
    if values.dtype == np.int8:
        return values
    s_in = float(np.float64(quant.scale))
    return np.clip(np.rint(values.astype(np.float64) / s_in) + int(quant.zero_point), *INT8).astype(np.int8)


def _npu_transpose(graph, node, host_layers) -> bool:
    """An NPU Transpose (its copies move the stored values: :func:`reference_transpose`)."""
    return node.op_type == "Transpose" and not node.fused and not _on_host(graph, node, host_layers)


def _on_host(graph, node, host_layers) -> bool:
    if node.target == "CPU":
        return True
    if node.op_type != "ConvTranspose" and (node.layer_name in host_layers or node.name in host_layers):
        return True  # (a ConvTranspose's output is written by its DepthToSpace or crop host step)
    operands = [graph.tensors[name] for name in node.inputs[:2] if name]
    return (node.op_type in ELTWISE_OPS and len(operands) == 2 and not any(t.is_const for t in operands)
            and tuple(operands[0].shape) != tuple(operands[1].shape) and _npu_broadcast(graph, node) is None)


def _npu_broadcast(graph, node) -> int | None:
    """Which operand of a 4-D element-wise node the NPU broadcasts, taken as its second operand
    (Sub's first only as a [1, C, 1, 1] gate), else None (a host step): a [1, 1, H, W] map over the other's [1, C, H, W]
    with C > 1 (compiler/LOWERING.md 16, replicated across the lanes) or a [1, C, 1, 1] gate over
    [1, C, H, W] with H x W > 1 (LOWERING.md 17, the ERDMA's per-channel mode)."""
    if node.op_type not in ELTWISE_OPS:
        return None
    shapes = [tuple(graph.tensors[name].shape) for name in node.inputs[:2]]
    out = tuple(graph.tensors[node.outputs[0]].shape)
    if len(out) != 4 or out[0] != 1 or any(len(s) != 4 for s in shapes):
        return None
    narrow = [shape for shape, wide in (((1, 1, *out[2:]), out[1] > 1), ((1, out[1], 1, 1), out[2] * out[3] > 1))
              if wide]
    for index in (1, 0):  # Sub: a [1, C, 1, 1] gate first too (BS negates the map, LOWERING.md 33.2)
        first_ok = node.op_type != "Sub" or index == 1 or shapes[index] == (1, out[1], 1, 1)
        if first_ok and shapes[index] in narrow and shapes[1 - index] == out:
            return index
    return None


# --- host steps ----------------------------------------------------------------------------------

def reference_host(op: str, attrs: dict, inputs: list[np.ndarray], input_quants: list[Quant],
                   output_quant: Quant | None, shape, dtype="float32") -> np.ndarray:
    """A host (CPU) step, the runtime's convention (emulator/cpu_ops.py run_step): each int8
    input dequantized to float32 ``s (q - zp)`` (a float input taken as it is), the op in
    float64 with ONNX semantics, the result quantized ``clip(round_half_even(v / s_out) +
    zp_out)``, or, without ``output_quant``, stored as ``dtype``."""
    real = [np.asarray(x, np.float64) if np.issubdtype(np.asarray(x).dtype, np.floating) else
            host_real(x, q).astype(np.float64) for x, q in zip(inputs, input_quants)]
    value = _host_op(op, attrs, real).reshape(shape)
    if output_quant is None:
        return value.astype(dtype)
    s_out = float(np.float64(output_quant.scale))
    return np.clip(np.rint(value / s_out) + int(output_quant.zero_point), *INT8).astype(np.int8)


def host_real(x: np.ndarray, quant: Quant) -> np.ndarray:
    """The float32 real value ``s (q - zp)`` the host reads of an int8 tensor."""
    return (float(np.float64(quant.scale)) * (np.asarray(x, np.float64) - int(quant.zero_point))).astype(np.float32)


def _host_op(op: str, attrs: dict, x: list[np.ndarray]) -> np.ndarray:
    if op in ELTWISE_OPS:
        return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum}[op](*x)
    if op == "Concat":
        return np.concatenate(x, axis=int(attrs.get("axis", 0)))
    if op == "Softmax":
        axis = int(attrs.get("axis", -1))
        exp = np.exp(x[0] - x[0].max(axis=axis, keepdims=True))
        return exp / exp.sum(axis=axis, keepdims=True)
    if op == "Relu":
        return np.maximum(x[0], 0.0)
    if op == "Sigmoid":
        return 1.0 / (1.0 + np.exp(-x[0]))
    if op == "HardSigmoid":
        return np.clip(float(attrs.get("alpha", 0.2)) * x[0] + float(attrs.get("beta", 0.5)), 0.0, 1.0)
    if op == "HardSwish":
        return x[0] * np.clip(x[0] / 6.0 + 0.5, 0.0, 1.0)
    if op == "DepthToSpace":
        return _depth_to_space(x[0], int(attrs["blocksize"]), attrs.get("mode", "DCR"))
    if op == "Resize":
        return _resize_nearest(x[0], attrs)
    raise NotImplementedError(f"the testing kit has no reference for the host step {op}")


def _depth_to_space(x: np.ndarray, block: int, mode: str) -> np.ndarray:
    n, c, h, w = x.shape
    depth = c // (block * block)
    if mode == "CRD":
        y = x.reshape(n, depth, block, block, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        y = x.reshape(n, block, block, depth, h, w).transpose(0, 3, 4, 1, 5, 2)
    return y.reshape(n, depth, h * block, w * block)


def _resize_nearest(x: np.ndarray, attrs: dict) -> np.ndarray:
    """ONNX Resize, mode nearest, per axis: the output coordinate mapped back by the
    coordinate transformation, then rounded by nearest_mode and clamped to the input."""
    if attrs.get("mode", "nearest") != "nearest":
        raise NotImplementedError(f"the testing kit has no reference for Resize mode {attrs.get('mode')}")
    scales, sizes = attrs.get("scales"), attrs.get("sizes")
    if sizes and not scales:
        scales = [out / size for out, size in zip(sizes, x.shape)]
    if not sizes:
        sizes = [int(math.floor(size * float(scale))) for size, scale in zip(x.shape, scales)]
    transform = attrs.get("coordinate_transformation_mode", "half_pixel")
    rounding = attrs.get("nearest_mode", "round_prefer_floor")
    for axis, (out_size, scale) in enumerate(zip(sizes, scales)):
        out_size, size, scale = int(out_size), x.shape[axis], float(scale)
        if out_size == size and scale == 1.0:
            continue
        o = np.arange(out_size, dtype=np.float64)
        source = {"asymmetric": o / scale, "half_pixel": (o + 0.5) / scale - 0.5,
                  "tf_half_pixel_for_nn": (o + 0.5) / scale,
                  "align_corners": o * (size - 1) / max(out_size - 1, 1),
                  "pytorch_half_pixel": (o + 0.5) / scale - 0.5 if out_size > 1 else 0 * o}[transform]
        index = {"floor": np.floor, "ceil": np.ceil, "round_prefer_floor": lambda v: np.ceil(v - 0.5),
                 "round_prefer_ceil": lambda v: np.floor(v + 0.5)}[rounding](source)
        x = np.take(x, np.clip(index, 0, size - 1).astype(np.int64), axis=axis)
    return x


# --- NPU layers of the graph ---------------------------------------------------------------------

@dataclass
class _Activation:
    """An activation as the DPU runs it: ``kind`` (:data:`DPU_ACTIVATIONS` or a LUT kind), clip
    ``bounds``, leaky ``alpha``, and for a LUT kind its ONNX op and attributes."""

    kind: str = "none"
    bounds: tuple[float, float] | None = None
    alpha: float | None = None
    lut_op: str | None = None
    lut_attrs: dict | None = None


#: ONNX activations the DPU runs without the LUT
PLAIN_ACTIVATIONS = ("Relu", "Clip", "LeakyRelu")


def _activation(graph, op_type: str, attrs: dict, operands, output: str) -> _Activation:
    """The activation of an ONNX Relu / Clip / LeakyRelu / LUT op; ``operands``: its inputs
    after the activated value (Clip's min and max)."""
    if op_type in LUT_OPS:
        return _Activation(LUT_OPS[op_type], lut_op=op_type, lut_attrs=dict(attrs))
    if op_type == "Relu":
        return _Activation("relu")
    if op_type == "LeakyRelu":
        return _Activation("leaky_relu", alpha=float(attrs.get("alpha", 0.01)))
    if op_type == "Clip":
        return _Activation("clip", bounds=_clip_bounds(graph, attrs, operands, output))
    raise NotImplementedError(f"the testing kit has no reference for the activation {op_type}")


def _clip_bounds(graph, attrs: dict, operands, output: str) -> tuple[float, float]:
    """Clip's (low, high), finite: an open end is the end of what the int8 output holds (the
    saturation does the same there; the DPU needs a number), and with min > max ONNX Clip gives
    max everywhere, a clip to [max, max]."""
    ends = [float(attrs.get("min", -np.inf)), float(attrs.get("max", np.inf))]
    for index, name in enumerate(list(operands)[:2]):
        if name:
            ends[index] = float(np.asarray(graph.tensors[name].data).reshape(-1)[0])
    low, high = ends
    quant = _quant(graph.tensors[output])
    s, zp = float(np.float64(quant.scale)), int(quant.zero_point)
    held = (s * (-128 - zp), s * (127 - zp))
    low = low if np.isfinite(low) else min(held[0], high if np.isfinite(high) else held[0])
    high = high if np.isfinite(high) else max(held[1], low)
    return (high, high) if low > high else (low, high)


@dataclass
class _ConvParts:
    """A conv's fused parts: its activation, residual tensor (and whether the residual Add
    comes after the activation) and the bias units of folded bias Adds."""

    activation: _Activation
    residual: str | None
    after: bool
    extra: np.ndarray


def _conv_parts(graph, node, unit: np.ndarray) -> _ConvParts:
    """The fused parts of a conv. Bias Adds of a constant fold into the bias as the build folds
    them: the constant's stored value in units ``unit`` (s_in s_w[c])."""
    activation, residual, after = _Activation(), None, False
    extra = np.zeros(unit.size, np.int64)
    for part in node.fused:
        if part.op_type == "Add" and getattr(part, "tag", None) == "bias_add" and activation.kind == "none" \
                and residual is None:
            extra += _bias_add_units(graph, part, unit)
        elif part.op_type in (*PLAIN_ACTIVATIONS, *LUT_OPS) and activation.kind == "none" \
                and (residual is None or part.op_type in PLAIN_ACTIVATIONS):
            activation = _activation(graph, part.op_type, part.attrs, part.inputs, node.outputs[0])
        elif part.op_type == "Add" and residual is None:
            residual, after = part.inputs[0], activation.kind != "none"
        else:
            raise NotImplementedError(f"the testing kit has no reference for the fused {part.op_type} of {node.name}")
    return _ConvParts(activation, residual, after, extra)


def _bias_add_units(graph, part, unit: np.ndarray) -> np.ndarray:
    """A fused bias Add's constant, as stored, in accumulator units per channel."""
    constant = graph.tensors[part.inputs[0]]
    data = np.asarray(constant.data, np.float64)
    if constant.quant is not None:
        q_scale, q_zero = _axis_params(constant, data.ndim)
        bounds = INT32 if constant.quant.dtype == "int32" else INT8
        data = q_scale * (_stored(data, q_scale, q_zero, bounds) - q_zero)
    data = data.reshape(-1)
    if data.size not in (1, unit.size):  # a ConvTranspose's per-co bias over its (co, i, j) channels
        data = np.repeat(data, unit.size // data.size)
    return round_half_away_array(np.broadcast_to(data, unit.shape) / unit)


def _lut_tables(activation: _Activation, unit: float, output: Quant, value_range=None) -> LutTables:
    """The compiler's table contents for this activation (data, not arithmetic: module docstring)."""
    from npuemu.compiler.lower.lut import lut_program

    attrs, kind = activation.lut_attrs or {}, activation.kind
    alpha = attrs.get("alpha") if kind in ("elu", "hard_sigmoid") else None
    beta = attrs.get("beta") if kind == "hard_sigmoid" else None
    program, _, _ = lut_program(kind, input_unit=unit, output_scale=float(np.float64(output.scale)),
                                output_zero_point=int(output.zero_point), alpha=alpha, beta=beta,
                                value_range=value_range)
    return LutTables(program.le, program.lo, program.domain / LUT_SPAN, program.output_unit)


def _conv_node(graph, node, read, weights=None, weight_quant=None, bias=None, *, source=None,
               attrs=None) -> np.ndarray:
    """One int8 conv (or, given ``weights``, ``source`` and ``attrs``, the conv a ConvTranspose is)."""
    weight = graph.tensors[node.inputs[1]]
    weights = _weights(weight) if weights is None else weights
    weight_quant = _quant(weight) if weight_quant is None else weight_quant
    input_quant, output_quant = _quant(graph.tensors[node.inputs[0]]), _quant(graph.tensors[node.outputs[0]])
    s_in = float(np.float64(input_quant.scale))
    s_w, _ = weight_quant.per_channel(weights.shape[0])
    unit = s_in * s_w
    parts = _conv_parts(graph, node, unit)
    activation, residual = parts.activation, parts.residual
    if residual is not None and activation.lut_op is not None and not parts.after:
        raise NotImplementedError(f"{node.name}: a LUT activation after a residual Add is a host step of the build")
    if bias is None and len(node.inputs) > 2 and node.inputs[2]:
        bias = np.asarray(graph.tensors[node.inputs[2]].data, np.float64).reshape(-1)
    units = parts.extra + (0 if bias is None else round_half_away_array(bias / unit))
    residual_quant = None if residual is None else _quant(graph.tensors[residual])
    tables = None
    if activation.lut_op is not None:
        value_range = None
        if residual is not None:  # act = out - residual (LOWERING.md 4.1)
            o, r = output_quant, residual_quant
            s_o, z_o, s_r, z_r = float(o.scale), int(o.zero_point), float(r.scale), int(r.zero_point)
            value_range = (s_o * (-128 - z_o) - s_r * (127 - z_r), s_o * (127 - z_o) - s_r * (-128 - z_r))
        tables = _lut_tables(activation, s_in * float(s_w.max()), output_quant, value_range)
    attrs = node.attrs if attrs is None else attrs
    return reference_conv(read(node.inputs[0])[0] if source is None else source, weights, None, input_quant=input_quant, weight_quant=weight_quant,
                          output_quant=output_quant, stride=tuple(attrs.get("strides", (1, 1))),
                          pads=tuple(attrs.get("pads", (0, 0, 0, 0))), dilation=tuple(attrs.get("dilations", (1, 1))),
                          groups=int(attrs.get("group", 1)), activation=activation.kind,
                          residual=None if residual is None else read(residual)[0], residual_quant=residual_quant,
                          bias_units=units, lut=tables, bounds=activation.bounds, alpha=activation.alpha,
                          residual_after_activation=parts.after)


def _activation_node(graph, node, read) -> np.ndarray:
    """A standalone NPU activation (one DPU-only task)."""
    x, output = node.inputs[0], node.outputs[0]
    activation = _activation(graph, node.op_type, node.attrs, node.inputs[1:], output)
    input_quant, output_quant = _quant(graph.tensors[x]), _quant(graph.tensors[output])
    tables = None
    if activation.lut_op is not None:
        tables = _lut_tables(activation, float(np.float64(input_quant.scale)), output_quant)
    return reference_activation(read(x)[0], activation.kind, input_quant=input_quant, output_quant=output_quant,
                                bounds=activation.bounds, alpha=activation.alpha, lut=tables)


def _conv_transpose_node(graph, node, read) -> np.ndarray:
    """ConvTranspose (group 1, dilation 1) as its textbook form, independent of the build's phase
    conv: the input spread s apart with the input zero point between (a real 0), then the int8
    conv arithmetic with the kernel flipped and its in/out axes swapped, padded k - 1 - pad
    (output_padding added after), cropped where a pad exceeds k - 1."""
    attrs = node.attrs
    if int(attrs.get("group", 1)) != 1 or any(d != 1 for d in attrs.get("dilations", (1, 1))):
        raise NotImplementedError(f"the testing kit has no reference for {node.name}: grouped or dilated "
                                  "ConvTranspose")
    weight = graph.tensors[node.inputs[1]]
    w = _weights(weight)  # [Ci, Co, kh, kw]
    _, outputs, kh, kw = w.shape
    sy, sx = (int(v) for v in attrs.get("strides", (1, 1)))
    top, left, bottom, right = (int(v) for v in attrs.get("pads", (0, 0, 0, 0)))
    extra_y, extra_x = (int(v) for v in attrs.get("output_padding", (0, 0)))
    x = read(node.inputs[0])[0]
    channels, height, width = x.shape
    spread = np.full((channels, (height - 1) * sy + 1, (width - 1) * sx + 1),
                     int(np.asarray(_quant(graph.tensors[node.inputs[0]]).zero_point)), x.dtype)
    spread[:, ::sy, ::sx] = x
    pads = (kh - 1 - top, kw - 1 - left, kh - 1 - bottom + extra_y, kw - 1 - right + extra_x)
    bias = np.asarray(graph.tensors[node.inputs[2]].data, np.float64).reshape(-1) if len(node.inputs) > 2 \
        and node.inputs[2] else None
    conv = np.ascontiguousarray(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    result = _conv_node(graph, node, read, conv, _quant(weight), bias, source=spread,
                        attrs={"pads": tuple(max(p, 0) for p in pads)})
    _, rows, cols = result.shape
    crop = [max(-p, 0) for p in pads]  # a pad beyond k - 1 removes output rows instead
    return result[:, crop[0]:rows - crop[2], crop[1]:cols - crop[3]]


def _pool_node(graph, node, read) -> np.ndarray:
    """Max / average pooling; the global forms as one window over the whole map."""
    source, output = _quant(graph.tensors[node.inputs[0]]), _quant(graph.tensors[node.outputs[0]])
    if (float(source.scale), int(source.zero_point)) != (float(output.scale), int(output.zero_point)):
        raise NotImplementedError(f"{node.name}: pooling with different input and output quantization")
    x, attrs = read(node.inputs[0])[0], node.attrs
    method = "max" if node.op_type in ("MaxPool", "GlobalMaxPool") else "average"
    if node.op_type.startswith("Global"):
        kernel, stride, pads = x.shape[1:], (1, 1), (0, 0, 0, 0)
    else:
        kernel, stride = tuple(attrs["kernel_shape"]), tuple(attrs.get("strides", (1, 1)))
        pads = tuple(attrs.get("pads", (0, 0, 0, 0)))
    return reference_pool(x, method=method, kernel=kernel, stride=stride, pads=pads, zero_point=int(source.zero_point))


def _eltwise_node(graph, node, inputs: list[str], read) -> np.ndarray:
    """An NPU element-wise layer on two feature maps, with its fused relu / clip if any."""
    gate_first = _npu_broadcast(graph, node) == 0 and node.op_type == "Sub"  # gate - map (LOWERING.md 33.2)
    if _npu_broadcast(graph, node) == 0:  # the NPU takes the broadcast operand second
        inputs = inputs[::-1]
    shape = graph.tensors[node.outputs[0]].shape
    activation = _Activation()
    if node.fused:
        part = node.fused[0]
        activation = _activation(graph, part.op_type, part.attrs, part.inputs, node.outputs[0])
        if activation.kind not in ("relu", "relu6", "clip"):
            raise NotImplementedError(f"the testing kit has no reference for the fused {part.op_type} of {node.name}")
    a, b = (np.broadcast_to(read(name)[0], shape[1:]) for name in inputs)
    return reference_eltwise(ELTWISE_OPS[node.op_type], a, b, a_quant=_quant(graph.tensors[inputs[0]]),
                             b_quant=_quant(graph.tensors[inputs[1]]), output_quant=_quant(graph.tensors[node.outputs[0]]),
                             activation=activation.kind, bounds=activation.bounds, gate_first=gate_first)


def _split_node(graph, node, read) -> dict[str, np.ndarray]:
    """An NPU channel Split: each output a requantizing DPU copy of its channels."""
    x = read(node.inputs[0])
    source, start, values = _quant(graph.tensors[node.inputs[0]]), 0, {}
    for output in node.outputs:
        size = int(graph.tensors[output].shape[1])
        values[output] = reference_copy(x[:, start:start + size], input_quant=source,
                                        output_quant=_quant(graph.tensors[output]))
        start += size
    return values


def _quant(tensor) -> Quant:
    return Quant(np.asarray(tensor.quant.scale, np.float64), np.asarray(tensor.quant.zero_point, np.int64))


def _axis_params(tensor, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """A quantized constant's scale and zero point, shaped to broadcast along its axis."""
    quant = tensor.quant
    scale, zero = np.asarray(quant.scale, np.float64), np.asarray(quant.zero_point, np.int64)
    if quant.axis is not None and scale.size > 1:
        shape = [1] * rank
        shape[quant.axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return scale, zero


def _stored(data: np.ndarray, scale, zero, bounds=INT8) -> np.ndarray:
    """A constant as stored: round half away of v / s, plus zp, saturated (NUMERICS.md 9)."""
    return np.clip(round_half_away_array(data / scale) + zero, *bounds).astype(np.int64)


def _weights(tensor) -> np.ndarray:
    data = np.asarray(tensor.data, np.float64)
    return _stored(data, *_axis_params(tensor, data.ndim))
