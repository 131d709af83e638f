"""The DPU's fp16 cubes (MRDMA main cube, ERDMA operand) widened to the fp32 pipeline in one pass
(kernels/dpu_convert.fp16_blocks_to_cube, issue 20): bit for bit the channel-block layout moved to
[C][H][W] planes and every value widened exactly (NUMERICS.md 7), NaN payloads and signed zeros
included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.dpu_convert import fp16_blocks_to_cube
from npuemu.isa.errors import EmulationError


def reference(blocks: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """Channel s x L + l of pixel p is blocks[s, p, l]; numpy's float16 -> float32 cast is exact."""
    surfaces, pixels, lanes = blocks.shape
    out = np.empty(shape, np.float32)
    for channel in range(shape[0]):
        out[channel] = blocks[channel // lanes, :, channel % lanes].astype(np.float32).reshape(shape[1:])
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5), st.integers(1, 9), st.integers(1, 9), st.sampled_from([1, 4, 8, 16]),
       st.integers(0, 2**31), st.data())
def test_blocks_widen_to_planes(surfaces, height, width, lanes, seed, data):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 16, (surfaces, height * width, lanes), dtype=np.uint32).astype(np.uint16)
    blocks = bits.view(np.float16)
    channels = data.draw(st.integers(1, surfaces * lanes))
    got = fp16_blocks_to_cube(blocks, (channels, height, width))
    assert got.dtype == np.float32 and got.shape == (channels, height, width)
    assert np.array_equal(got.view(np.uint32), reference(blocks, (channels, height, width)).view(np.uint32))


def test_every_pattern_and_a_strided_view():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(8, 1024, 8)
    blocks = bits.view(np.float16)[:, ::2]  # not contiguous
    got = fp16_blocks_to_cube(blocks, (61, 32, 16))
    assert np.array_equal(got.view(np.uint32), reference(np.ascontiguousarray(blocks), (61, 32, 16)).view(np.uint32))


def test_mismatched_shapes_are_refused():
    with pytest.raises(EmulationError, match="do not hold"):
        fp16_blocks_to_cube(np.zeros((1, 4, 8), np.float16), (9, 2, 2))
    with pytest.raises(EmulationError, match="do not hold"):
        fp16_blocks_to_cube(np.zeros((1, 4, 8), np.float32), (8, 2, 2))
