"""Depthwise tasks with more outputs than atom lanes, their rows written straight into the outputs
(issue 20, kernels/depthwise_direct.py through kernels/depthwise_plan.py): every run against the
reference convolution, CORE stage and window sums of tests/emulator/reference, over runs that reuse
the thread's result buffer with the same layout (its zero columns not written again), with another
layout and after a kernel that writes every column (the zeros then written again); broken variants
(a tail left unwritten after a full write, a kept lane dropped) are caught."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import depthwise_direct, depthwise_plan
from npuemu.emulator.kernels.mac import ConvGeometry
from tests.emulator.reference import arithmetic as ref_arith
from tests.emulator.reference import convolution as ref
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.test_kern_int8_passes import depthwise_case
from tests.emulator.test_kernels_mac import as_dict


def _prepared(geometry, w, shape, pad_value, truncate, out_channels, mode=nm.ROUND_HALF_AWAY, own=False):
    """The prepared run; ``own``: a small layer's buffers of its own (as the step keeps them), else the
    thread's shared ones (``tailed_results``), whatever the size."""
    w = w.copy()
    w.flags.writeable = False  # (as the CNA's unpacked weights)
    with pytest.MonkeyPatch.context() as patch:
        if not own:
            patch.setattr(depthwise_plan, "OWN_BUFFER_ELEMENTS", 0)
        return depthwise_plan.prepare_depthwise_int8_atoms(shape, w, geometry, pad_value, truncate, mode,
                                                           out_channels)


def _atoms(x):
    channels = x.shape[0]
    atoms = ref_layouts.nchw_to_nc1hwc2(x, 16)
    atoms[-1, :, :, channels % 16 or 16:] = 77  # lanes past the channels: never data
    return atoms


def _agrees(run, geometry, x, w, pad_value, truncate, out_channels, mode="half_away"):
    """Whether ``run`` on ``x`` gives the reference outputs (0 past the channels) and window sums."""
    channels = x.shape[0]
    out, sums = run(_atoms(x))
    padded = ref.padded_input(x, geometry.pad_top, geometry.pad_left, geometry.padded_h, geometry.padded_w,
                              pad_value, np.int64)
    exact = ref.conv(padded, w, as_dict(geometry))
    expected = np.array([ref_arith.core(int(v), truncate, mode) for v in exact.ravel()]).reshape(exact.shape)
    out = out.T.reshape((out_channels,) + exact.shape[1:])
    return (np.array_equal(out[:channels], expected) and not out[channels:].any()
            and np.array_equal(sums[:channels], ref.window_sums(padded, as_dict(geometry)))
            and not sums[channels:].any())


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(3, 3), (1, 1), (5, 5), (7, 7), (2, 7), (1, 3), (3, 1)]),
       st.integers(1, 3), st.integers(1, 2), st.sampled_from([0, 0, 2, 13]), st.sampled_from([-128, 127, 0, -9]),
       st.integers(1, 80), st.integers(1, 40), st.booleans())
