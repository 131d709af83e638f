"""Weight blob layouts: reference packer, round trips, vendor sizes (NUMERICS.md 8.2, 8.3)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.emulator.kernels import (
    FP16_CONV_RK3588, FP16_DEPTHWISE_RK3588, INT8_CONV_RK3566, INT8_CONV_RK3588,
    INT8_DEPTHWISE_RK3588, pack_conv_weights, pack_depthwise_weights, unpack_conv_weights,
    unpack_depthwise_weights,
)
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import layouts as ref

CONV_LAYOUTS = {"int8": (INT8_CONV_RK3588, np.int8), "fp16": (FP16_CONV_RK3588, np.float16),
                "int8_rk3566": (INT8_CONV_RK3566, np.int8)}


@st.composite
def conv_weights(draw):
    layout, dtype = CONV_LAYOUTS[draw(st.sampled_from(sorted(CONV_LAYOUTS)))]
    shape = (draw(st.integers(1, 80)), draw(st.integers(1, 80)), draw(st.integers(1, 3)),
             draw(st.integers(1, 3)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weights = rng.integers(-128, 128, shape).astype(dtype)
    fill = rng.integers(-128, 128, shape[0]).astype(dtype)
    return layout, weights, fill


@given(conv_weights())
def test_conv_blob_matches_reference_and_unpacks(case):
    layout, weights, fill = case
    blob = pack_conv_weights(weights, layout, input_fill=fill)
    expected = ref.conv_blob(weights, layout.oc_block, layout.ic_block, layout.ic_align,
                             layout.oc_align, fill, layout.pow2_atoms)
    assert blob.view(np.uint8).tobytes() == expected.view(np.uint8).tobytes()
    assert np.array_equal(unpack_conv_weights(blob, *weights.shape, layout=layout), weights)


@given(st.integers(1, 200), st.integers(1, 5), st.integers(1, 5),
       st.sampled_from(["int8", "fp16"]), st.integers(0, 2**32 - 1))
def test_depthwise_blob_matches_reference_and_unpacks(channels, kh, kw, kind, seed):
    layout, dtype = ((INT8_DEPTHWISE_RK3588, np.int8) if kind == "int8"
                     else (FP16_DEPTHWISE_RK3588, np.float16))
    weights = np.random.default_rng(seed).integers(-128, 128, (channels, 1, kh, kw)).astype(dtype)
    blob = pack_depthwise_weights(weights, layout)
    expected = ref.depthwise_blob(weights, layout.channel_block, layout.channel_align)
    assert blob.view(np.uint8).tobytes() == expected.view(np.uint8).tobytes()
    assert np.array_equal(unpack_depthwise_weights(blob, channels, kh, kw, layout), weights)


# (OC, IC, KH, KW) -> stored bytes of rk3588 layers in vendor-corpus layers.csv (w_bytes)
VENDOR_CONV_BYTES = [
    ((32, 32, 3, 3), 9216), ((32, 3, 3, 3), 4608), ((1000, 512, 1, 1), 512000),
    ((48, 48, 1, 1), 2304), ((24, 48, 7, 7), 56448), ((1, 24, 5, 5), 1600),
    ((64, 13, 5, 5), 25600), ((1, 16, 1, 1), 32), ((1, 8, 1, 3), 96), ((48, 8, 7, 7), 37632),
    ((128, 48, 7, 7), 301056), ((4, 48, 1, 1), 192), ((8, 3, 1, 1), 128),
]
VENDOR_DEPTHWISE_BYTES = [((96, 3, 3), 864), ((16, 3, 3), 144), ((32, 5, 5), 800),
                          ((960, 3, 3), 8640), ((16, 7, 7), 784)]


@pytest.mark.parametrize("shape, stored", VENDOR_CONV_BYTES)
def test_stored_conv_sizes_match_the_vendor(shape, stored):
    assert INT8_CONV_RK3588.elements(*shape) == stored
    assert pack_conv_weights(np.zeros(shape, np.int8)).size == stored


@pytest.mark.parametrize("shape, stored", VENDOR_DEPTHWISE_BYTES)
def test_stored_depthwise_sizes_match_the_vendor(shape, stored):
    assert INT8_DEPTHWISE_RK3588.elements(*shape) == stored


def test_first_layer_block_is_32_kernels_by_16_channels():
    # rep03: (32,3,3,3) is stored as one [1][1][3][3][32][16] block, padding = zp_w per kernel
    weights = np.arange(32 * 3 * 9, dtype=np.int64).reshape(32, 3, 3, 3).astype(np.int8)
    zero_points = np.arange(32, dtype=np.int8) - 16
    block = pack_conv_weights(weights, input_fill=zero_points).reshape(3, 3, 32, 16)
    assert np.array_equal(block[1, 2, :, :3], weights[:, :, 1, 2])
    assert np.array_equal(block[0, 0, :, 3:], np.repeat(zero_points[:, None], 13, axis=1))


def test_short_blob_is_an_emulation_error():
    with pytest.raises(EmulationError, match="needs 9216 weight elements"):
        unpack_conv_weights(np.zeros(100, np.int8), 32, 32, 3, 3)
    with pytest.raises(EmulationError, match="positive"):
        unpack_conv_weights(np.zeros(100, np.int8), 0, 32, 3, 3)
