"""A prepared depthwise task (kernels/depthwise_plan.py) run again and again: a small layer keeps its
own padded-input, output and window-sum buffers between runs (issue 20), so every run must still give
the reference convolution and window sums of tests/emulator/reference for its own input - nothing
from the run before (lanes past the channels, outputs past the lanes) - for 3x3 and other kernels,
narrow and wide atoms, outputs as many as the lanes or more."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import depthwise_plan
from npuemu.emulator.kernels.depthwise_plan import prepare_depthwise_int8_atoms
from npuemu.emulator.kernels.mac import ConvGeometry
from tests.emulator.reference import arithmetic as ref_arith
from tests.emulator.reference import convolution as ref
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.test_kern_int8_passes import depthwise_case
from tests.emulator.test_kernels_mac import as_dict


def _expected(geometry, x, w, pad_value, truncate):
    padded = ref.padded_input(x, geometry.pad_top, geometry.pad_left, geometry.padded_h, geometry.padded_w,
                              pad_value, np.int64)
    exact = ref.conv(padded, w, as_dict(geometry))
    core = np.array([ref_arith.core(int(v), truncate, "half_away") for v in exact.ravel()]).reshape(exact.shape)
    return core, ref.window_sums(padded, as_dict(geometry))


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(3, 3), (5, 5), (1, 1), (2, 7), (1, 2)]), st.integers(1, 2),
       st.sampled_from([0, 3]), st.sampled_from([-128, 0, 9]), st.integers(1, 80), st.sampled_from([None, 0, 16]))
def test_every_run_gives_its_own_input_s_reference(seed, kernel, stride, truncate, pad_value, channels, extra):
    geometry, x, w = depthwise_case(seed, kernel, stride, 1, channels, max_height=5, max_width=7)
    out_channels = channels if extra is None else -(-channels // 16) * 16 + extra
    w.flags.writeable = False  # (as the CNA's unpacked weights)
    lanes = -(-channels // 16) * 16
    run = prepare_depthwise_int8_atoms((lanes // 16,) + x.shape[1:] + (16,), w, geometry, pad_value, truncate,
                                       nm.ROUND_HALF_AWAY, out_channels)
    rng = np.random.default_rng(seed + 1)
    for _ in range(3):  # a new input each run (the last run's values are still in the buffers)
        x = rng.integers(-128, 128, x.shape).astype(np.int8)
        atoms = ref_layouts.nchw_to_nc1hwc2(x, 16)
        atoms[-1, :, :, channels % 16 or 16:] = 77  # lanes past the channels: never data
        out, sums = run(atoms)
        core, window = _expected(geometry, x, w, pad_value, truncate)
        out = out.T.reshape((out_channels,) + core.shape[1:])
        assert np.array_equal(out[:channels], core) and not out[channels:].any()
        assert np.array_equal(sums[:channels], window) and not sums[channels:].any()


def test_a_wide_layer_with_outputs_past_its_lanes_keeps_their_zeros():
    """Too large for the small layers' buffers: only its outputs are its own (zeros past the lanes
    written once), over runs with new inputs."""
    geometry = ConvGeometry(3, 3, 40, 40, 1, 1, 1, 1, 1, 1, 12)  # (3x3, stride 1, padding 1: 40 x 40 out)
    x = np.zeros((12, 40, 40), np.int8)
    w = np.random.default_rng(3).integers(-128, 128, (12, 1, 3, 3)).astype(np.int8)
    w.flags.writeable = False
    run = prepare_depthwise_int8_atoms((1, 40, 40, 16), w, geometry, 0, 0, nm.ROUND_HALF_AWAY, 64)
    assert geometry.out_h * geometry.out_w * 64 * 2 > depthwise_plan.OWN_BUFFER_ELEMENTS
    rng = np.random.default_rng(4)
    for _ in range(2):
        x = rng.integers(-128, 128, x.shape).astype(np.int8)
        out, sums = run(ref_layouts.nchw_to_nc1hwc2(x, 16))
        core, window = _expected(geometry, x, w, 0, 0)
        out = out.T.reshape((64,) + core.shape[1:])
        assert np.array_equal(out[:12], core) and not out[12:].any()
        assert np.array_equal(sums[:12], window) and not sums[12:].any()
