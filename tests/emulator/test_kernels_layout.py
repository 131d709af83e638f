"""NCHW / NHWC <-> NC1HWC2 against the reference (NUMERICS.md 8.1)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.emulator.kernels import (
    DEPTHWISE_OUTPUT_CHANNEL_ALIGN, channel_groups, nc1hwc2_to_nchw, nc1hwc2_to_nhwc,
    nchw_to_nc1hwc2, nhwc_to_nc1hwc2,
)
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import layouts as ref

DTYPES = [np.int8, np.int16, np.int32, np.float16, np.float32]


@st.composite
def feature_maps(draw):
    channels = draw(st.integers(1, 40))
    height, width = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    c2 = draw(st.sampled_from([4, 8, 16, 32] + ([channels] if channels <= 4 else [])))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**32 - 1))
    values = np.random.default_rng(seed).integers(-128, 128, (channels, height, width))
    return values.astype(dtype), c2


@given(feature_maps())
def test_nchw_to_nc1hwc2_matches_reference_and_round_trips(case):
    x, c2 = case
    packed = nchw_to_nc1hwc2(x, c2)
    assert packed.dtype == x.dtype
    assert np.array_equal(packed.view(np.uint8), ref.nchw_to_nc1hwc2(x, c2).view(np.uint8))
    assert np.array_equal(nc1hwc2_to_nchw(packed, x.shape[0]), x)


@given(feature_maps(), st.integers(1, 3))
def test_batched_nhwc_round_trip(case, batch):
    x, c2 = case
    nhwc = np.stack([x.transpose(1, 2, 0)] * batch)
    packed = nhwc_to_nc1hwc2(nhwc, c2)
    assert packed.shape[0] == batch
    assert np.array_equal(packed[0].view(np.uint8), ref.nchw_to_nc1hwc2(x, c2).view(np.uint8))
    assert np.array_equal(nc1hwc2_to_nhwc(packed, x.shape[0]), nhwc)
    assert np.array_equal(nc1hwc2_to_nchw(packed, x.shape[0])[batch - 1], x)


def test_first_layer_packed_input_is_three_bytes_per_pixel():
    image = np.arange(3 * 4 * 5, dtype=np.int8).reshape(3, 4, 5)
    packed = nchw_to_nc1hwc2(image, c2=3)
    assert packed.shape == (1, 4, 5, 3)  # hardware.md 2: (1,3,224,224) -> (1,1,224,224,3)
    assert np.array_equal(packed[0], image.transpose(1, 2, 0))


@pytest.mark.parametrize("channels, c1", [(16, 4), (32, 4), (64, 4), (96, 8), (960, 60)])
def test_depthwise_output_allocation_rounds_to_64_channels(channels, c1):
    # vendor-corpus 4.3: 16 or 32 channels stored as C1 = 4, 96 as C1 = 8
    groups = channel_groups(channels, 16, DEPTHWISE_OUTPUT_CHANNEL_ALIGN)
    assert groups == c1
    packed = nchw_to_nc1hwc2(np.ones((channels, 2, 2), np.int8), 16, c1=groups)
    assert packed.shape == (c1, 2, 2, 16)
    assert packed.sum() == channels * 4


def test_layout_errors_name_the_problem():
    with pytest.raises(EmulationError, match="cannot hold"):
        nchw_to_nc1hwc2(np.zeros((20, 2, 2), np.int8), 16, c1=1)
    with pytest.raises(EmulationError, match="cannot hold 33 channels"):
        nc1hwc2_to_nchw(np.zeros((2, 2, 2, 16), np.int8), 33)
    with pytest.raises(EmulationError, match="dimensions"):
        nchw_to_nc1hwc2(np.zeros((2, 2), np.int8), 16)
