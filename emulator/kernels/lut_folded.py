"""The int8 DPU's LUT path with BN folded into the table (issue 20, NUMERICS.md 41).

``lut._plain_table_to_atoms`` runs plain BS + BN (``lut.plain_bs_bn``) per element and reads LUT,
EW and OUT_CVT from one table indexed by the BN result (``lut.after_lut_values``). Where the BN
stage is the same for every computed channel (its operands equal across them: the compilers' BN
MUL is one per-tensor value) BN is a function of the BS result alone, so BN, LUT, EW and OUT_CVT
become one table indexed by the BS result (``fold_tables``), and an element costs BS and one
load: about half the per-element arithmetic of the unfolded path, its int64 index stream
replaced by a uint32 one, the cube and the window sums read in place (``folded_to_atoms``).

The table covers the BS results ``[first, first + size)`` where the folded function changes; past
either end it is constant (BN's table index is monotone in its input - MUL by one value, a
rounding shift, the saturation and ReLU clamps, the int32 store and the clamp into the table all
keep the order, reversing it for a negative MUL - so the inputs whose index stays in the table's
run of equal entries around the index of the lowest (highest) BS result form a prefix (suffix) of
the BS range), so a BS result is clamped into the span: the same clamp as the BS stage's own
int32 saturation and ReLU bounds, which contain it. Each entry is the unfolded path's value of that BS
result: ``numerics.bn_value``, the int32 store, the clamp into the after-LUT table and its entry.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu as kd
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels import lut
from npuemu.emulator.kernels.vector_width import wide_vectors

#: the most BS results a folded table covers (int8: 1 MiB); wider: the unfolded path
FOLD_SPAN = 1 << 20
#: folded tables kept (oldest dropped first)
FOLD_KEPT = 64
#: units/dpu_plan.py runs the folded path where it applies (the tests turn it off to compare)
FOLDED = True
#: lanes of an int8 atom (16 bytes): ``_folded_lines`` writes whole atoms of them
LANES = 16
#: ``narrow_lanes``' rows (NUMERICS.md 86): per computed channel CPEND, ALU and MUL (int32 values), the clamp
#: [LOW, HIGH] of the BS sum, and a KEY row of (first, top, shift) the rows were worked out for
CPEND_ROW, ALU_ROW, MUL_ROW, LOW_ROW, HIGH_ROW, KEY_ROW = range(6)
NARROW_ROWS = KEY_ROW + 1
#: the narrow form's shifts (the index's offset ``first << shift`` stays far from int64's ends)
NARROW_SHIFTS = range(1, 31)


@njit(cache=True, inline="always")
def _bn_index(y, bn, bn_alu, bn_mul, base, last):
    """The unfolded path's after-LUT table index of the BS result ``y``: BN, the int32 store, less
    the table's base, clamped into the table (``lut._plain_indices``)."""
    value = nm.bn_value(y, bn_alu, bn_mul, bn[kd.XP_SHIFT_POS], bn[kd.XP_SHIFT_NEG], bn[kd.XP_ALGO],
                        bn[kd.XP_ALU_ON] != 0, bn[kd.XP_MUL_ON] != 0, bn[kd.XP_PRELU] != 0, bn[kd.XP_RELU] != 0,
                        bn[kd.XP_RELUX] != 0, bn[kd.XP_RELUX_VALUE])
    return min(max(np.int64(np.int32(value)) - base, 0), last)


@njit(cache=True)
def _run_around(table, index):
    """The widest [a, b] holding ``index`` on which ``table`` equals ``table[index]``."""
    a, b = index, index
    while a > 0 and table[a - 1] == table[index]:
        a -= 1
    while b < table.shape[0] - 1 and table[b + 1] == table[index]:
        b += 1
    return a, b


