"""Prepared int8 CORE kernels that keep the views of the feature array they were last handed
(issue 20, fixed cost per task: kernels/gemm_conv_int8.py ``prepare``'s ``run`` and
kernels/depthwise_direct.py ``runner``'s ``run`` keep the feature's flat / word view, and their own
buffers' views, while the same array comes back): a CNA step hands in its own feature array,
refilled each run. Every run must give the reference of what the array holds now - the same array
refilled in place, then another array, then the first one again - for small layers (buffers of
their own: the views kept) and, for the convolution, a layer past them (views made per run)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import gemm_conv_int8
from npuemu.emulator.kernels.conv_pixels import prepare_conv_int8_pixels
from npuemu.emulator.kernels.depthwise_plan import prepare_depthwise_int8_atoms
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.test_cna_conv_pixels import expected_outputs
from tests.emulator.test_depthwise_own_buffers import _expected as depthwise_expected
from tests.emulator.test_kern_int8_passes import depthwise_case
from tests.emulator.test_kernels_mac import conv_cases


def _inputs(rng, shape, count):
    return [rng.integers(-128, 128, shape).astype(np.int8) for _ in range(count)]


@settings(max_examples=40, deadline=None)
@given(conv_cases(kinds=("direct",)), st.integers(0, 3), st.integers(0, 2**32 - 1), st.booleans())
def test_a_prepared_convolution_reads_what_its_feature_array_holds_now(case, truncate, seed, large):
    x, w, geometry, c2, pad_value = case
    if c2 % 4:
        return  # (the VNNI path's atoms)
    channels = x.shape[0]
    w = w.copy()
    w.flags.writeable = False  # (as the CNA's unpacked weights)
    atoms = ref_layouts.nchw_to_nc1hwc2(x, c2)
    if large:  # (past the small layers' own buffers: the thread's scratch, views made per run)
        saved, gemm_conv_int8.OWN_BUFFER_ELEMENTS = gemm_conv_int8.OWN_BUFFER_ELEMENTS, 0
    try:
        run = prepare_conv_int8_pixels(atoms.shape, channels, channels, w, geometry, pad_value, truncate,
                                       nm.ROUND_HALF_AWAY, w.shape[0])
    finally:
        if large:
            gemm_conv_int8.OWN_BUFFER_ELEMENTS = saved
    if run is None:
        return
    rng = np.random.default_rng(seed)
    own, other = atoms.copy(), atoms.copy()
    for index, values in enumerate(_inputs(rng, x.shape, 4)):
        feature = other if index == 2 else own
        feature[...] = ref_layouts.nchw_to_nc1hwc2(values, c2)  # (refilled in place, as a CNA step's)
        out, sums = run(feature)
        core, window, _ = expected_outputs(values, w, geometry, pad_value, channels, truncate, False)
        assert np.array_equal(out.T.reshape(core.shape), core)
        assert np.array_equal(sums.reshape(window.shape), window)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(3, 3), (5, 5), (1, 1), (2, 7)]), st.integers(1, 2),
       st.sampled_from([0, 3]), st.sampled_from([-128, 0, 9]), st.integers(1, 48))
def test_a_prepared_depthwise_layer_reads_what_its_feature_array_holds_now(seed, kernel, stride, truncate, pad_value,
                                                                          channels):
    geometry, x, w = depthwise_case(seed, kernel, stride, 1, channels, max_height=5, max_width=7)
    w.flags.writeable = False
    lanes = -(-channels // 16) * 16
    shape = (lanes // 16,) + x.shape[1:] + (16,)
    run = prepare_depthwise_int8_atoms(shape, w, geometry, pad_value, truncate, nm.ROUND_HALF_AWAY, channels)
    rng = np.random.default_rng(seed + 1)
    own, other = np.zeros(shape, np.int8), np.zeros(shape, np.int8)
    for index, values in enumerate(_inputs(rng, x.shape, 4)):
        feature = other if index == 2 else own
        feature[...] = ref_layouts.nchw_to_nc1hwc2(values, 16)
        out, sums = run(feature)
        core, window = depthwise_expected(geometry, values, w, pad_value, truncate)
        assert np.array_equal(out.T.reshape((channels,) + core.shape[1:]), core)
        assert np.array_equal(sums[:channels], window)
