"""PPU pooling on NC1HWC2 against the reference (NUMERICS.md 6)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import PoolConfig, nc1hwc2_to_nchw, nchw_to_nc1hwc2, pool_nc1hwc2
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import pooling as ref


@st.composite
def pool_cases(draw):
    channels = draw(st.integers(1, 20))
    height, width = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sy, sx = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]  # top, bottom, left, right
    out_h = (height + pads[0] + pads[1] - kh) // sy + 1
    out_w = (width + pads[2] + pads[3] - kw) // sx + 1
    assume(out_h >= 1 and out_w >= 1)
    method = draw(st.sampled_from([nm.POOL_AVERAGE, nm.POOL_MAX, nm.POOL_MIN]))
    recip_w = draw(st.sampled_from([65536 // kw, -(-65536 // kw)]))
    recip_h = draw(st.sampled_from([65536 // kh, -(-65536 // kh)]))
    dtype = draw(st.sampled_from([np.int8, np.int16, np.int32]))
    info = np.iinfo(dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(info.min, int(info.max) + 1, (channels, height, width)).astype(dtype)
    pad_value = int(rng.integers(info.min, int(info.max) + 1))
    config = PoolConfig(method, kh, kw, out_h, out_w, sy, sx, pads[0], pads[1], pads[2],
                        pads[3], pad_value, recip_w, recip_h)
    return x, config


def as_dict(config: PoolConfig) -> dict:
    cfg = {name: getattr(config, name) for name in config.__dataclass_fields__}
    cfg["recip_w"], cfg["recip_h"] = config.recip_kernel_w, config.recip_kernel_h
    return cfg


@given(pool_cases(), st.sampled_from([4, 8, 16]))
def test_integer_pooling_matches_reference(case, c2):
    x, config = case
    got = pool_nc1hwc2(nchw_to_nc1hwc2(x, c2), config)
    assert got.dtype == x.dtype and got.shape[1:3] == (config.out_h, config.out_w)
    info = np.iinfo(x.dtype)
    expected = ref.pool(x, as_dict(config), (int(info.min), int(info.max)))
    assert np.array_equal(nc1hwc2_to_nchw(got, x.shape[0]), expected)


def fp16_recip_bits(kernel: int) -> int:
    """The vendor's fp16 RECIP: the fp16 bits of 2^16 / k (fp16(1 / k) with the exponent field + 16)."""
    return int(np.float16(1 / kernel).view(np.uint16)) + (16 << 10)


@given(pool_cases(), st.booleans())
def test_fp16_pooling_matches_reference(case, vendor_recips):
    x, config = case
    rng = np.random.default_rng(abs(int(x.ravel()[0])))
    halves = (rng.standard_normal(x.shape) * 10).astype(np.float16)
    # fp16 RECIP fields are fp16 bits (NUMERICS.md 38): the vendor's encoding of k, or any 16-bit word
    recips = ((fp16_recip_bits(config.kernel_w), fp16_recip_bits(config.kernel_h)) if vendor_recips
              else tuple(int(v) for v in rng.integers(0, 1 << 16, 2)))
    config = dataclasses.replace(config, pad_value=0.5, recip_kernel_w=recips[0], recip_kernel_h=recips[1])
    got = pool_nc1hwc2(nchw_to_nc1hwc2(halves, 8), config)
    expected = ref.pool_float(halves, as_dict(config))
    assert np.array_equal(nc1hwc2_to_nchw(got, x.shape[0]), expected)


def test_max_pool_skips_padding_like_rep07():
    # zero point -91, PAD_VALUE 0: every value below the pad must still come out
    x = np.full((1, 4, 4), -100, np.int8)
    config = PoolConfig(nm.POOL_MAX, 3, 3, 2, 2, 2, 2, pad_top=1, pad_left=1)
    assert np.all(pool_nc1hwc2(nchw_to_nc1hwc2(x, 16), config)[..., 0] == -100)


def test_average_counts_padding_at_the_pad_value():
    x = np.full((1, 2, 2), 10, np.int8)
    config = PoolConfig(nm.POOL_AVERAGE, 2, 2, 2, 2, 1, 1, pad_top=1, pad_left=1,
                        pad_value=2, recip_kernel_w=32768, recip_kernel_h=32768)
    got = nc1hwc2_to_nchw(pool_nc1hwc2(nchw_to_nc1hwc2(x, 16), config), 1)
    assert got.ravel().tolist() == [4, 6, 6, 10]  # (10+2+2+2)/4, (10+10+2+2)/4, ...


def test_pool_configuration_errors():
    with pytest.raises(EmulationError, match="POOLING_METHOD"):
        PoolConfig(3, 2, 2, 1, 1)
    with pytest.raises(EmulationError, match="geometry"):
        PoolConfig(0, 0, 2, 1, 1)
    with pytest.raises(EmulationError, match="float16"):
        pool_nc1hwc2(np.zeros((1, 2, 2, 16), np.uint8), PoolConfig(0, 2, 2, 1, 1))
