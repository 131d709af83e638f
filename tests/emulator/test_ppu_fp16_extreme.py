"""The PPU's fp16 max / min pools on the bits (kernels/ppu_fp16.py) against a numpy model of the fp32 pool."""

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import PoolConfig
from npuemu.emulator.kernels.ppu_fp16 import pool_extreme

# fp16 values that decide a pick: both zeros, subnormals, the largest finite, infinities, quiet and
# signalling NaNs of both signs
_SPECIAL = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00,
                     0x7C01, 0xFD55, 0x3C00, 0xBC00], np.uint16)


def _model(cube: np.ndarray, config: PoolConfig) -> np.ndarray:
    """The pool in fp32 as NUMERICS.md 6 states it: each window's inside values in order, a value
    replacing the pick when it compares greater (max) / smaller (min) in fp32 (never with a NaN), the
    pad value for an empty window; stored as fp16 with every NaN 0x7E00."""
    groups, height, width, c2 = cube.shape
    wide = cube.astype(np.float32)
    out = np.empty((groups, config.out_h, config.out_w, c2), np.uint16)
    for g in range(groups):
        for oy in range(config.out_h):
            for ox in range(config.out_w):
                for lane in range(c2):
                    picked = None
                    for ky in range(config.kernel_h):
                        for kx in range(config.kernel_w):
                            y = oy * config.stride_y + ky - config.pad_top
                            x = ox * config.stride_x + kx - config.pad_left
                            if not (0 <= y < height and 0 <= x < width):
                                continue
                            value = wide[g, y, x, lane]
                            if picked is None or (value > picked if config.method == nm.POOL_MAX else value < picked):
                                picked = value
                    value = np.float32(config.pad_value) if picked is None else picked
                    out[g, oy, ox, lane] = 0x7E00 if np.isnan(value) else np.float16(value).view(np.uint16)
    return out


@st.composite
def cases(draw):
    groups, c2 = draw(st.integers(1, 3)), draw(st.sampled_from([1, 8, 16]))
    height, width = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    kh, kw, sy, sx = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    top, bottom, left, right = (draw(st.integers(0, 2)) for _ in range(4))
    out_h, out_w = (height + top + bottom - kh) // sy + 1, (width + left + right - kw) // sx + 1
    assume(out_h >= 1 and out_w >= 1)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # mostly few distinct values (ties, signed zeros, NaNs meet often), sometimes any bits
    pool = _SPECIAL if draw(st.booleans()) else rng.integers(0, 1 << 16, 24).astype(np.uint16)
    bits = rng.choice(pool, (groups, height, width, c2))
    pad = float(np.uint16(draw(st.sampled_from([0x0000, 0x8000, 0xFC00, 0x7E00, 0x3C00]))).view(np.float16))
    config = PoolConfig(draw(st.sampled_from([nm.POOL_MAX, nm.POOL_MIN])), kh, kw, out_h, out_w, sy, sx, top, bottom,
                        left, right, pad)
    return bits, config


@settings(max_examples=300, deadline=None)
@given(cases())
def test_fp16_extreme_pools_match_the_fp32_model(case):
    bits, config = case
    got = pool_extreme(bits.view(np.float16), config)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), _model(bits.view(np.float16), config))
