"""int8 depthwise straight from NC1HWC2 atoms (kernels/depthwise.py) against the independent
references: padded input at the pad value, direct convolution, window sums, the CORE stage."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import ConvGeometry
from npuemu.emulator.kernels.depthwise import MAX_EXACT_TAPS, depthwise_int8_atoms
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import arithmetic as ref_arith
from tests.emulator.reference import convolution as ref
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.test_kernels_mac import as_dict, conv_cases


def depthwise_cases():
    # one kernel per channel, 8- or 16-lane atoms (the kernel moves atoms as 8-byte words)
    return conv_cases(kinds=("depthwise",), depthwise_multipliers=(1,)).filter(
        lambda case: case[3] % 8 == 0)


@settings(max_examples=60, deadline=None)
@given(depthwise_cases(), st.integers(0, 40), st.integers(0, 12), st.booleans())
def test_depthwise_from_atoms_matches_the_reference(case, extra, truncate, half_even):
    x, w, geometry, c2, pad_value = case
    out_channels = x.shape[0] + extra  # CORE channels past the weights
    atoms = ref_layouts.nchw_to_nc1hwc2(x, c2)
    padded = ref.padded_input(x, geometry.pad_top, geometry.pad_left, geometry.padded_h,
                              geometry.padded_w, pad_value, np.int64)
    exact = ref.conv(padded, w, as_dict(geometry))
    sums = ref.window_sums(padded, as_dict(geometry))
    name = "half_even" if half_even else "half_away"
    out, got_sums = depthwise_int8_atoms(atoms, w, geometry, pad_value, truncate,
                                         nm.core_round_mode(int(half_even)), out_channels)
    channels = x.shape[0]
    assert out.dtype == np.int32 and out.shape == (exact.shape[1] * exact.shape[2], out_channels)
    out = out.T.reshape((out_channels,) + exact.shape[1:])  # pixel-major -> [C][OH][OW]
    expected = np.array([ref_arith.core(int(v), truncate, name) for v in exact.ravel()])
    assert np.array_equal(out[:channels].ravel(), expected)
    assert np.array_equal(got_sums[:channels], sums)
    # channels without weights stay 0 (REGISTER_SEMANTICS 2.5)
    assert not out[channels:].any() and not got_sums[channels:].any()


def test_extreme_values_and_lanes_past_the_weights():
    # every product -128 * -128 over a 7x7 window, pad -128 included; lanes 3..15 of the
    # atom hold garbage that must not leak into the 3 channels with weights
    x = np.full((3, 5, 6), -128, np.int8)
    atoms = ref_layouts.nchw_to_nc1hwc2(x, 16)
    atoms[0, :, :, 3:] = 77
    w = np.full((3, 1, 7, 7), -128, np.int8)
    geometry = ConvGeometry(7, 7, 5, 6, pad_top=3, pad_left=3, groups=3)
    out, sums = depthwise_int8_atoms(atoms, w, geometry, -128, 0, nm.ROUND_HALF_AWAY, 32)
    assert out.shape == (5 * 6, 32)
    assert np.all(out[:, :3] == 49 * 16384) and np.all(sums[:3] == 49 * -128)
    assert not out[:, 3:].any()


def test_rejects_inputs_it_cannot_handle():
    atoms = np.zeros((1, 2, 2, 16), np.int8)
    geometry = ConvGeometry(1, 1, 2, 2, groups=4)
    with pytest.raises(EmulationError, match="int8"):
        depthwise_int8_atoms(atoms.astype(np.int16), np.zeros((4, 1, 1, 1), np.int8), geometry,
                             0, 0, 0, 4)
    with pytest.raises(EmulationError, match="do not fit"):
        depthwise_int8_atoms(atoms, np.zeros((17, 1, 1, 1), np.int8), geometry, 0, 0, 0, 32)
    big = ConvGeometry(512, 256, 1, 1, groups=1)
    assert 512 * 256 >= MAX_EXACT_TAPS
    with pytest.raises(EmulationError, match="int32-exact"):
        depthwise_int8_atoms(np.zeros((1, 512, 256, 16), np.int8),
                             np.zeros((1, 1, 512, 256), np.int8), big, 0, 0, 0, 32)
