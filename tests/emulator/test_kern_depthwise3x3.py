"""The 3x3 depthwise kernels over a once-padded input (kernels/depthwise.py ``_depthwise3x3``,
NUMERICS.md 3.7) against the independent references (padded input at the pad value, direct
convolution, window sums): strides 1 and 2 (and 3), dilations, paddings that reach past the
input or leave rows unread, extreme values and pad values, lanes past the weights, CORE
channels past the lanes; and the cases it leaves to the general kernel."""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import ConvGeometry, depthwise
from tests.emulator.reference import convolution as ref
from tests.emulator.test_kern_chain_pixels import count_calls
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.test_kernels_mac import as_dict


@pytest.fixture
def padded_calls(monkeypatch):
    return count_calls(monkeypatch, depthwise, "_depthwise3x3", 2)  # the geometry


@st.composite
def cases(draw):
    channels = draw(st.sampled_from([16, 32, 48]) | st.integers(1, 40))
    sy, sx = draw(st.sampled_from([1, 1, 2, 3])), draw(st.sampled_from([1, 1, 2, 3]))
    dy, dx = draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2]))
    height, width = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    pad_top, pad_left = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    out_h = (height + pad_top + draw(st.integers(-1, 2)) - 2 * dy - 1) // sy + 1
    out_w = (width + pad_left + draw(st.integers(-1, 2)) - 2 * dx - 1) // sx + 1
    assume(out_h >= 1 and out_w >= 1)
    geometry = ConvGeometry(3, 3, out_h, out_w, sy, sx, dy, dx, pad_top, pad_left, channels)
    c2 = draw(st.sampled_from([8, 16]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pool = np.array([-128, 127, -1, 0]) if draw(st.booleans()) else np.arange(-128, 128)
    x = rng.choice(pool, (channels, height, width)).astype(np.int8)
    w = rng.choice(pool, (channels, 1, 3, 3)).astype(np.int8)
    pad_value = draw(st.sampled_from([-128, 127, 0]) | st.integers(-128, 127))
    return x, w, geometry, c2, pad_value


def check(x, w, geometry, c2, pad_value, out_channels, truncate=0):
    atoms = ref_layouts.nchw_to_nc1hwc2(x, c2)
    atoms[-1, :, :, x.shape[0] % c2 or c2:] = 77  # lanes past the channels: not read as data
    padded = ref.padded_input(x, geometry.pad_top, geometry.pad_left, geometry.padded_h,
                              geometry.padded_w, pad_value, np.int64)
    exact = ref.conv(padded, w, as_dict(geometry))
    sums = ref.window_sums(padded, as_dict(geometry))
    out, got_sums = depthwise.depthwise_int8_atoms(atoms, w, geometry, pad_value, truncate,
                                                   nm.ROUND_HALF_AWAY, out_channels)
    channels = x.shape[0]
    out = out.T.reshape((out_channels,) + exact.shape[1:])
    assert np.array_equal(out[:channels], exact)
    assert np.array_equal(got_sums[:channels], sums)
    assert not out[channels:].any() and not got_sums[channels:].any()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases(), st.sampled_from([0, 0, 5, 40]))
def test_padded_3x3_matches_the_reference(padded_calls, case, extra):
    x, w, geometry, c2, pad_value = case
    lanes = -(-x.shape[0] // c2) * c2
    out_channels = max(x.shape[0] + extra, lanes) if extra == 0 else x.shape[0] + extra
    before = len(padded_calls)
    check(x, w, geometry, c2, pad_value, out_channels)
    assert len(padded_calls) == before + 1


def test_extreme_windows_at_every_position(padded_calls):
    """-128 everywhere, pad -128: every window sums nine products of 2**14 (padding or not)."""
    x = np.full((40, 6, 7), -128, np.int8)
    w = np.full((40, 1, 3, 3), -128, np.int8)
    for stride in (1, 2):
        out_h, out_w = (6 + 2 - 3) // stride + 1, (7 + 2 - 3) // stride + 1
        geometry = ConvGeometry(3, 3, out_h, out_w, stride, stride, 1, 1, 1, 1, 40)
        check(x, w, geometry, 16, -128, 48)
    assert len(padded_calls) == 2


@pytest.mark.parametrize("truncate, kernel", [(3, 3), (0, 5)])
def test_other_cases_run_the_general_kernel(padded_calls, truncate, kernel):
    """A CORE shift (CLIP_TRUNCATE) or another kernel size: the general kernel, exact too."""
    rng = np.random.default_rng(kernel)
    x = rng.integers(-128, 128, (16, 6, 6)).astype(np.int8)
    w = rng.integers(-128, 128, (16, 1, kernel, kernel)).astype(np.int8)
    geometry = ConvGeometry(kernel, kernel, 6, 6, 1, 1, 1, 1, kernel // 2, kernel // 2, 16)
    if truncate == 0:
        check(x, w, geometry, 16, -3, 16)
    else:
        atoms = ref_layouts.nchw_to_nc1hwc2(x, 16)
        depthwise.depthwise_int8_atoms(atoms, w, geometry, -3, truncate, nm.ROUND_HALF_AWAY, 16)
    assert not padded_calls
