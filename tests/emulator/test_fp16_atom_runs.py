"""``fp16_atoms._store_runs`` (session 21: a surface's back-to-back rows stored as runs of whole rows)
against test_fp16_fused_atoms's reference (fp16 rounding through float64, atoms laid out by index
arithmetic): surfaces whose rows all follow each other, runs broken by a gap or a moved row, runs
longer than ``_RUN`` pixels, a last row over the first (the later row wins), surfaces of fewer than
C2 channels, C2 = 8 and 16, through ``planes_to_fp16_atoms`` (which picks the runs when the first two
rows are back to back) and the kernel itself."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import fp16_atoms
from npuemu.emulator.kernels.fp16_atoms import planes_to_fp16_atoms
from tests.emulator.test_fp16_fused_atoms import mismatches, planes_case


def _runs_case(rng, channels: int, height: int, width: int, c2: int, layout: str):
    """planes_case's planes with rows laid out surface after surface, each row where the one before
    ends, then ``layout``: "dense" as it is, "gaps" a gap of 5 elements before every third row,
    "moved" one row (not the first two) moved past the end, "overlap" the last row onto the first."""
    bits, _, _ = planes_case(rng, channels, height, width, c2, False)
    rows, line = -(-channels // c2) * height, width * c2
    offsets = np.arange(rows, dtype=np.int64) * line
    if layout == "gaps":
        offsets += (np.arange(rows) // 3) * 5
    elif layout == "moved" and rows > 2:
        offsets[int(rng.integers(2, rows))] = rows * line + 7
    elif layout == "overlap" and rows > 2:
        offsets[-1] = offsets[0] + line // 2
    return bits, offsets, int(rows * line + line + 2 * rows * 5 + 8)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(2, 60), st.integers(1, 130), st.sampled_from([8, 16]),
       st.sampled_from(["dense", "gaps", "moved", "overlap"]), st.integers(0, 2**32 - 1))
def test_runs_match_the_rounding_and_layout(channels, height, width, c2, layout, seed):
    height = max(2, min(height, 4000 // width))
    bits, offsets, size = _runs_case(np.random.default_rng(seed), channels, height, width, c2, layout)
    assert mismatches(planes_to_fp16_atoms, bits, c2, offsets, size) == 0
    assert mismatches(fp16_atoms._store_runs, bits, c2, offsets, size) == 0
