"""The MAC kernel's exact float32 method (NUMERICS.md 3.2): chunk bounds derived from the
weights, and the int8 kernel's operands memoised per read-only weight array."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import ConvGeometry, nchw_to_nc1hwc2
from npuemu.emulator.kernels.conv_pixels import conv_int8_pixels, pixel_operands
from npuemu.emulator.kernels.mac import _MAX_CHUNK as MAX_CHUNK
from npuemu.emulator.kernels.mac import exact_chunk_bounds

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


def test_memoised_operands_follow_the_array_not_its_address():
    # Read-only weight sets in turn, each dropped before the next (so a new array may reuse
    # the old one's address): results must follow the weights passed each time.
    geometry = ConvGeometry(1, 1, 1, 2)
    atoms = nchw_to_nc1hwc2(np.array([[[3, -5]], [[7, 2]]], np.int8), 16)
    for scale in (1, -2, 3, 1, -2):
        w = read_only(np.full((40, 2, 1, 1), scale, np.int8))
        data, _ = conv_int8_pixels(atoms, 2, 2, w, geometry, 0, 0, nm.ROUND_HALF_AWAY, 40)
        assert np.all(data.T == scale * np.array([10, -3]))


def test_operands_are_memoised_for_read_only_weights_only():
    w = np.ones((4, 3, 3, 3), np.int8)
    assert pixel_operands(w, 3) is not pixel_operands(w, 3)  # writable: may change, built each time
    fixed = read_only(w)
    assert pixel_operands(fixed, 3) is pixel_operands(fixed, 3)
    assert pixel_operands(fixed, 2) is not pixel_operands(fixed, 3)  # the real channels are in the key
