"""The DPU's integer -> fp16 output conversion in one pass (kernels/dpu_convert.py ``int_to_fp16``,
NUMERICS.md 26, issue 20) bit for bit against a model written here with Python integers:
v x SCALE, divided by 2^SHIFT and rounded half away from zero or half to even (NUMERICS.md 1),
saturated to int32, to fp32 (nearest even), times 2^-MINUS_EXP in fp32, rounded to fp16."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.dpu_convert import int_to_fp16
from npuemu.emulator.numerics import ROUND_HALF_AWAY, out_cvt_round_mode

INT32 = (-(2**31), 2**31 - 1)


def reference(value: int, scale: int, shift: int, half_away: bool, minus_exp: int) -> np.float16:
    q = Fraction(value * scale, 2**shift)
    if half_away:
        sign = -1 if q < 0 else 1
        rounded = sign * int(abs(q) + Fraction(1, 2))  # (int() truncates a non-negative value: floor)
    else:
        rounded = round(q)  # (Fraction rounds half to even)
    rounded = min(max(rounded, INT32[0]), INT32[1])
    number = np.float32(rounded)  # (exact to float64 below 2^53, then rounded once)
    if minus_exp:
        number = np.float32(number * np.float32(2.0 ** -minus_exp))
    with np.errstate(over="ignore"):
        return np.float16(number)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(*INT32), st.integers(-70000, 70000), st.sampled_from([0, -1, 1, *INT32])),
                min_size=1, max_size=40),
       st.integers(-(2**15), 2**16), st.integers(0, 40), st.integers(0, 1), st.integers(0, 20))
def test_one_pass_matches_the_integer_model(data, scale, shift, round_bit, minus_exp):
    values = np.array(data, np.int32).reshape(1, 1, -1)
    got = int_to_fp16(values, scale, shift, round_bit, minus_exp)
    half_away = out_cvt_round_mode(round_bit) == ROUND_HALF_AWAY
    want = np.array([reference(int(v), scale, shift, half_away, minus_exp) for v in data], np.float16)
    assert got.dtype == np.float16 and got.shape == values.shape
    assert np.array_equal(got.reshape(-1).view(np.uint16), want.view(np.uint16))


def test_ties_round_by_the_mode():
    # 5/2, -5/2, 7/2 at SHIFT 1: half away 3, -3, 4; half to even 2, -2, 4
    values = np.array([5, -5, 7], np.int32).reshape(1, 1, 3)
    modes = {out_cvt_round_mode(bit) == ROUND_HALF_AWAY: bit for bit in (0, 1)}
    assert int_to_fp16(values, 1, 1, modes[True], 0).reshape(-1).tolist() == [3, -3, 4]
    assert int_to_fp16(values, 1, 1, modes[False], 0).reshape(-1).tolist() == [2, -2, 4]
