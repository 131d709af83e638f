"""The NPU's arithmetic, stated once.

Every rounding, saturation and per-element stage formula the emulator's kernels use lives here
as a small ``@njit(cache=True)`` function on plain integers. ``NUMERICS.md`` (next to this file)
gives the source of each fact and the reason for each choice; the tests re-implement the same
rules independently from that document (``tests/emulator/reference``), never by importing this
module's logic.

All integer functions take and return int64 values. A stage computes exactly in 64 bits and
saturates once at its output, as NUMERICS.md section 2 explains.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.isa import lut_format

# ---------------------------------------------------------------------------------------------
# Rounding modes of a right shift (NUMERICS.md section 1)
# ---------------------------------------------------------------------------------------------
ROUND_HALF_AWAY = 0  # ties away from zero: NVDLA's shift-right units (CACC, SDP X/Y)
ROUND_HALF_EVEN = 1  # ties to even: OUT_CVT with CVT_ROUND = 0 [3P]
ROUND_HALF_UP = 2  # ties toward +infinity (not used by any unit; kept for the tie tests)
ROUND_FLOOR = 3  # plain arithmetic shift

ROUND_MODE_NAMES = {
    ROUND_HALF_AWAY: "half-away-from-zero",
    ROUND_HALF_EVEN: "half-to-even",
    ROUND_HALF_UP: "half-up",
    ROUND_FLOOR: "floor",
}

# ---------------------------------------------------------------------------------------------
# Integer ranges
# ---------------------------------------------------------------------------------------------
INT8_MIN, INT8_MAX = -(2**7), 2**7 - 1
INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
ACC34_MIN, ACC34_MAX = -(2**33), 2**33 - 1  # CORE accumulator width for int8 (rknpu-isa.md 7.6)

#: Largest reduction length for which a float32 sum of int8 x int8 products is exact: every
#: product has |p| <= 2**14 and every partial sum |s| <= 1024 * 2**14 = 2**24 (NUMERICS.md 3).
EXACT_FLOAT32_REDUCTION = 1024

# ---------------------------------------------------------------------------------------------
# Register codes
# ---------------------------------------------------------------------------------------------
# ALU_ALGO of BS_CFG / BN_CFG / EW_CFG (rknpu-isa.md 3, DPU table: 0 max ... 8 ceil)
ALU_MAX, ALU_MIN, ALU_ADD, ALU_DIV, ALU_MINUS, ALU_ABS, ALU_NEG, ALU_FLOOR, ALU_CEIL = range(9)
ALU_ALGO_NAMES = ("max", "min", "add", "div", "minus", "abs", "neg", "floor", "ceil")

# EW_CFG OP_TYPE (bit 2): 0 = ALU, 1 = MUL (rep12: OP_TYPE 0 with ALU add)
EW_OP_ALU, EW_OP_MUL = 0, 1

# PPU POOLING_METHOD (rknpu-isa.md 3, PPU): 0 avg, 1 max, 2 min
POOL_AVERAGE, POOL_MAX, POOL_MIN = 0, 1, 2

#: Entries per LUT table (LE and LO), stated in isa.lut_format
LUT_ENTRIES = lut_format.LUT_ENTRIES


def out_cvt_round_mode(cvt_round_bit: int) -> int:
    """Rounding mode of OUT_CVT (and, by analogy, EW_CVT) from its CVT_ROUND register bit."""
    return ROUND_HALF_AWAY if cvt_round_bit else ROUND_HALF_EVEN


def core_round_mode(round_type_bit: int) -> int:
    """Rounding mode of CORE CLIP_TRUNCATE from its ROUND_TYPE bit (a documented choice)."""
    return ROUND_HALF_EVEN if round_type_bit else ROUND_HALF_AWAY


# ---------------------------------------------------------------------------------------------
# Shifts and saturation
# ---------------------------------------------------------------------------------------------
@njit(cache=True)
def rshift_round(value, shift, mode):
    """``value / 2**shift`` rounded by ``mode``; ``shift <= 0`` returns ``value`` unchanged.

    Callers keep |value| < 2**62, so any shift >= 63 gives 0 (or -1 for floor of a negative).
    """
    value = np.int64(value)
    shift = np.int64(shift)
    if shift <= 0:
        return value
    if shift >= 63:
        if mode == ROUND_FLOOR and value < 0:
            return np.int64(-1)
        return np.int64(0)
    half = np.int64(1) << (shift - 1)
    # Branch-free forms (the sign of the data is unpredictable; branches on it cost more than
    # the arithmetic in the stage loops).
    if mode == ROUND_HALF_AWAY:
        # floor((v + half) / 2^s) for v >= 0; a negative tie must stay on the floor side, so
        # negative values lose one before the shift (value >> 63 is -1 for them, 0 otherwise)
        return (value + half + (value >> 63)) >> shift
    if mode == ROUND_HALF_UP:
        return (value + half) >> shift
    if mode == ROUND_FLOOR:
        return value >> shift
    quotient = value >> shift  # half to even: round up above half, and at half when odd
    remainder = value - (quotient << shift)
    round_up = (remainder > half) | ((remainder == half) & ((quotient & 1) == 1))
    return quotient + np.int64(round_up)


@njit(cache=True)
def saturate(value, low, high):
    return min(max(value, low), high)


@njit(cache=True)
def saturate_int32(value):
    return saturate(value, INT32_MIN, INT32_MAX)


# ---------------------------------------------------------------------------------------------
# CORE: accumulator to the 32-bit DPU input (NUMERICS.md section 3)
# ---------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def core_output(exact_sum, clip_truncate, mode):
    """CORE accumulator -> int32: 34-bit saturation, CLIP_TRUNCATE shift, 32-bit saturation."""
    value = saturate(np.int64(exact_sum), ACC34_MIN, ACC34_MAX)
    return saturate_int32(rshift_round(value, clip_truncate, mode))


# ---------------------------------------------------------------------------------------------
# DPU ALU, multiplier and ReLU (NUMERICS.md section 4)
# ---------------------------------------------------------------------------------------------
@njit(cache=True, error_model="numpy")  # no exception path: it would slow every stage loop
def alu_int(algo, data, operand):
    """One integer ALU operation; unary ones (abs, neg, floor, ceil) ignore the operand."""
    data = np.int64(data)
    operand = np.int64(operand)
    if algo == ALU_MAX:
        return data if data >= operand else operand
    if algo == ALU_MIN:
        return data if data <= operand else operand
    if algo == ALU_ADD:
        return data + operand
    if algo == ALU_DIV:
        if operand == 0:
            if data > 0:
                return np.int64(INT32_MAX)
            if data < 0:
                return np.int64(INT32_MIN)
            return np.int64(0)
        magnitude = abs(data) // abs(operand)  # truncates toward zero
        return magnitude if (data >= 0) == (operand > 0) else -magnitude
    if algo == ALU_MINUS:
        return data - operand
    if algo == ALU_ABS:
        return abs(data)
    if algo == ALU_NEG:
        return -data
    # floor and ceil are the identity on integers; unknown codes are rejected by the callers
    return data


@njit(cache=True, inline="always")
def nan_first(data, result):
    """``result`` of a binary fp32 operation on ``data`` and another operand, except that a NaN ``data`` gives
    itself quieted (``data + data``): x86's rule for two NaN operands (the first one's), which LLVM, free to
    commute an fadd or fmul, does not keep by itself - a vectorised loop gave the second operand's NaN where
    the scalar one gave the first's (issue 20, NUMERICS.md 89). One NaN operand: that NaN quieted either way."""
    return np.float32(data + data) if data != data else result


