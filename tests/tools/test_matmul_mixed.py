"""The Matmul API's mixed path (tools/MATMUL.md "Mixed fp16 x int"): fp16 A, int8/int4 B as
integer weights (CNA IN_PRECISION fp16, PROC_PRECISION int8/int4), per-channel B scale applied
by the DPU's BS MUL from the BRDMA blob as fp16 bits, in fp32 after the fp32 accumulation.

Bound (written from that model): with s[n] = fp16(b_scale[n]) and E = (A @ B) s exact,
|C - E| <= (K + 1) 2^-24 (|A| @ |B|) s (the fp32 sum and the fp32 multiply), plus one fp16
ulp of E for an fp16 C."""
import numpy as np
from hypothesis import given, settings, strategies as st

from npuemu.tools import matmul_layout as L
from npuemu.tools.matmul import MatmulContext

MIXED = ["fp16xint8->fp32", "fp16xint8->fp16", "fp16xint4->fp32", "fp16xint4->fp16"]
CHIPS = {"fp16xint8": ["rk3588", "rk3576", "rk3562", "rk3568"], "fp16xint4": ["rk3588"]}
CASES = [(chip, t) for t in MIXED for chip in CHIPS[t.split("->")[0]]]


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(CASES), st.integers(1, 8), st.integers(1, 3), st.integers(1, 2), st.booleans(),
       st.booleans(), st.integers(0, 2**31))
def test_mixed_within_bound(case, M, k_blocks, n_blocks, per_channel, native, seed):
    chip, name = case
    bits = 4 if "int4" in name else 8
    K, N = 32 * k_blocks, (64 if bits == 4 else 32) * n_blocks
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(M, K)).astype(np.float16)
    B = rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), (K, N)).astype(np.int8)
    scale = rng.uniform(1e-3, 0.1, N).astype(np.float32) if per_channel else np.float32(0.03)
    layout = "native" if native else "normal"
    ctx = MatmulContext(M, K, N, name, chip=chip, b_scale=scale, b_layout=layout, ac_layout=layout)
    a_in = L.a_to_native(A, M, K, name, chip) if native else A
    b_in = L.b_to_native(B, K, N, name, chip, packed=bits == 4) if native else B
    C = ctx.run(a_in, b_in)
    if native and name.endswith("fp32"):
        C = L.c_from_native(C, M, N, name, chip)
    assert ctx.path == "native" and C.shape == (M, N)
    s = np.broadcast_to(np.float32(scale).astype(np.float16).astype(np.float64), (N,))
    exact = (A.astype(np.float64) @ B.astype(np.float64)) * s
    bound = (K + 1) * 2.0**-24 * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))) * s
    if name.endswith("fp16"):
        assert C.dtype == np.float16
        bound = bound + np.spacing(np.abs(exact.astype(np.float16))).astype(np.float64)
    else:
        assert C.dtype == np.float32
    assert np.all(np.abs(C.astype(np.float64) - exact) <= bound)
    # the weights crossed the DMA as integers: N K bits / 8 bytes, on the fp16 MAC path
    records = ctx.last_records
    assert {(r.conv.precision, r.conv.weight_type) for r in records} == {(2, 6 if bits == 4 else 0)}
    assert {r.traffic.weight_read for r in records} <= {0, N * K * bits // 8} and records[0].traffic.weight_read


def test_mixed_with_b_zero_point_takes_the_fp16_weights_path():
    """The fp DPU path has no CPEND term, so a B zero point is applied on the host: the weights
    are fp16((B - zp) b_scale) on the fp16 x fp16 path (tools/MATMUL.md)."""
    M, K, N = 2, 32, 32
    A = np.ones((M, K), np.float16)
    B = np.full((K, N), 3, np.int8)
    ctx = MatmulContext(M, K, N, "fp16xint8->fp32", b_scale=0.5, b_zero_point=1)
    C = ctx.run(A, B)
    assert ctx.path == "fp16"
    np.testing.assert_array_equal(C, np.full((M, N), 32.0, np.float32))  # 32 x (3 - 1) x 0.5
