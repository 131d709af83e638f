"""Affine quantization arithmetic (compiler/quant/affine.py): parameters from ranges, the
round trip, zero, rounding modes, per-channel broadcasting, fp16 storage."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.compiler.quant.affine import (INT8, INT16, affine_params, affine_params_array, dequantize, fake_quantize,
                                          quantize, round_half_away, round_to_float16, symmetric_scale)

finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False, width=32)
ranges = st.tuples(st.floats(-1e3, 0.0, width=32), st.floats(0.0, 1e3, width=32)).filter(lambda r: r[1] - r[0] > 1e-3)


@given(ranges, st.lists(st.floats(0, 1), min_size=1, max_size=50))
def test_round_trip_error_is_at_most_half_a_step_inside_the_range(bounds, fractions):
    lo, hi = bounds
    scale, zero_point = affine_params(lo, hi)
    s = np.float64(scale)
    # the representable range is [s (-128 - z), s (127 - z)]; it covers [lo, hi] to within s/2
    assert s * (-128 - zero_point) <= lo + s / 2 + 1e-9 * abs(lo) and s * (127 - zero_point) >= hi - s / 2 - 1e-9 * hi
    values = np.array([lo + f * (hi - lo) for f in fractions])
    inside = values[(values >= s * (-128 - zero_point)) & (values <= s * (127 - zero_point))]
    error = np.abs(fake_quantize(inside, scale, zero_point) - inside)
    assert np.all(error <= s / 2 * (1 + 1e-6))


@given(ranges)
def test_zero_is_exactly_representable(bounds):
    scale, zero_point = affine_params(*bounds)
    assert -128 <= zero_point <= 127
    assert quantize(np.array([0.0]), scale, zero_point)[0] == zero_point
    assert fake_quantize(np.array([0.0]), scale, zero_point)[0] == 0.0


@given(st.lists(finite, min_size=1, max_size=40), ranges)
def test_quantized_values_stay_in_int8_and_saturate(values, bounds):
    scale, zero_point = affine_params(*bounds)
    stored = quantize(np.array(values), scale, zero_point)
    assert stored.min() >= INT8[0] and stored.max() <= INT8[1]
    top = dequantize(np.array([127]), scale, zero_point)[0]
    assert np.all(fake_quantize(np.array(values), scale, zero_point) <= top + 1e-9)


def test_scale_and_zero_point_follow_the_guide():
    # vendor cfg example (SDK guide 6.3): Relu6 range [0, 6] -> scale 6/255, zero point -128
    scale, zero_point = affine_params(0.0, 6.0)
    assert np.isclose(scale, 6 / 255) and zero_point == -128
    scale, zero_point = affine_params(-1.0, 3.0)
    assert np.isclose(scale, 4 / 255) and zero_point == -64  # -128 - round(-1 / (4/255)) = -128 + 64
    # a range not containing 0 is extended to 0
    assert affine_params(2.0, 4.0) == affine_params(0.0, 4.0)


def test_degenerate_range_still_stores_zero():
    scale, zero_point = affine_params(0.0, 0.0)
    assert scale > 0 and quantize(np.zeros(3), scale, zero_point).tolist() == [zero_point] * 3


def test_rounding_modes():
    assert round_half_away(np.array([0.5, 1.5, -0.5, -2.5, 2.4])).tolist() == [1, 2, -1, -3, 2]
    scale = np.float32(1.0)
    # activations (half even) and compile-time constants (half away) differ only at ties
    assert quantize(np.array([0.5, 1.5, 2.5]), scale, 0).tolist() == [0, 2, 2]
    assert quantize(np.array([0.5, 1.5, 2.5]), scale, 0, half_even=False).tolist() == [1, 2, 3]


def test_per_channel_along_an_axis():
    weights = np.array([[[1.0, -1.0]], [[10.0, -5.0]]])  # 2 output channels on axis 0
    scale, zero_point = affine_params_array(weights.min(axis=(1, 2)), weights.max(axis=(1, 2)))
    assert scale.shape == (2,) and zero_point.dtype == np.int32
    stored = quantize(weights, scale, zero_point, axis=0, half_even=False)
    assert stored.min() == -128 and stored.max() == 127  # each channel uses the full range
    assert np.allclose(dequantize(stored, scale, zero_point, axis=0), weights, atol=scale.max() / 2)


def test_int16_symmetric():
    scale = symmetric_scale(2.0, INT16)
    assert np.isclose(scale, 2.0 / 32767)
    assert quantize(np.array([2.0, -2.0, 0.0]), scale, 0, INT16).tolist() == [32767, -32767, 0]
    assert symmetric_scale(0.0, INT16) == 1.0


def test_float16_storage_rounds_to_nearest_even_and_overflows_to_inf():
    values = np.array([1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 65504.0, 65520.0, -1e6], dtype=np.float64)
    stored = round_to_float16(values)
    assert stored.dtype == np.float32
    assert stored[0] == 1.0 and stored[1] == 1.0 + 2 * 2.0 ** -10  # ties to even
    assert stored[2] == 65504.0 and np.isinf(stored[3]) and stored[4] == -np.inf


def test_non_finite_range_is_refused():
    with pytest.raises(ValueError):
        affine_params(-np.inf, 1.0)


def _reference_quantize(values, scale, zero_point, qrange, axis, half_even):
    """quantize's definition written out with rounding.py's functions (no in-place steps)."""
    from npuemu.compiler.rounding import round_half_even

    values = np.asarray(values, dtype=np.float64)
    shape = [1] * values.ndim
    if axis is not None:
        shape[axis] = -1
    s = np.asarray(scale, dtype=np.float64).reshape(shape if np.ndim(scale) else ())
    z = np.asarray(zero_point, dtype=np.float64).reshape(shape if np.ndim(zero_point) else ())
    rounded = round_half_even(values / s) if half_even else round_half_away(values / s)
    return np.clip(rounded + z, qrange[0], qrange[1]).astype(np.int64)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32])
@pytest.mark.parametrize("half_even", [True, False])
@given(seed=st.integers(0, 2**32 - 1), per_channel=st.booleans())
def test_in_place_quantize_equals_its_definition(dtype, half_even, seed, per_channel):
    """quantize rounds, shifts and clamps in place (issue 20: compile time); ties, -0.0, values
    beyond the range and each input type give what the out-of-place formula gives."""
    rng = np.random.default_rng(seed)
    channels = 5
    scale = rng.uniform(0.01, 0.5, channels if per_channel else ()).astype(np.float32)
    zero_point = rng.integers(-20, 20, channels if per_channel else ()).astype(np.int32)
    steps = rng.integers(-300, 300, (channels, 3, 2)) + rng.choice([0.0, 0.5, -0.5, 0.25], (channels, 3, 2))
    values = (steps * (scale.reshape(-1, 1, 1) if per_channel else scale)).astype(dtype)
    values.flat[0] = -0.0 if values.dtype.kind == "f" else 0
    axis = 0 if per_channel else None
    got = quantize(values, scale, zero_point, INT8, axis, half_even=half_even)
    assert got.dtype == np.int64
    assert np.array_equal(got, _reference_quantize(values, scale, zero_point, INT8, axis, half_even))


def test_quantize_of_a_scalar_and_of_a_list():
    assert quantize(np.float32(2.5), 1.0, 0, half_even=False) == 3
    assert quantize(np.float32(2.5), 1.0, 0) == 2
    assert list(quantize([0.5, -0.5, 1.5, 400.0], 1.0, 1, half_even=False)) == [2, 0, 3, 127]
