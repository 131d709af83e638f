"""The DPU stage kernel's direct form keeps the view it made of the window sums while the CORE step
hands in the same array (issue 20, fixed cost per task: kernels/dpu_pixel_plan.py ``_direct_run``,
``_sums_view``): a small CORE step's sums are one array of its own, refilled every run. Each run
must store what ``planned_to_atoms`` stores for the values the array holds now - refilled in place,
then another array, then the first again - for each layout ``direct`` reads (a convolution's int64
[1][OH][OW], a depthwise CORE's int32 [C][OH][OW] view of its [P][C] buffer, int32 planes
[C][OH][OW]); a variant keeping a copy of the first run's sums is caught (run by hand, session 18)."""

import numpy as np
import pytest

from npuemu.emulator.kernels.dpu_pixel import planned_to_atoms
from npuemu.emulator.kernels.dpu_pixel_plan import prepare_planned_to_atoms
from tests.emulator.test_dpu_rows_direct import CPEND_CONFIGS
from tests.emulator.test_task_plans import _held_case


def _sums(rng, layout: str, pixels: int, channels: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(the array the CORE hands over, the buffer its values are refilled through)."""
    if layout == "convolution":
        buffer = rng.integers(-3000, 3000, pixels).astype(np.int64)
        return buffer.reshape(1, height, width), buffer
    if layout == "depthwise":
        buffer = rng.integers(-3000, 3000, (pixels, channels)).astype(np.int32)
        return buffer.T.reshape(channels, height, width), buffer
    buffer = rng.integers(-3000, 3000, (channels, height, width)).astype(np.int32)
    return buffer, buffer


@pytest.mark.parametrize("config", CPEND_CONFIGS[:3])
@pytest.mark.parametrize("layout", ["convolution", "depthwise", "planes"])
def test_sums_refilled_in_place_are_read_as_they_are_now(config, layout):
    channels, surfaces = 48, 3
    plan, runs, (pixels, width, offsets, c2, surfaces) = _held_case(config, channels, surfaces, False, 3)
    height = pixels // width
    rng = np.random.default_rng(len(config))
    words = np.zeros(surfaces * pixels * 2, np.uint64)
    store = prepare_planned_to_atoms(plan, pixels, width, words, offsets, c2, surfaces)
    assert store is not None and store.direct is not None
    first, first_buffer = _sums(rng, layout, pixels, channels, height, width)
    other, other_buffer = _sums(rng, layout, pixels, channels, height, width)
    for index, (data, _, operand) in enumerate(runs):
        sums, buffer = (other, other_buffer) if index == 2 else (first, first_buffer)
        buffer[...] = rng.integers(-3000, 3000, buffer.shape)  # (refilled in place, as a CORE step's own)
        words[:] = 0
        store.direct(data, sums, operand)
        want = np.zeros_like(words)
        planned_to_atoms(plan, data, width, want, offsets, c2, surfaces, np.array(sums), operand)
        assert want.any()
        np.testing.assert_array_equal(words, want, err_msg=f"run {index}")
