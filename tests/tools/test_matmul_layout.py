import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.isa.errors import CompileError
from npuemu.tools import matmul_layout as L
from npuemu.tools.matmul_limits import MatmulLimitError, check_shape
from npuemu.tools.matmul_types import MatmulTypeError, TYPES, check_type_on_chip, types_for_chip

CHIPS = ["rk3562", "rk3568", "rk3576", "rk3588"]


def test_ten_types_and_chip_support():
    assert len(TYPES) == 10
    assert len(types_for_chip("rk3588")) == 10
    assert all("int4" not in t for t in types_for_chip("rk3568"))
    with pytest.raises(MatmulTypeError, match="only RK3588"):
        check_type_on_chip("int4xint4->int16", "rk3576")
    with pytest.raises(MatmulTypeError, match="no Matmul API"):
        check_type_on_chip("int8xint8->int8", "rv1106")
    with pytest.raises(MatmulTypeError, match="unknown matmul type"):
        check_type_on_chip("int8xint8->int64", "rk3588")


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 400), st.integers(1, 11000), st.sampled_from(CHIPS))
def test_limit_messages(n, k, chip):
    t = "int8xint8->int32"
    try:
        check_shape(2, k, n, t, chip)
        ok = True
    except MatmulLimitError as e:
        ok = False
        msg = str(e)
    n_al = 16 if chip in ("rk3562", "rk3568") else 32
    exp_ok = k % 32 == 0 and n % n_al == 0 and not (chip in ("rk3562", "rk3568") and k > 10240)
    assert ok == exp_ok
    if not ok:
        assert "table 3-7" in msg and ("K=" in msg or "N=" in msg)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 20), st.integers(1, 100), st.integers(1, 70),
       st.sampled_from(CHIPS), st.sampled_from(sorted(TYPES)), st.integers(0, 2**31))
def test_layout_round_trips(M, K, N, chip, t, seed):
    if t not in types_for_chip(chip):
        return
    rng = np.random.default_rng(seed)
    A = rng.integers(-8, 8, (M, K)).astype(np.int8)
    B = rng.integers(-8, 8, (K, N)).astype(np.int8)
    An = L.a_to_native(A, M, K, t, chip)
    a = L.a_block(t, chip)
    assert An.shape == (-(-K // a), M, a)
    # element mapping: native[k1, m, k2] = A[m, k1*a + k2]
    assert An[(K - 1) // a, M - 1, (K - 1) % a] == A[M - 1, K - 1]
    np.testing.assert_array_equal(L.a_from_native(An, M, K, t, chip), A)
    Bn = L.b_to_native(B, K, N, t, chip)
    n, k = L.b_blocks(t, chip)
    assert Bn[0][(N - 1) // n, 0, (N - 1) % n, 0] == B[0, N - 1]
    np.testing.assert_array_equal(L.b_from_native(Bn, K, N, t, chip), B)
    try:
        c = L.c_block(t, chip)
    except L.MatmulLayoutError:
        return
    C = rng.integers(-100, 100, (M, N)).astype(np.int32)
    Cn = L.c_to_native(C, M, N, t, chip)
    assert Cn.shape == (-(-N // c), M, c)
    np.testing.assert_array_equal(L.c_from_native(Cn, M, N, t, chip), C)


def test_b_split_on_rk3588_large_k():
    K, N = 8192 + 64, 32
    B = np.arange(K * N, dtype=np.int32).reshape(K, N).astype(np.int8)
    segs = L.b_to_native(B, K, N, "int8xint8->int32", "rk3588")
    assert len(segs) == 2 and segs[1].shape == (1, 2, 32, 32)
    np.testing.assert_array_equal(L.b_from_native(segs, K, N, "int8xint8->int32", "rk3588"), B)
    assert len(L.b_segments(4096 + 32, "rk3568")) == 2
    assert len(L.b_segments(8192, "rk3588")) == 1


def test_bad_shapes_name_the_problem():
    with pytest.raises(CompileError, match="expected"):
        L.a_to_native(np.zeros((3, 4), np.int8), 3, 5, "int8xint8->int8", "rk3588")
    with pytest.raises(CompileError, match="no native C layout"):
        L.c_block("int8xint8->int8", "rk3588")