@njit(cache=True)
def _fold_span(bn, bn_alu, bn_mul, table, base, low, high):
    """``(first, last)``: BS results in [low, high] such that the folded function is constant on
    [low, first] and on [last, high] (first <= last). BN's index is monotone in the BS result, so
    the results whose index stays in the after-LUT table's run of equal entries around the index
    of ``low`` are a prefix of [low, high] (``high``'s: a suffix); each end found by bisection."""
    end = table.shape[0] - 1
    low_from, low_to = _run_around(table, _bn_index(low, bn, bn_alu, bn_mul, base, end))
    high_from, high_to = _run_around(table, _bn_index(high, bn, bn_alu, bn_mul, base, end))
    a, b = low, high  # the last y whose index is in low's run
    while a < b:
        m = a + (b - a + 1) // 2
        index = _bn_index(m, bn, bn_alu, bn_mul, base, end)
        if low_from <= index <= low_to:
            a = m
        else:
            b = m - 1
    first = a
    a, b = low, high  # the first y whose index is in high's run
    while a < b:
        m = a + (b - a) // 2
        index = _bn_index(m, bn, bn_alu, bn_mul, base, end)
        if high_from <= index <= high_to:
            b = m
        else:
            a = m + 1
    last = a
    return min(first, last), max(first, last)


@njit(cache=True)
def _fold_values(first, bn, bn_alu, bn_mul, table, base, out):
    end = table.shape[0] - 1
    for j in range(out.shape[0]):
        out[j] = table[_bn_index(first + j, bn, bn_alu, bn_mul, base, end)]


def bs_bounds(bs: np.ndarray) -> tuple[int, int] | None:
    """The BS stage's output range: its int32 saturation and ReLU / RELUX clamps as one clamp
    (None where they do not meet: RELUX below the int32 range)."""
    low = max(nm.INT32_MIN, 0 if bs[kd.XP_RELU] != 0 else nm.INT32_MIN)
    high = min(nm.INT32_MAX, int(bs[kd.XP_RELUX_VALUE]) if bs[kd.XP_RELUX] != 0 else nm.INT32_MAX)
    return (low, high) if low <= high else None


class _FoldTables:
    """The folded tables per (after-LUT table, base, BN settings and operands, BS range)."""

    def __init__(self) -> None:
        self._kept: dict[tuple, tuple[int, np.ndarray] | None] = {}

    def get(self, bs: np.ndarray, bn: np.ndarray, bn_operands: np.ndarray, computed: int, table: np.ndarray,
            base: int) -> tuple[int, np.ndarray] | None:
        """``(first, folded)``: ``folded[j]`` is OUT_CVT(EW(LUT(BN(first + j)))) as the unfolded
        path computes it from ``table`` (``lut.after_lut_values``' table from ``base``) for a BS
        result clamped into [first, first + size); None where BN is not plain (MUL on, ALU and PReLU
        off: ``lut.plain_bs_bn``), differs between the ``computed`` channels or has operands past
        int32, where the BS range is empty, or the span is wider than FOLD_SPAN. The caller checks
        that the BS stage is plain too (``lut.plain_bs_bn``, ``table_flags``' fourth answer):
        ``_bs_index`` assumes BS shifts of 1..62."""
        bounds = bs_bounds(bs)
        rows = bn_operands[:, :computed]
        monotone = bn[kd.XP_MUL_ON] != 0 and bn[kd.XP_ALU_ON] == 0 and bn[kd.XP_PRELU] == 0  # (see above)
        if not monotone or bounds is None or computed < 1 or rows.shape[1] < computed or np.any(rows != rows[:, :1]) \
                or np.any(rows < nm.INT32_MIN) or np.any(rows > nm.INT32_MAX):
            return None
        bn_alu, bn_mul = (int(rows[r, 0]) if rows.shape[0] > r else 0 for r in (0, 1))
        key = (table.tobytes(), table.dtype.str, int(base), bn.tobytes(), bn_alu, bn_mul, bounds)
        if key in self._kept:
            return self._kept[key]
        params = np.ascontiguousarray(bn, np.int64)
        first, last = _fold_span(params, np.int64(bn_alu), np.int64(bn_mul), table, np.int64(base),
                                 np.int64(bounds[0]), np.int64(bounds[1]))
        folded = None
        if last - first + 1 <= FOLD_SPAN:
            values = np.empty(last - first + 1, table.dtype)
            _fold_values(np.int64(first), params, np.int64(bn_alu), np.int64(bn_mul), table, np.int64(base), values)
            folded = (int(first), values)
        if len(self._kept) >= FOLD_KEPT:
            del self._kept[next(iter(self._kept))]
        self._kept[key] = folded
        return folded


