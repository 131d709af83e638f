"""The MAC kernel's exact float32 method (NUMERICS.md 3.2): chunk bounds derived from the
weights, the fused window sums, read-only (cached) weights, at the 2**24 boundary and with
worst-case magnitudes. References: tests/emulator/reference/convolution.py (int64)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import ConvGeometry, core_outputs, fetch_padded_input, nchw_to_nc1hwc2
from npuemu.emulator.kernels.mac import _MAX_CHUNK as MAX_CHUNK
from npuemu.emulator.kernels.mac import _OPERANDS, conv2d_int8_with_window_sums, exact_chunk_bounds
from tests.emulator.reference import convolution as ref
from tests.emulator.test_kernels_mac import as_dict, conv_cases, reference_padded

LIMIT = 2**24  # float32 holds every integer up to here


def read_only(array: np.ndarray) -> np.ndarray:
    array = array.copy()
    array.flags.writeable = False  # as the weights the CNA unpacks (cached per weight bytes)
    return array


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 20000), st.integers(0, 2**32 - 1),
       st.sampled_from(["extreme", "uniform", "small"]))
def test_chunk_bounds_keep_every_partial_sum_below_2_to_the_24(rows, reduction, seed, pool):
    rng = np.random.default_rng(seed)
    values = {"extreme": [-128, 127, -127], "uniform": np.arange(-128, 128), "small": [-3, 0, 2]}
    matrix = rng.choice(values[pool], (rows, reduction)).astype(np.int8)
    bounds = exact_chunk_bounds(matrix)
    assert bounds[0] == 0 and bounds[-1] == reduction and all(a < b for a, b in zip(bounds, bounds[1:]))
    magnitudes = np.abs(matrix.astype(np.int64))
    for k0, k1 in zip(bounds, bounds[1:]):
        # |x| <= 128 bounds every partial sum of the chunk by 128 * sum |w|
        assert 128 * magnitudes[:, k0:k1].sum(axis=1).max() <= LIMIT
        if k1 < reduction and k1 - k0 < MAX_CHUNK:  # greedy: one more could break the bound
            assert 128 * magnitudes[:, k0:k1 + 1].sum(axis=1).max() > LIMIT
        assert k1 - k0 <= MAX_CHUNK


@pytest.mark.parametrize("reduction, expected", [
    (1024, (0, 1024)), (1025, (0, 1024, 1025)), (3000, (0, 1024, 2048, 3000)),
])
def test_worst_case_weights_give_chunks_of_exactly_1024(reduction, expected):
    assert nm.EXACT_FLOAT32_REDUCTION == 1024
    assert exact_chunk_bounds(np.full((2, reduction), -128, np.int8)) == expected


def test_small_weights_allow_one_long_exact_chunk_up_to_the_boundary():
    # 2048 weights of 64 with inputs of -128: the sum is exactly -2**24, the largest allowed
    assert exact_chunk_bounds(np.full((1, 2048), 64, np.int8)) == (0, 2048)
    assert exact_chunk_bounds(np.full((1, 2049), 64, np.int8)) == (0, 2048, 2049)
    # zero weights never reach the bound: the buffer cap cuts the chunks
    assert exact_chunk_bounds(np.zeros((1, 2 * MAX_CHUNK + 1), np.int8)) == (
        0, MAX_CHUNK, 2 * MAX_CHUNK, 2 * MAX_CHUNK + 1)


def run_fused(x, w, geometry, c2, pad_value, method="auto", truncate=0):
    padded = fetch_padded_input(nchw_to_nc1hwc2(x, c2), x.shape[0], geometry, pad_value)
    return conv2d_int8_with_window_sums(padded, read_only(w), geometry, clip_truncate=truncate,
                                        method=method)


@pytest.mark.parametrize("channels, weight, value", [
    (1024, -128, -128), (1025, -128, -128), (2048, 64, -128), (2049, 64, -128),
    (4100, -128, 127), (4100, 127, -128),
])
def test_fused_conv_is_exact_at_the_chunk_boundary(channels, weight, value):
    x = np.full((channels, 2, 3), value, np.int8)
    w = np.full((3, channels, 1, 1), weight, np.int8)
    x[-1], w[1, -1, 0, 0] = 1, 1  # kernel 1 at 1024 x 2**14 + 1 = 2**24 + 1: float32 cannot hold it
    geometry = ConvGeometry(1, 1, 2, 3)
    data, sums = run_fused(x, w, geometry, 16, 0, method="gemm")
    exact = w.reshape(3, -1).astype(np.int64) @ x.reshape(channels, -1).astype(np.int64)
    assert np.array_equal(data.reshape(3, -1), core_outputs(exact))
    assert np.all(sums == (channels - 1) * value + 1)


@pytest.mark.parametrize("kernel, channels", [(3, 113), (3, 114), (3, 512), (1, 1025)])
def test_all_minus_128_with_padding_is_exact(kernel, channels):
    x = np.full((channels, 4, 5), -128, np.int8)
    w = np.full((2, channels, kernel, kernel), -128, np.int8)
    geometry = ConvGeometry(kernel, kernel, 4, 5, pad_top=kernel // 2, pad_left=kernel // 2)
    data, sums = run_fused(x, w, geometry, 16, -128, method="gemm")
    reduction = channels * kernel * kernel
    assert np.all(data == min(reduction * 16384, 2**31 - 1))
    assert np.all(sums == -128 * reduction)


@settings(max_examples=40, deadline=None)
@given(conv_cases(), st.sampled_from(["gemm", "direct", "auto"]), st.integers(0, 4))
def test_fused_conv_and_window_sums_match_the_reference(case, method, truncate):
    x, w, geometry, c2, pad_value = case
    data, sums = run_fused(x, w, geometry, c2, pad_value, method, truncate)
    padded = reference_padded(x, geometry, pad_value)
    exact = ref.conv(padded, w, as_dict(geometry))
    assert np.array_equal(data, core_outputs(exact, truncate))
    assert sums.dtype == np.int64
    assert np.array_equal(sums, ref.window_sums(padded, as_dict(geometry)))


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2]), st.sampled_from([1, 2]))
def test_depthwise_direct_path_with_extreme_values(seed, stride, dilation):
    rng = np.random.default_rng(seed)
    channels, height, width = int(rng.integers(1, 40)), int(rng.integers(3, 20)), int(rng.integers(3, 20))
    x = rng.choice([-128, 127, -127, 0], (channels, height, width)).astype(np.int8)
    w = rng.choice([-128, 127, -127, 1], (channels, 1, 3, 3)).astype(np.int8)
    span = 2 * dilation + 1
    out_h, out_w = (height + 2 - span) // stride + 1, (width + 2 - span) // stride + 1
    if min(out_h, out_w) < 1:
        return
    geometry = ConvGeometry(3, 3, out_h, out_w, stride, stride, dilation, dilation, 1, 1, channels)
    data, sums = run_fused(x, w, geometry, 16, -128)
    padded = reference_padded(x, geometry, -128)
    assert np.array_equal(data, core_outputs(ref.conv(padded, w, as_dict(geometry))))
    assert np.array_equal(sums, ref.window_sums(padded, as_dict(geometry)))


def test_cached_operands_follow_the_array_not_its_address():
    # Two read-only weight sets in turn: results must follow the weights passed each time.
    geometry = ConvGeometry(1, 1, 1, 2)
    x = np.array([[[3, -5]], [[7, 2]]], np.int8)
    padded = fetch_padded_input(nchw_to_nc1hwc2(x, 16), 2, geometry, 0)
    for scale in (1, -2, 3):
        w = read_only(np.full((40, 2, 1, 1), scale, np.int8))
        data, _ = conv2d_int8_with_window_sums(padded, w, geometry)
        assert np.all(data == scale * np.array([10, -3]))


@settings(max_examples=30, deadline=None)
@given(conv_cases(kinds=("direct",)), st.integers(0, 2**32 - 1))
def test_trailing_zero_weight_channels_are_skipped_exactly(case, seed):
    # the image input's padding lanes: input channels past the real ones have all-zero weights
    # (but the pad value in the padded border); products skip them, window sums do not
    x, w, geometry, c2, pad_value = case
    live = int(np.random.default_rng(seed).integers(0, x.shape[0]))
    w = w.copy()
    w[:, live:] = 0
    weights = read_only(w)
    padded = fetch_padded_input(nchw_to_nc1hwc2(x, c2), x.shape[0], geometry, pad_value)
    reference = reference_padded(x, geometry, pad_value)
    got, sums = conv2d_int8_with_window_sums(padded, weights, geometry)
    expected = ref.conv(reference, w, as_dict(geometry))
    assert np.array_equal(got, core_outputs(expected, 0))
    assert np.array_equal(sums, ref.window_sums(reference, as_dict(geometry)))
    # (all-zero weights keep one channel)
    assert (_OPERANDS.get(weights, 1).trimmed is not None) == (max(live, 1) < x.shape[0])
