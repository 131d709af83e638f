"""The fp path's conversion to an integer output in one compiled pass (kernels/dpu_convert.py
``fp_to_int``, issue 20; NUMERICS.md 26 and 34): against the numpy formula written here - float64,
rint (CVT_ROUND half to even) or sign * floor(|v| + 0.5) (half away), NaN to 0, clipped to the
output type - on fp32 and float64 cubes with ties, zeros of both signs, infinities, NaNs and values
far outside every range; a refused OUT_CVT stays refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.dpu_convert import fp_to_int
from npuemu.emulator.numerics import ROUND_HALF_EVEN, out_cvt_round_mode
from npuemu.isa.errors import EmulationError

RANGES = {np.int8: (-128, 127), np.int16: (-32768, 32767), np.int32: (-2**31, 2**31 - 1)}
SPECIALS = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 127.5, -128.5, 32767.5, np.inf, -np.inf, np.nan,
            2.0**31, -2.0**31 - 1, 1e30, -1e30, 2.0**24 + 1]


def reference(data: np.ndarray, round_bit: int, dtype) -> np.ndarray:
    values = np.asarray(data, np.float64)
    if out_cvt_round_mode(round_bit) == ROUND_HALF_EVEN:
        rounded = np.rint(values)
    else:
        rounded = np.sign(values) * np.floor(np.abs(values) + 0.5)
    rounded = np.where(np.isnan(rounded), 0.0, rounded)
    low, high = RANGES[dtype]
    return np.clip(rounded, low, high).astype(dtype)


@settings(max_examples=200, deadline=None)
@given(st.tuples(st.integers(1, 6), st.integers(1, 5), st.integers(1, 9)), st.sampled_from([0, 1]),
       st.sampled_from([np.int8, np.int16, np.int32]), st.sampled_from([np.float32, np.float64]),
       st.floats(0.1, 1e6), st.integers(0, 2**31))
def test_conversion_equals_the_formula(shape, round_bit, dtype, source, spread, seed):
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal(shape) * spread).astype(source)
    where = rng.random(shape) < 0.3
    data[where] = rng.choice(np.array(SPECIALS), int(where.sum()))
    halves = rng.random(shape) < 0.2  # exact ties
    data[halves] = np.floor(data[halves]) + 0.5
    got = fp_to_int(data, 1, 0, 0, round_bit, dtype, "test")
    expected = reference(data, round_bit, dtype)
    assert got.dtype == np.dtype(dtype) and got.shape == data.shape
    assert np.array_equal(got, expected)


def test_a_strided_cube_and_the_refusal():
    data = np.arange(-40, 40, 0.5, dtype=np.float32).reshape(4, 5, 8)[:, ::2, ::3]
    assert np.array_equal(fp_to_int(data, 1, 0, 0, 0, np.int8, "t"), reference(data, 0, np.int8))
    with pytest.raises(EmulationError, match="not modelled"):
        fp_to_int(data, 2, 0, 0, 0, np.int8, "t")
