"""The folded LUT's lines from int32 factors (issue 20, kernels/lut_folded.py ``narrow_lanes`` /
``_narrow_lines``, NUMERICS.md 86), against a reference written here on Python integers: the BS sum
x + CPEND * w + ALU times MUL, rounded half away from zero by the one shift, clamped into the table's
span [first, first + size), the table's byte.

- ``narrow_lanes``' clamp [LOW, HIGH] needs no clamp into the table after it: for sums at and around
  both ends, at int32's ends and far past them, the clamped sum's rounding (with the rows' MUL: 2^shift
  for MUL 0) less first is the reference's index of the sum itself; LOW and HIGH are int32;
- the settings it refuses (shifts unequal or past 30, operands past int32, products that could wrap);
- ``folded_to_atoms`` with the rows equals the reference and the int64 form on cubes drawn so that
  the form applies (asserted), window sums per channel, per pixel (int64 too) or none;
- broken variants are caught: an ALU or CPEND row one off, the rounding's sign term dropped."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels import lut_folded
from npuemu.emulator.kernels.dpu import XStageConfig, _x_params

_I32 = (nm.INT32_MIN, nm.INT32_MAX)
_EMPTY = np.zeros((0, 3), np.int64)


def _round(product: int, shift: int) -> int:
    """``product`` / 2^shift rounded half away from zero (Python integers)."""
    magnitude = (abs(product) + (1 << (shift - 1))) >> shift
    return magnitude if product >= 0 else -magnitude


def _index(s: int, mul: int, shift: int, first: int, size: int) -> int:
    return min(max(_round(s * mul, shift), first), first + size - 1) - first


def _bs(shift: int, cpend: bool = True, negative: int | None = None) -> np.ndarray:
    return _x_params(XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=shift,
                                  shift_negative=shift if negative is None else negative, cpend_enable=cpend))


@st.composite
def _channel(draw):
    """One channel's shift, MUL (0, either sign, up to 2^shift and past it, int32's ends) and a table span
    the rounded sums reach (a span around a reachable result, or anywhere in int32)."""
    shift = draw(st.integers(1, 30))
    mul = draw(st.sampled_from([0, 1, -1, 1 << shift, -(1 << shift), (1 << shift) + 1, nm.INT32_MAX, nm.INT32_MIN])
               | st.integers(-(2 << shift), 2 << shift) | st.integers(*_I32))
    size = draw(st.integers(1, 5000))
    reach = _round(draw(st.integers(*_I32)) * mul, shift)
    first = draw(st.sampled_from([reach - size // 2, reach, reach - size + 1]) | st.integers(*_I32))
    first = min(max(first, nm.INT32_MIN), nm.INT32_MAX - size + 1)
    return shift, mul, first, size


@settings(max_examples=300, deadline=None)
@given(_channel(), st.integers(0, 2**32 - 1))
def test_the_clamp_changes_no_index(channel, seed):
    shift, mul, first, size = channel
    operands = np.array([[0], [0], [mul]], np.int64)
    rows = lut_folded.narrow_lanes(_bs(shift), operands, 1, first, size)
    if rows.shape[0] == 0:  # refused: only where no int32 run of sums meets both ends exactly
        top = first + size - 1
        ends = [_round(s * mul, shift) for s in _I32]
        assert mul != 0 and (min(ends) > first or max(ends) < top or abs(mul) > 1 << shift)
        return
    low, high, factor = (int(rows[row, 0]) for row in (lut_folded.LOW_ROW, lut_folded.HIGH_ROW,
                                                       lut_folded.MUL_ROW))
    assert nm.INT32_MIN <= low <= high <= nm.INT32_MAX and (factor == mul or (mul == 0 and factor == 1 << shift))
    assert rows[lut_folded.KEY_ROW, :3].tolist() == [first, first + size - 1, shift]
    rng = np.random.default_rng(seed)
    sums = [low - 1, low, low + 1, high - 1, high, high + 1, *_I32, -(2**40), 2**40, 0, -1, 1]
    sums += rng.integers(low - 3, high + 4, 40).tolist() + rng.integers(-(2**33), 2**33, 20).tolist()
    for s in sums:  # (the kernel's index: the clamped sum's rounding less first, no clamp into the table)
        assert _round(min(max(s, low), high) * factor, shift) - first == _index(s, mul, shift, first, size), s


def test_refused_settings():
    operands = np.array([[5], [3], [1000]], np.int64)
    assert lut_folded.narrow_lanes(_bs(14), operands, 1, -100, 200).shape[0] == lut_folded.NARROW_ROWS
    assert lut_folded.narrow_lanes(_bs(14, negative=13), operands, 1, -100, 200).shape[0] == 0  # two roundings
    assert lut_folded.narrow_lanes(_bs(31), operands, 1, -100, 200).shape[0] == 0  # past NARROW_SHIFTS
    for row, value in ((0, 2**31), (1, -(2**31) - 1), (2, 2**31)):  # an operand past int32
        wide = operands.copy()
        wide[row, 0] = value
        assert lut_folded.narrow_lanes(_bs(14), wide, 1, -100, 200).shape[0] == 0
    wraps = np.array([[0], [2**20], [2**14]], np.int64)  # (2^31 + CPEND * 2^31) * MUL past 2^62
    assert lut_folded.narrow_lanes(_bs(14), wraps, 1, -100, 200).shape[0] == 0
    # CPEND off: its operand does not count
    assert lut_folded.narrow_lanes(_bs(14, cpend=False), wraps, 1, -100, 200).shape[0] == lut_folded.NARROW_ROWS
    # one channel refused refuses the call; too few operand columns too
    two = np.array([[0, 0], [0, 0], [1000, 3 << 14]], np.int64)  # steps of 3: the span's ends skipped
    assert lut_folded.narrow_lanes(_bs(14), two, 2, -100, 200).shape[0] == 0
    assert lut_folded.narrow_lanes(_bs(14), operands, 2, -100, 200).shape[0] == 0


def _reference(data, window, alu, cpend, mul, shift, first, table):
    pixels, channels = data.shape[1], data.shape[2]
    size = table.shape[0]
    out = np.zeros((channels // 16, pixels, 16), np.int8)
    for p in range(pixels):
        for c in range(channels):
            s = int(data[0, p, c]) + int(cpend[c]) * int(window[p, c]) + int(alu[c])
            out[c // 16, p, c % 16] = table[_index(s, int(mul[c]), shift, first, size)]
    return out


@st.composite
def _cube(draw):
    surfaces, height, width = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 5))
    channels, pixels = 16 * surfaces, height * width
    shift = draw(st.integers(1, 30))
    ints = lambda low, high, n: np.array(draw(st.lists(st.sampled_from([low, high, 0, -1, 1]) | st.integers(low, high),
                                                       min_size=n, max_size=n)), np.int64)
    data = ints(*_I32, pixels * channels).reshape(1, pixels, channels)
    # |MUL| from 2^(shift-8) (int32's sums reach past a span within 2^20) to 2^shift (steps of at most one)
    # and 2^22 ((2^31 * 129 + 2^24) * MUL below 2^62), either sign, or 0
    low, high = max(1, 1 << max(shift - 8, 0)), min(1 << shift, 1 << 22)
    mul = np.array([draw(st.sampled_from([0, low, high, -low, -high]) | st.integers(low, high)
                         | st.integers(-high, -low)) for _ in range(channels)], np.int64)
    alu, cpend = ints(-(2**24), 2**24, channels), ints(-128, 128, channels)
    form = draw(st.sampled_from(["per-channel", "per-pixel", "per-pixel int64", "none"]))
    sums = ints(*_I32, pixels * (channels if form == "per-channel" else 1))
    size = draw(st.integers(1, 3000))
    first = draw(st.integers(-(2**20), 2**20))
    return surfaces, height, width, shift, data, alu, cpend, mul, form, sums, first, size, draw(
        st.integers(0, 2**32 - 1))


def _run(case, narrow: np.ndarray | None = None):
    surfaces, height, width, shift, data, alu, cpend, mul, form, sums, first, size, seed = case
    channels, pixels = 16 * surfaces, height * width
    table = np.random.default_rng(seed).integers(-128, 128, size).astype(np.int8)
    operands = np.stack([alu, cpend, mul])
    bs = _bs(shift, cpend=form != "none")
    rows = lut_folded.narrow_lanes(bs, operands, channels, first, size) if narrow is None else narrow
    layout, per_group = {"per-channel": (dp.SUMS_PIXEL_MAJOR, 1), "per-pixel": (dp.SUMS_SHARED, channels),
                         "per-pixel int64": (dp.SUMS_SHARED, channels), "none": (dp.SUMS_NONE, 1)}[form]
    flat = {"per-channel": sums.astype(np.int32), "per-pixel": sums.astype(np.int32), "per-pixel int64": sums,
            "none": dp._NO_SUMS}[form]
    target = np.zeros(surfaces * pixels * 2, np.uint64)
    lut_folded.folded_to_atoms(data.astype(np.int32), flat, layout, per_group, bs, operands, table, np.int64(first),
                               channels, surfaces, width, np.zeros((4, channels), np.int8),
                               np.arange(surfaces * height, dtype=np.int64) * width * 2, target, rows)
    window = (sums.reshape(pixels, channels) if form == "per-channel" else np.repeat(sums.reshape(pixels, 1),
              channels, 1)) if form != "none" else np.zeros((pixels, channels), np.int64)
    want = _reference(data, window, alu, cpend if form != "none" else 0 * cpend, mul, shift, first, table)
    return target.view(np.int8).reshape(surfaces, pixels, 16), want, rows, (table, operands, bs, channels)


@settings(max_examples=150, deadline=None)
@given(_cube())
def test_narrow_lines_equal_the_reference_and_the_int64_form(case):
    got, want, rows, _ = _run(case)
    assert rows.shape[0] == lut_folded.NARROW_ROWS  # (drawn so that the form applies)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_run(case, _EMPTY)[0], want)


def _spanning_case(form: str):
    """A cube whose sums run across the table's whole span and past both ends (every channel)."""
    shift, surfaces, height, width = 6, 1, 2, 40
    channels, pixels = 16, height * width
    mul = np.arange(1, 17, dtype=np.int64) * 4 - 33  # -29..31: both signs, steps under 1
    first, size = -50, 100
    sums = np.arange(pixels * (channels if form == "per-channel" else 1), dtype=np.int64) % 7
    span = np.linspace(-200, 200, pixels).astype(np.int64)
    data = np.repeat(span.reshape(1, pixels, 1), channels, 2)
    data[0, :4] = [[nm.INT32_MIN], [nm.INT32_MAX], [-(2**20)], [2**20]]
    alu, cpend = np.full(channels, 3, np.int64), np.full(channels, -2, np.int64)
    return surfaces, height, width, shift, data, alu, cpend, mul, form, sums, first, size, 7


