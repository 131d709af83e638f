"""``fp16_atoms.planes_to_fp16_atoms``'s two loops (NUMERICS.md 33) on the shapes that pick them: rows
narrower than ``_WIDE_ROW`` (one-pixel rows of an interleaved write, 7x7 maps) in blocks of
``_BLOCK`` pixels that end mid-row, surfaces of fewer than C2 channels, C2 = 8 and 16, shuffled and
overlapping rows, against test_fp16_fused_atoms's reference (fp16 rounding through float64, atoms
laid out by index arithmetic). A blocked loop that loses the row order where rows overlap is caught."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import fp16_atoms
from npuemu.emulator.kernels.fp16_atoms import planes_to_fp16_atoms
from tests.emulator.test_fp16_fused_atoms import mismatches, planes_case


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20), st.integers(1, 1100), st.integers(1, fp16_atoms._WIDE_ROW - 1), st.sampled_from([8, 16]),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_narrow_rows_in_blocks_match_the_rounding_and_layout(channels, height, width, c2, overlap, seed):
    height = max(1, min(height, 3000 // width))  # up to ~3000 pixels a surface: several blocks
    bits, offsets, size = planes_case(np.random.default_rng(seed), channels, height, width, c2, overlap)
    assert mismatches(planes_to_fp16_atoms, bits, c2, offsets, size) == 0


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 30), st.integers(1, 4), st.integers(fp16_atoms._WIDE_ROW, 90), st.sampled_from([8, 16]),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_wide_rows_match_the_rounding_and_layout(channels, height, width, c2, overlap, seed):
    bits, offsets, size = planes_case(np.random.default_rng(seed), channels, height, width, c2, overlap)
    assert mismatches(planes_to_fp16_atoms, bits, c2, offsets, size) == 0


def test_both_loops_run_on_tall_one_pixel_rows_and_block_edges():
    rng = np.random.default_rng(7)
    for channels, height, width in ((8, 1500, 1), (13, 1030, 1), (24, 97, 7), (5, 300, 15), (9, 3, 16)):
        bits, offsets, size = planes_case(rng, channels, height, width, 8, True)
        assert mismatches(planes_to_fp16_atoms, bits, 8, offsets, size) == 0


def last_rows_first(planes, c2, offsets, data):
    """Broken on purpose: the blocked loop's surfaces stored last to first (overlapping rows: the
    earlier row wins)."""
    height = planes.shape[1]
    for s in range(-(-offsets.size // height) - 1, -1, -1):
        rows = offsets[s * height:(s + 1) * height]
        fp16_atoms._store_blocks(np.ascontiguousarray(planes[s * c2:(s + 1) * c2]), c2, rows, data)


def test_a_store_out_of_row_order_is_caught():
    bits, offsets, size = planes_case(np.random.default_rng(11), 24, 40, 1, 8, False)
    offsets[-1] = offsets[0]  # the last row lands on the first: it must win
    assert mismatches(last_rows_first, bits, 8, offsets, size) > 0
    assert mismatches(planes_to_fp16_atoms, bits, 8, offsets, size) == 0
