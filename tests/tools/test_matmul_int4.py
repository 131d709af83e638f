"""The Matmul API's native int4 path (tools/MATMUL.md "Native int4"): int4 x int4 -> int16 and
int8 x int4 -> int32 run with CNA/CORE precision int4 (6), packed half-byte operands and the
int4 MAC rate; C equals numpy's exactly (int16 saturated)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.tools import matmul_layout as L
from npuemu.tools.matmul import MatmulContext
from npuemu.tools.matmul_limits import MatmulLimitError
from npuemu.tools.matmul_types import MatmulTypeError

INT4_TYPES = ["int4xint4->int16", "int8xint4->int32"]


def _values(rng, element, shape):
    bound = 8 if element == "int4" else 128
    return rng.integers(-bound, bound, shape).astype(np.int8)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(INT4_TYPES), st.integers(1, 9), st.integers(1, 4), st.integers(1, 2), st.booleans(),
       st.sampled_from(["auto", "0_1_2"]), st.booleans(), st.integers(0, 2**31))
def test_native_int4_equals_numpy(name, M, k_blocks, n_blocks, native, core_mask, zero_points, seed):
    a_elem = name.split("x")[0]
    K, N = 32 * k_blocks, 64 * n_blocks
    rng = np.random.default_rng(seed)
    A, B = _values(rng, a_elem, (M, K)), _values(rng, "int4", (K, N))
    a_zp = int(rng.integers(-3, 4)) if zero_points else 0
    b_zp = rng.integers(-3, 4, N) if zero_points else 0
    layout = "native" if native else "normal"
    ctx = MatmulContext(M, K, N, name, b_layout=layout, ac_layout=layout, core_mask=core_mask,
                        a_zero_point=a_zp, b_zero_point=b_zp)
    a_in = L.a_to_native(A, M, K, name, "rk3588", packed=a_elem == "int4") if native else A
    b_in = L.b_to_native(B, K, N, name, "rk3588", packed=True) if native else B
    C = ctx.run(a_in, b_in)
    if native:
        C = L.c_from_native(C, M, N, name, "rk3588")
    info = np.iinfo(np.int16 if name.endswith("int16") else np.int32)
    want = np.clip((A.astype(np.int64) - a_zp) @ (B.astype(np.int64) - b_zp), info.min, info.max)
    assert C.dtype == info.dtype
    np.testing.assert_array_equal(C, want)
    # the machine ran the int4 path: weights int4, MAC int4 (or int8 for an int8 A), half-byte
    # weights and (int4 A) half-byte features over the DMA
    records = ctx.last_records
    assert {(r.conv.precision, r.conv.weight_type) for r in records} == {(6 if a_elem == "int4" else 0, 6)}
    assert {r.traffic.weight_read for r in records} <= {0, N * K // 2} and records[0].traffic.weight_read
    assert sum(r.traffic.feature_read for r in records) == M * K // (2 if a_elem == "int4" else 1)


def test_int16_saturates():
    M, K, N = 2, 2048, 64
    A = np.full((M, K), -8, np.int8)
    B = np.full((K, N), -8, np.int8)
    B[:, 1] = 7
    C = MatmulContext(M, K, N, "int4xint4->int16").run(A, B)
    assert C[0, 0] == 32767 and C[0, 1] == -32768  # 131072 and -114688


def test_int4_rate_and_weight_bytes_against_int8():
    """The same product as int8 x int8 -> int32: the int4 path reads half the weight bytes and
    its MAC cycles follow the 2048 int4 MACs/cycle (64 kernels per pass, half int8's passes)."""
    from npuemu.emulator.timing.task_time import time_task
    from npuemu.platforms import load_platform

    M, K, N = 16, 256, 256
    rng = np.random.default_rng(3)
    A, B = _values(rng, "int4", (M, K)), _values(rng, "int4", (K, N))
    int4 = MatmulContext(M, K, N, "int4xint4->int16")
    int4.run(A, B)
    int8 = MatmulContext(M, K, N, "int8xint8->int32")
    int8.run(A, B)
    weights8 = sum(r.traffic.weight_read for run in int8.last_model_runs for r in run.tasks)
    weights4 = sum(r.traffic.weight_read for r in int4.last_records)
    assert weights4 * 2 == weights8 == K * N
    platform = load_platform("rk3588")
    mac4 = sum(time_task(r, platform).npu_cycles for r in int4.last_records)
    mac8 = sum(time_task(r, platform).npu_cycles for run in int8.last_model_runs for r in run.tasks)
    assert mac4 * 2 == mac8
    assert int4.perf.macs == int8.perf.macs == M * K * N


def test_int4_limits_and_chips():
    with pytest.raises(MatmulLimitError, match=r"N=96 must be a multiple of 64 for int4xint4->int16"):
        MatmulContext(2, 64, 96, "int4xint4->int16")
    with pytest.raises(MatmulLimitError, match=r"N=8256 exceeds the limit N <= 8192"):
        MatmulContext(2, 64, 8256, "int8xint4->int32")
    with pytest.raises(MatmulTypeError, match="only RK3588"):
        MatmulContext(2, 64, 64, "int4xint4->int16", chip="rk3576")
