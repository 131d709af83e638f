"""The fast fp16 <-> fp32 array conversions (kernels/fp16.py, issue 20) against references written
from NUMERICS.md 7 alone: fp32 -> fp16 round to nearest even with subnormal results, overflow to
infinity from 65520, NaN quiet with the top 10 payload bits; fp16 -> fp32 exact.

The fp32 -> fp16 reference rounds through float64 (every fp32 value is a float64, and numpy's
float64 -> float16 conversion is one IEEE rounding, not the fp32 path under test). The kernel was
also checked against ``numerics.fp32_bits_to_fp16_bits`` on all 2**32 patterns (0 differences) when it
was written; that sweep takes half a minute, so CI samples instead.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.fp16 import fp16_to_fp32, fp32_to_fp16, widening_table


def reference_to_half(bits: np.ndarray) -> np.ndarray:
    bits = np.asarray(bits, np.uint32)
    singles = bits.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # NaN is replaced below
        halves = singles.astype(np.float64).astype(np.float16).view(np.uint16)
    nan = np.isnan(singles)
    quiet = ((bits >> 16) & 0x8000) | 0x7E00 | ((bits & 0x7FFFFF) >> 13)
    return np.where(nan, quiet.astype(np.uint16), halves)


def reference_to_single(halves: np.ndarray) -> np.ndarray:
    """fp32 bits from the fp16 fields: sign, 2**(e - 15) * (1 + m / 1024) or 2**-14 * m / 1024;
    infinity and NaN keep their payload in the top bits of the fp32 mantissa."""
    halves = halves.astype(np.int64)
    sign, exponent, mantissa = halves >> 15, (halves >> 10) & 0x1F, halves & 0x3FF
    magnitude = np.where(exponent == 0, mantissa / 1024 * 2.0**-14, (1 + mantissa / 1024) * np.exp2(exponent - 15.0))
    values = np.where(sign == 1, -magnitude, magnitude).astype(np.float32).view(np.uint32).astype(np.int64)
    special = (sign << 31) | 0x7F800000 | (mantissa << 13)
    return np.where(exponent == 31, special, values).astype(np.uint32)


def to_half_bits(bits: np.ndarray) -> np.ndarray:
    return fp32_to_fp16(np.asarray(bits, np.uint32).view(np.float32)).view(np.uint16)


def test_every_fp16_pattern_widens_exactly():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    expected = reference_to_single(halves)
    assert np.array_equal(fp16_to_fp32(halves.view(np.float16)).view(np.uint32), expected)
    assert np.array_equal(widening_table(), expected) and not widening_table().flags.writeable


def test_a_sweep_of_fp32_patterns():
    # every 4099th pattern (a million, all exponents and signs), and every pattern's neighbourhood
    # of the rounding boundaries: ties (low 13 bits 0x1000), one below and above
    sweep = np.arange(0, 1 << 32, 4099, dtype=np.uint64)
    ties = (np.arange(0, 1 << 19, dtype=np.uint64) << 13) | 0x1000
    bits = np.concatenate([sweep, ties, ties - 1, ties + 1]).astype(np.uint32)
    assert np.array_equal(to_half_bits(bits), reference_to_half(bits))


@st.composite
def near_fp16_range(draw):
    """fp32 patterns whose exponent lies where fp16 results change form: zero, the subnormal
    results (2**-25 .. 2**-14), the normals, the overflow edge (65504 .. 65536) and NaN."""
    sign = draw(st.integers(0, 1))
    exponent = draw(st.sampled_from([0, 1, 255] + list(range(98, 146))))
    low = draw(st.sampled_from([0, 0xFFF, 0x1000, 0x1001, 0x1FFF]) | st.integers(0, 0x1FFF))
    mantissa = (draw(st.integers(0, (1 << 10) - 1)) << 13) | low
    return (sign << 31) | (exponent << 23) | mantissa


@settings(max_examples=300, deadline=None)
@given(st.lists(near_fp16_range() | st.integers(0, (1 << 32) - 1), min_size=1, max_size=64))
def test_fp32_to_fp16_rounds_as_documented(patterns):
    bits = np.array(patterns, np.uint64).astype(np.uint32)
    assert np.array_equal(to_half_bits(bits), reference_to_half(bits))


def test_documented_edges():
    values = np.array([65504, 65519.996, 65520, 65536, np.inf, 2.0**-25, 3 * 2.0**-26, 2.0**-24,
                       2.0**-14 - 2.0**-25, 1 + 2.0**-11, 1 + 3 * 2.0**-11, -0.0, 0.0], np.float32)
    expected = [65504, 65504, np.inf, np.inf, np.inf, 0.0, 2.0**-24, 2.0**-24, 2.0**-14, 1.0, 1 + 2.0**-9,
                -0.0, 0.0]
    got = fp32_to_fp16(values)
    assert got.astype(np.float64).tolist() == expected
    assert np.signbit(got).tolist() == [False] * 11 + [True, False]
    assert [hex(v) for v in to_half_bits(np.array([0x7F800001, 0xFFC02000, 0x7FBFFFFF], np.uint32))] == \
        ["0x7e00", "0xfe01", "0x7fff"]
