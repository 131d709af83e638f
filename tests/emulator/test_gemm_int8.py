"""The AVX-512 VNNI int8 products (kernels/gemm_int8.py, gemm_conv_int8.py; NUMERICS.md 29)
against numpy int64 references written here: plain products over edge sizes and all-extreme
values, rows read in place through bases and runs, whole convolutions (padding, strides,
dilations, several surfaces, DATAIN_CHANNEL_REAL), and the float32 path they replace.

The kernel runs only where the CPU has AVX-512 VNNI; elsewhere the tests of its results skip
(the emulator keeps the float32 path there, checked by ``test_fallback_*``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import conv_pixels, gemm_conv_int8, gemm_int8
from npuemu.emulator.kernels.mac import ConvGeometry

vnni = pytest.mark.skipif(not gemm_int8.available(), reason="VNNI path off (CPU without AVX-512 VNNI, or NPUEMU_INT8_GEMM=0): float32 path only")
SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


def int8_arrays(draw, shape, extreme: bool) -> np.ndarray:
    """Random int8, or only -128 / 127 (the largest products and sums)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if extreme:
        return rng.choice(np.array([-128, 127], np.int8), size=shape)
    return rng.integers(-128, 128, shape, dtype=np.int8)


def packed_columns(weights: np.ndarray) -> np.ndarray:
    """int8 [N][K] -> the packing the kernel expects: w + 128, then a column of ones (row sums)."""
    shifted = (weights.astype(np.int16) + 128).astype(np.uint8)
    return gemm_int8.pack(np.concatenate([shifted, np.ones((1, weights.shape[1]), np.uint8)]))


