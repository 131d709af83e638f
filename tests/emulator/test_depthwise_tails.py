"""The zero columns of the thread's depthwise result buffer (issue 20, kernels/depthwise_direct.py
``tailed_results``): over any sequence of runs that write every column (``results``) and narrow
runs of any layout (``tailed_results``, then the kept columns written and, where it answers True,
the zeros past them, as ``_emit`` does), every narrow run's outputs are 0 past its kept columns and
its window sums past its summed ones. The writers fill everything they may write with non-zero
values, so a zero left unwritten shows; a broken tracker (a full writer's rows not marked) is caught."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import depthwise_direct

_WIDTHS = (16, 32, 64)


@st.composite
def _runs(draw):
    runs = []
    for _ in range(draw(st.integers(1, 14))):
        if runs and draw(st.integers(0, 3)) == 0:  # a layout again (in series or not)
            runs.append(draw(st.sampled_from(runs)))
            continue
        pixels, width = draw(st.integers(1, 300)), draw(st.sampled_from(_WIDTHS))
        if draw(st.booleans()):
            runs.append(("full", pixels, width, width, width))
        else:
            kept = draw(st.integers(0, width))
            runs.append(("narrow", pixels, width, kept, draw(st.integers(0, kept))))
    return runs


def _play(runs, seed):
    """The runs in order; False at the first narrow run whose tails are not all 0."""
    rng = np.random.default_rng(seed)
    for kind, pixels, width, kept, summed in runs:
        if kind == "full":
            out, sums = depthwise_direct.results(pixels, width)
            out[:] = rng.integers(1, 100, out.shape)
            sums[:] = rng.integers(1, 100, sums.shape)
            continue
        out, sums, zero_tail = depthwise_direct.tailed_results(pixels, width, kept, summed)
        out[:, :kept] = rng.integers(1, 100, (pixels, kept))
        sums[:, :summed] = rng.integers(1, 100, (pixels, summed))
        if zero_tail:
            out[:, kept:] = 0
            sums[:, summed:] = 0
        if out[:, kept:].any() or sums[:, summed:].any():
            return False
    return True


@settings(max_examples=150, deadline=None)
@given(_runs(), st.integers(0, 2**32 - 1))
def test_narrow_runs_see_zeros_past_their_columns(runs, seed):
    assert _play(runs, seed)


def test_a_full_writer_not_marked_is_caught(monkeypatch):
    """Broken on purpose: ``results`` leaves the tracker as it was - a narrow run after a full writer
    over its rows keeps the full writer's values in its tails."""
    runs = [("narrow", 40, 64, 16, 16), ("full", 20, 64, 64, 64), ("narrow", 40, 64, 16, 16)]
    assert _play(runs, 1)

    def unmarked(pixels, out_channels):
        both = depthwise_direct.working_buffer("depthwise results", 2 * pixels * out_channels, np.int32)
        both = both.reshape(2, pixels, out_channels)
        return both[0], both[1]

    monkeypatch.setattr(depthwise_direct, "results", unmarked)
    assert not _play(runs, 1)
    depthwise_direct._TAILS.__dict__.clear()  # (the broken writer left values where rows are told 0)


@pytest.mark.parametrize("between", [("full", 10, 64, 64, 64), ("narrow", 10, 64, 32, 8), ("full", 10, 32, 32, 32)])
def test_only_the_rows_written_over_are_cleared(between):
    """After a narrow run, a smaller run over its first rows: the next narrow run of the first layout
    zeroes those rows' tails itself (its answer False) and leaves the rest as they are."""
    assert _play([("narrow", 100, 64, 16, 16), between], 2)
    out, sums, zero_tail = depthwise_direct.tailed_results(100, 64, 16, 16)
    assert not zero_tail and not out[:, 16:].any() and not sums[:, 16:].any()
