"""The float16 conv blocking's power-of-two partial group (isa.weight_layout, LOWERING.md 34).

Native shapes are the vendor's ``w1`` listings (``npuemu inspect`` of rknn-toolkit2 2.5.0
builds: helper R2's a16_88 and f16odd_88 for rk3588; vendor-corpus layers.csv conv_022 for
rk3576 fp16)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.isa.weight_layout import FP16_CONV, FP16_CONV_V1, INT8_CONV, conv_native_shapes


@given(st.integers(1, 300))
def test_partial_group_is_the_smallest_of_8_16_32_holding_it(channels):
    full, rest = divmod(channels, 32)
    expected = 32 * full + (min(size for size in (8, 16, 32) if size >= rest) if rest else 0)
    assert FP16_CONV.stored_channels(channels) == expected
    # only 17..24 differ from the old whole-atom rule
    assert (expected != FP16_CONV_V1.stored_channels(channels)) == (17 <= rest <= 24)


@given(st.integers(1, 300))
def test_fp16_kernel_tail_is_unpadded_int8_stays_even(kernels):
    assert FP16_CONV.stored_kernels(kernels) == kernels
    assert INT8_CONV.stored_kernels(kernels) == kernels + kernels % 2


@pytest.mark.parametrize("shape, native", [
    ((40, 24, 3, 5), ((2, 1, 3, 5, 16, 32), (1, 1, 3, 5, 8, 32))),
    ((17, 5, 3, 2), ((1, 1, 3, 2, 16, 8), (1, 1, 3, 2, 1, 8))),
    ((128, 48, 7, 7), ((8, 1, 7, 7, 16, 32), (8, 1, 7, 7, 16, 16))),
])
def test_native_shapes_equal_the_vendors(shape, native):
    assert conv_native_shapes(*shape, FP16_CONV) == native
