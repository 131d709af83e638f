"""The int8 DPU's int64 stages (BS, EW, OUT_CVT; NUMERICS.md 4) on a line of atoms without
branches in the element loops (issue 20): ``dpu_atoms._stages_atoms``' passes for the settings the
flying SE gates use, with every runtime setting turned into loop-invariant numbers beforehand.

``numerics.rshift_round`` tests its shift (<= 0, >= 63) and its rounding mode per element, and
``alu_int`` picks its operation per element; with those tests in the loop body LLVM keeps the
passes scalar (0.3-0.45 ns an element). Here:

- a shift ``s`` in 0..62 rounds as ``_shift``: the additive form ``rshift_round`` uses for
  half-away / half-up / floor (``(v + half + ((v >> 63) & away)) >> s``: the same int64 sum,
  so the same bits even where it wraps), or its quotient / remainder form for half-even; ``half``,
  ``away`` and ``even`` are worked out once (``_rounding``; all 0 for a shift <= 0: ``v``);
- an ALU add or minus is ``v + sign * operand`` (sign 1 / -1, 0 with the ALU off);
- an unused multiplier is ``* 1 >> 0`` (``v``), an unused ReLU the clamp to +-2^62 as
  ``relu_int`` makes it.

Settings outside that (a shift >= 63, another ALU operation, the BN stage) are not taken
(``lines_settings`` returns None): the caller runs ``_stages_atoms``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.dpu import (
    CP_HIGH, CP_LOW, CP_MODE, CP_OFFSET, CP_SCALE, CP_SHIFT, EP_ALGO, EP_CVT_MODE, EP_CVT_OFFSET, EP_CVT_ON,
    EP_CVT_SCALE, EP_CVT_SHIFT, EP_OP_ON, EP_OP_TYPE, EP_PRELU, EP_RELU, EP_RELUX, EP_RELUX_VALUE, EP_TRUNC_NEG,
    EP_TRUNC_POS, XP_ALGO, XP_ALU_ON, XP_MUL_ON, XP_PRELU, XP_RELU, XP_RELUX, XP_RELUX_VALUE, XP_SHIFT_NEG,
    XP_SHIFT_POS,
)

# One rounding shift as four int64 numbers: shift, half, away mask, even flag.
_R_SHIFT, _R_HALF, _R_AWAY, _R_EVEN = range(4)
# The settings vector ``lines_settings`` makes (int64): BS, EW and OUT_CVT as loop invariants.
(L_BS_SIGN, L_BS_MUL_ON, L_BS_PRELU, L_BS_LOW, L_BS_HIGH, L_EW_SIGN, L_EW_MUL, L_EW_PRELU, L_EW_LOW, L_EW_HIGH,
 L_EW_CVT_ON, L_EW_CVT_OFFSET, L_EW_CVT_SCALE, L_CVT_SCALE, L_CVT_OFFSET, L_CVT_LOW, L_CVT_HIGH) = range(17)
L_ROUNDINGS = 17  # then five roundings of 4: BS +, BS -, EW +, EW -, EW converter, OUT_CVT
L_BS_POS, L_BS_NEG, L_EW_POS, L_EW_NEG, L_EW_CVT, L_CVT = (L_ROUNDINGS + 4 * i for i in range(6))
L_COUNT = L_ROUNDINGS + 24
_HUGE = 2**62  # relu_int's open bounds


def _rounding(shift: int, mode: int) -> tuple[int, int, int, int] | None:
    """(shift, half, away, even) for ``_shift``; None for a shift >= 63 (not taken here)."""
    shift = int(shift)
    if shift >= 63:
        return None
    if shift <= 0:
        return 0, 0, 0, 0
    mode = int(mode)
    half = 1 << (shift - 1)
    if mode == nm.ROUND_HALF_AWAY:
        return shift, half, -1, 0
    if mode == nm.ROUND_HALF_UP:
        return shift, half, 0, 0
    if mode == nm.ROUND_FLOOR:
        return shift, 0, 0, 0
    return shift, half, 0, 1  # half-even


@njit(cache=True, inline="always")
def _shift(value, shift, half, away, even):
    """``rshift_round(value, s, mode)`` for s in 0..62 from ``_rounding``'s numbers, branch-free."""
    if not even:
        return (value + half + ((value >> 63) & away)) >> shift
    quotient = value >> shift
    remainder = value - (quotient << shift)
    return quotient + ((remainder > half) | ((remainder == half) & ((quotient & 1) == 1)))


