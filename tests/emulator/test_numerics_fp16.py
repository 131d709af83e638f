"""fp16 <-> fp32 conversions against numpy's IEEE conversions (NUMERICS.md 7)."""

import numpy as np

from npuemu.emulator.kernels import fp16_to_fp32, fp32_to_fp16

ALL_HALF_BITS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def bits(values: np.ndarray) -> np.ndarray:
    return values.view(np.uint16 if values.dtype == np.float16 else np.uint32)


def same_bits_or_both_nan(ours: np.ndarray, theirs: np.ndarray) -> bool:
    nan = np.isnan(theirs)
    return bool(np.array_equal(np.isnan(ours), nan)
                and np.array_equal(bits(ours[~nan]), bits(theirs[~nan])))


def test_every_fp16_value_widens_exactly():
    halves = ALL_HALF_BITS.view(np.float16)
    assert same_bits_or_both_nan(fp16_to_fp32(halves), halves.astype(np.float32))


def test_every_fp16_value_survives_the_round_trip():
    halves = ALL_HALF_BITS.view(np.float16)
    assert same_bits_or_both_nan(fp32_to_fp16(fp16_to_fp32(halves)), halves)


def test_random_fp32_bit_patterns_round_like_numpy():
    bits = np.random.default_rng(7).integers(0, 1 << 32, 400_000, dtype=np.uint64).astype(np.uint32)
    singles = bits.view(np.float32)
    with np.errstate(over="ignore"):
        assert same_bits_or_both_nan(fp32_to_fp16(singles), singles.astype(np.float16))


def test_midpoints_between_fp16_neighbours_round_to_even():
    finite = ALL_HALF_BITS.view(np.float16)
    finite = np.sort(finite[np.isfinite(finite) & (finite >= 0)].astype(np.float64))
    midpoints = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)  # exact: 12 bits suffice
    assert np.array_equal((midpoints[:-1].astype(np.float64) * 2),
                          finite[:-2] + finite[1:-1])
    expected = midpoints.astype(np.float16)
    assert same_bits_or_both_nan(fp32_to_fp16(midpoints), expected)
    assert same_bits_or_both_nan(fp32_to_fp16(-midpoints), (-midpoints).astype(np.float16))


def test_documented_edge_values():
    values = np.array([65504, 65519.996, 65520, 2.0**-25, 3 * 2.0**-26, 2.0**-24, 1 + 2.0**-11],
                      np.float32)
    expected = [65504, 65504, np.inf, 0.0, 2.0**-24, 2.0**-24, 1.0]
    got = fp32_to_fp16(values).astype(np.float64)
    assert got.tolist() == expected