def test_runs_past_the_lanes_match_the_reference(seed, kernel, stride, dilation, truncate, pad_value, channels, extra,
                                                 own):
    """Outputs past the lanes (extra), narrow and wide atoms (up to 5 surfaces: the pixel-at-a-time
    kernel from 64 lanes), strides, dilations, CORE shifts (rounding ties, saturation of large
    sums), the int8 pad values' extremes, the step's own buffers or the thread's; three runs of new
    inputs with one layout."""
    geometry, x, w = depthwise_case(seed, kernel, stride, dilation, channels, max_height=6, max_width=9)
    out_channels = -(-channels // 16) * 16 + extra
    run = _prepared(geometry, w, (-(-channels // 16),) + x.shape[1:] + (16,), pad_value, truncate, out_channels,
                    own=own)
    rng = np.random.default_rng(seed + 1)
    for _ in range(3):
        x = rng.integers(-128, 128, x.shape).astype(np.int8)
        assert _agrees(run, geometry, x, w, pad_value, truncate, out_channels)


def test_extreme_inputs_saturate_and_round_as_the_core():
    """All inputs and weights at -128 (the largest products, 2**14 each) with a shift that leaves
    ties: the CORE's rounding and saturation on the emitted lanes."""
    geometry = ConvGeometry(3, 3, 4, 5, 1, 1, 1, 1, 1, 1, 20)
    x = np.full((20, 4, 5), -128, np.int8)
    w = np.full((20, 1, 3, 3), -128, np.int8)
    for truncate in (0, 1, 7, 31):
        for mode, name in ((nm.ROUND_HALF_AWAY, "half_away"), (nm.ROUND_HALF_EVEN, "half_even")):
            for own in (False, True):
                run = _prepared(geometry, w, (2, 4, 5, 16), -128, truncate, 64, mode, own)
                assert _agrees(run, geometry, x, w, -128, truncate, 64, name)


def test_layouts_and_full_writers_in_turn_leave_no_stale_values():
    """One thread's result buffer shared by a narrow layer (zeros past its lanes), another narrow layer
    of another layout, and a layer whose kernel writes every column: each run still has its zeros."""
    rng = np.random.default_rng(5)
    narrow, x_narrow, w_narrow = depthwise_case(11, (3, 3), 1, 1, 20, max_height=6, max_width=9)
    other, x_other, w_other = depthwise_case(12, (1, 1), 1, 1, 33, max_height=6, max_width=9)
    full = ConvGeometry(3, 3, 6, 9, 1, 1, 1, 1, 1, 1, 64)
    x_full = rng.integers(-128, 128, (64, 6, 9)).astype(np.int8)
    w_full = rng.integers(-128, 128, (64, 1, 3, 3)).astype(np.int8)
    runs = [(_prepared(narrow, w_narrow, (2,) + x_narrow.shape[1:] + (16,), -3, 0, 64), narrow, x_narrow, w_narrow, 64),
            (_prepared(other, w_other, (3,) + x_other.shape[1:] + (16,), 5, 0, 64), other, x_other, w_other, 64),
            (_prepared(full, w_full, (4, 6, 9, 16), -3, 0, 64), full, x_full, w_full, 64)]
    pads = (-3, 5, -3)
    for order in ([0, 0, 1, 0, 2, 0, 0], [2, 1, 1, 2, 0, 1]):
        for index in order:
            run, geometry, x, w, out_channels = runs[index]
            x = rng.integers(-128, 128, x.shape).astype(np.int8)
            assert _agrees(run, geometry, x, w, pads[index], 0, out_channels)


def test_a_tail_not_written_after_another_layout_is_caught(monkeypatch):
    """Broken on purpose: ``tailed_results`` never asks for the zeros - after a layer that writes every
    column of the shared buffer, the next narrow run shows that layer's values past its lanes."""
    geometry, x, w = depthwise_case(21, (3, 3), 1, 1, 16, max_height=5, max_width=6)
    shape = (1,) + x.shape[1:] + (16,)
    narrow = _prepared(geometry, w, shape, 0, 0, 64)
    assert _agrees(narrow, geometry, x, w, 0, 0, 64)
    real = depthwise_direct.tailed_results

    def no_zeros(*args):
        out, sums, _ = real(*args)
        return out, sums, False

    monkeypatch.setattr(depthwise_direct, "tailed_results", no_zeros)
    out, sums = depthwise_direct.results(geometry.out_h * geometry.out_w, 64)  # a full writer's run
    out.fill(9)
    sums.fill(9)
    assert not _agrees(narrow, geometry, x, w, 0, 0, 64)
    depthwise_direct._TAILS.__dict__.clear()  # (the broken run left 9s where the thread's rows are told 0)


@pytest.mark.parametrize("dropped", [0, 15])
def test_a_dropped_lane_is_caught(monkeypatch, dropped):
    """Broken on purpose: ``_emit`` told to keep one lane fewer (the last kept output lane stays 0)."""
    geometry, x, w = depthwise_case(31, (3, 3), 2, 1, 16, max_height=6, max_width=7)
    run = _prepared(geometry, w, (1,) + x.shape[1:] + (16,), 4, 0, 64)
    assert _agrees(run, geometry, x, w, 4, 0, 64)
    real = depthwise_direct._padded_rows.py_func

    def short(*args):
        *head, kept, summed, clip_truncate, mode, zero_tail = args
        real(*head, kept - 1 - dropped, summed, clip_truncate, mode, True)

    monkeypatch.setattr(depthwise_direct, "_padded_rows", short)
    x = np.random.default_rng(32).integers(-128, 128, x.shape).astype(np.int8)  # (not the last run's values)
    assert not _agrees(run, geometry, x, w, 4, 0, 64)
