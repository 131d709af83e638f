"""Register values for requantization, derived from float scales.

These invert the DPU arithmetic of ``emulator/NUMERICS.md`` (section 4; the compiler-side
formulas are its section 9) into the vendor's operand conventions, measured on the 11 int8
conv layers of the RK3588 listings (vendor-corpus README 5, ``regcmd/*.quant.json``):

- **BS, per output channel c** (the 64-byte-per-8-channel BRDMA blob, ``weight_pack``):
  ``ALU[c] = round(b[c] / (s_in * s_w[c])) - zp_in * sum(w_q[c] - zp_w[c])`` (int32),
  ``CPEND[c] = -zp_w[c]`` (int16, multiplies the window sum: removes the weight zero point),
  ``MUL[c] = round(2^14 * s_w[c] / max(s_w))`` with shift 14, so the channel with the largest
  weight scale gets 16384 (all 11 vendor layers). After BS every channel is in one unit,
  ``acc_scale = s_in * max(s_w)``.
- **OUT_CVT** carries the layer-wide factor ``M = acc_scale / s_out = SCALE * 2^-SHIFT`` with
  SCALE in [2^14, 2^15) (rep01: 29491 * 2^-23), OFFSET = zp_out.
- **Residual add** (rep12): the EW operand converter maps the residual into BS units,
  ``(q_r - zp_r) * s_r / acc_scale``: EW_CVT_OFFSET = -zp_r, SCALE * 2^-SHIFT = s_r / acc_scale
  (rep12: 21736 * 2^-6, offset 128).
- **Add of two tensors** (rep09): BS ALU = -zp_a, MUL = 16384 with shift 0, so the BS unit is
  s_a / 2^14; EW converter offset -zp_b and factor 2^14 s_b / s_a; OUT_CVT s_a / (2^14 s_out).
  When s_b >= 2 s_a that factor does not fit SCALE < 2^15: the unit becomes s_b / 2^14, the
  EW converter factor 2^14 (shift 0) and BS MUL * 2^-shift = 2^14 s_a / s_b.

Rounding: ``round`` here is half away from zero [C] (the vendor's ALU values agree with the
exact quotient to within its own weight-scale error, so they do not decide the tie rule).

Precision of the realised factor ``MUL[c] * 2^-14 * SCALE * 2^-SHIFT`` against
``M[c] = s_in * s_w[c] / s_out``: OUT_CVT's SCALE has at least 15 significant bits (relative
error <= 2^-15) and MUL[c] is rounded to an integer (relative error <= 0.5 / MUL[c]), so
``|realised / M[c] - 1| <= 2^-15 + 0.5 / MUL[c] (+ their product)``; with all weight scales
within a factor 64 of the largest (MUL >= 256) that is below 0.2 %. The vendor's registers
agree with the float factor within 0.25 % (VC 5); ``test_quant_regs.py`` checks both.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError

from .rounding import round_half_away

log = logging.getLogger(__name__)

BS_MUL_SHIFT = 14  # vendor: BS_MUL_SHIFT_VALUE = 14 in every conv layer (VC 5)
BS_MUL_ONE = 1 << BS_MUL_SHIFT
SCALE_BITS = 15  # OUT_CVT / EW converter SCALE in [2^14, 2^15): signed 16-bit field, positive
OUT_CVT_SHIFT_MAX = (1 << 12) - 1  # OUT_CVT_SHIFT[11:0]
EW_CVT_SHIFT_MAX = (1 << 6) - 1  # EW_OP_CVT_SHIFT[21:16]
BS_SHIFT_MAX = (1 << 6) - 1  # BS_MUL_CFG.BS_MUL_SHIFT_VALUE[13:8]
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass(frozen=True)
class FixedPoint:
    """``scale * 2^-shift``."""

    scale: int
    shift: int

    @property
    def value(self) -> float:
        return math.ldexp(self.scale, -self.shift)


def fixed_point(factor: float, *, max_shift: int = OUT_CVT_SHIFT_MAX, what: str = "factor") -> FixedPoint:
    """``factor`` as SCALE * 2^-SHIFT with SCALE in [2^14, 2^15) and 0 <= SHIFT <= max_shift.

    A factor too small for ``max_shift`` keeps SHIFT = max_shift and a smaller SCALE (less
    precision; at least 1). CompileError if the factor is not positive and finite, needs a
    negative shift (>= 2^15) or rounds to zero.
    """
    if not (factor > 0 and math.isfinite(factor)):
        raise CompileError(f"{what} must be a positive finite number, got {factor}")
    mantissa, exponent = math.frexp(factor)  # factor = mantissa * 2^exponent, mantissa in [0.5, 1)
    shift = SCALE_BITS - exponent
    scale = int(round_half_away(math.ldexp(mantissa, SCALE_BITS)))
    if scale == 1 << SCALE_BITS:  # rounding carried into the next power of two
        scale, shift = scale >> 1, shift - 1
    if shift < 0:
        raise CompileError(f"{what} {factor:.6g} is too large for a 15-bit scale with a non-negative shift (max 32767)")
    if shift > max_shift:
        scale = int(round_half_away(math.ldexp(factor, max_shift)))
        shift = max_shift
        if scale < 1:
            raise CompileError(f"{what} {factor:.6g} is below the smallest representable 2^-{max_shift}")
    return FixedPoint(scale, shift)


@dataclass(frozen=True, eq=False)
class ConvRequant:
    """Per-channel BS operands and the layer-wide OUT_CVT of an int8 convolution."""

    alu: np.ndarray  # int32 [OC]
    cpend: np.ndarray  # int16 [OC]
    mul: np.ndarray  # int16 [OC]
    out_cvt: FixedPoint
    out_offset: int
    acc_scale: float  # real value of one BS output unit: s_in * max(s_w)
    mul_shift: int = BS_MUL_SHIFT

    def realised_factor(self) -> np.ndarray:
        """The factor the registers apply per channel: MUL * 2^-14 * SCALE * 2^-SHIFT."""
        return self.mul.astype(np.float64) * 2.0 ** -self.mul_shift * self.out_cvt.value


def weight_sums(weights: np.ndarray, zero_points: np.ndarray) -> np.ndarray:
    """``sum(w_q[c] - zp_w[c])`` per output channel over (IC, KH, KW), exact in int64."""
    w = np.asarray(weights, dtype=np.int64)
    zp = np.asarray(zero_points, dtype=np.int64).reshape(-1)
    return w.reshape(w.shape[0], -1).sum(axis=1) - zp * (w[0].size)


def conv_requant(*, input_scale: float, input_zero_point: int, weights: np.ndarray,
                 weight_scale: np.ndarray, weight_zero_point: np.ndarray, bias: np.ndarray | None,
                 output_scale: float, output_zero_point: int, bias_in_accumulator_units: bool = False,
                 layer: str = "?", scale_max: float = 0.0) -> ConvRequant:
    """BS and OUT_CVT operands of an int8 convolution (formulas in the module docstring).
    ``scale_max``: the largest weight scale of the whole layer this conv is a channel group of
    (compiler/LOWERING.md 28), so that its BS multipliers and OUT_CVT equal the whole layer's."""
    s_w = np.asarray(weight_scale, dtype=np.float64).reshape(-1)
    zp_w = np.asarray(weight_zero_point, dtype=np.int64).reshape(-1)
    out_channels = s_w.size
    if np.any(zp_w < -128) or np.any(zp_w > 127):
        raise CompileError(f"layer {layer}: weight zero points must be int8")
    if bias is None:
        bias_units = np.zeros(out_channels)
    elif bias_in_accumulator_units:
        bias_units = round_half_away(np.asarray(bias, dtype=np.float64))
    else:
        bias_units = round_half_away(np.asarray(bias, dtype=np.float64) / (input_scale * s_w))
    alu = bias_units - float(input_zero_point) * weight_sums(weights, zp_w)
    if np.any(alu < INT32_MIN) or np.any(alu > INT32_MAX):
        worst = int(np.argmax(np.abs(alu)))
        raise CompileError(
            f"layer {layer}: bias operand of channel {worst} ({alu[worst]:.0f}) does not fit the int32 "
            "BS ALU operand (bias too large for s_in * s_w)"
        )
    s_max = max(float(s_w.max()), float(scale_max))
    mul = round_half_away(BS_MUL_ONE * s_w / s_max).astype(np.int64)
    if np.any(mul == 0):
        log.warning("layer %s: %d channel(s) have weight scales below 2^-15 of the largest; their "
                    "BS multiplier rounds to 0", layer, int(np.sum(mul == 0)))
    acc_scale = float(input_scale) * s_max
    out_cvt = fixed_point(acc_scale / output_scale, what=f"layer {layer}: requantization factor s_in*s_w/s_out")
    return ConvRequant(alu.astype(np.int32), (-zp_w).astype(np.int16), mul.astype(np.int16), out_cvt,
                       int(output_zero_point), acc_scale)


