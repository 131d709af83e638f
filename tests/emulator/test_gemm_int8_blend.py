"""The int8 conv passes of session 17 (NUMERICS.md 51) against references written here:

- the VNNI products' window sums blended into one ``vpdpbusd`` per quad (``gemm_int8._blend``,
  kernel counts a multiple of 16) - whole 1x1 and 3x3 convs against numpy int64;
- the padded operand copy on 4-byte words (``gemm_conv_int8._copy_padded``) against a numpy
  padding of the atoms;
- the depthwise padded input (``depthwise._pad_pixels``, ``_scatter_runs``) against numpy.

The VNNI products run only where the CPU has AVX-512 VNNI (elsewhere those tests skip)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import depthwise, gemm_conv_int8, gemm_int8
from npuemu.emulator.kernels.mac import ConvGeometry

vnni = pytest.mark.skipif(not gemm_int8.available(), reason="VNNI path off: float32 path only")
SETTINGS = settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])


def conv_reference(atoms: np.ndarray, weights: np.ndarray, geometry: ConvGeometry, pad_value: int,
                   out_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """int64 conv of atoms [S][H][W][C2] (channels = weights' C), the pad value outside: [P][out], sums [P]."""
    surfaces, height, width, c2 = atoms.shape
    kernels, channels, kernel_h, kernel_w = weights.shape
    planes = atoms.transpose(0, 3, 1, 2).reshape(surfaces * c2, height, width)[:channels].astype(np.int64)
    g = geometry
    big = np.full((channels, height + 2 * kernel_h + g.pad_top + g.out_h * g.stride_y,
                   width + 2 * kernel_w + g.pad_left + g.out_w * g.stride_x), pad_value, np.int64)
    big[:, g.pad_top:g.pad_top + height, g.pad_left:g.pad_left + width] = planes
    out = np.zeros((g.out_h * g.out_w, out_channels), np.int64)
    sums = np.zeros(g.out_h * g.out_w, np.int64)
    for oy in range(g.out_h):
        for ox in range(g.out_w):
            window = big[:, oy * g.stride_y:oy * g.stride_y + kernel_h, ox * g.stride_x:ox * g.stride_x + kernel_w]
            out[oy * g.out_w + ox, :kernels] = np.tensordot(weights.astype(np.int64), window, axes=3)
            sums[oy * g.out_w + ox] = window.sum()
    return out, sums


@st.composite
def blended_convs(draw):
    """Convs whose kernel count is a multiple of 16 (the window sums blended), 1x1 or 3x3."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    c2 = 16
    channels = draw(st.sampled_from([3, 16, 32, 40]) | st.integers(1, 48))
    surfaces = -(-channels // c2)
    kernels = 16 * draw(st.integers(1, 9))
    out_channels = kernels + draw(st.sampled_from([0, 0, 16, 32]))
    size = draw(st.integers(1, 3))
    pad = draw(st.integers(0, 1)) if size == 3 else 0
    stride = draw(st.integers(1, 2))
    height, width = draw(st.integers(size, 12)), draw(st.integers(size, 13))
    geometry = ConvGeometry(size, size, (height + 2 * pad - size) // stride + 1, (width + 2 * pad - size) // stride + 1,
                            stride, stride, 1, 1, pad, pad)
    values = np.array([-128, 127], np.int8) if draw(st.booleans()) else None
    shape = (surfaces * c2, height, width)
    planes = rng.choice(values, shape) if values is not None else rng.integers(-128, 128, shape, dtype=np.int8)
    # (the lanes past the channels hold whatever they hold: their weights and ones are 0)
    atoms = np.ascontiguousarray(planes.reshape(surfaces, c2, height, width).transpose(0, 2, 3, 1))
    weights = rng.integers(-128, 128, (kernels, channels, size, size), dtype=np.int8)
    if values is not None:
        weights = rng.choice(values, weights.shape)
    weights.flags.writeable = False
    pad_value = draw(st.sampled_from([0, -128, 127]) | st.integers(-128, 127))
    return atoms, weights, geometry, pad_value, out_channels


@vnni
@SETTINGS
@given(blended_convs())
def test_blended_window_sums_equal_int64_reference(case):
    atoms, weights, geometry, pad_value, out_channels = case
    channels = weights.shape[1]
    scratch = {}
    run = gemm_conv_int8.prepare(atoms.shape, channels, channels, weights, geometry, pad_value, 0, 0, out_channels,
                                 lambda name, size, dtype: scratch.setdefault(name, np.empty(size, dtype)))
    assert gemm_conv_int8.blends_window_sums(weights.shape[0], out_channels) == (out_channels == weights.shape[0])
    for _ in range(2):  # (a second run over the buffers the first left)
        out, sums = run(atoms)
        expected, expected_sums = conv_reference(atoms, weights, geometry, pad_value, out_channels)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(sums.reshape(-1), expected_sums)


def padded_reference(atoms: np.ndarray, surfaces: int, channels: int, real: int, pad_value: int, pad_top: int,
                     pad_left: int, padded_h: int, padded_w: int, lanes: int) -> np.ndarray:
    """int8 [surfaces][Hp][Wp][lanes]: lane l of surface s is channel s * C2 + l; inside the input the
    atom (0 from ``real`` on), outside the pad value (0 from ``channels`` on)."""
    c2 = atoms.shape[3]
    channel = np.arange(surfaces)[:, None] * c2 + np.arange(lanes)[None]  # [S][lanes]
    outside = np.where(channel < channels, pad_value, 0).astype(np.int8)
    result = np.broadcast_to(outside[:, None, None, :], (surfaces, padded_h, padded_w, lanes)).copy()
    height, width = atoms.shape[1:3]
    rows, cols = max(0, min(height, padded_h - pad_top)), max(0, min(width, padded_w - pad_left))
    inside = atoms[:surfaces, :rows, :cols, :lanes].copy()
    inside[np.broadcast_to((channel >= real)[:, None, None, :], inside.shape)] = 0
    result[:, pad_top:pad_top + rows, pad_left:pad_left + cols] = inside
    return result


@SETTINGS
@given(st.data())
def test_copy_padded_words_equal_numpy(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    c2 = data.draw(st.sampled_from([4, 8, 16, 32]))
    surfaces = data.draw(st.integers(1, 3))
    channels = data.draw(st.integers((surfaces - 1) * c2 + 1, surfaces * c2))
    lanes = -(-min(channels, c2) // 4) * 4
    real = data.draw(st.integers(1, channels))
    height, width = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 9))
    pad_top, pad_left = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 3))
    padded_h = data.draw(st.integers(1, height + pad_top + 2))
    padded_w = data.draw(st.integers(1, width + pad_left + 2))
    pad_value = data.draw(st.integers(-128, 127))
    atoms = rng.integers(-128, 128, (surfaces + data.draw(st.integers(0, 1)), height, width, c2), dtype=np.int8)
    padded = rng.integers(-128, 128, (surfaces, padded_h, padded_w, lanes), dtype=np.int8)  # stale contents
    gemm_conv_int8._copy_padded(atoms.view(np.uint32), surfaces, channels, real, pad_value, pad_top, pad_left,
                                padded.view(np.uint32))
    expected = padded_reference(atoms, surfaces, channels, real, pad_value, pad_top, pad_left, padded_h, padded_w,
                                lanes)
    np.testing.assert_array_equal(padded, expected)


@SETTINGS
@given(st.data())
def test_depthwise_padded_input_equals_numpy(data):
    # [S][H][W][C2] atoms -> [Hp][stride][Wp / stride][S * C2]: padded column X in phase X mod stride
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    c2 = data.draw(st.sampled_from([8, 16, 32]))
    surfaces = data.draw(st.integers(1, 5))
    height, width = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 40))
    stride = data.draw(st.integers(1, 3))
    pad_top, pad_left = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 3))
    padded_h = height + pad_top + data.draw(st.integers(0, 2))
    phase_w = -(-(width + pad_left + data.draw(st.integers(0, 3))) // stride)
    pad_value = data.draw(st.integers(-128, 127))
    atoms = rng.integers(-128, 128, (surfaces, height, width, c2), dtype=np.int8)
    phased = rng.integers(0, 2**63, (padded_h, stride, phase_w, surfaces * c2 // 8), dtype=np.uint64)
    word = np.uint64((pad_value & 0xFF) * 0x0101010101010101)
    depthwise._pad_pixels(atoms.view(np.uint64), word, phased, pad_top, pad_left)
    full = np.full((padded_h, phase_w * stride, surfaces * c2), pad_value, np.int8)
    full[pad_top:pad_top + height, pad_left:pad_left + width] = atoms.transpose(1, 2, 0, 3).reshape(height, width, -1)
    expected = full.reshape(padded_h, phase_w, stride, -1).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(phased.view(np.int8).reshape(expected.shape), expected)
