"""int8 depthwise rows on AVX-512 VNNI (issue 20, kernels/depthwise_vnni.py) against an exact int64
depthwise written here: the row kernel on padded inputs of any phase layout (odd widths: the scalar
tail; strides, dilations, 1x1..7x7 kernels, -128 x -128 everywhere), and the task programs' prepared
form (kernels/depthwise_plan.py) from NCHW inputs with pads, on the VNNI path and on the fallback
(NPUEMU_INT8_GEMM=0); packing errors; broken packed weights are caught."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import depthwise_plan, depthwise_vnni
from npuemu.emulator.kernels.mac import ConvGeometry

KERNELS = [(1, 1), (3, 3), (5, 5), (7, 7), (2, 7), (1, 3), (3, 1), (4, 4), (7, 1)]


def _rows_reference(phased, weights, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y, starts):
    """int64 [OH * OW][L] products and window sums: tap (ky, kx) of output (oy, ox), lane c reads
    phased[oy * sy + ky * dy, phase_kx, ox + shift_kx, c] (``depthwise.padded_layout``'s layout)."""
    lanes = phased.shape[3]
    out = np.zeros((out_h, out_w, lanes), np.int64)
    sums = np.zeros((out_h, out_w, lanes), np.int64)
    for oy in range(out_h):
        for ox in range(out_w):
            for ky in range(kernel_h):
                for kx in range(kernel_w):
                    phase, shift = starts[kx]
                    x = phased[oy * stride_y + ky * dilation_y, phase, ox + shift].astype(np.int64)
                    out[oy, ox] += x * weights[ky * kernel_w + kx].astype(np.int64)
                    sums[oy, ox] += x
    return out.reshape(-1, lanes), sums.reshape(-1, lanes)


def _rows_case(seed, kernel, stride_x, stride_y, dilation_y, dilation_x, lanes, out_h, out_w, extreme):
    rng = np.random.default_rng(seed)
    kernel_h, kernel_w = kernel
    starts = np.array([divmod(kx * dilation_x, stride_x)[::-1] for kx in range(kernel_w)], np.int64)
    phase_w = out_w + int(starts[:, 1].max()) + int(rng.integers(0, 3))
    padded_h = (out_h - 1) * stride_y + (kernel_h - 1) * dilation_y + 1 + int(rng.integers(0, 2))
    if extreme:  # every product (-128) * (-128) = 2**14 and every input -128
        phased = np.full((padded_h, stride_x, phase_w, lanes), -128, np.int8)
        weights = np.full((kernel_h * kernel_w, lanes), -128, np.int16)
    else:
        phased = rng.integers(-128, 128, (padded_h, stride_x, phase_w, lanes)).astype(np.int8)
        weights = rng.integers(-128, 128, (kernel_h * kernel_w, lanes)).astype(np.int16)
        weights[:, rng.integers(0, lanes)] = 127
    return phased, weights, starts


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(KERNELS), st.integers(1, 2), st.integers(1, 2),
       st.integers(1, 2), st.integers(1, 2), st.sampled_from([8, 16, 24, 32, 40, 48, 64, 72, 96, 136, 192]),
       st.integers(1, 4), st.integers(1, 13), st.booleans())
def test_rows_match_the_exact_depthwise(seed, kernel, stride_x, stride_y, dilation_y, dilation_x, lanes, out_h,
                                        out_w, extreme):
    phased, weights, starts = _rows_case(seed, kernel, stride_x, stride_y, dilation_y, dilation_x, lanes, out_h,
                                         out_w, extreme)
    out = np.full((out_h * out_w, lanes), 12345, np.int32)
    sums = out.copy()
    depthwise_vnni.rows(phased, depthwise_vnni.pack(weights), weights, *kernel, out_h, out_w, stride_y, dilation_y,
                        starts, out, sums)
    expected, window = _rows_reference(phased, weights, *kernel, out_h, out_w, stride_y, dilation_y, starts)
    assert np.array_equal(out, expected) and np.array_equal(sums, window)