@njit(cache=True, inline="always")
def _by_sign(value, r):
    """``shift_by_sign``: rounding ``r[:4]`` for value >= 0, ``r[4:]`` below (``_roundings``)."""
    up = _shift(value, r[0], r[1], r[2], r[3] != 0)
    down = _shift(value, r[4], r[5], r[6], r[7] != 0)
    return up if value >= 0 else down


@njit(cache=True, inline="always")
def _clamp(value, low, high):
    return min(max(value, low), high)


@njit(cache=True, inline="always")
def _roundings(lines, pos, neg):
    """The two roundings of a multiplier as a tuple of locals (not re-read from ``lines`` in the
    loops: a store to the block could alias it, which keeps LLVM from vectorising)."""
    return (lines[pos], lines[pos + 1], lines[pos + 2], lines[pos + 3],
            lines[neg], lines[neg + 1], lines[neg + 2], lines[neg + 3])


@njit(cache=True)
def bs_line(block, lines, alu, mul):
    """BS (ALU add / minus, MUL, PReLU, ReLU; no window sums) over ``block``, operands scalars."""
    sign, mul_on, prelu = lines[L_BS_SIGN], lines[L_BS_MUL_ON] != 0, lines[L_BS_PRELU] != 0
    low, high, r = lines[L_BS_LOW], lines[L_BS_HIGH], _roundings(lines, L_BS_POS, L_BS_NEG)
    term, factor = np.int64(sign * alu), np.int64(mul if mul_on else 1)
    if r[0] == 0 and r[4] == 0:  # no multiplier shift (the SE gates): one product, no rounding
        for p in range(block.shape[0]):
            value = block[p] + term
            value = value if (prelu and value >= 0) else value * factor
            block[p] = _clamp(_clamp(value, nm.INT32_MIN, nm.INT32_MAX), low, high)
        return
    for p in range(block.shape[0]):
        value = block[p] + term
        scaled = _by_sign(value * factor, r)
        value = value if (prelu and value >= 0) else scaled
        block[p] = _clamp(_clamp(value, nm.INT32_MIN, nm.INT32_MAX), low, high)


@njit(cache=True)
def bs_line_tiled(block, lines, alu, mul):
    """``bs_line`` with one ALU and MUL operand an element (per-channel operands tiled)."""
    sign, mul_on, prelu = lines[L_BS_SIGN], lines[L_BS_MUL_ON] != 0, lines[L_BS_PRELU] != 0
    low, high, r = lines[L_BS_LOW], lines[L_BS_HIGH], _roundings(lines, L_BS_POS, L_BS_NEG)
    one = np.int64(0 if mul_on else 1)  # mul * on + one: the factor, branch-free
    on = np.int64(1 if mul_on else 0)
    for p in range(block.shape[0]):
        value = block[p] + sign * alu[p]
        scaled = _by_sign(value * (mul[p] * on + one), r)
        value = value if (prelu and value >= 0) else scaled
        block[p] = _clamp(_clamp(value, nm.INT32_MIN, nm.INT32_MAX), low, high)


@njit(cache=True)
def convert_line(operand, lines):
    """EW's operand converter (``numerics.ew_operand_value``) over a line in place."""
    if lines[L_EW_CVT_ON] == 0:
        return
    offset, scale = lines[L_EW_CVT_OFFSET], lines[L_EW_CVT_SCALE]
    shift, half, away, even = lines[L_EW_CVT], lines[L_EW_CVT + 1], lines[L_EW_CVT + 2], lines[L_EW_CVT + 3] != 0
    if even:  # one loop a rounding form, as cvt_line
        for p in range(operand.shape[0]):
            value = _shift((operand[p] + offset) * scale, shift, half, 0, True)
            operand[p] = _clamp(value, nm.INT32_MIN, nm.INT32_MAX)
        return
    for p in range(operand.shape[0]):
        value = _shift((operand[p] + offset) * scale, shift, half, away, False)
        operand[p] = _clamp(value, nm.INT32_MIN, nm.INT32_MAX)


