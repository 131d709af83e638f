"""Pixel-major int8 convolution straight from NC1HWC2 atoms (kernels/conv_pixels.py) against
the independent references: padded input at the pad value (channels past DATAIN_CHANNEL_REAL
read 0 inside the input), direct convolution, window sums, the CORE stage."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import ConvGeometry
from npuemu.emulator.kernels.conv_pixels import BLOCK_ELEMENTS, PixelOperands, conv_int8_pixels
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import arithmetic as ref_arith
from tests.emulator.reference import convolution as ref
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.test_kernels_mac import as_dict, conv_cases


def expected_outputs(x, w, geometry, pad_value, real, truncate, half_even):
    masked = x.copy()
    masked[real:] = 0  # DATAIN_CHANNEL_REAL: the CNA reads 0 there, the pad value stays
    padded = ref.padded_input(masked, geometry.pad_top, geometry.pad_left, geometry.padded_h,
                              geometry.padded_w, pad_value, np.int64)
    exact = ref.conv(padded, w, as_dict(geometry))
    name = "half_even" if half_even else "half_away"
    core = np.array([ref_arith.core(int(v), truncate, name) for v in exact.ravel()]).reshape(exact.shape)
    return core, ref.window_sums(padded, as_dict(geometry)), masked


@settings(max_examples=60, deadline=None)
@given(conv_cases(kinds=("direct",)), st.integers(0, 40), st.integers(0, 12), st.booleans(),
       st.integers(0, 40), st.data())
def test_matches_the_reference(case, extra, truncate, half_even, real_cut, data):
    x, w, geometry, c2, pad_value = case
    channels = x.shape[0]
    real = max(1, channels - real_cut)
    core, sums, masked = expected_outputs(x, w, geometry, pad_value, real, truncate, half_even)
    atoms = ref_layouts.nchw_to_nc1hwc2(masked, c2)
    if data.draw(st.booleans()):  # channels past the real ones hold junk in memory: never read
        atoms = ref_layouts.nchw_to_nc1hwc2(x, c2)
    out_channels = w.shape[0] + extra
    out, got_sums = conv_int8_pixels(atoms, channels, real, w, geometry, pad_value, truncate,
                                     nm.core_round_mode(int(half_even)), out_channels)
    pixels = geometry.out_h * geometry.out_w
    assert out.dtype == np.int32 and out.shape == (pixels, out_channels)
    assert np.array_equal(out[:, :w.shape[0]].T.reshape(core.shape), core)
    assert not out[:, w.shape[0]:].any()  # kernels without weights stay 0 (REGISTER_SEMANTICS 2.5)
    assert got_sums.dtype == np.int64 and np.array_equal(got_sums, sums)


def test_worst_case_values_over_several_chunks_and_blocks():
    # all -128 (pad too) over 3x3 x 300 channels: 2700 products per output, three exact chunks
    # of float32 (<= 1024 each, NUMERICS.md 3.5) added in float64; more pixels than one block
    channels, size = 300, 64
    assert size * size * 9 * channels > BLOCK_ELEMENTS
    x = np.full((channels, size, size), -128, np.int8)
    w = np.full((2, channels, 3, 3), -128, np.int8)
    geometry = ConvGeometry(3, 3, size, size, pad_top=1, pad_left=1)
    assert len(PixelOperands.build(w, channels).bounds) > 3
    out, sums = conv_int8_pixels(ref_layouts.nchw_to_nc1hwc2(x, 16), channels, channels, w,
                                 geometry, -128, 0, nm.ROUND_HALF_AWAY, 32)
    assert np.all(out[:, :2] == 2700 * 16384) and not out[:, 2:].any()
    assert np.all(sums == 2700 * -128)


def test_channels_past_the_real_ones_enter_as_one_column_per_tap():
    # the image input: 3 real channels of 16 lanes, weights nonzero on every lane (the vendor
    # stores the weight zero point there): the padding lanes count only where the pad is
    w = np.arange(2 * 16 * 9, dtype=np.int64).reshape(2, 16, 3, 3) % 255 - 127
    w = w.astype(np.int8)
    operands = PixelOperands.build(w, 3)
    assert operands.matrix.shape == (9 * 3 + 9, 3) and operands.virtual
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (16, 7, 9)).astype(np.int8)
    geometry = ConvGeometry(3, 3, 4, 5, 2, 2, pad_top=1, pad_left=1)
    core, sums, _ = expected_outputs(x, w, geometry, 7, 3, 0, False)
    out, got_sums = conv_int8_pixels(ref_layouts.nchw_to_nc1hwc2(x, 16), 16, 3, w, geometry, 7, 0,
                                     nm.ROUND_HALF_AWAY, 32)
    assert np.array_equal(out[:, :2].T.reshape(core.shape), core)
    assert np.array_equal(got_sums, sums)


def test_rejects_operands_that_do_not_fit():
    atoms = np.zeros((1, 2, 2, 16), np.int8)
    geometry = ConvGeometry(1, 1, 2, 2)
    with pytest.raises(EmulationError, match="pixel-major conv"):
        conv_int8_pixels(atoms, 20, 20, np.zeros((4, 20, 1, 1), np.int8), geometry, 0, 0, 0, 32)
    with pytest.raises(EmulationError, match="pixel-major conv"):
        conv_int8_pixels(atoms, 16, 16, np.zeros((40, 16, 1, 1), np.int8), geometry, 0, 0, 0, 32)


def test_the_products_choose_the_blas_thread_count(monkeypatch):
    from npuemu.emulator.kernels import mac

    monkeypatch.setattr(mac, "_blas_threads_chosen", False)
    conv_int8_pixels(np.zeros((1, 2, 2, 16), np.int8), 16, 16, np.ones((4, 16, 1, 1), np.int8),
                     ConvGeometry(1, 1, 2, 2), 0, 0, 0, 32)
    assert mac._blas_threads_chosen


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 20), st.integers(1, 4), st.integers(2, 4),
       st.integers(1, 2), st.integers(1, 2), st.integers(0, 2), st.integers(0, 2),
       st.integers(0, 12), st.integers(0, 2**32 - 1))
def test_stride_one_kernels_run_one_product_per_tap(channels, kernels, kh, kw, dy, dx, pad_top,
                                                    pad_left, real_cut, seed):
    # kernels wider than 1x1 at stride 1 with one exact chunk: the per-tap path, also with the
    # summed column of the channels past the real ones
    rng = np.random.default_rng(seed)
    height, width = int(rng.integers(1, 10)), int(rng.integers(1, 10))
    out_h = max(1, height + pad_top + int(rng.integers(0, 3)) - (kh - 1) * dy)
    out_w = max(1, width + pad_left + int(rng.integers(0, 3)) - (kw - 1) * dx)
    geometry = ConvGeometry(kh, kw, out_h, out_w, 1, 1, dy, dx, pad_top, pad_left)
    x = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    w = rng.integers(-8, 8, (kernels, channels, kh, kw)).astype(np.int8)  # one chunk
    w.flags.writeable = False  # as weights from the memory's cache
    real = max(1, channels - real_cut)
    pad_value = int(rng.integers(-128, 128))
    assert PixelOperands.build(w, real).taps is not None
    core, sums, _ = expected_outputs(x, w, geometry, pad_value, real, 0, False)
    out, got_sums = conv_int8_pixels(ref_layouts.nchw_to_nc1hwc2(x, 16), channels, real, w,
                                     geometry, pad_value, 0, nm.ROUND_HALF_AWAY, kernels + 3)
    assert np.array_equal(out[:, :kernels].T.reshape(core.shape), core)
    assert not out[:, kernels:].any() and np.array_equal(got_sums, sums)


def test_worst_case_products_per_tap_at_the_one_chunk_limit():
    # 113 channels x 3x3 = 1017 products of -128 * -128 (+ the ones column): one chunk
    channels = 113
    x = np.full((channels, 4, 5), -128, np.int8)
    w = np.full((2, channels, 3, 3), -128, np.int8)
    geometry = ConvGeometry(3, 3, 4, 5, pad_top=1, pad_left=1)
    assert PixelOperands.build(w, channels).taps is not None
    out, sums = conv_int8_pixels(ref_layouts.nchw_to_nc1hwc2(x, 16), channels, channels, w,
                                 geometry, -128, 0, nm.ROUND_HALF_AWAY, 32)
    assert np.all(out[:, :2] == channels * 9 * 16384) and np.all(sums == channels * 9 * -128)


def test_the_core_stage_saturates_long_sums_to_int32():
    # 512 channels x 16x16 taps of -128 * -128 = 2**31: one past the int32 range, saturated
    # (NUMERICS.md 3.2); with CLIP_TRUNCATE 1 it fits, rounded
    channels, size = 512, 16
    x = np.full((channels, size, size), -128, np.int8)
    w = np.full((1, channels, size, size), -128, np.int8)
    geometry = ConvGeometry(size, size, 1, 1)
    atoms = ref_layouts.nchw_to_nc1hwc2(x, 16)
    out, _ = conv_int8_pixels(atoms, channels, channels, w, geometry, 0, 0, nm.ROUND_HALF_AWAY, 32)
    assert out[0, 0] == 2**31 - 1
    inside = np.full_like(atoms, 127)  # -128 * 127 products: just inside the range
    out, _ = conv_int8_pixels(inside, channels, channels, w, geometry, 0, 0, nm.ROUND_HALF_AWAY, 32)
    assert out[0, 0] == -128 * 127 * channels * size * size
    out, _ = conv_int8_pixels(atoms, channels, channels, w, geometry, 0, 1, nm.ROUND_HALF_AWAY, 32)
    assert out[0, 0] == 2**30


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 70), st.integers(1, 40), st.integers(1, 9), st.integers(1, 9),
       st.integers(0, 2), st.integers(0, 20), st.sampled_from([8, 16]), st.integers(0, 2**32 - 1))
def test_pointwise_convolutions_copy_the_atoms(channels, kernels, height, width, short_rows,
                                               real_cut, c2, seed):
    # 1x1, stride 1, output rows within the input and no padding: the plain-copy gather,
    # also with the per-tap column of channels past the real ones
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    w = rng.integers(-128, 128, (kernels, channels, 1, 1)).astype(np.int8)
    real = max(1, channels - real_cut)
    geometry = ConvGeometry(1, 1, max(1, height - short_rows), width)
    core, sums, _ = expected_outputs(x, w, geometry, 5, real, 0, False)
    out, got_sums = conv_int8_pixels(ref_layouts.nchw_to_nc1hwc2(x, c2), channels, real, w,
                                     geometry, 5, 0, nm.ROUND_HALF_AWAY, kernels)
    assert np.array_equal(out.T.reshape(core.shape), core) and np.array_equal(got_sums, sums)