@dataclass(frozen=True)
class OperandConvert:
    """The EW operand converter: ``(q + offset) * scale >> shift``."""

    offset: int
    scale: int
    shift: int


def operand_convert(scale_ratio: float, zero_point: int, what: str) -> OperandConvert:
    """Map an operand ``q`` with zero point ``zero_point`` into units ``scale_ratio`` times finer."""
    fixed = fixed_point(scale_ratio, max_shift=EW_CVT_SHIFT_MAX, what=what)
    return OperandConvert(-int(zero_point), fixed.scale, fixed.shift)


def residual_convert(residual_scale: float, residual_zero_point: int, acc_scale: float, layer: str = "?") -> OperandConvert:
    """EW converter for Conv+Add: residual into BS output units (rep12)."""
    return operand_convert(residual_scale / acc_scale, residual_zero_point,
                           f"layer {layer}: residual scale ratio s_r/(s_in*max s_w)")


@dataclass(frozen=True)
class EltwiseRequant:
    """Operands of a DPU-only element-wise layer on two int8 tensors."""

    bs_alu: int  # BS ALU operand (register): -zp_a
    bs_mul: int  # BS MUL operand (register)
    bs_mul_shift: int
    ew: OperandConvert
    out_cvt: FixedPoint
    out_offset: int
    acc_scale: float  # real value of one unit after BS