@pytest.mark.parametrize("form", ["per-channel", "per-pixel", "per-pixel int64", "none"])
def test_broken_variants_are_caught(form):
    case = _spanning_case(form)
    got, want, rows, _ = _run(case)
    assert rows.shape[0] == lut_folded.NARROW_ROWS
    np.testing.assert_array_equal(got, want)
    for row in (lut_folded.ALU_ROW, lut_folded.CPEND_ROW)[:1 if form == "none" else 2]:  # (CPEND off: no sums)
        # (the sum one off: the clamp keeps its indices in the table)
        broken = rows.copy()
        broken[row, :16] += 1
        assert not np.array_equal(_run(case, broken)[0], want)


def test_per_pixel_sums_past_int32_take_the_int64_form():
    """Per-pixel window sums (int64) past int32 are not held as int32: the call takes the int64 form, and
    the atoms are the reference's."""
    case = list(_spanning_case("per-pixel int64"))
    case[9] = case[9] * 0 + np.array([2**40, -(2**35)] * 40, np.int64)
    case[6] = np.full(16, -1, np.int64)  # (CPEND -1: no product near int64's ends)
    got, want, rows, (table, operands, bs, channels) = _run(tuple(case))
    assert rows.shape[0] == lut_folded.NARROW_ROWS
    np.testing.assert_array_equal(got, want)