def test_the_largest_sums_are_exact():
    # 7x7 of (-128) x (-128) and of 127 x (-128): the extremes of the products, the window sums and
    # of the packed dot (w + 128 = 0 and 255) over 40 lanes (a scalar tail of 3 x 40 mod 64 elements)
    for value, weight in ((-128, -128), (-128, 127), (127, -128), (127, 127)):
        phased = np.full((7, 1, 9, 40), value, np.int8)
        weights = np.full((49, 40), weight, np.int16)
        starts = np.array([[0, kx] for kx in range(7)], np.int64)
        out, sums = np.zeros((3, 40), np.int32), np.zeros((3, 40), np.int32)
        depthwise_vnni.rows(phased, depthwise_vnni.pack(weights), weights, 7, 7, 1, 3, 1, 1, starts, out, sums)
        assert (out == 49 * value * weight).all() and (sums == 49 * value).all()


def _exact_depthwise(x, w, geometry, pad_value):
    """int64 outputs [C][OH][OW] and window sums of NCHW int8 ``x`` padded with ``pad_value``."""
    channels, height, width = x.shape
    kernel_h, kernel_w = geometry.kernel_h, geometry.kernel_w
    padded = np.full((channels, geometry.pad_top + height + kernel_h * geometry.dilation_y * 2 + 8,
                      geometry.pad_left + width + kernel_w * geometry.dilation_x * 2 + 8), pad_value, np.int64)
    padded[:, geometry.pad_top:geometry.pad_top + height, geometry.pad_left:geometry.pad_left + width] = x
    out = np.zeros((channels, geometry.out_h, geometry.out_w), np.int64)
    sums = np.zeros_like(out)
    for ky in range(kernel_h):
        for kx in range(kernel_w):
            y0, x0 = ky * geometry.dilation_y, kx * geometry.dilation_x
            window = padded[:, y0:y0 + geometry.out_h * geometry.stride_y:geometry.stride_y,
                            x0:x0 + geometry.out_w * geometry.stride_x:geometry.stride_x]
            out += window * w[:, 0, ky, kx].astype(np.int64)[:, None, None]
            sums += window
    return out, sums


def _core(values, shift):
    """The CORE stage (NUMERICS.md 3.7) of exact sums, written out: 34-bit saturation, then a
    right shift by ``shift`` rounding half away from zero, saturated to int32."""
    values = np.clip(values, -(2**33), 2**33 - 1)
    if shift:
        magnitude = (np.abs(values) + (1 << (shift - 1))) >> shift
        values = np.sign(values) * magnitude
    return np.clip(values, -(2**31), 2**31 - 1)


def _prepared_case(seed, kernel, stride, dilation, channels, extreme):
    rng = np.random.default_rng(seed)
    kernel_h, kernel_w = kernel
    height, width = int(rng.integers(kernel_h, kernel_h + 6)), int(rng.integers(kernel_w, kernel_w + 9))
    pad_top, pad_left = int(rng.integers(0, kernel_h)), int(rng.integers(0, kernel_w))
    out_h = (height + 2 * pad_top - (kernel_h - 1) * dilation - 1) // stride + 1
    out_w = (width + 2 * pad_left - (kernel_w - 1) * dilation - 1) // stride + 1
    geometry = ConvGeometry(kernel_h=kernel_h, kernel_w=kernel_w, stride_y=stride, stride_x=stride,
                            dilation_y=dilation, dilation_x=dilation, pad_top=pad_top, pad_left=pad_left,
                            out_h=max(out_h, 1), out_w=max(out_w, 1))
    if extreme:
        x = np.full((channels, height, width), -128, np.int8)
        w = np.full((channels, 1, kernel_h, kernel_w), -128, np.int8)
    else:
        x = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
        w = rng.integers(-128, 128, (channels, 1, kernel_h, kernel_w)).astype(np.int8)
    return geometry, x, w


def _atoms(x):
    """NCHW -> [C1][H][W][16] int8 atoms, lanes past the channels holding garbage (never data)."""
    channels, height, width = x.shape
    surfaces = -(-channels // 16)
    atoms = np.full((surfaces * 16, height, width), 77, np.int8)
    atoms[:channels] = x
    return np.ascontiguousarray(atoms.reshape(surfaces, 16, height, width).transpose(0, 2, 3, 1))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(KERNELS), st.integers(1, 2), st.integers(1, 2),
       st.integers(1, 80), st.sampled_from([None, 0, 16, 37]), st.sampled_from([0, 0, 2, 13]),
       st.sampled_from([-128, 127, 0, -9]), st.booleans(), st.sampled_from([True, False, False]))
