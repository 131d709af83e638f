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
