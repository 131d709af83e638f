"""Depthwise kernels other than 3x3 over wide atoms, a pixel at a time (issue 20,
kernels/depthwise.py ``_depthwise_pixel_rows``, from ``PIXEL_LANES`` lanes on) against the reference
convolution and window sums in tests/emulator/reference, through ``depthwise_int8_atoms`` and the
task programs' prepared form (kernels/depthwise_plan.py, which hands over the lane weights); a
broken variant (a kernel column left out) is caught."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import depthwise
from npuemu.emulator.kernels.depthwise_plan import prepare_depthwise_int8_atoms
from tests.emulator.reference import arithmetic as ref_arith
from tests.emulator.reference import convolution as ref
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.test_kern_int8_passes import depthwise_case
from tests.emulator.test_kernels_mac import as_dict


def _case(seed, kernel, stride, dilation, channels):
    return depthwise_case(seed, kernel, stride, dilation, channels, max_height=6, max_width=9)


def _check(geometry, x, w, pad_value, truncate, out_channels, prepared):
    channels = x.shape[0]
    atoms = ref_layouts.nchw_to_nc1hwc2(x, 16)
    atoms[-1, :, :, channels % 16 or 16:] = 77  # lanes past the channels: never data
    assert atoms.shape[0] * 16 >= depthwise.PIXEL_LANES  # (the pixel-at-a-time kernel's case)
    padded = ref.padded_input(x, geometry.pad_top, geometry.pad_left, geometry.padded_h, geometry.padded_w,
                              pad_value, np.int64)
    exact = ref.conv(padded, w, as_dict(geometry))
    if prepared:
        w = w.copy()
        w.flags.writeable = False  # (as the CNA's unpacked weights)
        run = prepare_depthwise_int8_atoms(atoms.shape, w, geometry, pad_value, truncate, nm.ROUND_HALF_AWAY,
                                           out_channels)
        out, sums = run(atoms)
    else:
        out, sums = depthwise.depthwise_int8_atoms(atoms, w, geometry, pad_value, truncate, nm.ROUND_HALF_AWAY,
                                                   out_channels)
    out = out.T.reshape((out_channels,) + exact.shape[1:])
    expected = np.array([ref_arith.core(int(v), truncate, "half_away") for v in exact.ravel()])
    return (np.array_equal(out[:channels].ravel(), expected)
            and np.array_equal(sums[:channels], ref.window_sums(padded, as_dict(geometry)))
            and not out[channels:].any() and not sums[channels:].any())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(1, 1), (5, 5), (7, 7), (1, 3), (3, 5), (2, 2), (5, 1)]),
       st.integers(1, 3), st.integers(1, 2), st.sampled_from([0, 0, 3]), st.sampled_from([-128, 127, -5, 0]),
       st.integers(49, 130), st.sampled_from([0, 16, None]), st.booleans())
def test_wide_depthwise_matches_the_reference(seed, kernel, stride, dilation, truncate, pad_value, channels, extra,
                                              prepared):
    """Outputs as many as the atoms' lanes, more, or just the channels (fewer where C is no multiple of 16)."""
    geometry, x, w = _case(seed, kernel, stride, dilation, channels)
    out_channels = channels if extra is None else -(-channels // 16) * 16 + extra
    assert _check(geometry, x, w, pad_value, truncate, out_channels, prepared)


@pytest.mark.parametrize("prepared", [False, True])
def test_a_dropped_kernel_column_is_caught(monkeypatch, prepared):
    # (the pixel-row kernel, not the VNNI rows a prepared task takes where the CPU has them)
    monkeypatch.setenv("NPUEMU_INT8_GEMM", "0")
    # broken on purpose: the taps of the kernel's third column left out
    broken = depthwise._depthwise_pixel_rows.py_func

    def two_of_three(phased, weights, kernel_h, kernel_w, *rest):
        broken(phased, weights, kernel_h, min(kernel_w, 2), *rest)  # (the kernel's third column never read)

    geometry, x, w = _case(4, (5, 3), 1, 1, 64)
    assert _check(geometry, x, w, -3, 0, 64, prepared)
    monkeypatch.setattr(depthwise, "_depthwise_pixel_rows", two_of_three)
    assert not _check(geometry, x, w, -3, 0, 64, prepared)