def run_products(source: np.ndarray, bases: np.ndarray, segs: np.ndarray, quads: int, packed: np.ndarray,
                 rows: int) -> np.ndarray:
    padded = np.zeros(-(-rows // gemm_int8.MR) * gemm_int8.MR, np.int64)
    padded[:rows] = bases
    acc = np.empty((padded.size, packed.shape[0] * 16), np.int32)
    gemm_int8.products(source.reshape(-1), padded, segs.astype(np.int64), quads, packed, acc)
    return acc[:rows]


def check_products(acc: np.ndarray, a: np.ndarray, w: np.ndarray) -> None:
    """acc = A.W + 128 * rowsum(A) in columns < N, rowsum(A) in column N (int64 reference)."""
    a64, w64 = a.astype(np.int64), w.astype(np.int64)
    sums = a64.sum(axis=1)
    np.testing.assert_array_equal(acc[:, w.shape[0]], sums)
    np.testing.assert_array_equal(acc[:, :w.shape[0]].astype(np.int64) - 128 * sums[:, None], a64 @ w64.T)


@st.composite
def matrices(draw):
    rows = draw(st.sampled_from([1, 3, 4, 5, 7, 8, 49]) | st.integers(1, 70))
    reduction = 4 * draw(st.sampled_from([1, 2, 4, 40, 240]) | st.integers(1, 100))
    columns = draw(st.sampled_from([1, 15, 16, 17, 63, 64, 65, 96]) | st.integers(1, 150))
    extreme = draw(st.booleans())
    return int8_arrays(draw, (rows, reduction), extreme), int8_arrays(draw, (columns, reduction), extreme)


@vnni
@SETTINGS
@given(matrices())
def test_products_equal_int64_reference(case):
    a, w = case
    rows, reduction = a.shape
    acc = run_products(a, np.arange(rows) * reduction, np.zeros(1), reduction // 4, packed_columns(w), rows)
    check_products(acc, a, w)


@vnni
def test_products_extremes_of_longest_reduction():
    # the largest |sums|: every product 128 * 128 (or 127 * 128 with the +128 offset) over a long reduction
    for value in (-128, 127):
        a = np.full((5, 8192), value, np.int8)
        w = np.full((3, 8192), -128, np.int8)
        acc = run_products(a, np.arange(5) * 8192, np.zeros(1), 2048, packed_columns(w), 5)
        check_products(acc, a, w)


@vnni
@SETTINGS
@given(st.data())
def test_products_read_rows_in_place(data):
    # rows at arbitrary byte offsets, the reduction as several runs (the atoms' surfaces and taps)
    runs, quads = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6))
    rows, columns = data.draw(st.integers(1, 23)), data.draw(st.integers(1, 70))
    source = int8_arrays(data.draw, (4096,), data.draw(st.booleans()))
    segs = np.array(data.draw(st.lists(st.integers(0, 1024), min_size=runs, max_size=runs)))
    bases = np.array(data.draw(st.lists(st.integers(0, 3000), min_size=rows, max_size=rows)))
    w = int8_arrays(data.draw, (columns, runs * quads * 4), False)
    acc = run_products(source, bases, segs, quads, packed_columns(w), rows)
    a = np.stack([np.concatenate([source[b + s:b + s + 4 * quads] for s in segs]) for b in bases])
    check_products(acc, a, w)


def test_broken_variant_fails():
    # the checker catches a packing whose offset is 127, not the 128 the correction removes
    a = np.full((4, 8), 127, np.int8)
    w = np.full((2, 8), -128, np.int8)
    broken = np.concatenate([(w.astype(np.int16) + 127).astype(np.uint8), np.ones((1, 8), np.uint8)])
    acc = np.concatenate([(broken[:2].astype(np.int64) @ a.T.astype(np.int64)).T,
                          (broken[2:].astype(np.int64) @ a.T.astype(np.int64)).T], axis=1)
    with pytest.raises(AssertionError):
        check_products(acc, a, w)
    if gemm_int8.available():
        computed = run_products(a, np.arange(4) * 8, np.zeros(1), 2, gemm_int8.pack(broken), 4)
        with pytest.raises(AssertionError):
            check_products(computed, a, w)


def reference_conv(atoms, channels, real, weights, geometry, pad_value, out_channels):
    """int64 convolution of the first ``channels`` channels of atoms [C1][H][W][C2] (lanes from
    ``real`` on read 0 inside the input), the pad value outside: out [P][out_channels], sums."""
    c1, height, width, c2 = atoms.shape
    planes = atoms.transpose(0, 3, 1, 2).reshape(c1 * c2, height, width)[:channels].astype(np.int64)
    planes[real:] = 0
    g = geometry
    span_h = (g.out_h - 1) * g.stride_y + (g.kernel_h - 1) * g.dilation_y + 1
    span_w = (g.out_w - 1) * g.stride_x + (g.kernel_w - 1) * g.dilation_x + 1
    big = np.full((channels, span_h + height + g.pad_top, span_w + width + g.pad_left), pad_value, np.int64)
    big[:, g.pad_top:g.pad_top + height, g.pad_left:g.pad_left + width] = planes
    out = np.zeros((g.out_h * g.out_w, out_channels), np.int64)
    sums = np.zeros(g.out_h * g.out_w, np.int64)
    w64 = weights.astype(np.int64)
    for oy in range(g.out_h):
        for ox in range(g.out_w):
            y, x = oy * g.stride_y, ox * g.stride_x
            window = big[:, y:y + (g.kernel_h - 1) * g.dilation_y + 1:g.dilation_y,
                         x:x + (g.kernel_w - 1) * g.dilation_x + 1:g.dilation_x]
            out[oy * g.out_w + ox, :weights.shape[0]] = np.einsum("chw,mchw->m", window, w64)
            sums[oy * g.out_w + ox] = window.sum()
    return out, sums


@st.composite
def convolutions(draw):
    c2 = draw(st.sampled_from([4, 8, 16]))
    channels = draw(st.integers(1, 40))
    surfaces = -(-channels // c2) + draw(st.integers(0, 1))
    real = draw(st.sampled_from([channels, draw(st.integers(1, channels))]))
    kernel_h, kernel_w = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride_y, stride_x, dilation_y, dilation_x = (draw(st.integers(1, 2)) for _ in range(4))
    pad_top, pad_left = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    height, width = draw(st.integers(1, 11)), draw(st.integers(1, 11))
    out_h = max(1, (height + 2 * pad_top - (kernel_h - 1) * dilation_y - 1) // stride_y + 1)
    out_w = max(1, (width + 2 * pad_left - (kernel_w - 1) * dilation_x - 1) // stride_x + 1)
    geometry = ConvGeometry(kernel_h, kernel_w, out_h, out_w, stride_y, stride_x, dilation_y, dilation_x,
                            pad_top, pad_left)
    extreme = draw(st.booleans())
    atoms = int8_arrays(draw, (surfaces, height, width, c2), extreme)
    planes = atoms.transpose(0, 3, 1, 2).reshape(surfaces * c2, height, width)
    planes[real:] = 0  # DATAIN_CHANNEL_REAL: the lanes past the real channels hold 0
    atoms = np.ascontiguousarray(planes.reshape(surfaces, c2, height, width).transpose(0, 2, 3, 1))
    kernels = draw(st.integers(1, 70) | st.integers(60, 140))  # one or several column blocks
    weights = int8_arrays(draw, (kernels, channels, kernel_h, kernel_w), extreme)
    weights.flags.writeable = False
    pad = draw(st.sampled_from([-128, 127, 0]) | st.integers(-128, 127))
    return atoms, channels, real, weights, geometry, pad, kernels + draw(st.integers(0, 4) | st.integers(0, 40))


@vnni
@SETTINGS
@given(convolutions())
def test_conv_equals_int64_reference(case):
    atoms, channels, real, weights, geometry, pad, out_channels = case
    run = gemm_conv_int8.prepare(atoms.shape, channels, real, weights, geometry, pad, 0, 0, out_channels,
                                 lambda name, size, dtype: np.empty(size, dtype))
    out, sums = run(atoms)
    expected, expected_sums = reference_conv(atoms, channels, real, weights, geometry, pad, out_channels)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(sums.reshape(-1), expected_sums)


@vnni
@SETTINGS
@given(convolutions(), st.sampled_from([1, 5, 12]), st.sampled_from([0, 1]))
def test_conv_equals_float_path_with_shift(case, clip, mode):
    # CLIP_TRUNCATE and its rounding: the same CORE outputs as the float32 path it replaces
    atoms, channels, real, weights, geometry, pad, out_channels = case
    runs = []
    for enabled in ("0", "1"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("NPUEMU_INT8_GEMM", enabled)
            run = conv_pixels.prepare_conv_int8_pixels(atoms.shape, channels, real, weights, geometry, pad,
                                                       clip, mode, out_channels)
            runs.append([array.copy() for array in run(atoms)])
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def test_fallback_without_vnni(monkeypatch):
    # NPUEMU_INT8_GEMM=0 (as a CPU without VNNI): no VNNI run, the float32 path still exact
    monkeypatch.setenv("NPUEMU_INT8_GEMM", "0")
    assert not gemm_int8.available()
    rng = np.random.default_rng(3)
    atoms = rng.integers(-128, 128, (2, 5, 6, 8), dtype=np.int8)
    weights = rng.integers(-128, 128, (9, 16, 3, 3), dtype=np.int8)
    weights.flags.writeable = False
    geometry = ConvGeometry(3, 3, 5, 6, pad_top=1, pad_left=1)
    assert gemm_conv_int8.prepare(atoms.shape, 16, 16, weights, geometry, -3, 0, 0, 12, None) is None
    out, sums = conv_pixels.prepare_conv_int8_pixels(atoms.shape, 16, 16, weights, geometry, -3, 0, 0, 12)(atoms)
    expected, expected_sums = reference_conv(atoms, 16, 16, weights, geometry, -3, 12)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(sums.reshape(-1), expected_sums)


@vnni
def test_image_input_channels_past_real_on_the_border():
    # the image input: 3 real of 16 channels, 3x3 stride 2 with padding; the 13 others (0 inside
    # the input) enter only through the border pixels' pad value (NUMERICS.md 29)
    rng = np.random.default_rng(5)
    atoms = rng.integers(-128, 128, (1, 9, 10, 16), dtype=np.int8)
    atoms[..., 3:] = 0
    weights = rng.integers(-128, 128, (32, 16, 3, 3), dtype=np.int8)
    weights.flags.writeable = False
    geometry = ConvGeometry(3, 3, 5, 5, 2, 2, pad_top=1, pad_left=1)
    for pad in (-128, -5, 0, 127):
        run = gemm_conv_int8.prepare(atoms.shape, 16, 3, weights, geometry, pad, 0, 0, 32,
                                     lambda name, size, dtype: np.empty(size, dtype))
        out, sums = run(atoms)
        expected, expected_sums = reference_conv(atoms, 16, 3, weights, geometry, pad, 32)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(sums.reshape(-1), expected_sums)
