"""Review of the fp16 depthwise kernel and the feature fetch in registers (NUMERICS.md 49): every
buffer they touch sits against an inaccessible page, so a read or write past it (a vector load or
store of a whole 8-pixel block at a row's end, scratch used past ``scratch_sizes``) stops the process.

The operands (atoms with NaN in the unused lanes, signalling NaNs, subnormals) and the references
(numpy: +0 then the taps' products in (ky, kx) order; the binary16 -> binary32 bit formula) are the
ones of test_depthwise_fp16_rows.py, written there independently of the kernels.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import depthwise_fp16_rows, fetch_fp16
from npuemu.emulator.kernels.fp16 import widening_table
from tests.emulator.test_depthwise_fp16_rows import (
    SPECIAL, atoms, cases, needs_f16c, reference, same_bits_or_both_nan, widened_bits,
)

PAGE = mmap.PAGESIZE
_LIBC = ctypes.CDLL(None, use_errno=True)
_KEEP = []  # the mappings stay alive (and fenced) for the session


def fenced(shape: tuple, dtype, at_end: bool) -> np.ndarray:
    """A C-contiguous array whose last byte ends at an inaccessible page (``at_end``) or whose first
    byte follows one."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    data_pages = max(1, -(-nbytes // PAGE))
    mapping = mmap.mmap(-1, (data_pages + 2) * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    for page in (0, data_pages + 1):
        assert _LIBC.mprotect(ctypes.c_void_p(base + page * PAGE), PAGE, 0) == 0  # PROT_NONE
    _KEEP.append(mapping)
    offset = (data_pages + 1) * PAGE - nbytes if at_end else PAGE
    return np.frombuffer(mapping, dtype, int(np.prod(shape)), offset).reshape(shape)


def special_fp16(rng, shape, share=0.15):
    x = (rng.standard_normal(shape) * 4).astype(np.float16)
    bits = x.view(np.uint16).reshape(-1)
    where = rng.random(bits.size) < share
    bits[where] = rng.choice(SPECIAL, int(where.sum()))
    return x


@needs_f16c
@settings(max_examples=80, deadline=None)
@given(cases(), st.booleans(), st.integers(0, 2**32 - 1))
def test_depthwise_stays_inside_fenced_operands_and_exact_scratch(case, at_end, seed):
    channels, height, width, geometry, pad = case
    rng = np.random.default_rng(seed)
    x, w = special_fp16(rng, (channels, height, width)), special_fp16(rng, (channels, geometry.kernel_h, geometry.kernel_w))
    weights = depthwise_fp16_rows.lane_weights(w.astype(np.float32)[:, None])
    packed = atoms(x)
    bits16 = fenced(packed.shape, np.uint16, at_end)
    bits16[...] = packed
    rows_size, acc_size = depthwise_fp16_rows.scratch_sizes(geometry)
    rows, acc = fenced((rows_size,), np.float32, at_end), fenced((acc_size,), np.float32, at_end)
    rows[:], acc[:] = np.nan, np.nan
    out = fenced((channels, geometry.out_h, geometry.out_w), np.float32, not at_end)
    out[...] = np.nan
    depthwise_fp16_rows.depthwise_fp16_rows(bits16, weights, geometry, pad, out, rows, acc)
    assert same_bits_or_both_nan(out, reference(x, w, geometry, pad))


@needs_f16c
@settings(max_examples=80, deadline=None)
@given(st.integers(1, 27), st.integers(1, 12), st.integers(1, 40), st.integers(0, 2), st.integers(0, 2),
       st.booleans(), st.sampled_from([None, 1]), st.integers(0, 2**32 - 1))
def test_fetch_stays_inside_fenced_operands(channels, height, width, top, left, at_end, long_run, seed):
    rng = np.random.default_rng(seed)
    x = special_fp16(rng, (channels, height, width))
    padded_h, padded_w = top + height + int(rng.integers(-1, 2)), left + width + int(rng.integers(-1, 2))
    padded_h, padded_w = max(1, padded_h), max(1, padded_w)
    pad = np.float32(-1.5).view(np.uint32)
    want = np.full((channels, padded_h + height + 3, padded_w + width + 3), pad)
    want[:, top:top + height, left:left + width] = widened_bits(x.view(np.uint16))
    packed = atoms(x)
    bits16 = fenced(packed.shape, np.uint16, at_end)
    bits16[...] = packed
    got = fenced((channels, padded_h, padded_w), np.uint32, not at_end)
    got[...] = 0x7FC00001
    kept = fetch_fp16.LONG_RUN
    fetch_fp16.LONG_RUN = long_run or kept
    try:
        fetch_fp16.fetch_padded_half(bits16, channels, top, left, pad, got, widening_table())
    finally:
        fetch_fp16.LONG_RUN = kept
    assert np.array_equal(got, want[:, :padded_h, :padded_w])
