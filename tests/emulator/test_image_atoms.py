"""The image-mode feature atoms a CNA step keeps (emulator/kernels/image_atoms.py) against a reference
written here: each image row read at its offset as W pixels of C interleaved channels, the first
DATAIN_CHANNEL_REAL channels in the first lanes of a [1][H][W][C2] cube, every other lane 0
(REGISTER_SEMANTICS 2.2 and 2.3); the buffer refilled in place by each run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.image_atoms import image_loader


def _reference(memory: np.ndarray, offsets: list[int], width: int, channels: int, real: int, c2: int,
               dtype: np.dtype) -> np.ndarray:
    out = np.zeros((1, len(offsets), width, c2), dtype)
    size = np.dtype(dtype).itemsize
    for y, start in enumerate(offsets):
        row = memory[start:start + width * channels * size].view(dtype).reshape(width, channels)
        for x in range(width):
            for c in range(real):
                out[0, y, x, c] = row[x, c]
    return out


@st.composite
def _images(draw):
    dtype = np.dtype(draw(st.sampled_from([np.int8, np.float16])))
    c2 = draw(st.sampled_from([8, 16])) if dtype == np.int8 else 8
    channels = draw(st.integers(1, 4))
    real = draw(st.integers(1, channels))
    height, width = draw(st.integers(1, 6)), draw(st.integers(1, 9))
    row_bytes = width * channels * dtype.itemsize
    memory_bytes = draw(st.integers(row_bytes, row_bytes * (height + 3)))
    # rows anywhere in the memory: in order, out of order, overlapping (the DMA reads what is there)
    offsets = draw(st.lists(st.integers(0, memory_bytes - row_bytes), min_size=height, max_size=height))
    seed = draw(st.integers(0, 2**32 - 1))
    return dtype, c2, channels, real, width, offsets, memory_bytes, seed


@settings(max_examples=150, deadline=None)
@given(_images())
def test_atoms_match_the_reference_over_runs(case):
    dtype, c2, channels, real, width, offsets, memory_bytes, seed = case
    rng = np.random.default_rng(seed)
    memory = rng.integers(0, 256, memory_bytes, dtype=np.uint8)
    fill = image_loader(memory, np.array(offsets, np.int64), len(offsets), width, channels, real, c2, dtype)
    for _ in range(2):  # a second run after the memory changed: the same buffer, refilled
        expected = _reference(memory, offsets, width, channels, real, c2, dtype)
        feature = fill()
        assert feature is fill.buffer and feature.shape == expected.shape and feature.dtype == dtype
        assert np.array_equal(feature.view(np.uint8), expected.view(np.uint8))
        memory[:] = rng.integers(0, 256, memory_bytes, dtype=np.uint8)


def test_refuses_more_real_channels_than_the_image_has():
    with pytest.raises(ValueError, match="3 real"):
        image_loader(np.zeros(64, np.uint8), np.zeros(2, np.int64), 2, 4, 2, 3, 16, np.int8)
