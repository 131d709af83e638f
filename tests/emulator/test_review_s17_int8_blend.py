"""Review of the int8 window sums blended into the VNNI products (NUMERICS.md 51): long reductions
(hundreds of input channels, 3x3 kernels) with the extreme bytes -128 / 127 everywhere, the pad value
at either extreme, and kernel counts around the 16-column blocks - the sums and products against the
int64 reference of test_gemm_int8_blend.py (written there, independent of the kernels), two runs over
the same buffers, and a third after the atoms changed in place (what the one-frame step re-gathers)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import gemm_conv_int8
from npuemu.emulator.kernels.mac import ConvGeometry
from tests.emulator.test_gemm_int8_blend import conv_reference, vnni


@st.composite
def long_convs(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    c2 = 32
    channels = draw(st.sampled_from([255, 256, 257, 300, 512, 520]))
    surfaces = -(-channels // c2)
    kernels = 16 * draw(st.integers(1, 6))
    out_channels = kernels + draw(st.sampled_from([0, 0, 16]))
    size = draw(st.sampled_from([1, 3]))
    pad = draw(st.integers(0, 1)) if size == 3 else 0
    height, width = draw(st.integers(size, 5)), draw(st.integers(size, 6))
    out_h, out_w = (height + 2 * pad - size) + 1, (width + 2 * pad - size) + 1
    geometry = ConvGeometry(size, size, out_h, out_w, 1, 1, 1, 1, pad, pad)
    extremes = np.array([-128, 127], np.int8)
    planes = rng.choice(extremes, (surfaces * c2, height, width)) if draw(st.booleans()) \
        else np.full((surfaces * c2, height, width), draw(st.sampled_from([-128, 127])), np.int8)
    atoms = np.ascontiguousarray(planes.reshape(surfaces, c2, height, width).transpose(0, 2, 3, 1))
    weights = rng.choice(extremes, (kernels, channels, size, size))
    weights.flags.writeable = False
    return atoms, weights, geometry, draw(st.sampled_from([-128, 127])), out_channels


@vnni
@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(long_convs(), st.integers(0, 2**32 - 1))
def test_long_reductions_of_extreme_bytes_equal_int64(case, seed):
    atoms, weights, geometry, pad_value, out_channels = case
    channels = weights.shape[1]
    scratch = {}
    run = gemm_conv_int8.prepare(atoms.shape, channels, channels, weights, geometry, pad_value, 0, 0, out_channels,
                                 lambda name, size, dtype: scratch.setdefault(name, np.empty(size, dtype)))
    for step in range(3):
        if step == 2:  # the atoms rewritten in place (a later run's input in the same buffer)
            atoms[...] = np.random.default_rng(seed).integers(-128, 128, atoms.shape, dtype=np.int8)
        out, sums = run(atoms)
        expected, expected_sums = conv_reference(atoms, weights, geometry, pad_value, out_channels)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(sums.reshape(-1), expected_sums)