@njit(cache=True)
def ew_line(block, operand, lines):
    """EW (ALU add / minus or MUL >> EW_TRUNCATE, PReLU, ReLU) on converted operands."""
    sign, mul, prelu = lines[L_EW_SIGN], lines[L_EW_MUL] != 0, lines[L_EW_PRELU] != 0
    low, high, r = lines[L_EW_LOW], lines[L_EW_HIGH], _roundings(lines, L_EW_POS, L_EW_NEG)
    on, one = np.int64(1 if mul else 0), np.int64(0 if mul else 1)  # the factor: other * on + one
    if r[0] == 0 and r[4] == 0:  # no EW_TRUNCATE (the SE gates): one product, no rounding
        for p in range(block.shape[0]):
            value = block[p]
            other = operand[p]
            scaled = value if (prelu and value >= 0) else value * (other * on + one)
            block[p] = _clamp(_clamp(scaled + sign * other, nm.INT32_MIN, nm.INT32_MAX), low, high)
        return
    for p in range(block.shape[0]):
        value = block[p]
        other = operand[p]
        scaled = _by_sign(value * (other * on + one), r)
        scaled = value if (prelu and value >= 0) else scaled
        value = scaled + sign * other  # (sign 0 with the multiplier on)
        block[p] = _clamp(_clamp(value, nm.INT32_MIN, nm.INT32_MAX), low, high)


@njit(cache=True)
def cvt_line(block, out, lines):
    """OUT_CVT (``numerics.out_cvt_value``) of ``block`` into ``out``."""
    scale, offset, low, high = lines[L_CVT_SCALE], lines[L_CVT_OFFSET], lines[L_CVT_LOW], lines[L_CVT_HIGH]
    shift, half, away, even = lines[L_CVT], lines[L_CVT + 1], lines[L_CVT + 2], lines[L_CVT + 3] != 0
    # one loop a rounding form: the even form alone where it applies, else the additive one
    if even:
        for i in range(block.shape[0]):
            out[i] = _clamp(_shift(block[i] * scale, shift, half, 0, True) + offset, low, high)
        return
    for i in range(block.shape[0]):
        out[i] = _clamp(_shift(block[i] * scale, shift, half, away, False) + offset, low, high)


def _alu_sign(on: bool, algo: int) -> int | None:
    """The ALU as ``v + sign * operand``: 0 off, 1 add, -1 minus; None for another operation."""
    if not on:
        return 0
    return {nm.ALU_ADD: 1, nm.ALU_MINUS: -1}.get(int(algo))


def _relu_bounds(relu: int, relux: int, relux_value: int) -> tuple[int, int]:
    return (0 if relu else -_HUGE), (int(relux_value) if relux else _HUGE)


def lines_settings(stages: np.ndarray, bs: np.ndarray, ew: np.ndarray, cvt: np.ndarray) -> np.ndarray | None:
    """The ``L_*`` vector for ``stages`` (BS, BN, EW on) and the BS / EW / OUT_CVT settings as
    ``dpu_atoms._stages_atoms`` takes them; None where these passes do not apply (BN on, an ALU
    other than add / minus, a shift >= 63)."""
    if stages[1] != 0:
        return None
    lines = np.zeros(L_COUNT, np.int64)
    bs_on, ew_on = stages[0] != 0, stages[2] != 0
    bs_sign = _alu_sign(bs_on and bs[XP_ALU_ON] != 0, bs[XP_ALGO])
    ew_alu = ew_on and ew[EP_OP_ON] != 0 and ew[EP_OP_TYPE] == nm.EW_OP_ALU
    ew_sign = _alu_sign(ew_alu, ew[EP_ALGO])
    bs_mul, ew_mul = bs_on and bs[XP_MUL_ON] != 0, ew_on and ew[EP_OP_ON] != 0 and ew[EP_OP_TYPE] != nm.EW_OP_ALU
    shifts = [(L_BS_POS, bs[XP_SHIFT_POS] if bs_mul else 0, nm.ROUND_HALF_AWAY),
              (L_BS_NEG, bs[XP_SHIFT_NEG] if bs_mul else 0, nm.ROUND_HALF_AWAY),
              (L_EW_POS, ew[EP_TRUNC_POS] if ew_mul else 0, nm.ROUND_HALF_AWAY),
              (L_EW_NEG, ew[EP_TRUNC_NEG] if ew_mul else 0, nm.ROUND_HALF_AWAY),
              (L_EW_CVT, ew[EP_CVT_SHIFT] if ew_on and ew[EP_CVT_ON] else 0, ew[EP_CVT_MODE]),
              (L_CVT, cvt[CP_SHIFT], cvt[CP_MODE])]
    roundings = [(at, _rounding(shift, mode)) for at, shift, mode in shifts]
    if bs_sign is None or ew_sign is None or any(r is None for _, r in roundings):
        return None
    for at, rounding in roundings:
        lines[at:at + 4] = rounding
    bs_low, bs_high = _relu_bounds(bs[XP_RELU], bs[XP_RELUX], bs[XP_RELUX_VALUE]) if bs_on else (-_HUGE, _HUGE)
    ew_low, ew_high = _relu_bounds(ew[EP_RELU], ew[EP_RELUX], ew[EP_RELUX_VALUE]) if ew_on else (-_HUGE, _HUGE)
    lines[:L_ROUNDINGS] = (
        bs_sign, bs_mul, bs_on and bs[XP_PRELU] != 0 and bs_mul, bs_low, bs_high,
        ew_sign, ew_mul, ew_mul and ew[EP_PRELU] != 0, ew_low, ew_high,
        ew_on and ew[EP_CVT_ON] != 0, ew[EP_CVT_OFFSET], ew[EP_CVT_SCALE],
        cvt[CP_SCALE], cvt[CP_OFFSET], cvt[CP_LOW], cvt[CP_HIGH])
    return lines


