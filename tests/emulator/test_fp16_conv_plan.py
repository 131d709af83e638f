"""An fp16 CORE task's prepared convolution (kernels/conv_fp16_plan.py) and the depthwise kernel on the
atoms (kernels/depthwise_fp16.py, NUMERICS.md 36), bit for bit against the summation order NUMERICS.md
3.3 documents: the direct order (+0, then each product in (channel, ky, kx) order, one fp32 rounding
per add), which the gemm path follows too (gemm_fp32_seq). The references (tests/emulator/test_fp16_exact_order.py)
gather the windows with numpy slicing from padded planes built by tests/emulator/reference and never
call the emulator's kernels; the atoms come from tests/emulator/reference/layouts.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import ConvGeometry
from npuemu.emulator.kernels import conv_fp16_plan, depthwise_fp16
from npuemu.emulator.kernels.conv_fp16_plan import prepare_conv2d_fp16
from tests.emulator.reference.layouts import nchw_to_nc1hwc2
from tests.emulator.test_fp16_exact_order import (direct_reference, gemm_reference, padded_planes,
                                                  same_bits_or_both_nan, with_special_values)
from tests.emulator.test_kernels_mac import conv_cases


def read_only(array: np.ndarray) -> np.ndarray:
    array = array.copy()
    array.flags.writeable = False
    return array


def expected(x, w, geometry, pad_value, out_channels):
    """NUMERICS.md 3.3's order (the direct reference for at most 4 kernels a group, else the gemm one), then
    zero rows up to ``out_channels`` (kernels without weights, REGISTER_SEMANTICS 2.5)."""
    padded = padded_planes(x, geometry, pad_value)
    direct = w.shape[0] // geometry.groups <= 4
    with np.errstate(invalid="ignore", over="ignore"):
        sums = (direct_reference if direct else gemm_reference)(padded, w, geometry)
    result = np.zeros((out_channels,) + sums.shape[1:], np.float32)
    result[:w.shape[0]] = sums
    return result


def run_plan(x, w, geometry, pad_value, c2, out_channels, runs=2, own=True):
    """The plan's results of ``runs`` runs; ``own``: a small task's own arrays (else the thread's
    working buffers, shared with the other plans)."""
    atoms = nchw_to_nc1hwc2(x, c2)
    if x.shape[0] % c2:  # lanes past the channels hold NaN: never read into a result
        atoms[-1, :, :, x.shape[0] % c2:].view(np.uint16)[...] = 0x7E00
    kept, conv_fp16_plan._OWN_BYTES = conv_fp16_plan._OWN_BYTES, conv_fp16_plan._OWN_BYTES if own else 0
    try:
        plan = prepare_conv2d_fp16(atoms.shape, x.shape[0], read_only(w), geometry, pad_value, out_channels)
    finally:
        conv_fp16_plan._OWN_BYTES = kept
    assert plan is not None
    results = []
    for _ in range(runs):  # the second run reuses the working buffers
        with np.errstate(invalid="ignore", over="ignore"):
            results.append(plan(atoms).copy())
    return results


@settings(max_examples=80, deadline=None)
@given(conv_cases(values="fp16"), st.integers(0, 3), st.booleans(), st.integers(0, 2**31), st.booleans())
def test_prepared_convolution_follows_the_documented_order(case, extra, special, seed, own):
    x, w, geometry, c2, pad_value = case
    if special:  # -0, infinities, NaN, subnormals among the inputs
        x = with_special_values(x, seed)
    want = expected(x, w, geometry, pad_value, w.shape[0] + extra)
    for got in run_plan(x, w, geometry, pad_value, c2, w.shape[0] + extra, own=own):
        assert same_bits_or_both_nan(got, want)


@st.composite
def depthwise_cases(draw):
    channels = draw(st.integers(1, 40))
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    sy, sx, dy, dx = (draw(st.integers(1, 3)) for _ in range(4))
    height, width = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    pad_top, pad_left = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    out_h = (height + pad_top + draw(st.integers(0, 3)) - (kh - 1) * dy - 1) // sy + 1
    out_w = (width + pad_left + draw(st.integers(0, 3)) - (kw - 1) * dx - 1) // sx + 1
    out_h, out_w = max(out_h, 1), max(out_w, 1)  # (an output past the input reads the pad value)
    geometry = ConvGeometry(kh, kw, out_h, out_w, sy, sx, dy, dx, pad_top, pad_left, channels)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # values over many binades: a sum in another order shows in the bits
    x = (rng.standard_normal((channels, height, width)) * np.exp2(rng.integers(-10, 10, (channels, height, width))))
    w = rng.standard_normal((channels, 1, kh, kw)) * np.exp2(rng.integers(-6, 6, (channels, 1, kh, kw)))
    pad_value = float(np.float16(draw(st.sampled_from([0.0, -0.0, 1.5, -3.0, 65504.0]))))
    return x.astype(np.float16), w.astype(np.float16), geometry, pad_value


@settings(max_examples=120, deadline=None)
@given(depthwise_cases(), st.booleans(), st.integers(0, 2**31), st.booleans())
def test_depthwise_on_the_atoms_follows_the_direct_order(case, special, seed, own):
    x, w, geometry, pad_value = case
    if special:
        x = with_special_values(x, seed)
    want = expected(x, w, geometry, pad_value, x.shape[0])
    for got in run_plan(x, w, geometry, pad_value, 8, x.shape[0], own=own):
        assert same_bits_or_both_nan(got, want)


def test_signalling_nan_inputs_and_negative_zero_products():
    # a signalling-NaN input (fp16 0x7D01) yields NaN; products that are all -0 sum to +0 (0 + -0)
    x = np.zeros((9, 5, 6), np.float16)
    x.view(np.uint16)[3, 2, 2] = 0x7D01
    w = -np.ones((9, 1, 3, 3), np.float16)
    geometry = ConvGeometry(3, 3, 5, 6, pad_top=1, pad_left=1, groups=9)
    got = run_plan(x, w, geometry, 0.0, 8, 9)[0]
    assert np.isnan(got[3, 1:4, 1:4]).all() and np.isnan(got).sum() == 9
    assert not np.signbit(got[~np.isnan(got)]).any()


def test_a_wide_map_and_the_long_tile_runs():
    # lines longer than depthwise_fp16.TILE (several runs of the repeated lane weights), stride 1 and 2,
    # in the thread's working buffers
    rng = np.random.default_rng(5)
    for stride in (1, 2):
        x = (rng.standard_normal((19, 23, 61)) * 8).astype(np.float16)
        w = rng.standard_normal((19, 1, 3, 3)).astype(np.float16)
        geometry = ConvGeometry(3, 3, (23 - 1) // stride + 1, (61 - 1) // stride + 1, stride, stride,
                                pad_top=1, pad_left=1, groups=19)
        assert depthwise_fp16.phase_layout(geometry)[2] * depthwise_fp16.LANES > 2 * depthwise_fp16.TILE
        got = run_plan(x, w, geometry, -1.0, 8, 24, own=False)[0]
        assert same_bits_or_both_nan(got, expected(x, w, geometry, -1.0, 24))


def test_plans_sharing_the_working_buffers_in_turn():
    # two tasks' plans (a depthwise and a 3x3 gemm) on the thread's working buffers, run in turn: each
    # run's result is its own task's (nothing left over from the other's run)
    rng = np.random.default_rng(7)
    cases = []
    for kernels, group_inputs, groups in ((21, 1, 21), (12, 21, 1)):
        x = (rng.standard_normal((21, 17, 40)) * 4).astype(np.float16)
        w = rng.standard_normal((kernels, group_inputs, 3, 3)).astype(np.float16)
        geometry = ConvGeometry(3, 3, 17, 40, pad_top=1, pad_left=1, groups=groups)
        kept, conv_fp16_plan._OWN_BYTES = conv_fp16_plan._OWN_BYTES, 0
        try:
            plan = prepare_conv2d_fp16((3, 17, 40, 8), 21, read_only(w), geometry, 0.5, kernels + 3)
        finally:
            conv_fp16_plan._OWN_BYTES = kept
        cases.append((plan, nchw_to_nc1hwc2(x, 8), expected(x, w, geometry, 0.5, kernels + 3)))
    for plan, atoms, want in cases + cases:
        assert same_bits_or_both_nan(plan(atoms), want)


def test_another_tap_order_is_caught():
    # the depthwise case drawn over many binades: (kx, ky) order instead of (ky, kx) changes bits,
    # so the comparisons above can fail
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((8, 9, 9)) * np.exp2(rng.integers(-10, 10, (8, 9, 9)))).astype(np.float16)
    w = (rng.standard_normal((8, 1, 3, 3)) * np.exp2(rng.integers(-6, 6, (8, 1, 3, 3)))).astype(np.float16)
    geometry = ConvGeometry(3, 3, 9, 9, pad_top=1, pad_left=1, groups=8)
    got = run_plan(x, w, geometry, 0.0, 8, 8)[0]
    transposed = expected(x.transpose(0, 2, 1).copy(), w.transpose(0, 1, 3, 2).copy(), geometry, 0.0, 8)
    assert not np.array_equal(got.view(np.uint32), transposed.transpose(0, 2, 1).view(np.uint32))
    assert same_bits_or_both_nan(got, expected(x, w, geometry, 0.0, 8))


def test_refused_operands_take_the_plain_calls():
    w = np.ones((4, 2, 3, 3), np.float16)
    geometry = ConvGeometry(3, 3, 4, 4, pad_top=1, pad_left=1)
    assert prepare_conv2d_fp16((1, 4, 4, 8), 2, w, geometry, 0.0, 4) is None  # writeable weights
    assert prepare_conv2d_fp16((1, 4, 4, 8), 3, read_only(w), geometry, 0.0, 4) is None  # 3 channels, 2 a kernel
    assert prepare_conv2d_fp16((1, 4, 4, 8), 2, read_only(w), geometry, 0.0, 3) is None  # more kernels than outputs
    assert prepare_conv2d_fp16((1, 4, 4, 8), 2, read_only(w.astype(np.float32)), geometry, 0.0, 4) is None


def test_the_float_widening_reads_every_fp16_pattern_exactly():
    # fp16.fp16_bits_to_float32_native (the depthwise kernel's widening) against float64 -> float32 of
    # numpy's own float16 values, every pattern; NaNs by their bits: the payload kept, quiet bit as given
    from numba import njit

    from npuemu.emulator.kernels.fp16 import fp16_bits_to_float32_native

    @njit
    def widen(bits, out):
        for i in range(bits.shape[0]):
            out[i] = fp16_bits_to_float32_native(bits[i])

    bits = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty(bits.size, np.float32)
    widen(bits, got)
    halves = bits.view(np.float16)
    finite = ~np.isnan(halves)
    exact = halves[finite].astype(np.float64).astype(np.float32)
    assert np.array_equal(got[finite].view(np.uint32), exact.view(np.uint32))
    nan_bits = bits[~finite].astype(np.uint32)
    want = ((nan_bits & 0x8000) << 16) | 0x7F800000 | ((nan_bits & 0x3FF) << 13)
    assert np.array_equal(got[~finite].view(np.uint32), want)