fold_tables = _FoldTables()


@njit(cache=True, inline="always")
def _bs_index(x, window, cpend, alu, mul, pos, neg, first, last):
    """The folded table's index of one element: plain BS (``lut._bs_bn_plain``'s first half, shifts
    1..62: both roundings, the product's sign selecting) clamped into the table's span, which lies
    in the stage's saturation and ReLU range (one clamp stands for both)."""
    return min(max(lut._scale_shift(np.int64(x) + cpend * window + alu, mul, pos, neg), first), last) - first


@njit(cache=True)
def _block_indices(data, sums, row0, shared, start, count, computed, cpend, alu, mul, pos, neg, first, last, out):
    """``_bs_index`` of pixels ``start..start+count`` of ``data`` [1][P][L] into ``out``
    [count][computed] (int32). The window sum of pixel p, channel c: ``sums[p - row0, c]`` (a
    [P][G] pixel-major buffer, or the block's loaded sums) where ``sums`` has rows, else
    ``shared[p]`` (or 0 where that is empty too). Indexed in place (no staged copies); a row of
    16 channels (the commonest short one) with a constant count, which LLVM turns into a few
    vector operations where a loop that short would run scalar."""
    for b in range(count):
        p, into = np.uint64(start + b), b * computed  # (indices unsigned: no negative-index wrap)
        if sums.shape[0] > 0:
            r = np.uint64(start + b - row0)
            if computed == 16:
                for k in range(16):
                    c = np.uint64(k)
                    out[np.uint64(into + k)] = _bs_index(data[0, p, c], np.int64(sums[r, c]), cpend[c], alu[c], mul[c],
                                                         pos, neg, first, last)
            else:
                for k in range(computed):
                    c = np.uint64(k)
                    out[np.uint64(into + k)] = _bs_index(data[0, p, c], np.int64(sums[r, c]), cpend[c], alu[c], mul[c],
                                                         pos, neg, first, last)
        else:
            w = np.int64(shared[p]) if shared.shape[0] > 0 else np.int64(0)
            if computed == 16:
                for k in range(16):
                    c = np.uint64(k)
                    out[np.uint64(into + k)] = _bs_index(data[0, p, c], w, cpend[c], alu[c], mul[c], pos, neg, first,
                                                         last)
            else:
                for k in range(computed):
                    c = np.uint64(k)
                    out[np.uint64(into + k)] = _bs_index(data[0, p, c], w, cpend[c], alu[c], mul[c], pos, neg, first,
                                                         last)


