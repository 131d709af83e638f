"""The phase planes an fp16 one-call step makes straight from its atoms, its copy out of a wide result
(kernels/conv_fp16_step.py ``_atoms_to_phases``, ``_results``) and the padded planes' border of the fp16
fetch (kernels/fetch_fp16.py ``_border``, skipped where the planes have none; issue 20).

Against references written here in numpy: the padded planes (the pad value outside the input, every
element of the atoms widened by numpy's float16 -> float32 cast, the bits of the exact widening,
signalling NaNs included), then phase (py, px) of them row r, position q = padded[r SY + py, q SX + px]
with 0 past the padded planes; the wide result's first OW columns of each row, 0 in the rows past the
kernels. Strides drawn apart across and down, padded planes shorter or longer than the padded input.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import conv_fp16_step, depthwise_fp16_rows, fetch_fp16

pytestmark = pytest.mark.skipif(not depthwise_fp16_rows.available(), reason="needs F16C in Numba's target")

#: fp16 bit patterns the widening must keep exactly: zeros, subnormals, infinities, quiet and
#: signalling NaNs of either sign
SPECIAL = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFDFF, 0x7D00, 0x3C00],
                   np.uint16)


def reference_planes(bits16, channels, pad_top, pad_left, pad_bits, padded_h, padded_w):
    """float32 bits [C][Hp][Wp]: the pad value, the atoms' widened channels at (pad_top, pad_left)."""
    groups, height, width, lanes = bits16.shape
    planes = bits16.transpose(0, 3, 1, 2).reshape(groups * lanes, height, width)[:channels]
    wide = planes.view(np.float16).astype(np.float32).view(np.uint32)
    padded = np.full((channels, padded_h, padded_w), pad_bits, np.uint32)
    rows, cols = max(0, min(height, padded_h - pad_top)), max(0, min(width, padded_w - pad_left))
    padded[:, pad_top:pad_top + rows, pad_left:pad_left + cols] = wide[:, :rows, :cols]
    return padded


def reference_phases(bits16, channels, pad_top, pad_left, pad_bits, padded_h, padded_w, stride_y, stride_x, pitch):
    """float32 bits [C][SY][SX][rows pitch] of the phase planes, from the padded planes."""
    padded = reference_planes(bits16, channels, pad_top, pad_left, pad_bits, padded_h, padded_w)
    phase_rows = -(-padded_h // stride_y)
    out = np.zeros((channels, stride_y, stride_x, phase_rows, pitch), np.uint32)
    for py in range(stride_y):
        for px in range(stride_x):
            part = padded[:, py::stride_y, px::stride_x]
            out[:, py, px, :part.shape[1], :min(pitch, part.shape[2])] = part[:, :, :pitch]
    return out.reshape(channels, stride_y, stride_x, -1)


@st.composite
def phase_cases(draw):
    stride_y, stride_x = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    height, width = draw(st.integers(1, 9)), draw(st.integers(1, 11))
    pad_top, pad_left = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    # (padded planes past the input and its bottom / right pad, or cut short of it)
    padded_h = max(1, height + pad_top + draw(st.integers(-height, 3)))
    padded_w = max(1, width + pad_left + draw(st.integers(-width, 3)))
    channels = draw(st.integers(1, 20))
    groups = -(-channels // 8) + draw(st.integers(0, 1))
    return stride_y, stride_x, height, width, pad_top, pad_left, padded_h, padded_w, channels, groups, \
        draw(st.integers(0, 2**32 - 1))


def _operands(rng, groups, height, width):
    bits16 = rng.integers(0, 1 << 16, (groups, height, width, 8)).astype(np.uint16)
    special = rng.random(bits16.shape) < 0.2
    bits16[special] = rng.choice(SPECIAL, int(special.sum()))
    return bits16, np.uint32(rng.choice([0x3F800000, 0x00000000, 0x7FA00000, 0xFF800000]))


@settings(max_examples=200, deadline=None)
@given(phase_cases())
def test_phase_planes_from_the_atoms_equal_the_padded_planes_phases(case):
    stride_y, stride_x, height, width, pad_top, pad_left, padded_h, padded_w, channels, groups, seed = case
    rng = np.random.default_rng(seed)
    bits16, pad_bits = _operands(rng, groups, height, width)
    pitch = -(-padded_w // stride_x)
    phase_rows = -(-padded_h // stride_y)
    # (stale values everywhere first: the kernel writes every element)
    phases = rng.integers(0, 1 << 32, (channels, stride_y, stride_x, phase_rows * pitch), dtype=np.uint64)
    phases = phases.astype(np.uint32)
    conv_fp16_step._atoms_to_phases(bits16, pad_top, pad_left, pad_bits, padded_w, padded_h, pitch, phases)
    want = reference_phases(bits16, channels, pad_top, pad_left, pad_bits, padded_h, padded_w, stride_y, stride_x,
                            pitch)
    assert np.array_equal(phases, want)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.integers(0, 6), st.integers(1, 7), st.integers(1, 9), st.integers(0, 4),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_results_keep_each_rows_first_columns_and_zero_the_rest(kernels, extra, out_h, out_w, more, wide, seed):
    rng = np.random.default_rng(seed)
    pitch = out_w + more
    settings_ = np.zeros(conv_fp16_step.SETTINGS, np.int64)
    settings_[[conv_fp16_step.KERNELS, conv_fp16_step.WIDE, conv_fp16_step.OUT_H, conv_fp16_step.OUT_W,
               conv_fp16_step.PITCH]] = kernels, wide, out_h, out_w, pitch
    products = rng.standard_normal((kernels, out_h * pitch)).astype(np.float32)
    out = rng.standard_normal((kernels + extra, out_h * out_w)).astype(np.float32)  # (stale values)
    kept = out[:kernels].copy()
    conv_fp16_step._results(settings_, out, products)
    # (one output row: the step's products went straight into ``out``, nothing to copy)
    want = products.reshape(kernels, out_h, pitch)[:, :, :out_w].reshape(kernels, -1) if wide and out_h > 1 else kept
    assert np.array_equal(out[:kernels], want)
    assert (out[kernels:].view(np.uint32) == 0).all()


@settings(max_examples=200, deadline=None)
@given(phase_cases(), st.integers(0, 1))
def test_fetched_planes_have_the_pad_value_on_their_border_and_the_atoms_inside(case, long_run):
    _, _, height, width, pad_top, pad_left, padded_h, padded_w, channels, groups, seed = case
    rng = np.random.default_rng(seed)
    bits16, pad_bits = _operands(rng, groups, height, width)
    planes = rng.integers(0, 1 << 32, (channels, padded_h, padded_w), dtype=np.uint64).astype(np.uint32)  # (stale)
    table = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    # (long_run 1: whole groups through mac's vector loop where rows run back to back, else the transposes)
    fetch_fp16._fetch_atoms(bits16, channels, pad_top, pad_left, pad_bits, planes, table,
                            1 if long_run else fetch_fp16.LONG_RUN)
    assert np.array_equal(planes, reference_planes(bits16, channels, pad_top, pad_left, pad_bits, padded_h, padded_w))
