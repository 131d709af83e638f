"""The fp16 depthwise kernel with accumulators in registers (kernels/depthwise_fp16_rows.py) and the
feature fetch into planes (kernels/fetch_fp16.py; NUMERICS.md 49) bit for bit: the depthwise sums in the
order NUMERICS.md 3.3 / 36 documents (each output +0, then + w x for its taps in (ky, kx) order, one
fp32 rounding per add, on the exact float32 values of the fp16 inputs and the pad value outside the
input), the fetch as the exact widening (NUMERICS.md 7) of every pattern. The references below pad and
slice with numpy and widen with the bit formula; they never call the emulator's kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import ConvGeometry, depthwise_fp16_rows, fetch_fp16
from npuemu.emulator.kernels.fp16 import widening_table

#: the depthwise kernel needs F16C (elsewhere conv_fp16_plan keeps depthwise_fp16; the fetch falls back itself)
needs_f16c = pytest.mark.skipif(not depthwise_fp16_rows.available(), reason="needs F16C")

SPECIAL = np.array([0x8000, 0x0000, 0x7C00, 0xFC00, 0x7E00, 0x7D01, 0xFD55, 0x0001, 0x83FF, 0x0400, 0x7BFF],
                   np.uint16)  # -0, +0, +-inf, quiet and signalling NaNs, subnormals, the smallest normal, max


def reference(x: np.ndarray, w: np.ndarray, geometry: ConvGeometry, pad: float) -> np.ndarray:
    """float32 [C][OH][OW] of fp16 x [C][H][W] and fp16 w [C][KH][KW]: +0, then each tap's product
    in (ky, kx) order, one float32 rounding per add (numpy float32 arithmetic)."""
    channels, height, width = x.shape
    g = geometry
    rows = (g.out_h - 1) * g.stride_y + (g.kernel_h - 1) * g.dilation_y + 1
    columns = (g.out_w - 1) * g.stride_x + (g.kernel_w - 1) * g.dilation_x + 1
    padded = np.full((channels, max(rows, g.pad_top + height), max(columns, g.pad_left + width)), np.float32(pad))
    padded[:, g.pad_top:g.pad_top + height, g.pad_left:g.pad_left + width] = x.astype(np.float32)
    acc = np.zeros((channels, g.out_h, g.out_w), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for ky in range(g.kernel_h):
            for kx in range(g.kernel_w):
                y0, x0 = ky * g.dilation_y, kx * g.dilation_x
                window = padded[:, y0:y0 + (g.out_h - 1) * g.stride_y + 1:g.stride_y,
                                x0:x0 + (g.out_w - 1) * g.stride_x + 1:g.stride_x]
                acc = acc + w[:, ky, kx].astype(np.float32)[:, None, None] * window
    return acc


def same_bits_or_both_nan(ours: np.ndarray, theirs: np.ndarray) -> bool:
    nan = np.isnan(theirs)
    return bool(np.array_equal(np.isnan(ours), nan)
                and np.array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32)))


def atoms(x: np.ndarray) -> np.ndarray:
    """fp16 [C][H][W] -> uint16 atoms [C1][H][W][8]; lanes past the channels hold NaN (never read into
    a result)."""
    channels, height, width = x.shape
    groups = -(-channels // 8)
    lanes = np.full((groups * 8, height, width), 0x7E00, np.uint16)
    lanes[:channels] = x.view(np.uint16)
    return np.ascontiguousarray(lanes.reshape(groups, 8, height, width).transpose(0, 2, 3, 1))


def run(x, w, geometry, pad, contiguous=True):
    weights = depthwise_fp16_rows.lane_weights(w.astype(np.float32)[:, None])
    sizes = depthwise_fp16_rows.scratch_sizes(geometry)
    rows = np.full(sizes[0] + 5, np.nan, np.float32)
    acc = np.full(sizes[1] + 3, np.nan, np.float32)
    shape = (x.shape[0], geometry.out_h, geometry.out_w)
    out = np.full(shape, np.nan, np.float32) if contiguous else np.full(shape[::-1], np.nan, np.float32).T
    depthwise_fp16_rows.depthwise_fp16_rows(atoms(x), weights, geometry, pad, out, rows, acc)
    return out


@st.composite
def cases(draw):
    kernel_h, kernel_w = draw(st.sampled_from([1, 2, 3, 5, 7])), draw(st.sampled_from([1, 2, 3, 5, 7]))
    stride_y, stride_x = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2, 3]))
    dilation_y, dilation_x = draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2]))
    pad_top, pad_left = draw(st.integers(0, kernel_h - 1)), draw(st.integers(0, kernel_w - 1))
    height, width = draw(st.integers(1, 24)), draw(st.integers(1, 40))
    reach_y = (kernel_h - 1) * dilation_y + 1
    reach_x = (kernel_w - 1) * dilation_x + 1
    out_h = max(1, (height + 2 * pad_top - reach_y) // stride_y + 1)
    out_w = max(1, (width + 2 * pad_left - reach_x) // stride_x + 1)
    channels = draw(st.integers(1, 27))
    geometry = ConvGeometry(kernel_h, kernel_w, out_h, out_w, stride_y, stride_x, dilation_y, dilation_x,
                            pad_top, pad_left, channels)
    pad = draw(st.sampled_from([0.0, 0.0, -0.0, 1.5, -3.25]))
    return channels, height, width, geometry, pad


@needs_f16c
@settings(max_examples=150, deadline=None)
@given(cases(), st.sampled_from(["auto", "rows", "map"]), st.booleans(), st.booleans(), st.integers(0, 2**31))
def test_depthwise_rows_follow_the_documented_order(case, mode, special, contiguous, seed):
    channels, height, width, geometry, pad = case
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((channels, height, width)) * 4).astype(np.float16)
    w = rng.standard_normal((channels, geometry.kernel_h, geometry.kernel_w)).astype(np.float16)
    if special:  # -0, infinities, NaNs (signalling too), subnormals among the inputs and the weights
        for array, share in ((x, 0.15), (w, 0.1)):
            bits = array.view(np.uint16).reshape(-1)
            where = rng.random(bits.size) < share
            bits[where] = rng.choice(SPECIAL, int(where.sum()))
    # "rows": every map a row at a time and every 1x1 run by the scaling loop; "map": the reverse
    kept = depthwise_fp16_rows.MAP_BYTES, depthwise_fp16_rows._LONG_SCALING
    depthwise_fp16_rows.MAP_BYTES, depthwise_fp16_rows._LONG_SCALING = {
        "auto": kept, "rows": (-1, 1), "map": (1 << 40, 1 << 40)}[mode]
    try:
        got = run(x, w, geometry, pad, contiguous)
    finally:
        depthwise_fp16_rows.MAP_BYTES, depthwise_fp16_rows._LONG_SCALING = kept
    assert same_bits_or_both_nan(got, reference(x, w, geometry, pad))


@needs_f16c
@pytest.mark.parametrize("mode", ["rows", "map"])
@pytest.mark.parametrize("kernel", [3, 1])
def test_negative_zero_products_sum_to_positive_zero_and_order_matters(mode, kernel):
    # all products -0: +0 + -0 = +0 (no product taken as the start; a 1x1 kernel too); and sums whose
    # rounding depends on the order: the reversed order gives other bits, the kernel the documented ones
    pad = kernel // 2
    geometry = ConvGeometry(kernel, kernel, 6, 9, 1, 1, 1, 1, pad, pad, 11)
    x = np.full((11, 6, 9), -0.0, np.float16)
    w = np.ones((11, kernel, kernel), np.float16)
    kept = depthwise_fp16_rows.MAP_BYTES, depthwise_fp16_rows._LONG_SCALING
    depthwise_fp16_rows.MAP_BYTES, depthwise_fp16_rows._LONG_SCALING = (-1, 1) if mode == "rows" else (1 << 40,) * 2
    try:
        zero = run(x, w, geometry, 0.0)
        assert (zero.view(np.uint32) == 0).all()
        rng = np.random.default_rng(5)
        x = (rng.standard_normal((11, 6, 9)) * np.exp2(rng.integers(-12, 12, (11, 6, 9)))).astype(np.float16)
        w = rng.standard_normal((11, kernel, kernel)).astype(np.float16)
        got = run(x, w, geometry, 0.0)
    finally:
        depthwise_fp16_rows.MAP_BYTES, depthwise_fp16_rows._LONG_SCALING = kept
    want = reference(x, w, geometry, 0.0)
    assert same_bits_or_both_nan(got, want)
    if kernel > 1:
        reversed_order = reference(x[:, ::-1, ::-1].copy(), w[:, ::-1, ::-1].copy(), geometry, 0.0)[:, ::-1, ::-1]
        assert not same_bits_or_both_nan(got, reversed_order)


def test_fp16_products_are_exact_in_fp32():
    # why a fused multiply-add gives the bits of multiply then add (NUMERICS.md 49): every fp16 x fp16
    # product is exact in float32 (11-bit significands), checked against float64 on all finite pairs of
    # a random sample and all subnormal x extreme pairs
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 16, 200_000, dtype=np.uint64).astype(np.uint16)
    edges = np.concatenate([np.arange(0, 0x400, dtype=np.uint16), np.array([0x7BFF, 0x0400, 0xFBFF], np.uint16)])
    a = np.concatenate([bits.view(np.float16), np.repeat(edges.view(np.float16), 3)])
    b = np.concatenate([bits[::-1].view(np.float16), np.tile(np.array([0x7BFF, 0x0400, 0x3C00], np.uint16)
                                                             .view(np.float16), edges.size)])
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]
    with np.errstate(over="ignore"):
        single = a.astype(np.float32) * b.astype(np.float32)
    double = a.astype(np.float64) * b.astype(np.float64)
    assert np.array_equal(single.astype(np.float64), double)


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 27), st.integers(1, 20), st.integers(1, 70), st.integers(0, 2), st.integers(0, 2),
       st.integers(0, 3), st.integers(0, 3), st.sampled_from([0.0, -0.0, 2.5]), st.booleans(),
       st.sampled_from([None, 1]), st.integers(0, 2**31))
def test_fetch_into_planes_widens_exactly(channels, height, width, top, left, extra_h, extra_w, pad, special,
                                          long_run, seed):
    # fetch_fp16: the atoms' exact float32 values in [C][Hp][Wp] planes, the pad value on the border and
    # past the input (also with the planes cut short of the input); long_run=1: every run by mac's loop
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((channels, height, width)) * 8).astype(np.float16)
    if special:
        bits = x.view(np.uint16).reshape(-1)
        where = rng.random(bits.size) < 0.2
        bits[where] = rng.choice(SPECIAL, int(where.sum()))
    padded_h = max(1, top + height + extra_h - 2)
    padded_w = max(1, left + width + extra_w - 2)
    want = np.full((channels, padded_h + height + 3, padded_w + width + 3), np.float32(pad).view(np.uint32))
    want[:, top:top + height, left:left + width] = widened_bits(x.view(np.uint16))
    want = want[:, :padded_h, :padded_w]
    got = np.full((channels, padded_h, padded_w), 0x7FC00001, np.uint32)
    kept = fetch_fp16.LONG_RUN
    fetch_fp16.LONG_RUN = long_run or kept
    try:
        fetch_fp16.fetch_padded_half(atoms(x), channels, top, left, np.float32(pad).view(np.uint32), got,
                                     widening_table())
    finally:
        fetch_fp16.LONG_RUN = kept
    assert np.array_equal(got, want)  # every bit, NaN payloads and signalling NaNs' clear quiet bit too


def widened_bits(half: np.ndarray) -> np.ndarray:
    """The exact float32 bits of fp16 bits (IEEE 754 binary16 -> binary32, a NaN's payload kept as is)."""
    half = half.astype(np.uint32)
    sign, exponent, fraction = (half & 0x8000) << 16, (half >> 10) & 0x1F, half & 0x3FF
    normal = ((exponent + 112) << 23) | (fraction << 13)
    subnormal = (fraction.astype(np.float32) * np.float32(2.0**-24)).view(np.uint32)  # exact: 10 bits
    special = 0x7F800000 | (fraction << 13)
    return sign | np.where(exponent == 31, special, np.where(exponent == 0, subnormal, normal)).astype(np.uint32)