@njit(cache=True)
def folded_to_atoms(data, sums, sums_layout, kernels_per_group, bs, bs_operands, folded, first, channels, surfaces,
                    width, tile, offsets, target, narrow):
    """``lut._plain_table_to_atoms`` with BN folded into the table (``fold_tables``: ``folded``
    indexed by the BS result less ``first``) on a pixel-major cube ``data`` [1][P][L] (int32),
    in the same blocks: a block's indices (``_block_indices``), the table read into ``tile``
    (its lanes past the computed channels left as they are: zeros), the atoms stored. Int8 atoms
    of 16 lanes, every one computed, with the window sums in place, per pixel or none, go straight
    into their lines instead (``_folded_lines``: the same indices and entries, no tile), from int32
    factors where ``narrow`` (``narrow_lanes``' rows for these operands and this table, or an empty
    array) has them and the window sums fit int32 (``_narrow_lines``)."""
    per_block, lanes_out = tile.shape
    computed = min(channels, lanes_out)
    pixels = data.shape[1]
    alu = bs_operands[0, :computed].astype(np.int64)
    cpend = bs_operands[1, :computed].astype(np.int64)
    mul = bs_operands[2, :computed].astype(np.int64)
    if bs[kd.XP_CPEND_ON] == 0:
        cpend[:] = 0
    pos, neg = np.int64(bs[kd.XP_SHIFT_POS]), np.int64(bs[kd.XP_SHIFT_NEG])
    top = np.int64(first + folded.shape[0] - 1)
    groups = channels // kernels_per_group
    # the window sums: read in place from a pixel-major buffer with one sum per channel, or per
    # pixel (SUMS_SHARED); the other layouts loaded per block in block order
    in_place = sums_layout == dp.SUMS_PIXEL_MAJOR and kernels_per_group == 1
    loaded = not in_place and sums_layout in (dp.SUMS_PIXEL_MAJOR, dp.SUMS_GROUP_MAJOR)
    window = np.zeros(per_block * computed if loaded else 0, sums.dtype)
    rows = sums.reshape(pixels, groups) if in_place else window.reshape(-1, computed) if loaded \
        else np.zeros((0, 1), sums.dtype)
    shared = sums if sums_layout == dp.SUMS_SHARED else sums[:0]
    # int8 atoms of 16 lanes, all computed, sums in place or per pixel: straight into the lines (NUMERICS.md 50)
    if not loaded and tile.itemsize == 1 and lanes_out == LANES * surfaces and computed == lanes_out:
        if _narrow_fits(narrow, computed, first, top, pos, shared) and _int32_sums(rows):
            _narrow_lines(data, rows, shared, narrow, pos, first, surfaces, width, folded, offsets, target)
        else:
            _folded_lines(data, rows, shared, cpend, alu, mul, pos, neg, folded, first, top, surfaces, width, offsets,
                          target)
        return
    indices = np.empty(per_block * computed, np.uint32)  # (unsigned: the table reads skip the negative-index wrap)
    flat_tile = tile.reshape(-1)
    for start in range(0, pixels, per_block):
        count = min(per_block, pixels - start)
        if loaded:
            dp._load_window(sums, sums_layout, groups, kernels_per_group, start, count, computed, window)
        _block_indices(data, rows, start if loaded else 0, shared, start, count, computed, cpend, alu, mul, pos, neg,
                       first, top, indices)
        if lanes_out == computed:
            for i in range(count * computed):
                flat_tile[np.uint64(i)] = folded[indices[i]]
        else:
            for b in range(count):
                row = tile[b]
                for c in range(computed):
                    row[c] = folded[indices[b * computed + c]]
        dp._store_atoms(tile, start, count, width, surfaces, offsets, target)



@njit(cache=True, inline="always")
def _lane_index(x, window, cpend, alu, mul, pos, neg, first, last, one_shift):
    """``_bs_index``; with ``one_shift`` (the BS shifts alike, every compiled model's case) the one
    rounding ``lut._round_shift`` - ``_scale_shift`` selects between two equal roundings there -
    which drops the second shift, the sign mask and the select from the lane's vector operations."""
    if one_shift:
        value = lut._round_shift((np.int64(x) + cpend * window + alu) * mul, pos)
        return min(max(value, first), last) - first
    return _bs_index(x, window, cpend, alu, mul, pos, neg, first, last)


