"""The folded LUT's lines kernel on extreme BS operands (issue 20, kernels/lut_folded.py
``_folded_lines`` / ``_lane_index``): int8 atoms of 16 lanes written straight into their lines from
a folded table, against a reference written here on Python integers - BS as the hardware defines
it (x + CPEND * window sum + ALU, times MUL, rounded half away from zero by the shift of the
product's sign), clamped into the table's span, the table's byte - for BS shifts alike (the one
rounding form) and not, shifts 1 and 62 and between, multipliers up to the int32 limits, data and
window sums at the int32 limits, window sums per channel, per pixel or none. Operands are drawn so
that the product stays inside int64 (the kernel's int64 arithmetic is the hardware's there)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels import lut_folded
from npuemu.emulator.kernels.dpu import XStageConfig, _x_params

_I32 = (nm.INT32_MIN, nm.INT32_MAX)


def _reference_bs(value: int, mul: int, positive: int, negative: int) -> int:
    """value * mul, rounded half away from zero by ``positive`` (product >= 0) or ``negative``."""
    product = value * mul
    shift = positive if product >= 0 else negative
    magnitude = (abs(product) + (1 << (shift - 1))) >> shift
    return magnitude if product >= 0 else -magnitude


def _int32s(draw, size, bound: int | None = None):
    """``size`` int32 values reaching both limits (or +-``bound``), 0 and +-1."""
    low, high = (-bound, bound) if bound else _I32
    ends = st.sampled_from([low, high, 0, -1, 1])
    return np.array(draw(st.lists(st.one_of(ends, st.integers(low, high)), min_size=size, max_size=size)), np.int64)


@st.composite
def _case(draw):
    surfaces, height, width = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    channels, pixels = 16 * surfaces, height * width
    # multipliers up to the int32 limits on small sums, int32 data and sums on small multipliers
    # (|(x + cpend * w + alu) * mul| < 2^62 either way), or all small on shifts 1..4: BS results
    # within a table's reach, where the roundings' ties (half a step, below zero too) land in the span
    scale = draw(st.sampled_from(["wide multipliers", "wide data", "narrow"]))
    shifts = st.integers(1, 4) if scale == "narrow" else st.sampled_from([1, 2, 14, 31, 61, 62]) | st.integers(1, 62)
    positive = draw(shifts)
    negative = draw(st.sampled_from([positive, positive]) | shifts)
    data_bound, mul_bound, cpend_bound = {"wide multipliers": (2**15, None, 64), "wide data": (None, 2**15, 2**15),
                                          "narrow": (2**8, 16, 4)}[scale]
    data = _int32s(draw, pixels * channels, data_bound).reshape(1, pixels, channels)
    alu, cpend, mul = _int32s(draw, channels, data_bound), _int32s(draw, channels, cpend_bound), _int32s(
        draw, channels, mul_bound)
    form = draw(st.sampled_from(["per-channel", "per-pixel", "none"]))
    sums = _int32s(draw, pixels * (channels if form == "per-channel" else 1), cpend_bound if data_bound else None)
    size = draw(st.integers(1, 3000))
    return surfaces, height, width, positive, negative, data, alu, cpend, mul, form, sums, size, draw(
        st.integers(0, 2**32 - 1))


def _run(case, broken: bool = False, narrowed: bool = True):
    surfaces, height, width, positive, negative, data, alu, cpend, mul, form, sums, size, seed = case
    channels, pixels = 16 * surfaces, height * width
    window = sums.reshape(pixels, -1) if form != "none" else np.zeros((pixels, 1), np.int64)
    expected_bs = [[_reference_bs(int(data[0, p, c]) + int(cpend[c]) * int(window[p, c if form == "per-channel" else 0])
                                  + int(alu[c]), int(mul[c]), positive, negative) for c in range(channels)]
                   for p in range(pixels)]
    rng = np.random.default_rng(seed)
    middle = int(np.median(np.array(expected_bs, dtype=object).astype(float)))  # (a span the results reach into)
    first = min(max(middle - size // 2 + int(rng.integers(-size, size + 1)), nm.INT32_MIN), nm.INT32_MAX - size + 1)
    table = rng.integers(-128, 128, size).astype(np.int8)
    if broken:  # the broken variant: the two roundings swapped
        positive, negative = negative, positive
    bs = _x_params(XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=positive,
                                shift_negative=negative, cpend_enable=form != "none"))
    layout, per_group = {"per-channel": (dp.SUMS_PIXEL_MAJOR, 1), "per-pixel": (dp.SUMS_SHARED, channels),
                         "none": (dp.SUMS_NONE, 1)}[form]
    target = np.zeros(surfaces * pixels * 2, np.uint64)
    operands = np.stack([alu, cpend, mul])
    narrow = lut_folded.narrow_lanes(bs, operands, channels, first, size) if narrowed else np.zeros((0, 3), np.int64)
    lut_folded.folded_to_atoms(data.astype(np.int32), sums if form != "none" else dp._NO_SUMS, layout, per_group, bs,
                               operands, table, np.int64(first), channels, surfaces, width,
                               np.zeros((4, channels), np.int8), np.arange(surfaces * height, dtype=np.int64) * width * 2,
                               target, narrow)
    got = target.view(np.int8).reshape(surfaces, pixels, 16)
    want = np.array([[[table[min(max(expected_bs[p][16 * s + k], first), first + size - 1) - first] for k in range(16)]
                      for p in range(pixels)] for s in range(surfaces)], np.int8)
    return got, want


@settings(max_examples=150, deadline=None)
@given(_case())
def test_lines_kernel_equals_the_reference_on_extreme_operands(case):
    got, want = _run(case)
    np.testing.assert_array_equal(got, want)


def test_the_one_rounding_form_and_a_tie_below_zero():
    """Shifts alike (the one rounding form): products exactly half a step below zero round away
    (down), above zero up; the broken variant - shifts swapped per sign - is caught where they differ."""
    data = np.zeros((1, 1, 16), np.int64)
    data[0, 0, :8] = [-1, 1, -3, 3, -5, 5, -(2**31), 2**31 - 1]
    ones = np.ones(16, np.int64)
    for shift in (1, 62):
        case = (1, 1, 1, shift, shift, data, 0 * ones, 0 * ones, ones, "none", np.zeros(0, np.int64), 64, 5)
        got, want = _run(case)
        np.testing.assert_array_equal(got, want)
    case = (1, 1, 1, 1, 2, data, 0 * ones, 0 * ones, ones, "none", np.zeros(0, np.int64), 64, 5)
    got, want = _run(case)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(_run(case, broken=True)[0], want)


@njit
def _gather_line(indices, table, words, line, count):
    lut_folded._gather_words(indices, table, words, line, count)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 70000), st.integers(1, 40), st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_table_entries_packed_eight_to_a_word(size, count, line, seed):
    """``_gather_words``: word ``line + j`` holds the entries of indices 8j..8j+7, byte k the (8j+k)th
    (the byte order of the line's int8 atoms), negative entries whole; the words around untouched."""
    rng = np.random.default_rng(seed)
    table = rng.integers(-128, 128, size).astype(np.int8)
    indices = rng.integers(0, size, 8 * count).astype(np.uint32)
    indices[:2] = [0, size - 1]
    words = np.full(line + count + 3, 0x5A5A5A5A5A5A5A5A, np.uint64)
    _gather_line(indices, table.view(np.uint8), words, np.uint64(line), count)
    want = [table[i] for i in indices]
    assert words.view(np.int8)[8 * line:8 * (line + count)].tolist() == want
    assert (words[:line] == 0x5A5A5A5A5A5A5A5A).all() and (words[line + count:] == 0x5A5A5A5A5A5A5A5A).all()