@njit(cache=True, error_model="numpy")
def alu_float(algo, data, operand):
    """The fp32 ALU (fp16 processing runs the DPU in fp32); division follows IEEE 754; two NaN operands give
    the first (``nan_first``)."""
    if algo == ALU_MAX:
        return data if data >= operand else operand
    if algo == ALU_MIN:
        return data if data <= operand else operand
    if algo == ALU_ADD:
        return nan_first(data, np.float32(data + operand))
    if algo == ALU_DIV:
        return nan_first(data, np.float32(data / operand))
    if algo == ALU_MINUS:
        return nan_first(data, np.float32(data - operand))
    if algo == ALU_ABS:
        return abs(data)
    if algo == ALU_NEG:
        return -data
    if algo == ALU_FLOOR:
        return np.float32(np.floor(data))
    if algo == ALU_CEIL:
        return np.float32(np.ceil(data))
    return data


@njit(cache=True)
def shift_by_sign(value, shift_positive, shift_negative):
    """Multiplier truncation: separate shifts for non-negative and negative products [3P]."""
    # both candidates, then a select: the shift amounts stay loop-invariant, which lets the
    # compiler keep the stage loops branch-free
    positive = rshift_round(value, shift_positive, ROUND_HALF_AWAY)
    negative = rshift_round(value, shift_negative, ROUND_HALF_AWAY)
    return positive if value >= 0 else negative