@njit(cache=True)
def _lane_operands(other, operand, s, ew, width, c2):
    """A surface's per-channel EW operand through the converter once a lane, tiled over a line."""
    for lane in range(c2):
        other[lane] = nm.ew_operand_value(operand[s, 0, lane], ew[EP_CVT_ON] != 0, ew[EP_CVT_OFFSET],
                                          ew[EP_CVT_SCALE], ew[EP_CVT_SHIFT], ew[EP_CVT_MODE])
    for x in range(1, width):
        for lane in range(c2):
            other[x * c2 + lane] = other[lane]


@njit(cache=True)
def _uniform(operands, channels):
    """Whether each row of ``operands`` holds one value over its first ``channels`` (>= 1) columns."""
    for row in range(operands.shape[0]):
        for c in range(1, channels):
            if operands[row, c] != operands[row, 0]:
                return False
    return channels >= 1


@njit(cache=True)
def _bs_spread(alu, mul, bs_operands, first, used, width, c2):
    for x in range(width):
        for lane in range(used):
            alu[x * c2 + lane] = bs_operands[0, first + lane]
            mul[x * c2 + lane] = bs_operands[2, first + lane]


@njit(cache=True)
def stage_lines_atoms(main, operand, stages, lines, bs_operands, ew, channels, height, width, out, offsets):
    """``dpu_atoms._stages_atoms`` with BN off, on ``lines_settings``' numbers: each line of atoms
    main[s, y * W:(y + 1) * W] widened to int64, ``bs_line`` (``bs_operands`` [3][C]: scalars
    where one value over the channels read, else tiled per channel), ``ew_line`` on the operand
    ([S][P][C2] converted a line at a time, or [S][1][C2] converted a lane at a time and tiled),
    ``cvt_line`` into ``out`` at ``offsets``; lanes past the channels 0, surfaces past them zeros."""
    surfaces, c2 = offsets.shape[0] // height, main.shape[2]
    per_pixel, bs_on, ew_on = operand.shape[1] > 1, stages[0] != 0, stages[2] != 0
    run = width * c2
    bs_uniform = _uniform(bs_operands, min(channels, surfaces * c2))
    block, other = np.empty(run, np.int64), np.zeros(run, np.int64)
    alu, mul = np.zeros(run, np.int64), np.zeros(run, np.int64)
    for s in range(surfaces):
        used = min(max(channels - s * c2, 0), c2)
        first = s * c2
        if used == 0:
            for y in range(height):
                out[offsets[s * height + y]:offsets[s * height + y] + run] = 0
            continue
        if bs_on and not bs_uniform:  # (lanes past the channels: operands 0, values overwritten)
            _bs_spread(alu, mul, bs_operands, first, used, width, c2)
        if ew_on and not per_pixel:
            _lane_operands(other, operand, s, ew, width, c2)
        flat = main[s].reshape(-1)
        for y in range(height):
            line = out[offsets[s * height + y]:offsets[s * height + y] + run]
            source = flat[y * run:(y + 1) * run]
            for i in range(run):
                block[i] = source[i]
            if bs_on:
                if bs_uniform:
                    bs_line(block, lines, bs_operands[0, 0], bs_operands[2, 0])
                else:
                    bs_line_tiled(block, lines, alu, mul)
            if ew_on:
                if per_pixel:
                    raw = operand[s].reshape(-1)[y * run:(y + 1) * run]
                    for i in range(run):
                        other[i] = raw[i]
                    convert_line(other, lines)
                ew_line(block, other, lines)
            cvt_line(block, line, lines)
            if used < c2:
                for x in range(width):
                    for lane in range(used, c2):
                        line[x * c2 + lane] = 0
