"""The DPU stage kernel's direct form with a depthwise CORE's window sums (issue 20,
kernels/dpu_pixel_plan.py ``_direct_run`` / ``_rows_chain``): int32 sums per pixel and channel, the
[C][OH][OW] view of a [P][C] buffer the depthwise kernels hand over, read in place - the same atoms
as ``planned_to_atoms`` on the same inputs, run after run (sums past the chain's bound, or laid out
otherwise, through the general run); a broken variant (the sums read as one per pixel) is caught."""

import numpy as np
import pytest

from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels import dpu_pixel_plan
from npuemu.emulator.kernels.dpu_pixel import planned_to_atoms
from npuemu.emulator.kernels.dpu_pixel_plan import prepare_planned_to_atoms
from tests.emulator.test_task_plans import HELD_CONFIGS, _held_case


def _depthwise_sums(rng, pixels: int, channels: int, height: int, width: int, top: int) -> np.ndarray:
    buffer = rng.integers(-top, top, (pixels, channels)).astype(np.int32)
    return buffer.T.reshape(channels, height, width)  # (as depthwise_plan's run_padded returns them)


def _mismatches(config: str, channels: int, surfaces: int, monkeypatch) -> tuple[list[int], int]:
    """Runs in which ``direct`` wrote other words than ``planned_to_atoms``, and how many runs
    ``_rows_chain`` took."""
    plan, runs, (pixels, width, offsets, c2, surfaces) = _held_case(config, channels, surfaces, False, 3)
    height = pixels // width
    rng = np.random.default_rng(channels)
    taken = []
    original = dpu_pixel_plan._rows_chain

    def counted(*args):
        done = original(*args)
        taken.append(done)
        return done

    monkeypatch.setattr(dpu_pixel_plan, "_rows_chain", counted)
    words = np.zeros(surfaces * pixels * 2, np.uint64)
    store = prepare_planned_to_atoms(plan, pixels, width, words, offsets, c2, surfaces)
    assert store is not None and store.direct is not None
    wrong = []
    for index, (data, _, operand) in enumerate(runs):
        top = 2**31 - 1 if index == 2 else 3000  # (run 2: sums up to int32's ends)
        sums = _depthwise_sums(rng, pixels, channels, height, width, top)
        if index == 4:  # laid out otherwise (a copy): the general run
            sums = np.ascontiguousarray(sums)
        words[:] = 0
        store.direct(data, sums, operand)
        want = np.zeros_like(words)
        planned_to_atoms(plan, data, width, want, offsets, c2, surfaces, sums, operand)
        assert want.any()
        if not np.array_equal(words, want):
            wrong.append(index)
    return wrong, sum(taken)


CPEND_CONFIGS = sorted(name for name, settings in HELD_CONFIGS.items()
                       if settings.get("bs") is not None and settings["bs"].cpend_enable and name != "stages")


@pytest.mark.parametrize("config", CPEND_CONFIGS)
@pytest.mark.parametrize("channels, surfaces", [(40, 2), (48, 3)])
def test_depthwise_sums_direct_equals_planned_to_atoms(config, channels, surfaces, monkeypatch):
    wrong, taken = _mismatches(config, channels, surfaces, monkeypatch)
    assert wrong == []
    assert taken >= 3  # (runs 0, 1, 3 at least; run 4's copy is not the view)


def test_the_checks_catch_sums_read_as_one_per_pixel(monkeypatch):
    # broken on purpose: the per-channel sums read with the one-per-pixel layout
    def shared(data, window, floats, operand, settings, top, surfaces, width, tile, offsets, target):
        tile[:] = 0
        dp._chain_pixels_to_atoms(data, window, dp.SUMS_SHARED, floats, operand, settings, surfaces, width, tile,
                                  offsets, target)
        return True

    monkeypatch.setattr(dpu_pixel_plan, "_rows_chain", shared)
    wrong, _ = _mismatches(CPEND_CONFIGS[0], 48, 3, monkeypatch)
    assert wrong != []
