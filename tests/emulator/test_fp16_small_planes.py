"""The fp16 reads and stores of cubes of 1, 2 or 4 pixels a plane (session 22: dpu_convert.widen_rows' and
widen_channels' surfaces in registers, fp16_atoms.planes_to_fp16_atoms' and store_channels'), against a numpy
model of the atom layout with the exact widening and the canonical rounding written out here."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.dpu_convert import widen_channels, widen_rows
from npuemu.emulator.kernels.fp16 import widening_table
from npuemu.emulator.kernels.fp16_atoms import planes_to_fp16_atoms, store_channels

_SHAPES = [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (4, 1)]


def _widened(halves: np.ndarray) -> np.ndarray:
    """fp16 bits -> fp32 bits, exactly (a NaN keeps its payload, a signalling one stays signalling)."""
    h = halves.astype(np.uint32)
    sign, exponent, mantissa = (h >> 15) << 31, (h >> 10) & 0x1F, h & 0x3FF
    normal = sign | ((exponent + 112) << 23) | (mantissa << 13)
    special = sign | 0x7F800000 | (mantissa << 13)
    tiny = (mantissa.astype(np.float32) * np.float32(2.0**-24)).view(np.uint32) | sign
    return np.where(exponent == 0x1F, special, np.where(exponent == 0, tiny, normal)).astype(np.uint32)


def _rounded(bits: np.ndarray) -> np.ndarray:
    """fp32 bits -> fp16 bits, nearest even, every NaN 0x7E00."""
    values = bits.astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore"):
        halves = values.astype(np.float16).view(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7E00), halves).astype(np.uint16)


def _rows(rng, count: int, line: int, gap: bool) -> np.ndarray:
    # each row's first element: back to back, or apart by a random gap of whole atoms
    steps = line + (8 * rng.integers(0, 3, count) if gap else np.zeros(count, np.int64))
    return np.concatenate([[0], np.cumsum(steps)[:-1]]).astype(np.int64)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40), st.sampled_from(_SHAPES), st.sampled_from([(1, 0), (2, 0), (2, 1)]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_reads_of_small_planes_widen_each_lane_into_its_channel(channels, hw, split, gap, seed):
    (height, width), (step, first), lanes = hw, split, 8
    rng = np.random.default_rng(seed)
    surfaces = len(range(first, -(-channels // lanes), step))
    offsets = _rows(rng, surfaces * height, width * lanes, gap)
    data = rng.integers(0, 1 << 16, int(offsets[-1]) + width * lanes + 8, dtype=np.uint16)
    out = rng.integers(0, 1 << 32, (channels, height * width), dtype=np.uint32)
    want = out.copy()
    for r, offset in enumerate(offsets):
        surface, y = first + (r // height) * step, r % height
        for x in range(width):
            for lane in range(lanes):
                if surface * lanes + lane < channels:
                    want[surface * lanes + lane, y * width + x] = _widened(data[offset + x * lanes + lane:][:1])[0]
    got = out.copy()
    widen_rows(data, offsets, height, lanes, first, step, widening_table(), got)
    assert np.array_equal(got, want)
    if height * width == 1:
        flat = out.reshape(-1).copy()
        widen_channels(data, offsets, lanes, first, step, widening_table(), flat)
        assert np.array_equal(flat, want.reshape(-1))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40), st.sampled_from(_SHAPES), st.sampled_from([8, 16]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_stores_of_small_planes_round_each_channel_into_its_lane(channels, hw, c2, gap, seed):
    height, width = hw
    rng = np.random.default_rng(seed)
    surfaces = -(-channels // c2)
    offsets = _rows(rng, surfaces * height, width * c2, gap)
    bits = rng.integers(0, 1 << 32, (channels, height, width), dtype=np.uint32)
    bits.reshape(-1)[::3] = rng.normal(0, 1e3, bits.size)[::3].astype(np.float32).view(np.uint32)
    data = rng.integers(0, 1 << 16, int(offsets[-1]) + width * c2 + 8, dtype=np.uint16)
    want = data.copy()
    for r, offset in enumerate(offsets):
        surface, y = r // height, r % height
        for x in range(width):
            for lane in range(c2):
                channel = surface * c2 + lane
                want[offset + x * c2 + lane] = _rounded(bits[channel, y, x:x + 1])[0] if channel < channels else 0
    got = data.copy()
    planes_to_fp16_atoms(bits, c2, offsets, got)
    assert np.array_equal(got, want)
    if height * width == 1:
        flat = data.copy()
        store_channels(bits.reshape(-1), c2, offsets, flat)
        assert np.array_equal(flat, want)