def test_prepared_runs_match_the_exact_depthwise(seed, kernel, stride, dilation, channels, extra, truncate,
                                                  pad_value, fallback, extreme):
    """Outputs as many as the atoms' lanes (None) or more, on VNNI where the host has it and on the
    fallback kernels (NPUEMU_INT8_GEMM=0 when the task is prepared: no packed weights)."""
    geometry, x, w = _prepared_case(seed, kernel, stride, dilation, channels, extreme)
    lanes = -(-channels // 16) * 16
    out_channels = lanes if extra is None else lanes + extra
    w.flags.writeable = False  # (as the CNA's unpacked weights)
    atoms = _atoms(x)
    with pytest.MonkeyPatch.context() as patch:
        if fallback:
            patch.setenv("NPUEMU_INT8_GEMM", "0")
        run = depthwise_plan.prepare_depthwise_int8_atoms(atoms.shape, w, geometry, pad_value, truncate,
                                                          nm.ROUND_HALF_AWAY, out_channels)
    exact, window = _exact_depthwise(x, w, geometry, pad_value)
    for _ in range(2):  # (a second run over the buffers the first left)
        out, sums = run(atoms)
        out = out.T.reshape(out_channels, geometry.out_h, geometry.out_w)
        assert np.array_equal(out[:channels], _core(exact, truncate)) and not out[channels:].any()
        assert np.array_equal(sums[:channels], window) and not sums[channels:].any()


def test_the_fallback_packs_nothing(monkeypatch):
    w = np.ones((16, 1, 3, 3), np.int8)
    w.flags.writeable = False
    monkeypatch.setenv("NPUEMU_INT8_GEMM", "0")
    assert not depthwise_vnni.available() and depthwise_plan._packed(w, 16) is None
    monkeypatch.delenv("NPUEMU_INT8_GEMM")
    assert (depthwise_plan._packed(w, 16) is not None) == depthwise_vnni.available()


def test_pack_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="taps"):
        depthwise_vnni.pack(np.zeros((depthwise_vnni.MAX_TAPS + 1, 16), np.int16))
    with pytest.raises(ValueError, match="int8"):
        depthwise_vnni.pack(np.full((9, 16), 128, np.int16))


def test_pack_layout():
    # byte 4 j + b of vector v of quad q of chunk k: tap 4 q + b of element 64 k + 16 v + j, + 128
    weights = np.arange(5 * 24, dtype=np.int16).reshape(5, 24) % 200 - 100
    packed = depthwise_vnni.pack(weights)
    assert packed.shape == (3, 2, 4, 64) and packed.ctypes.data % 64 == 0 and not packed.flags.writeable
    for k, q, v, j, b in [(0, 0, 0, 0, 0), (2, 1, 3, 15, 0), (1, 0, 2, 7, 3), (2, 1, 1, 3, 2)]:
        tap, element = 4 * q + b, 64 * k + 16 * v + j
        expected = weights[tap, element % 24] + 128 if tap < 5 else 0
        assert packed[k, q, v, 4 * j + b] == expected


def test_broken_packed_weights_are_caught():
    # the harness itself: a packed byte changed (one weight of one lane off by one) must show
    phased, weights, starts = _rows_case(3, (3, 3), 1, 1, 1, 1, 32, 2, 5, False)
    packed = depthwise_vnni.pack(weights).copy()
    packed[0, 1, 2, 9] += 1
    out, sums = np.zeros((10, 32), np.int32), np.zeros((10, 32), np.int32)
    depthwise_vnni.rows(phased, packed, weights, 3, 3, 2, 5, 1, 1, starts, out, sums)
    expected, window = _rows_reference(phased, weights, 3, 3, 2, 5, 1, 1, starts)
    assert np.array_equal(sums, window) and not np.array_equal(out, expected)