@njit(cache=True, inline="always")
def _line_indices(flat, rows, shared, y, c0, stride, width, lane_cpend, lane_alu, lane_mul, pos, neg, first, top,
                  one_shift, indices):
    """The indices of line ``y``'s pixels, channels ``c0..c0+16``, into ``indices`` [width * 16]: a
    16-lane loop of constant count per pixel (LLVM: a few vector operations), the window sums
    from ``rows`` [P][G] where it has rows, else ``shared`` [P] (or none where that is empty)."""
    per_channel, with_shared = rows.shape[0] > 0, shared.shape[0] > 0
    for x in range(width):
        p = np.uint64(y * width + x)
        i, into = p * np.uint64(stride) + np.uint64(c0), np.uint64(x * LANES)
        if per_channel:
            for lane in range(LANES):
                u = np.uint64(lane)
                indices[into + u] = _lane_index(flat[i + u], np.int64(rows[p, np.uint64(c0) + u]), lane_cpend[u],
                                                lane_alu[u], lane_mul[u], pos, neg, first, top, one_shift)
        else:
            w = np.int64(shared[p]) if with_shared else np.int64(0)
            for lane in range(LANES):
                u = np.uint64(lane)
                indices[into + u] = _lane_index(flat[i + u], w, lane_cpend[u], lane_alu[u], lane_mul[u], pos, neg,
                                                first, top, one_shift)


