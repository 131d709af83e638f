"""``dpu_convert.widen_rows`` with rows back to back widened as one run (NUMERICS.md 48): the planes
of every layout - dense surfaces (one run a surface), line gaps (a run a row), rows of some surfaces
back to back and of others not, a row that continues into the next surface's first row in the
region, split operands (every other surface), partial last surfaces, 4 / 8 / 16 lanes - equal to
a per-element model written here (numpy's exact float16 -> float32 cast, NaN payloads kept)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.dpu_convert import widen_rows
from npuemu.emulator.kernels.fp16 import widening_table


def reference(region: np.ndarray, offsets: np.ndarray, height: int, width: int, lanes: int, first: int, step: int,
              out: np.ndarray) -> None:
    """Row r: surface first + (r // height) * step, line r % height; pixel x lane l at x * lanes + l."""
    channels = out.shape[0]
    for r, offset in enumerate(offsets):
        surface, line = first + (r // height) * step, r % height
        for lane in range(lanes):
            channel = surface * lanes + lane
            if channel >= channels:
                continue
            halves = region[offset + lane:offset + width * lanes:lanes].view(np.float16)
            out[channel, line * width:(line + 1) * width] = halves.astype(np.float32).view(np.uint32)


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.integers(1, 50), st.sampled_from([4, 8, 16]), st.sampled_from([1, 2]),
       st.integers(0, 1), st.integers(0, 2**32 - 1), st.data())
def test_row_runs_widen_like_each_row(surfaces, height, width, lanes, step, first, seed, data):
    rng = np.random.default_rng(seed)
    row = width * lanes
    gaps = data.draw(st.lists(st.sampled_from([0, 0, 0, lanes, 3 * lanes]), min_size=surfaces * height,
                              max_size=surfaces * height))
    offsets = np.cumsum([0] + [row + gap for gap in gaps[:-1]]).astype(np.int64) + data.draw(st.integers(0, 3))
    region = rng.integers(0, 1 << 16, int(offsets[-1]) + row + 5, dtype=np.uint32).astype(np.uint16)
    region[rng.integers(0, region.size, 4)] = [0x7C01, 0xFE01, 0x8000, 0x0001]  # NaNs, -0, a subnormal
    channels = data.draw(st.integers(1, (first + (surfaces - 1) * step + 1) * lanes))
    got = np.full((channels, height * width), 0xDEADBEEF, np.uint32)
    want = got.copy()
    widen_rows(region, offsets, height, lanes, first, step, widening_table(), got)
    reference(region, offsets, height, width, lanes, first, step, want)
    assert np.array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.sampled_from([1, 2, 7, 8, 9, 15, 40, 127, 128, 2040, 2047, 2048, 2049]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_transposed_runs_widen_like_each_row(surfaces, width, wider_rows, seed):
    """Dense 8-lane surfaces of one row: runs of 1 .. 2049 pixels (below, at and past ``_TRANSPOSED_RUN``, pixel
    counts off a multiple of 8: the transposed path's tail), signalling NaNs of either sign, into planes whose
    rows are further apart than their width (a view: the transposed path's plane stride)."""
    rng = np.random.default_rng(seed)
    lanes, row = 8, width * 8
    offsets = np.arange(surfaces, dtype=np.int64) * row + 3
    dense = rng.integers(0, 1 << 16, int(offsets[-1]) + row + 5, dtype=np.uint32).astype(np.uint16)
    signalling = np.arange(0x7C01, 0x7E00, dtype=np.uint32).astype(np.uint16)
    picks = rng.integers(0, dense.size, min(dense.size, 64))
    dense[picks] = rng.choice(signalling, picks.size) | (rng.integers(0, 2, picks.size) << 15).astype(np.uint16)
    channels = surfaces * lanes
    columns = width + (5 if wider_rows else 0)
    got = np.full((channels, columns), 0xDEADBEEF, np.uint32)
    want = got.copy()
    widen_rows(dense, offsets, 1, lanes, 0, 1, widening_table(), got[:, :width])
    reference(dense, offsets, 1, width, lanes, 0, 1, want[:, :width])
    assert np.array_equal(got, want)
