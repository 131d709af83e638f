"""Review of ``gemm_fp32_seq`` (session 17, NUMERICS.md 3.3 / 47): edges the kernel's own tests leave out.

- Masked column tails and the partial-sum reloads never touch memory outside the operands: B and the
  output sit in buffers that end (or start) at a page made inaccessible (``mprotect``), so a read or
  write past them stops the process. Shapes just around the tile (16 / 64 columns), chunk (512
  columns), reduction block (256) and row block (6) edges.
- The reference is written here: numpy, +0 then one product added a step, k = 0, 1, ..., each add
  rounded to float32.
- Operands the checked entry must refuse (int32 offsets read as int64 crashed the process) and K = 0
  (every sum is its +0; the kernel used to leave the output as it was).
- NaN results: which NaN comes out where two NaNs meet (x86 keeps one operand's sign and payload) is
  the compiled instruction's choice, so the micro-kernel (fused or not), the plain loops and the
  narrow form used to differ in NaN sign / payload bits; every path now stores a NaN sum as the
  canonical NaN 0x7FC00000 (NUMERICS.md 3.3; test_canonical_nan_sums.py: every fp16 CORE path, other
  targets in subprocesses, NaN-rich hypothesis cases). Everything else is compared bit for bit.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import gemm_fp32_seq

PAGE = mmap.PAGESIZE
_LIBC = ctypes.CDLL(None, use_errno=True)
_KEEP = []  # the mappings stay alive (and fenced) for the whole session: arrays may outlive a test


def fenced(count: int, at_end: bool) -> np.ndarray:
    """float32 [count] whose last element ends at an inaccessible page (``at_end``) or whose first
    element starts right after one."""
    data_pages = -(-count * 4 // PAGE)
    mapping = mmap.mmap(-1, (data_pages + 2) * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    for page in (0, data_pages + 1):
        assert _LIBC.mprotect(ctypes.c_void_p(base + page * PAGE), PAGE, 0) == 0  # PROT_NONE
    _KEEP.append(mapping)
    offset = (data_pages + 1) * PAGE - count * 4 if at_end else PAGE
    return np.frombuffer(mapping, np.float32, count, offset)


def fp16_values(rng, shape, special=True):
    values = (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, shape))).astype(np.float16)
    if special:
        where = rng.random(shape) < 0.05
        pool = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, 2.0**-24, -(2.0**-24), 65504], np.float16)
        values[where] = rng.choice(pool, int(where.sum()))
    return values.astype(np.float32)


def reference(a: np.ndarray, rows_of_b: np.ndarray) -> np.ndarray:
    acc = np.zeros((a.shape[0], rows_of_b.shape[1]), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(a.shape[1]):
            acc = acc + a[:, k:k + 1] * rows_of_b[k]
    return acc


def equal_bits_nan_as_nan(ours, want) -> bool:
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(ours), nan)
                and np.array_equal(ours[~nan].view(np.uint32), want[~nan].view(np.uint32)))


EDGE_ROWS = st.sampled_from([1, 5, 6, 7, 11, 12, 13])
EDGE_K = st.one_of(st.sampled_from([1, 2, 255, 256, 257, 512, 513]), st.integers(1, 40))
EDGE_N = st.one_of(st.sampled_from([1, 4, 5, 15, 16, 17, 31, 33, 47, 49, 63, 64, 65, 127, 511, 512, 513, 577]),
                   st.integers(1, 140))


@settings(max_examples=60, deadline=None)
@given(EDGE_ROWS, EDGE_K, EDGE_N, st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_tails_stay_inside_fenced_operands(rows, reduction, columns, b_at_end, narrow, seed):
    narrow = narrow and columns <= gemm_fp32_seq.NARROW
    rng = np.random.default_rng(seed)
    a = fp16_values(rng, (rows, reduction))
    b = fenced(reduction * columns, b_at_end)
    b[:] = fp16_values(rng, (reduction * columns,))
    out = fenced(rows * columns, not b_at_end).reshape(rows, columns)
    out[:] = np.float32(3.5)  # (the kernel must not read it before the first block's stores)
    with np.errstate(invalid="ignore", over="ignore"):
        gemm_fp32_seq.products(gemm_fp32_seq.pack(a, narrow), gemm_fp32_seq.row_offsets(reduction, columns),
                               b, 0, columns, out, rows)
    assert equal_bits_nan_as_nan(out, reference(a, b.reshape(reduction, columns)))


@settings(max_examples=25, deadline=None)
@given(EDGE_ROWS, EDGE_K, EDGE_N, st.integers(0, 2**32 - 1))
def test_every_path_gives_the_reference_bits_on_edge_shapes(rows, reduction, columns, seed):
    # micro-kernel, plain loops (NPUEMU_FP16_GEMM=0) and, for a few columns, the narrow form
    rng = np.random.default_rng(seed)
    a, b = fp16_values(rng, (rows, reduction)), fp16_values(rng, (reduction, columns))
    want = reference(a, b)
    offsets, packed = gemm_fp32_seq.row_offsets(reduction, columns), gemm_fp32_seq.pack(a)
    kernel, loops = np.empty((rows, columns), np.float32), np.empty((rows, columns), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        gemm_fp32_seq.products(packed, offsets, b, 0, columns, kernel, rows)
        gemm_fp32_seq.products_loops(packed, offsets, b.reshape(-1), 0, columns, loops, rows)
    assert equal_bits_nan_as_nan(kernel, want) and equal_bits_nan_as_nan(loops, want)
    if columns <= gemm_fp32_seq.NARROW:
        narrow = np.empty((rows, columns), np.float32)
        gemm_fp32_seq.products(gemm_fp32_seq.pack(a, True), offsets, b, 0, columns, narrow, rows)
        assert equal_bits_nan_as_nan(narrow, want)


def test_a_later_reduction_block_reloads_only_the_valid_columns():
    # K past one block: the second block reloads the partial sums from the output with masked loads;
    # a NaN right after the output (a row's neighbour) must not leak into it
    rng = np.random.default_rng(3)
    a, b = fp16_values(rng, (7, 300), False), fp16_values(rng, (300, 21), False)
    out = np.full((7, 24), np.nan, np.float32)
    gemm_fp32_seq.products(gemm_fp32_seq.pack(a), gemm_fp32_seq.row_offsets(300, 21), b, 0, 21, out[:, :21], 7)
    assert np.array_equal(out[:, :21].view(np.uint32), reference(a, b).view(np.uint32))
    assert np.isnan(out[:, 21:]).all()


def test_empty_reduction_gives_positive_zero_on_every_path():
    for narrow in (False, True):
        out = np.full((3, 2), np.float32(9))
        gemm_fp32_seq.products(gemm_fp32_seq.pack(np.ones((3, 0), np.float32), narrow),
                               gemm_fp32_seq.row_offsets(0, 2), np.ones((1, 2), np.float32), 0, 2, out, 3)
        assert (out.view(np.uint32) == 0).all()


def test_offsets_of_another_integer_type_are_refused():
    # the kernel reads the offsets as int64: int32 ones used to be read in pairs (a crash)
    a, b = np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    with pytest.raises(ValueError):
        gemm_fp32_seq.products(gemm_fp32_seq.pack(a), gemm_fp32_seq.row_offsets(4, 2).astype(np.int32), b, 0, 2,
                               np.empty((3, 2), np.float32), 3)
    with pytest.raises(ValueError):
        gemm_fp32_seq.products(gemm_fp32_seq.pack(a).astype(np.float64), gemm_fp32_seq.row_offsets(4, 2), b, 0, 2,
                               np.empty((3, 2), np.float32), 3)


def _quiet_nan(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


def _nan_meetings():
    # one output each where two NaNs of different sign / payload meet in one add
    positive, negative = _quiet_nan(0x7FC01234), _quiet_nan(0xFFC05678)
    ones, zeros = np.ones(3, np.float32), np.zeros(3, np.float32)
    return [
        (np.array([[positive, negative]], np.float32), np.stack([ones, ones])),  # NaN sum + NaN product
        (np.array([[positive, np.inf]], np.float32), np.stack([ones, zeros])),  # NaN sum + (inf x 0)
        (np.array([[np.inf, positive]], np.float32), np.stack([zeros, ones])),  # (inf x 0) sum + NaN product
        (np.array([[np.inf, -np.inf, positive]], np.float32), np.stack([ones, ones, ones])),  # inf - inf, NaN
        (np.array([[positive]], np.float32), np.full((1, 3), negative, np.float32)),  # NaN x NaN
    ]


def _nan_bits_of_every_path(a, b):
    rows, reduction, columns = a.shape[0], a.shape[1], b.shape[1]
    offsets = gemm_fp32_seq.row_offsets(reduction, columns)
    results = []
    for packed in (gemm_fp32_seq.pack(a), gemm_fp32_seq.pack(a, True)):
        out = np.empty((rows, columns), np.float32)
        with np.errstate(invalid="ignore"):
            gemm_fp32_seq.products(packed, offsets, b, 0, columns, out, rows)
        results.append(out.view(np.uint32).copy())
    loops = np.empty((rows, columns), np.float32)
    with np.errstate(invalid="ignore"):
        gemm_fp32_seq.products_loops(gemm_fp32_seq.pack(a), offsets, b.reshape(-1), 0, columns, loops, rows)
    results.append(loops.view(np.uint32))
    return results


def test_where_nans_meet_every_path_gives_a_nan():
    for a, b in _nan_meetings():
        for bits in _nan_bits_of_every_path(a, b):
            assert np.isnan(bits.view(np.float32)).all()


def test_where_nans_meet_every_path_gives_the_same_nan_bits():
    # micro-kernel, narrow form and plain loops on the same operands give the canonical NaN (the fp16
    # conversion keeps a NaN's sign and payload top, so these bits reach the output: 0x7E00); the
    # fmul + fadd build for another CPU: test_canonical_nan_sums.py's subprocesses
    for a, b in _nan_meetings():
        kernel, narrow, loops = _nan_bits_of_every_path(a, b)
        assert np.array_equal(kernel, loops) and np.array_equal(kernel, narrow)
        assert (kernel == 0x7FC00000).all()