@njit(cache=True)
def _folded_lines(data, rows, shared, cpend, alu, mul, pos, neg, folded, first, top, surfaces, width, offsets, out):
    """``folded_to_atoms`` for int8 atoms of 16 lanes, every lane a computed channel, written
    straight into their lines (``out``: the target's words; atom s of pixel (y, x) at word
    ``offsets[s * H + y] + 2x``), a surface at a time (issue 20, NUMERICS.md 50): per line,
    the indices of its pixels' 16 channels (``_line_indices``) into a line of indices, then the
    table read along it into the line's words (``_gather_words``) - no tile, no second pass moving
    atoms, no row loop entered once per pixel for 16 or 32 lanes. Window sums as ``_block_indices`` reads them:
    ``rows`` [P][G] (in place, one per channel) where it has rows, else ``shared`` [P] (or none
    where that is empty too)."""
    lines = offsets.shape[0] // surfaces
    stride = data.shape[2]
    flat = data.reshape(-1)
    table = folded.view(np.uint8)  # (unsigned: the entries' bytes widen without sign bits to mask)
    indices = np.empty(width * LANES, np.uint32)
    lane_cpend, lane_alu, lane_mul = np.empty(LANES, np.int64), np.empty(LANES, np.int64), np.empty(LANES, np.int64)
    one_shift = pos == neg
    for s in range(surfaces):
        c0 = s * LANES
        for lane in range(LANES):
            lane_cpend[lane], lane_alu[lane], lane_mul[lane] = cpend[c0 + lane], alu[c0 + lane], mul[c0 + lane]
        for y in range(lines):
            _line_indices(flat, rows, shared, y, c0, stride, width, lane_cpend, lane_alu, lane_mul, pos, neg, first,
                          top, one_shift, indices)
            _gather_words(indices, table, out, np.uint64(offsets[s * lines + y]), width * (LANES // 8))


@njit(cache=True, inline="always")
def _gather_words(indices, table, words, line, count):
    """``table[indices[j]]`` for j < 8 * ``count`` into the words ``line..line+count`` of ``words``,
    eight bytes a word (byte k of word j: entry 8j + k, the little-endian hosts' byte order of the
    lines' atoms): one store per eight entries, where a store per entry was the loop's limit (~5%
    of the folded path, session 21)."""
    for j in range(count):
        at = np.uint64(8 * j)
        word = np.uint64(table[indices[at]])
        for k in range(1, 8):
            word |= np.uint64(table[indices[at + np.uint64(k)]]) << np.uint64(8 * k)
        words[line + np.uint64(j)] = word


# The lines from int32 factors (issue 20, NUMERICS.md 86). ``_lane_index`` multiplies int64 by int64
# (vpmullq: three micro-ops on Intel's cores, four lanes a ymm register). Where the BS shifts are one
# (1..30) and CPEND, ALU and MUL are int32, the BS sum s = x + CPEND * w + ALU is clamped into [LOW, HIGH]
# - the int32 run of sums whose rounded results go from the table's first entry to its last, met
# exactly at both ends -, so the product is int32 by int32 (vpmuldq) and the index needs no clamp:
# (s * MUL + 2^(shift-1) - first * 2^shift + sign) >> shift. Outside [LOW, HIGH] the result is at or past
# the table's end it is clamped to (the rounding is monotone in s), so the clamp changes no index.


@njit(cache=True)
def _at_least_from(mul, shift, bound, at_least):
    """The least int32 s with ``_round_shift(s * mul, shift)`` >= ``bound`` (``at_least``) or <= it, the
    result monotone in s that way; int32's top + 1 where none is."""
    low, high = np.int64(nm.INT32_MIN), np.int64(nm.INT32_MAX) + 1
    while low < high:
        middle = low + (high - low) // 2
        value = lut._round_shift(middle * mul, shift)
        if (value >= bound) if at_least else (value <= bound):
            high = middle
        else:
            low = middle + 1
    return low


@njit(cache=True)
def _narrow_rows(cpend, alu, mul, shift, first, top, out):
    """``narrow_lanes``' rows into ``out``; False where a channel has none."""
    for c in range(mul.shape[0]):
        k, a, m = cpend[c], alu[c], mul[c]
        for v in (k, a, m):
            if v < nm.INT32_MIN or v > nm.INT32_MAX:
                return False
        # the unclamped sum times MUL stays inside int64 (the int64 form's product wraps nowhere)
        if (2.0**31 * (1.0 + abs(float(k))) + abs(float(a))) * abs(float(m)) >= 2.0**62:
            return False
        if m == 0:  # every result 0, clamped into the table: the sum held there, times 2^shift (rounding back to it)
            m = np.int64(1) << shift
            low = high = min(max(np.int64(0), first), top)
        elif m > 0:
            low = _at_least_from(m, shift, first, True)
            high = _at_least_from(m, shift, top + 1, True) - 1
            if low > nm.INT32_MAX or high < low or lut._round_shift(low * m, shift) != first \
                    or lut._round_shift(high * m, shift) != top:
                return False
        else:
            low = _at_least_from(m, shift, top, False)
            high = _at_least_from(m, shift, first - 1, False) - 1
            if low > nm.INT32_MAX or high < low or lut._round_shift(low * m, shift) != top \
                    or lut._round_shift(high * m, shift) != first:
                return False
        out[CPEND_ROW, c], out[ALU_ROW, c], out[MUL_ROW, c], out[LOW_ROW, c], out[HIGH_ROW, c] = k, a, m, low, high
    out[KEY_ROW, 0], out[KEY_ROW, 1], out[KEY_ROW, 2] = first, top, shift
    return True


def narrow_lanes(bs: np.ndarray, bs_operands: np.ndarray, computed: int, first: int, size: int) -> np.ndarray:
    """``folded_to_atoms``' ``narrow`` for the BS settings ``bs`` and operands ``bs_operands`` (ALU, CPEND, MUL
    rows) on the table of ``size`` entries from ``first``: [NARROW_ROWS][max(computed, 3)] int64, or an empty
    array where the narrow form does not apply (shifts unequal or past NARROW_SHIFTS, an operand past int32,
    a product that could pass int64's ends, a rounding that skips the table's first or last entry). Worked
    out once per step and table (a binary search per channel and end)."""
    shift = int(bs[kd.XP_SHIFT_POS])
    none = np.zeros((0, max(computed, 3)), np.int64)
    if shift != int(bs[kd.XP_SHIFT_NEG]) or shift not in NARROW_SHIFTS or computed < 1 or size < 1 \
            or bs_operands.shape[0] < 3 or bs_operands.shape[1] < computed:
        return none
    operands = np.asarray(bs_operands[:3, :computed], np.int64)
    cpend = operands[1] if bs[kd.XP_CPEND_ON] != 0 else np.zeros(computed, np.int64)
    out = np.zeros((NARROW_ROWS, max(computed, 3)), np.int64)
    top = first + size - 1
    if not _narrow_rows(np.ascontiguousarray(cpend), np.ascontiguousarray(operands[0]),
                        np.ascontiguousarray(operands[2]), np.int64(shift), np.int64(first), np.int64(top), out):
        return none
    return out


@njit(cache=True)
def _narrow_fits(narrow, computed, first, top, shift, shared):
    """Whether ``narrow`` holds rows for this call (``computed`` channels, the table from ``first`` to
    ``top``, ``shift``) and the per-pixel window sums ``shared`` (if any) are int32."""
    if narrow.shape[0] != NARROW_ROWS or narrow.shape[1] < computed or narrow[KEY_ROW, 0] != first \
            or narrow[KEY_ROW, 1] != top or narrow[KEY_ROW, 2] != shift:
        return False
    for p in range(shared.shape[0]):
        if shared[p] < nm.INT32_MIN or shared[p] > nm.INT32_MAX:
            return False
    return True


@njit(cache=True)
def _int32_sums(rows):
    """Whether the per-channel window sums ``rows`` are int32 (an int64 buffer's values looked at)."""
    if rows.itemsize <= 4:
        return True
    flat = rows.reshape(-1)
    for i in range(flat.shape[0]):
        if flat[i] < nm.INT32_MIN or flat[i] > nm.INT32_MAX:
            return False
    return True


@njit(cache=True, inline="always")
def _narrow_index(x, window, cpend, alu, mul, low, high, offset, shift):
    """One element's index: the BS sum clamped into [low, high], its product with MUL from int32 factors
    (vpmuldq), rounded and less ``first`` (in ``offset``: ``2^(shift-1) - first * 2^shift``)."""
    s = min(max(np.int64(x) + np.int64(window) * np.int64(cpend) + alu, low), high)
    product = np.int64(np.int32(s)) * np.int64(mul)
    return (product + offset + (product >> 63)) >> shift


@njit(cache=True)
def _narrow_lines(data, rows, shared, narrow, shift, first, surfaces, width, folded, offsets, out):
    """``_folded_lines`` from ``narrow``'s int32 factors (``_narrow_index``), in 512-bit vectors where the
    host has them (two zmm registers a pixel's 16 lanes)."""
    wide_vectors()
    lines = offsets.shape[0] // surfaces
    stride = data.shape[2]
    flat = data.reshape(-1)
    table = folded.view(np.uint8)
    indices = np.empty(width * LANES, np.uint32)
    cpend, mul = np.empty(LANES, np.int32), np.empty(LANES, np.int32)
    alu, low, high = np.empty(LANES, np.int64), np.empty(LANES, np.int64), np.empty(LANES, np.int64)
    offset = (np.int64(1) << (shift - 1)) - (first << shift)
    per_channel, with_shared = rows.shape[0] > 0, shared.shape[0] > 0
    for s in range(surfaces):
        c0 = s * LANES
        for lane in range(LANES):
            c = c0 + lane
            cpend[lane], alu[lane], mul[lane] = narrow[CPEND_ROW, c], narrow[ALU_ROW, c], narrow[MUL_ROW, c]
            low[lane], high[lane] = narrow[LOW_ROW, c], narrow[HIGH_ROW, c]
        for y in range(lines):
            for x in range(width):
                p = np.uint64(y * width + x)
                i, into = p * np.uint64(stride) + np.uint64(c0), np.uint64(x * LANES)
                if per_channel:
                    for lane in range(LANES):
                        u = np.uint64(lane)
                        indices[into + u] = _narrow_index(flat[i + u], np.int32(rows[p, np.uint64(c0) + u]), cpend[u],
                                                          alu[u], mul[u], low[u], high[u], offset, shift)
                else:
                    w = np.int32(shared[p]) if with_shared else np.int32(0)
                    for lane in range(LANES):
                        u = np.uint64(lane)
                        indices[into + u] = _narrow_index(flat[i + u], w, cpend[u], alu[u], mul[u], low[u], high[u],
                                                          offset, shift)
            _gather_words(indices, table, out, np.uint64(offsets[s * lines + y]), width * (LANES // 8))