@njit(cache=True)
def relu_int(value, relu_on, relux_on, relux_value):
    """RELU (max with 0) then RELUX (min with the RELUX compare value), each when enabled."""
    # written as one clamp with loop-invariant bounds: branches here cost the stage loops 2x
    low = np.int64(0) if relu_on else np.int64(-(2**62))
    high = np.int64(relux_value) if relux_on else np.int64(2**62)
    return min(max(np.int64(value), low), high)


@njit(cache=True)
def relu_float(value, relu_on, relux_on, relux_value):
    if relu_on and value < 0:
        value = np.float32(0)
    if relux_on and value > relux_value:
        value = np.float32(relux_value)
    return value


# ---------------------------------------------------------------------------------------------
# DPU stages, one element each (NUMERICS.md section 4)
# ---------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def bs_value(data, window_sum, alu_operand, cpend_operand, mul_operand,
             shift_positive, shift_negative, alu_algo, alu_on, cpend_on, mul_on, prelu,
             relu_on, relux_on, relux_value):
    """BS stage: ((data + CPEND*window_sum) ALU operand) * MUL >> shift, saturate, ReLU."""
    value = np.int64(data)
    if cpend_on:
        value += np.int64(cpend_operand) * np.int64(window_sum)
    if alu_on:
        value = alu_int(alu_algo, value, alu_operand)
    if mul_on:
        scaled = shift_by_sign(value * np.int64(mul_operand), shift_positive, shift_negative)
        value = value if (prelu and value >= 0) else scaled  # PReLU: non-negatives pass
    return relu_int(saturate_int32(value), relu_on, relux_on, relux_value)


@njit(cache=True, inline="always")
def bn_value(data, alu_operand, mul_operand, shift_positive, shift_negative, alu_algo,
             alu_on, mul_on, prelu, relu_on, relux_on, relux_value):
    """BN stage: (data * MUL) ALU operand >> shift, saturate, ReLU (MUL before ALU, see 4.2)."""
    value = np.int64(data)
    if mul_on:
        product = value * np.int64(mul_operand)
        if alu_on:
            product = alu_int(alu_algo, product, alu_operand)
        scaled = shift_by_sign(product, shift_positive, shift_negative)
        if alu_on:  # PReLU: non-negatives skip the multiplier and its shift, not the ALU
            value = alu_int(alu_algo, value, alu_operand)
        value = value if (prelu and data >= 0) else scaled
    elif alu_on:
        value = alu_int(alu_algo, value, alu_operand)
    return relu_int(saturate_int32(value), relu_on, relux_on, relux_value)


@njit(cache=True, inline="always")
def ew_operand_value(operand, cvt_on, cvt_offset, cvt_scale, cvt_shift, cvt_mode):
    """EW operand converter: (operand + OFFSET) * SCALE >> SHIFT, saturated to int32."""
    operand = np.int64(operand)
    if not cvt_on:
        return operand
    converted = (operand + np.int64(cvt_offset)) * np.int64(cvt_scale)
    return saturate_int32(rshift_round(converted, cvt_shift, cvt_mode))


@njit(cache=True, inline="always")
def ew_value(data, operand, op_on, op_type, alu_algo, truncate_positive, truncate_negative,
             prelu, relu_on, relux_on, relux_value):
    """EW stage on an already converted operand: ALU or MUL (>> EW_TRUNCATE), saturate, ReLU."""
    value = np.int64(data)
    operand = np.int64(operand)
    if op_on:
        if op_type == EW_OP_ALU:
            value = alu_int(alu_algo, value, operand)
        else:
            scaled = shift_by_sign(value * operand, truncate_positive, truncate_negative)
            value = value if (prelu and value >= 0) else scaled
    return relu_int(saturate_int32(value), relu_on, relux_on, relux_value)


@njit(cache=True, inline="always")
def out_cvt_value(data, scale, shift, offset, mode, low, high):
    """OUT_CVT: sat(round((data * SCALE) >> SHIFT) + OFFSET) into [low, high]."""
    product = np.int64(data) * np.int64(scale)
    return saturate(rshift_round(product, shift, mode) + np.int64(offset), low, high)


# ---------------------------------------------------------------------------------------------
# LUT (NUMERICS.md section 5)
# ---------------------------------------------------------------------------------------------
LUT_HIT, LUT_UNDERFLOW, LUT_OVERFLOW = 0, 1, 2