def eltwise_requant(op: str, scale_a: float, zp_a: int, scale_b: float, zp_b: int, output_scale: float,
                    output_zp: int, layer: str = "?") -> EltwiseRequant:
    """add/sub/max/min: both operands in units s_a / 2^14 (rep09); mul: plain (q - zp) products."""
    bs_shift = 0
    if op == "mul":
        ew = OperandConvert(-int(zp_b), 1, 0)
        acc_scale = scale_a * scale_b
        bs_mul = 1
    elif scale_b < 2 * scale_a:
        ew = operand_convert(BS_MUL_ONE * scale_b / scale_a, zp_b, f"layer {layer}: operand scale ratio 2^14*s_b/s_a")
        acc_scale = scale_a / BS_MUL_ONE
        bs_mul = BS_MUL_ONE
    else:
        # The second operand's steps are at least twice the first's: 2^14 s_b / s_a would need
        # SCALE >= 2^15. Count in s_b / 2^14 instead: the EW converter multiplies by 2^14 and
        # BS scales the first operand by 2^14 s_a / s_b (SCALE in [2^14, 2^15), 6-bit shift,
        # rounded half away at BS, NUMERICS.md 4.1). Found by the testing kit (issue 7).
        ew = OperandConvert(-int(zp_b), BS_MUL_ONE, 0)
        acc_scale = scale_b / BS_MUL_ONE
        first = fixed_point(BS_MUL_ONE * scale_a / scale_b, max_shift=BS_SHIFT_MAX,
                            what=f"layer {layer}: operand scale ratio 2^14*s_a/s_b")
        bs_mul, bs_shift = first.scale, first.shift
    out_cvt = fixed_point(acc_scale / output_scale, what=f"layer {layer}: output factor")
    return EltwiseRequant(-int(zp_a), bs_mul, bs_shift, ew, out_cvt, int(output_zp), acc_scale)


def clamp_threshold(value: float, unit: float) -> int:
    """A real activation bound in DPU units (RELUX compare value, clip low), int32."""
    threshold = int(round_half_away(value / unit))
    return max(INT32_MIN, min(INT32_MAX, threshold))


def activation_threshold(value: float, unit: float, dtype: str = "int8") -> int:
    """An activation bound as a DPU compare/ALU operand: int8 layers count in ``unit`` (the
    stage's real value per step), float16 layers write the fp32 bits [C]."""
    if dtype == "float16":
        return int(np.float32(value).view(np.int32))
    return clamp_threshold(value, unit)


def leaky_multiplier(alpha: float, layer: str = "?") -> FixedPoint:
    """LeakyRelu slope as the BN multiplier (MUL_PRELU: negative values only), 6-bit shift."""
    if not 0 < alpha < 1:
        raise CompileError(f"layer {layer}: leaky_relu alpha must be in (0, 1), got {alpha}")
    return fixed_point(alpha, max_shift=EW_CVT_SHIFT_MAX, what=f"layer {layer}: leaky_relu alpha")


#: fp16 RECIP = the fp16 bits of 1 / k with 16 added to the exponent field (2^16 / k; 0x7c00 for k = 1)
FP16_RECIP_EXPONENT_STEP = 16 << 10


def pool_reciprocal(kernel: int, dtype: str = "int8") -> int:
    """PPU RECIP_KERNEL_WIDTH/HEIGHT. int8: round(2^16 / k) (VC 4.3: 32768 for k = 2); exact for powers
    of two, otherwise the rounding of NUMERICS.md 6 applies to the rounded reciprocal. float16: the fp16
    bits of 2^16 / k, fp16(1 / k) rounded to nearest even, the exponent 31 of k = 1 a number (0x7555 k = 3,
    0x7800 k = 2, 0x7c00 k = 1 [V ORC: the vendor's rk3588 fp16 AveragePools]; NUMERICS.md 38)."""
    if kernel < 1:
        raise CompileError(f"pool kernel size must be positive, got {kernel}")
    if dtype == "float16":
        return int(np.float16(1.0 / kernel).view(np.uint16)) + FP16_RECIP_EXPONENT_STEP
    return int(round_half_away((1 << 16) / kernel))
