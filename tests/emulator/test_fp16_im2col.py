"""The fp16 gemm convolution's gather (``mac._im2col``: runs located by offsets into the flat planes,
NUMERICS.md 33) on planes wide enough for its vector loops, strides 1-3 with dilations, grouped and
plain, padded planes larger than the output needs and long reductions, against
test_fp16_exact_order's reference (windows gathered by numpy slicing, per group +0 then the products
k after k in fp32). Pad values are fp16 values, as the CNA's (PAD_CON1's low 16 bits): every operand
is then an fp16 value, whose products are exact in fp32 (NUMERICS.md 3.3)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import ConvGeometry, conv2d_fp16
from tests.emulator.test_fp16_exact_order import gemm_reference, padded_planes, same_bits_or_both_nan


@st.composite
def gemm_cases(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    channels = groups * draw(st.integers(1, 16))
    kernels = groups * draw(st.integers(5, 12))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sy, sx = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dy, dx = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    height, width = draw(st.integers(1, 24)), draw(st.integers(1, 90))
    pad_top, pad_left = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    out_h = max(1, (height + 2 * pad_top - (kh - 1) * dy - 1) // sy + 1)
    out_w = max(1, (width + 2 * pad_left - (kw - 1) * dx - 1) // sx + 1)
    geometry = ConvGeometry(kh, kw, out_h, out_w, sy, sx, dy, dx, pad_top, pad_left, groups)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal((channels, height, width)) * 4).astype(np.float16)
    w = rng.standard_normal((kernels, channels // groups, kh, kw)).astype(np.float16)
    return x, w, geometry, float(np.float16(rng.uniform(-2, 2))), draw(st.integers(0, 3))


@settings(max_examples=50, deadline=None)
@given(gemm_cases())
def test_gemm_convolution_gathers_the_windows_in_order(case):
    x, w, geometry, pad_value, grow = case
    padded = padded_planes(x, geometry, pad_value)
    padded = np.pad(padded, ((0, 0), (0, grow), (0, grow)), constant_values=np.float32(-3.25))
    assert same_bits_or_both_nan(conv2d_fp16(padded, w, geometry, "gemm"), gemm_reference(padded, w, geometry))


def test_a_long_reduction_on_a_wide_map():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((120, 6, 70)) * np.exp2(rng.integers(-6, 6, (120, 1, 1)))).astype(np.float16)
    w = (rng.standard_normal((7, 120, 3, 3)) * 2).astype(np.float16)  # 1080 products
    geometry = ConvGeometry(3, 3, 6, 70, pad_top=1, pad_left=1)
    padded = padded_planes(x, geometry, 0.0)
    assert same_bits_or_both_nan(conv2d_fp16(padded, w, geometry, "gemm"), gemm_reference(padded, w, geometry))


def test_a_non_contiguous_input_is_read_as_its_values():
    rng = np.random.default_rng(6)
    planes = rng.standard_normal((4, 9, 20)).astype(np.float16).astype(np.float32)
    padded = planes[:, :, ::2]  # a strided view: [4][9][10]
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float16)
    geometry = ConvGeometry(3, 3, 7, 8)
    expected = gemm_reference(np.ascontiguousarray(padded), w, geometry)
    assert same_bits_or_both_nan(conv2d_fp16(padded, w, geometry, "gemm"), expected)
