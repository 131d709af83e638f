"""``gemm_fp32_seq``: float32 products summed k after k from +0 (NUMERICS.md 3.3, 47), bit for bit.

The reference here is written independently of the kernel: numpy, one reduction row at a time, each
add rounded to float32 (``acc = acc + a[:, k] * b[k]``; the product of two fp16 values is exact in
float32). Shapes cover row tails (M not a multiple of the micro-kernel's rows), column tails (masked
vectors), the narrow form (a few columns), K = 1 and reductions past several reduction blocks; values
include -0, infinities, NaN, subnormal fp16 and values over many binades (so that another order shows
in the bits). B's rows are read at arbitrary byte offsets (the taps of a convolution overlap).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import gemm_fp32_seq
from npuemu.emulator.kernels.fp16_atoms_ir import halves_native

SPECIAL = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, 2.0**-24, -(2.0**-14) * 0.5, 65504, -65504], np.float16)


def fp16_values(rng: np.random.Generator, shape: tuple, special: bool) -> np.ndarray:
    """fp16 values (as float32) spread over many binades; with ``special`` some -0/inf/NaN/subnormals."""
    values = (rng.standard_normal(shape) * np.exp2(rng.integers(-10, 10, shape))).astype(np.float16)
    if special:
        where = rng.random(shape) < 0.08
        values[where] = rng.choice(SPECIAL, int(where.sum()))
    return values.astype(np.float32)


def sequential(a: np.ndarray, rows_of_b: np.ndarray) -> np.ndarray:
    """+0, then a[:, k] * B[k] for k = 0, 1, ..., one float32 rounding an add."""
    acc = np.zeros((a.shape[0], rows_of_b.shape[1]), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(a.shape[1]):
            acc = acc + a[:, k:k + 1] * rows_of_b[k]
    return acc


def same_bits(ours: np.ndarray, theirs: np.ndarray) -> bool:
    nan = np.isnan(theirs)
    return bool(np.array_equal(np.isnan(ours), nan) and np.array_equal(ours[~nan].view(np.uint32),
                                                                        theirs[~nan].view(np.uint32)))


@st.composite
def cases(draw):
    rows = draw(st.one_of(st.integers(1, 14), st.integers(15, 40)))
    reduction = draw(st.one_of(st.just(1), st.integers(2, 40), st.integers(250, 700)))
    columns = draw(st.one_of(st.integers(1, 5), st.integers(6, 70), st.integers(120, 560)))
    return rows, reduction, columns, draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 2**32 - 1))


def run_case(rows, reduction, columns, special, overlapping, seed, narrow=False):
    rng = np.random.default_rng(seed)
    a = fp16_values(rng, (rows, reduction), special)
    if overlapping:  # rows of B anywhere in one buffer, overlapping and out of order (as taps read)
        flat = fp16_values(rng, (3 * columns + 2 * reduction + 5,), special)
        starts = rng.integers(0, flat.size - columns + 1, reduction)
        buffer, offsets, first = flat, starts.astype(np.int64) * 4, 0
    else:  # a [K][pitch] buffer, B starting a few columns in
        pitch, first = columns + int(rng.integers(0, 4)), int(rng.integers(0, 3))
        buffer = fp16_values(rng, (reduction, pitch + first), special).reshape(-1)
        offsets = np.arange(reduction, dtype=np.int64) * (pitch + first) * 4
        starts = np.arange(reduction) * (pitch + first) + first
    rows_of_b = np.stack([buffer[s:s + columns] for s in starts])
    out = np.full((rows, columns + 3), np.float32(7.25))  # a strided target: its last 3 columns untouched
    with np.errstate(invalid="ignore", over="ignore"):
        gemm_fp32_seq.products(gemm_fp32_seq.pack(a, narrow), offsets, buffer, first * 4, columns, out[:, :columns],
                               rows)
    return out, sequential(a, rows_of_b)


@settings(max_examples=120, deadline=None)
@given(cases())
def test_products_sum_in_order(case):
    out, want = run_case(*case)
    assert same_bits(out[:, :-3], want) and (out[:, -3:] == 7.25).all()


@settings(max_examples=40, deadline=None)
@given(cases())
def test_the_narrow_form_sums_in_the_same_order(case):
    rows, reduction, columns, special, overlapping, seed = case
    out, want = run_case(rows, reduction, min(columns, 6), special, overlapping, seed, narrow=True)
    assert same_bits(out[:, :-3], want) and (out[:, -3:] == 7.25).all()


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 300), st.one_of(st.just(1), st.integers(2, 300)), st.one_of(st.integers(1, 5), st.integers(6, 19)),
       st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_the_narrow_form_keeps_the_order_over_blocks_of_rows(rows, reduction, columns, special, overlapping, seed):
    # (register blocks of 16-row vectors and up to 8 columns: rows past a block's, the last one partial, columns
    # past 8 in a second and third group; NaN sums canonical)
    out, want = run_case(rows, reduction, columns, special, overlapping, seed, narrow=True)
    assert same_bits(out[:, :-3], want) and (out[:, -3:] == 7.25).all()
    assert (out.view(np.uint32)[np.isnan(out)] == 0x7FC00000).all()


@pytest.mark.skipif(not halves_native(), reason="the binary16 narrow form needs F16C in Numba's target")
@settings(max_examples=80, deadline=None)
@given(st.integers(1, 300), st.one_of(st.just(1), st.integers(2, 300)), st.one_of(st.integers(1, 5), st.integers(6, 19)),
       st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_the_narrow_form_of_binary16_weights_sums_in_the_same_order(rows, reduction, columns, special, overlapping,
                                                                    seed):
    # (``_narrow_halves``: A^T's binary16 bits widened as loaded; the very bits of the sequential sums, NaN canonical)
    rng = np.random.default_rng(seed)
    a = fp16_values(rng, (rows, reduction), special)
    flat = fp16_values(rng, (reduction * (columns + 2) + 3,), special)
    if overlapping:
        offsets = rng.integers(0, flat.size - columns + 1, reduction).astype(np.int64) * 4
    else:
        offsets = np.arange(reduction, dtype=np.int64) * (columns + 2) * 4
    rows_of_b = np.stack([flat[o // 4:o // 4 + columns] for o in offsets])
    out = np.full((rows, columns + 3), np.float32(7.25))
    packed = gemm_fp32_seq.pack_halves(a.astype(np.float16))
    assert packed.dtype == np.uint16 and packed.shape == (reduction, -(-rows // 16) * 16)
    with np.errstate(invalid="ignore", over="ignore"):
        gemm_fp32_seq._narrow_halves(packed, offsets, flat, 0, out[:, :columns], rows)
    assert same_bits(out[:, :-3], sequential(a, rows_of_b)) and (out[:, -3:] == 7.25).all()
    assert (out.view(np.uint32)[np.isnan(out)] == 0x7FC00000).all()


@settings(max_examples=30, deadline=None)
@given(cases())
def test_the_plain_loops_give_the_same_bits(case):
    # NPUEMU_FP16_GEMM=0: products_loops (multiply then add, no intrinsics) on the same operands
    gemm_fp32_seq._PLAIN = True
    try:
        out, want = run_case(*case)
    finally:
        gemm_fp32_seq._PLAIN = False
    assert same_bits(out[:, :-3], want)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_an_fp16_product_is_exact_in_float32_so_fma_is_multiply_then_add(seed):
    # the micro-kernel's fused multiply-add rounds a * b + s once; multiply-then-add rounds a * b first.
    # Every fp16 pattern x 64 drawn ones: the float32 product equals the exact (float64) one, so both
    # are round(a * b + s) - here the float64 sum of the two float32 values rounded to float32, which
    # is the correctly rounded sum (53 >= 2 * 24 + 2 bits: no double-rounding error)
    rng = np.random.default_rng(seed)
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    y = rng.integers(0, 1 << 16, 64).astype(np.uint16).view(np.float16)
    s = rng.integers(0, 1 << 32, (1 << 16, 1), dtype=np.uint64).astype(np.uint32).view(np.float32)
    finite = np.isfinite(x)[:, None] & np.isfinite(y)[None, :] & np.isfinite(s)
    with np.errstate(invalid="ignore", over="ignore"):
        product = x.astype(np.float32)[:, None] * y.astype(np.float32)[None, :]
        exact = x.astype(np.float64)[:, None] * y.astype(np.float64)[None, :]
        fused = (exact + s.astype(np.float64)).astype(np.float32)
        separate = product + s
    assert np.array_equal(product[finite].astype(np.float64), exact[finite])
    keep = finite & np.isfinite(separate)
    assert np.array_equal(fused[keep].view(np.uint32), separate[keep].view(np.uint32))


def test_the_kernel_with_fma_equals_multiply_then_add_on_fp16_values():
    # on this host the micro-kernel uses llvm.fma where the host has FMA; products_loops multiplies then
    # adds: the same bits on fp16 operands over many binades, a reduction past several blocks
    rng = np.random.default_rng(5)
    a = fp16_values(rng, (13, 900), True)
    b = fp16_values(rng, (900, 150), True)
    packed, offsets = gemm_fp32_seq.pack(a), gemm_fp32_seq.row_offsets(900, 150)
    fused, plain = np.empty((13, 150), np.float32), np.empty((13, 150), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        gemm_fp32_seq.products(packed, offsets, b, 0, 150, fused, 13)
        gemm_fp32_seq.products_loops(packed, offsets, b.reshape(-1), 0, 150, plain, 13)
    assert same_bits(fused, plain) and same_bits(fused, sequential(a, b))


def test_another_order_is_caught():
    # sums over many binades: exact (float64) sums or a reversed order give other bits somewhere
    rng = np.random.default_rng(11)
    a, b = fp16_values(rng, (8, 600), False), fp16_values(rng, (600, 40), False)
    out = np.empty((8, 40), np.float32)
    gemm_fp32_seq.products(gemm_fp32_seq.pack(a), gemm_fp32_seq.row_offsets(600, 40), b, 0, 40, out, 8)
    assert same_bits(out, sequential(a, b))
    assert not same_bits(out, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))
    assert not same_bits(out, sequential(a[:, ::-1], b[::-1]))


def test_negative_zero_products_sum_to_positive_zero():
    a = -np.ones((7, 300), np.float32)
    b = np.zeros((300, 20), np.float32)
    for narrow in (False, True):
        out = np.full((7, 20), np.float32(1))
        gemm_fp32_seq.products(gemm_fp32_seq.pack(a, narrow), gemm_fp32_seq.row_offsets(300, 20), b, 0, 20, out, 7)
        assert (out == 0).all() and not np.signbit(out).any()


def test_operands_of_the_wrong_layout_are_refused():
    packed = gemm_fp32_seq.pack(np.ones((3, 4), np.float32))
    with pytest.raises(ValueError):
        gemm_fp32_seq.products(packed, gemm_fp32_seq.row_offsets(5, 2), np.ones((5, 2), np.float32), 0, 2,
                               np.empty((3, 2), np.float32), 3)
    with pytest.raises(ValueError):
        gemm_fp32_seq.products(packed, gemm_fp32_seq.row_offsets(4, 2), np.ones((4, 2), np.float32), 0, 2,
                               np.empty((3, 2), np.float32)[:, ::-1], 3)