def test_a_dropped_sign_term_is_caught():
    """The index without the rounding's sign term (ties below zero rounded up) differs where a product is
    exactly half a step below zero; the kernel's index has it."""
    shift, mul, first, size = 3, 1, -8, 16
    sums = [-12, -4, -20, 4, 12]  # products -1.5, -0.5, -2.5, 0.5, 1.5 steps
    narrow = lut_folded.narrow_lanes(_bs(shift), np.array([[0], [0], [mul]], np.int64), 1, first, size)
    low, high = int(narrow[lut_folded.LOW_ROW, 0]), int(narrow[lut_folded.HIGH_ROW, 0])
    offset = (1 << (shift - 1)) - (first << shift)
    with_sign = [(min(max(s, low), high) * mul + offset + (-1 if s * mul < 0 else 0)) >> shift for s in sums]
    without = [(min(max(s, low), high) * mul + offset) >> shift for s in sums]
    want = [_index(s, mul, shift, first, size) for s in sums]
    assert with_sign == want and without != want
    data = np.zeros((1, 1, 16), np.int64)
    data[0, 0, :5] = sums
    ones = np.ones(16, np.int64)
    case = (1, 1, 1, shift, data, 0 * ones, 0 * ones, ones, "none", np.zeros(0, np.int64), first, size, 3)
    got, expected, rows, _ = _run(case)
    assert rows.shape[0] == lut_folded.NARROW_ROWS
    np.testing.assert_array_equal(got, expected)
