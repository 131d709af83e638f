"""Session 16's fp16 conv speed kernels (issue 20; NUMERICS.md 42): the im2col gather with its runs
located once a tap (``mac._im2col``), the gemm layouts (session 17: taps read in place, NUMERICS.md
47), the 1x1 depthwise scaling straight from the atoms
(``depthwise_fp16._scaled_atoms``), 5- and 7-wide depthwise kernel rows and 3x3 kernels in one
pass (``depthwise_fp16._add_taps5`` / ``_add_taps7`` / ``_add_taps9``) and the few-kernel 1x1 convolution on the atoms
(``pointwise_fp16.pointwise_fp16_atoms``). References here are written independently: windows and
columns by numpy slicing of padded planes, sums as +0 then one product at a time in the documented
order (NUMERICS.md 3.3: the direct order), each add rounded to float32 by numpy."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import ConvGeometry, depthwise_fp16, mac
from npuemu.emulator.kernels.conv_fp16_plan import prepare_conv2d_fp16
from npuemu.emulator.kernels.pointwise_fp16 import pointwise_fp16_atoms, takes
from tests.emulator.reference.layouts import nchw_to_nc1hwc2
from tests.emulator.test_fp16_exact_order import (direct_reference, gemm_reference, padded_planes,
                                                  same_bits_or_both_nan, with_special_values)


def reference_columns(padded, channel0, k0, k1, kh, kw, sy, sx, dy, dx, row0, row1, out_w):
    """Rows k0..k1 of the im2col matrix (k = (c - channel0, ky, kx)) over output rows row0..row1."""
    rows = []
    for k in range(k0, k1):
        c, tap = channel0 + k // (kh * kw), k % (kh * kw)
        ky, kx = divmod(tap, kw)
        window = padded[c, row0 * sy + ky * dy:(row1 - 1) * sy + ky * dy + 1:sy,
                        kx * dx:(out_w - 1) * sx + kx * dx + 1:sx]
        rows.append(window.reshape(-1))
    return np.array(rows, np.float32)


@st.composite
def gathers(draw):
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    sy, sx, dy, dx = (draw(st.integers(1, 4)) for _ in range(4))
    out_h, out_w = draw(st.integers(1, 9)), draw(st.integers(1, 70))
    channels = draw(st.integers(1, 6))
    grow_h, grow_w = draw(st.integers(0, 3)), draw(st.integers(0, 5))  # planes larger than needed
    padded_h = (out_h - 1) * sy + (kh - 1) * dy + 1 + grow_h
    padded_w = (out_w - 1) * sx + (kw - 1) * dx + 1 + grow_w
    taps = kh * kw
    channel0 = draw(st.integers(0, channels - 1))
    reduction = (channels - channel0) * taps
    k0 = draw(st.integers(0, reduction - 1))
    k1 = draw(st.integers(k0 + 1, reduction))
    row0 = draw(st.integers(0, out_h - 1))
    row1 = draw(st.integers(row0 + 1, out_h))
    seed = draw(st.integers(0, 2**32 - 1))
    return (kh, kw, sy, sx, dy, dx, out_h, out_w, channels, padded_h, padded_w, channel0, k0, k1, row0, row1, seed)


@settings(max_examples=150, deadline=None)
@given(gathers())
def test_the_gather_copies_the_windows(case):
    kh, kw, sy, sx, dy, dx, out_h, out_w, channels, padded_h, padded_w, channel0, k0, k1, row0, row1, seed = case
    padded = np.random.default_rng(seed).standard_normal((channels, padded_h, padded_w)).astype(np.float32)
    want = reference_columns(padded, channel0, k0, k1, kh, kw, sy, sx, dy, dx, row0, row1, out_w)
    width = (row1 - row0) * out_w + 3  # (a buffer wider than the block, as a layout's for the last block)
    columns = np.full((k1 - k0 + 2, width), np.float32(7.5))
    mac._im2col(padded, channel0, k0, k1, kh, kw, sy, sx, dy, dx, row0, row1, out_w, columns)
    assert np.array_equal(columns[:k1 - k0, :want.shape[1]], want)
    assert (columns[k1 - k0:] == 7.5).all()  # rows past the chunk untouched


def test_the_gemm_layout_reads_taps_in_place_and_gathers_only_strided_1x1_kernels():
    matrices = np.zeros((1, 4, 8 * 9), np.float32)
    strided = mac.gemm_layout(matrices, ConvGeometry(3, 3, 5, 6, 2, 2), (8, 11, 13))
    assert strided.taps and strided.phases == 8 * 2 * 2 * 6 * 7 and strided.pitch == 7 and strided.wide == (4, 35)
    # tap (ky, kx) = (1, 2) of channel 1: phase (1, 0), row 0, column 1
    assert strided.offsets[9 + 5] == (2 * 2 * 6 * 7 + (1 * 2 + 0) * 6 * 7 + 0 * 7 + 1) * 4
    plain = mac.gemm_layout(matrices, ConvGeometry(3, 3, 9, 11, dilation_x=1), (8, 11, 13))
    assert plain.taps and plain.phases is None and plain.pitch == 13 and plain.offsets[9 + 5] == (11 * 13 + 13 + 2) * 4
    pointwise = mac.gemm_layout(matrices[:, :, :8], ConvGeometry(1, 1, 11, 13), (8, 11, 13))
    assert pointwise.taps and pointwise.wide is None and pointwise.offsets[3] == 3 * 11 * 13 * 4
    gathered = mac.gemm_layout(matrices[:, :, :8], ConvGeometry(1, 1, 5, 6, 2, 2), (8, 9, 11))
    assert not gathered.taps and gathered.columns == (8, 30) and gathered.phases is None


def sequential_sums(x, w, out_h, out_w):
    """+0, then w[o][c] * x[c] for c in order, one float32 rounding an add (x [C][H][W] float16)."""
    values = x[:, :out_h, :out_w].astype(np.float32)
    acc = np.zeros((w.shape[0], out_h, out_w), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for c in range(x.shape[0]):
            acc = acc + w[:, c, 0, 0].astype(np.float32)[:, None, None] * values[c][None]
    return acc


def atoms_of(x):
    atoms = nchw_to_nc1hwc2(x, 8)
    if x.shape[0] % 8:  # lanes past the channels hold NaN: never read into a result
        atoms[-1, :, :, x.shape[0] % 8:].view(np.uint16)[...] = 0x7E00
    return atoms


@st.composite
def pointwise_cases(draw):
    channels, kernels = draw(st.integers(1, 30)), draw(st.integers(1, 4))
    height, width = draw(st.integers(1, 12)), draw(st.integers(1, 70))
    out_h, out_w = draw(st.integers(1, height)), draw(st.sampled_from([width, draw(st.integers(1, width))]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal((channels, height, width)) * np.exp2(rng.integers(-12, 12, (channels, height, width))))
    w = rng.standard_normal((kernels, channels, 1, 1)) * np.exp2(rng.integers(-8, 8, (kernels, channels, 1, 1)))
    return x.astype(np.float16), w.astype(np.float16), out_h, out_w


@settings(max_examples=120, deadline=None)
@given(pointwise_cases(), st.booleans(), st.integers(0, 2**31))
def test_the_pointwise_kernel_adds_the_channels_in_order(case, special, seed):
    x, w, out_h, out_w = case
    if special:  # -0, infinities, NaN, subnormals among the inputs
        x = with_special_values(x, seed)
    out = np.full((w.shape[0], out_h, out_w), np.float32(3.0))
    with np.errstate(invalid="ignore", over="ignore"):
        pointwise_fp16_atoms(atoms_of(x).view(np.uint16), w.reshape(w.shape[0], -1).astype(np.float32), x.shape[0],
                             out)
    assert same_bits_or_both_nan(out, sequential_sums(x, w, out_h, out_w))


def test_another_channel_order_is_caught():
    # sums over many binades: the reversed order gives other bits, which the comparison sees
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((24, 4, 40)) * np.exp2(rng.integers(-12, 12, (24, 4, 40)))).astype(np.float16)
    w = rng.standard_normal((1, 24, 1, 1)).astype(np.float16)
    out = np.empty((1, 4, 40), np.float32)
    pointwise_fp16_atoms(atoms_of(x).view(np.uint16), w.reshape(1, -1).astype(np.float32), 24, out)
    assert same_bits_or_both_nan(out, sequential_sums(x, w, 4, 40))
    assert not same_bits_or_both_nan(out, sequential_sums(x[::-1], w[:, ::-1], 4, 40))


def test_the_plan_takes_the_pointwise_kernel_where_it_applies():
    g = ConvGeometry(1, 1, 5, 7)
    assert takes((3, 5, 7, 8), 24, (2, 24, 1, 1), g)
    assert not takes((3, 5, 7, 16), 24, (2, 24, 1, 1), g)  # 16-lane atoms
    assert not takes((3, 5, 7, 8), 24, (2, 24, 1, 1), ConvGeometry(1, 1, 5, 7, pad_top=1))
    assert not takes((3, 5, 7, 8), 24, (2, 24, 1, 1), ConvGeometry(1, 1, 6, 7))  # past the input
    assert not takes((3, 5, 7, 8), 24, (2, 24, 1, 1), ConvGeometry(1, 1, 3, 4, 2, 2))
    assert not takes((3, 5, 7, 8), 24, (2, 12, 1, 1), ConvGeometry(1, 1, 5, 7, groups=2))


def read_only(array):
    array = array.copy()
    array.flags.writeable = False
    return array


@settings(max_examples=80, deadline=None)
@given(pointwise_cases(), st.booleans(), st.integers(0, 2**31))
def test_the_prepared_pointwise_and_depthwise_scalings(case, special, seed):
    # through prepare_conv2d_fp16: the few-kernel 1x1 convolution and a 1x1 depthwise kernel (+0 + w x:
    # a -0 product gives +0), zero rows past the kernels
    x, w, out_h, out_w = case
    if special:
        x = with_special_values(x, seed)
    atoms = atoms_of(x)
    geometry = ConvGeometry(1, 1, out_h, out_w)
    plan = prepare_conv2d_fp16(atoms.shape, x.shape[0], read_only(w), geometry, 1.5, w.shape[0] + 2)
    with np.errstate(invalid="ignore", over="ignore"):
        got = plan(atoms).copy()
    assert same_bits_or_both_nan(got[:w.shape[0]], sequential_sums(x, w, out_h, out_w))
    assert (got[w.shape[0]:] == 0).all()
    depthwise = np.random.default_rng(seed).standard_normal((x.shape[0], 1, 1, 1)).astype(np.float16)
    depthwise.reshape(-1)[::3] = -0.0  # -0 weights: products -0 or NaN
    geometry = ConvGeometry(1, 1, out_h, out_w, groups=x.shape[0])
    plan = prepare_conv2d_fp16(atoms.shape, x.shape[0], read_only(depthwise), geometry, 1.5, x.shape[0])
    with np.errstate(invalid="ignore", over="ignore"):
        got = plan(atoms).copy()
        want = np.float32(0) + depthwise.astype(np.float32).reshape(-1, 1, 1) * x[:, :out_h, :out_w].astype(np.float32)
    assert same_bits_or_both_nan(got, want)
    assert not np.signbit(got[(got == 0)]).any()


def test_five_and_seven_wide_rows_and_3x3_kernels_on_long_lines():
    # lines past depthwise_fp16._LONG_LINE take one pass a kernel row (_add_taps5 / _add_taps7), a 3x3
    # kernel one pass for its nine taps (_add_taps9): at
    # strides 1 and 2 and a dilation, against the exact-order reference of test_fp16_exact_order
    rng = np.random.default_rng(11)
    for kernel, stride, dilation in ((3, 1, 1), (3, 2, 1), (3, 2, 2), (5, 1, 1), (7, 1, 1), (5, 2, 1), (7, 1, 2),
                                     (5, 1, 2)):
        x = (rng.standard_normal((13, 30, 41)) * np.exp2(rng.integers(-8, 8, (13, 30, 41)))).astype(np.float16)
        w = (rng.standard_normal((13, 1, kernel, kernel)) * 4).astype(np.float16)
        reach = (kernel - 1) * dilation
        geometry = ConvGeometry(kernel, kernel, (30 + 4 - reach - 1) // stride + 1, (41 + 4 - reach - 1) // stride + 1,
                                stride, stride, dilation, dilation, 2, 2, 13)
        phase_rows, pitch, length = depthwise_fp16.phase_layout(geometry)
        assert length * depthwise_fp16.LANES >= depthwise_fp16._LONG_LINE
        plan = prepare_conv2d_fp16(atoms_of(x).shape, 13, read_only(w), geometry, -1.5, 13)
        got = plan(atoms_of(x)).copy()
        want = direct_reference(padded_planes(x, geometry, -1.5), w, geometry)
        assert same_bits_or_both_nan(got, want)


def test_the_single_product_of_a_small_pointwise_layer():
    # 1x1 convolutions read the planes in place (gemm_fp32_seq's products), 1100 channels past several
    # reduction blocks: the documented order, k after k from +0
    rng = np.random.default_rng(8)
    for channels, kernels, height, width in ((40, 40, 1, 40), (24, 9, 3, 17), (1100, 6, 2, 5)):
        x = (rng.standard_normal((channels, height, width)) * np.exp2(rng.integers(-8, 8, (channels, 1, 1))))
        x = with_special_values(x.astype(np.float16), 8)
        w = rng.standard_normal((kernels, channels, 1, 1)).astype(np.float16)
        geometry = ConvGeometry(1, 1, height, width)
        plan = prepare_conv2d_fp16(atoms_of(x).shape, channels, read_only(w), geometry, 0.0, kernels + 1)
        for _ in range(2):
            with np.errstate(invalid="ignore", over="ignore"):
                got = plan(atoms_of(x)).copy()
                want = gemm_reference(padded_planes(x, geometry, 0.0), w, geometry)
            assert same_bits_or_both_nan(got[:kernels], want) and (got[kernels:] == 0).all()