@njit(cache=True)
def lut_table_value(x, table, start, end, index_select, uflow_scale, uflow_shift,
                    oflow_scale, oflow_shift):
    """Evaluate one table: returns (status, value) with status hit / underflow / overflow."""
    x = np.int64(x)
    last = table.shape[0] - 1
    if x < start:
        slope = rshift_round((x - start) * uflow_scale, uflow_shift, ROUND_HALF_AWAY)
        return LUT_UNDERFLOW, np.int64(table[0]) + slope
    if x > end:
        slope = rshift_round((x - end) * oflow_scale, oflow_shift, ROUND_HALF_AWAY)
        return LUT_OVERFLOW, np.int64(table[last]) + slope
    offset = x - start
    index = offset >> index_select
    if index >= last:
        return LUT_HIT, np.int64(table[last])
    fraction = offset - (index << index_select)
    low = np.int64(table[index])
    step = np.int64(table[index + 1]) - low
    return LUT_HIT, low + rshift_round(step * fraction, index_select, ROUND_HALF_AWAY)


# Layout of the int64 parameter vector the LUT functions take (built by kernels.lut.LutConfig).
(LUTP_LE_START, LUTP_LE_END, LUTP_LE_SELECT, LUTP_LE_UFLOW_SCALE, LUTP_LE_UFLOW_SHIFT,
 LUTP_LE_OFLOW_SCALE, LUTP_LE_OFLOW_SHIFT, LUTP_LO_START, LUTP_LO_END, LUTP_LO_SELECT,
 LUTP_LO_UFLOW_SCALE, LUTP_LO_UFLOW_SHIFT, LUTP_LO_OFLOW_SCALE, LUTP_LO_OFLOW_SHIFT,
 LUTP_HYBRID_PRIORITY, LUTP_UFLOW_PRIORITY, LUTP_OFLOW_PRIORITY, LUTP_COUNT) = range(18)


@njit(cache=True, inline="always")
def lut_value(x, le_table, lo_table, params):
    """Both tables evaluated; a single hit wins, otherwise the priority bits pick (0 LE, 1 LO)."""
    le_status, le_result = lut_table_value(
        x, le_table, params[LUTP_LE_START], params[LUTP_LE_END], params[LUTP_LE_SELECT],
        params[LUTP_LE_UFLOW_SCALE], params[LUTP_LE_UFLOW_SHIFT],
        params[LUTP_LE_OFLOW_SCALE], params[LUTP_LE_OFLOW_SHIFT])
    lo_status, lo_result = lut_table_value(
        x, lo_table, params[LUTP_LO_START], params[LUTP_LO_END], params[LUTP_LO_SELECT],
        params[LUTP_LO_UFLOW_SCALE], params[LUTP_LO_UFLOW_SHIFT],
        params[LUTP_LO_OFLOW_SCALE], params[LUTP_LO_OFLOW_SHIFT])
    return saturate_int32(lo_result if _lut_use_lo(le_status, lo_status, params) else le_result)


@njit(cache=True, inline="always")
def _lut_edge_float(x, edge, base, scale, shift):
    """An under/overflowing fp32 value: the end entry plus the slope term in fp32 (each
    operation rounded to fp32); SCALE 0 means no slope term, so +-inf reads the end entry."""
    value = np.float32(base)
    if scale == 0:
        return value
    slope = np.float32(np.float64(scale) * 2.0 ** -np.float64(shift))  # 16-bit scale: exact
    return np.float32(value + np.float32(np.float32(x - np.float32(edge)) * slope))


@njit(cache=True)
def lut_table_value_float(x, table, start, end, index_select, uflow_scale, uflow_shift,
                          oflow_scale, oflow_shift):
    """One table on the fp path (NUMERICS.md 5.1): (status, fp32 value); the input is fp32."""
    x = np.float32(x)
    last = table.shape[0] - 1
    if x < np.float32(start):
        return LUT_UNDERFLOW, _lut_edge_float(x, start, table[0], uflow_scale, uflow_shift)
    if x > np.float32(end):
        return LUT_OVERFLOW, _lut_edge_float(x, end, table[last], oflow_scale, oflow_shift)
    position = np.float32(np.float32(x - np.float32(start)) * np.float32(2.0 ** -index_select))
    index = np.int64(np.floor(position))
    if index >= last:
        return LUT_HIT, np.float32(table[last])
    fraction = np.float32(position - np.float32(index))
    low = np.float32(table[index])
    step = np.float32(np.int64(table[index + 1]) - np.int64(table[index]))
    return LUT_HIT, np.float32(low + np.float32(step * fraction))


