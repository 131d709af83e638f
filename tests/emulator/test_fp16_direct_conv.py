"""The fp16 direct convolution (depthwise-like: few kernels per group) over phase planes (NUMERICS.md 33:
a stride-S convolution as stride-1 runs over the S x S phases of the padded planes) against
test_fp16_exact_order's reference (each output +0 plus its products in (input channel, ky, kx) order,
one fp32 rounding per add, windows gathered by numpy slicing): strides 1-3 with dilations, planes wide
and tall enough for the vector loops, padded planes larger than the output needs, 1x1 kernels whose
line is the output plane itself, special values (inf, NaN, -0, subnormals)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import ConvGeometry, conv2d_fp16
from tests.emulator.test_fp16_exact_order import direct_reference, padded_planes, same_bits_or_both_nan, \
    with_special_values


@st.composite
def direct_cases(draw):
    channels = draw(st.integers(1, 12))
    multiplier = draw(st.sampled_from([1, 2, 4]))
    kh, kw = draw(st.integers(1, 7)), draw(st.sampled_from([1, 2, 3, 3, 5, 7]))
    sy, sx = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dy, dx = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    height, width = draw(st.integers(1, 40)), draw(st.integers(1, 70))
    pad_top, pad_left = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    extra_h, extra_w = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    out_h = (height + pad_top + extra_h - (kh - 1) * dy - 1) // sy + 1
    out_w = (width + pad_left + extra_w - (kw - 1) * dx - 1) // sx + 1
    if out_h < 1 or out_w < 1:
        out_h, out_w, pad_top, pad_left = 1, 1, (kh - 1) * dy, (kw - 1) * dx
    geometry = ConvGeometry(kh, kw, out_h, out_w, sy, sx, dy, dx, pad_top, pad_left, channels)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal((channels, height, width)) * 4).astype(np.float16)
    w = rng.standard_normal((channels * multiplier, 1, kh, kw)).astype(np.float16)
    return x, w, geometry, float(rng.uniform(-2, 2)), draw(st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(direct_cases(), st.booleans(), st.integers(0, 2**31))
def test_direct_convolution_over_phase_planes_follows_the_order(case, special, seed):
    x, w, geometry, pad_value, grow = case
    if special:
        x = with_special_values(x, seed)
    padded = padded_planes(x, geometry, pad_value)
    if grow:  # planes larger than the output needs (the kernel reads only what it needs)
        padded = np.pad(padded, ((0, 0), (0, grow), (0, grow)), constant_values=np.float16(7.5))
    with np.errstate(invalid="ignore"):
        got = conv2d_fp16(padded, w, geometry, "direct")
        expected = direct_reference(padded, w, geometry)
    assert same_bits_or_both_nan(got, expected)


def test_one_by_one_kernels_write_the_plane_in_place_and_keep_signed_zeros_positive():
    # the line is the output plane itself (no dropped columns): it must start at +0 for every kernel
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 9, 13)) * 4).astype(np.float16)
    x[0] = -0.0
    w = np.concatenate([-np.ones((1, 1, 1, 1)), rng.standard_normal((11, 1, 1, 1))]).astype(np.float16)
    geometry = ConvGeometry(1, 1, 9, 13, groups=6)
    padded = padded_planes(x, geometry, 0.0)
    got = conv2d_fp16(padded, w, geometry, "direct")
    assert same_bits_or_both_nan(got, direct_reference(padded, w, geometry))
    assert not np.signbit(got[0]).any()  # -1 x -0 = +0; 0 + (+0) = +0


def test_stride_two_on_a_wide_map():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((16, 49, 112)) * 8).astype(np.float16)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float16)
    geometry = ConvGeometry(3, 3, 25, 56, 2, 2, pad_top=1, pad_left=1, groups=16)
    padded = padded_planes(x, geometry, 0.0)
    assert same_bits_or_both_nan(conv2d_fp16(padded, w, geometry, "direct"), direct_reference(padded, w, geometry))
