"""Stride-1 convolutions as one accumulating BLAS product per tap (kernels/tap_gemm.py): the
path is taken with numpy's OpenBLAS and its sums are the exact reference sums."""

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import ConvGeometry, conv2d_int8_exact, fetch_padded_input, mac, tap_gemm
from tests.emulator.reference import convolution as ref
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.test_kernels_mac import as_dict


def test_the_cblas_entry_point_is_found_where_numpy_bundles_it():
    # numpy's Linux wheels bundle scipy-openblas64 (the CI's numpy): there the per-tap path must
    # run; another BLAS build (MKL, Accelerate) runs the im2col path with the same values
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    bundled = blas.get("name") == "scipy-openblas" and "USE64BITINT" in blas.get("openblas configuration", "")
    assert tap_gemm.available() or not bundled


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 20), st.integers(1, 4), st.integers(1, 4),
       st.integers(1, 2), st.integers(1, 2), st.integers(0, 2), st.integers(0, 2),
       st.integers(0, 2**32 - 1))
def test_tap_products_give_the_exact_sums(channels, kernels, kh, kw, dy, dx, pad_top, pad_left, seed):
    rng = np.random.default_rng(seed)
    height, width = int(rng.integers(1, 10)), int(rng.integers(1, 10))
    out_h = height + pad_top + int(rng.integers(0, 3)) - (kh - 1) * dy
    out_w = width + pad_left + int(rng.integers(0, 3)) - (kw - 1) * dx
    assume(out_h >= 1 and out_w >= 1 and kh * kw > 1)  # the tap path is for wider kernels
    geometry = ConvGeometry(kh, kw, out_h, out_w, 1, 1, dy, dx, pad_top, pad_left)
    x = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    w = rng.integers(-128, 128, (kernels, channels, kh, kw)).astype(np.int8)
    w.flags.writeable = False  # as weights from the memory's cache
    pad_value = int(rng.integers(-128, 128))
    padded = fetch_padded_input(ref_layouts.nchw_to_nc1hwc2(x, 16), channels, geometry, pad_value)
    operands = mac._OPERANDS.get(w, 1)
    assert operands.taps is not None  # one exact chunk: the tap path runs
    expected = ref.conv(ref.padded_input(x, pad_top, pad_left, geometry.padded_h, geometry.padded_w,
                                         pad_value), w, as_dict(geometry))
    assert np.array_equal(conv2d_int8_exact(padded, w, geometry, "gemm"), expected)


def test_worst_case_products_at_the_one_chunk_limit():
    # 113 channels x 3x3 = 1017 products of -128 * -128: 1017 * 16384 < 2**24, one chunk
    channels = 113
    x = np.full((channels, 4, 5), -128, np.int8)
    w = np.full((2, channels, 3, 3), -128, np.int8)
    w.flags.writeable = False
    geometry = ConvGeometry(3, 3, 4, 5, pad_top=1, pad_left=1)
    padded = fetch_padded_input(ref_layouts.nchw_to_nc1hwc2(x, 16), channels, geometry, -128)
    assert mac._OPERANDS.get(w, 1).taps is not None
    assert np.all(conv2d_int8_exact(padded, w, geometry, "gemm") == channels * 9 * 16384)