@njit(cache=True, inline="always")
def lut_value_float(x, le_table, lo_table, params):
    """lut_value on the fp path: the same table choice, fp32 arithmetic, no saturation; NaN
    passes through [C]."""
    if x != x:
        return np.float32(x)
    le_status, le_result = lut_table_value_float(
        x, le_table, params[LUTP_LE_START], params[LUTP_LE_END], params[LUTP_LE_SELECT],
        params[LUTP_LE_UFLOW_SCALE], params[LUTP_LE_UFLOW_SHIFT],
        params[LUTP_LE_OFLOW_SCALE], params[LUTP_LE_OFLOW_SHIFT])
    lo_status, lo_result = lut_table_value_float(
        x, lo_table, params[LUTP_LO_START], params[LUTP_LO_END], params[LUTP_LO_SELECT],
        params[LUTP_LO_UFLOW_SCALE], params[LUTP_LO_UFLOW_SHIFT],
        params[LUTP_LO_OFLOW_SCALE], params[LUTP_LO_OFLOW_SHIFT])
    return lo_result if _lut_use_lo(le_status, lo_status, params) else le_result


@njit(cache=True, inline="always")
def _lut_use_lo(le_status, lo_status, params):
    """Exactly one hit wins; otherwise the LUT_CFG priority bits pick (0 LE, 1 LO)."""
    if le_status == LUT_HIT and lo_status != LUT_HIT:
        return False
    if lo_status == LUT_HIT and le_status != LUT_HIT:
        return True
    if le_status == LUT_UNDERFLOW and lo_status == LUT_UNDERFLOW:
        return params[LUTP_UFLOW_PRIORITY] != 0
    if le_status == LUT_OVERFLOW and lo_status == LUT_OVERFLOW:
        return params[LUTP_OFLOW_PRIORITY] != 0
    return params[LUTP_HYBRID_PRIORITY] != 0  # both hit, or one under- and one overflowing


# ---------------------------------------------------------------------------------------------
# PPU average (NUMERICS.md section 6)
# ---------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def pool_average_value(window_total, recip_width, recip_height, low, high):
    """Average = round(total * RECIP_W * RECIP_H / 2**32), ties away from zero, saturated."""
    product = np.int64(window_total) * np.int64(recip_width) * np.int64(recip_height)
    return saturate(rshift_round(product, 32, ROUND_HALF_AWAY), low, high)


# ---------------------------------------------------------------------------------------------
# fp16 <-> fp32 bit conversions (NUMERICS.md section 7)
# ---------------------------------------------------------------------------------------------
@njit(cache=True)
def fp32_bits_to_fp16_bits(bits):
    """IEEE binary32 -> binary16, round to nearest even, overflow to infinity, NaN kept quiet."""
    bits = np.int64(bits) & 0xFFFFFFFF
    sign = (bits >> 16) & 0x8000
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    if exponent == 0xFF:
        if mantissa == 0:
            return np.uint16(sign | 0x7C00)
        return np.uint16(sign | 0x7E00 | (mantissa >> 13))
    half_exponent = exponent - 127 + 15
    if half_exponent >= 31:
        return np.uint16(sign | 0x7C00)
    if half_exponent <= 0:
        if half_exponent < -10:  # below half the smallest subnormal: rounds to zero
            return np.uint16(sign)
        significand = mantissa | 0x800000
        shift = 14 - half_exponent
        result = significand >> shift
        remainder = significand - (result << shift)
        half = np.int64(1) << (shift - 1)
        if remainder > half or (remainder == half and (result & 1) == 1):
            result += 1  # may carry into the smallest normal, which encodes correctly
        return np.uint16(sign | result)
    result = mantissa >> 13
    remainder = mantissa & 0x1FFF
    if remainder > 0x1000 or (remainder == 0x1000 and (result & 1) == 1):
        result += 1
    encoded = (half_exponent << 10) + result  # a mantissa carry bumps the exponent
    if encoded >= 0x7C00:
        return np.uint16(sign | 0x7C00)
    return np.uint16(sign | encoded)


@njit(cache=True)
def fp16_bits_to_fp32_bits(bits):
    """IEEE binary16 -> binary32 (exact)."""
    bits = np.int64(bits) & 0xFFFF
    sign = (bits & 0x8000) << 16
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    if exponent == 0:
        if mantissa == 0:
            return np.uint32(sign)
        single_exponent = np.int64(113)  # 127 - 15 + 1, lowered while normalising
        while (mantissa & 0x400) == 0:
            mantissa = mantissa << 1
            single_exponent -= 1
        return np.uint32(sign | (single_exponent << 23) | ((mantissa & 0x3FF) << 13))
    if exponent == 31:
        return np.uint32(sign | 0x7F800000 | (mantissa << 13))
    return np.uint32(sign | ((exponent + 112) << 23) | (mantissa << 13))
