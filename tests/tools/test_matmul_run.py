import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.isa.errors import InputError
from npuemu.tools.matmul import MatmulContext
from npuemu.tools.matmul_layout import a_to_native, b_to_native
from npuemu.tools.matmul_limits import MatmulLimitError
from npuemu.tools.testing_reference import OUT_CVT_SHIFT_MAX, clamp, round_shift, scale_shift


def _ref(A, B, s):
    return (A.astype(np.float32) * s) @ (B.astype(np.float32) * s)


def _requant(A, B, a_s, b_s, c_s, c_zp):
    acc = A.astype(np.int64) @ B.astype(np.int64)
    real = acc * (np.float64(a_s) * np.asarray(b_s, np.float64)) / np.float64(c_s)
    return np.clip(np.sign(real) * np.floor(np.abs(real) + 0.5) + c_zp, -128, 127).astype(np.int8)


def _requant_registers(A, B, a_s, b_s, c_s, c_zp):
    """int8 C as the DPU computes it with one B scale: the exact int32 products, BS times
    2^14 >> 14 (exact), OUT_CVT with the realised SCALE * 2^-SHIFT of a_s * b_s / c_s, rounding
    half to even (NUMERICS.md 4.5; the kit's independent scale_shift / round_shift). The float
    factor itself would differ at near-ties (found by hypothesis: M=5, K=N=64, seed 680912695)."""
    acc = A.astype(np.int64) @ B.astype(np.int64)
    scale, shift = scale_shift(float(np.float32(a_s)) * float(np.float32(b_s)) / float(np.float32(c_s)),
                               OUT_CVT_SHIFT_MAX)
    out = [[clamp(round_shift(int(v) * scale, shift, "half_even") + c_zp, (-128, 127)) for v in row] for row in acc]
    return np.asarray(out, np.int8)


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 8), st.sampled_from([32, 64]), st.sampled_from([32, 64]), st.integers(0, 2**31))
def test_int8_per_layer_equals_numpy(M, K, N, seed):
    rng = np.random.default_rng(seed)
    A = rng.integers(-128, 128, (M, K)).astype(np.int8)
    B = rng.integers(-128, 128, (K, N)).astype(np.int8)
    ctx = MatmulContext(M, K, N, a_scale=1 / 128, b_scale=1 / 128, c_scale=0.05, c_zero_point=3)
    C = ctx.run(A, B)
    assert C.dtype == np.int8 and C.shape == (M, N)
    np.testing.assert_array_equal(C, _requant_registers(A, B, 1 / 128, 1 / 128, 0.05, 3))
    assert ctx.perf.cycles > 0 and ctx.perf.macs >= M * K * N


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 8), st.sampled_from([32, 64]), st.integers(0, 2**31))
def test_int8_per_channel_within_one_lsb(M, K, seed):
    # Per-channel B scales go through the BS multiplier 2^14 s[c]/max(s) (compiler quant_regs):
    # its rounding can move a result by one step, so per-channel is checked to 1 LSB.
    N = 32
    rng = np.random.default_rng(seed)
    A = rng.integers(-128, 128, (M, K)).astype(np.int8)
    B = rng.integers(-128, 128, (K, N)).astype(np.int8)
    bs = rng.uniform(0.002, 0.01, N).astype(np.float32)
    C = MatmulContext(M, K, N, a_scale=1 / 128, b_scale=bs, c_scale=0.03).run(A, B)
    want = _requant(A, B, 1 / 128, bs, 0.03, 0)
    assert np.abs(C.astype(int) - want.astype(int)).max() <= 1


def test_native_layouts_give_same_result():
    rng = np.random.default_rng(1)
    M, K, N = 3, 64, 32
    A = rng.integers(-128, 128, (M, K)).astype(np.int8)
    B = rng.integers(-128, 128, (K, N)).astype(np.int8)
    c1 = MatmulContext(M, K, N, a_scale=1 / 128, b_scale=1 / 128).run(A, B)
    ctx = MatmulContext(M, K, N, a_scale=1 / 128, b_scale=1 / 128, b_layout="native", ac_layout="native")
    c2 = ctx.run(a_to_native(A, M, K, ctx.type, "rk3588"), b_to_native(B, K, N, ctx.type, "rk3588"))
    np.testing.assert_array_equal(c1, c2)


def test_dynamic_shapes_and_errors():
    ctx = MatmulContext(2, 32, 32, shapes=[(4, 64, 32)])
    ctx.set_shape(4, 64, 32)
    with pytest.raises(InputError, match="not given at creation"):
        ctx.set_shape(5, 64, 32)
    with pytest.raises(InputError, match="do not match"):
        ctx.run(np.zeros((2, 32), np.int8), np.zeros((32, 32), np.int8))
    with pytest.raises(MatmulLimitError, match="N=33"):
        MatmulContext(2, 32, 33)


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 8), st.sampled_from([32, 64, 128]), st.sampled_from([32, 64]), st.integers(0, 2**31))
def test_fp16_within_half_an_ulp_of_the_exact_product(M, K, N, seed):
    """fp16 x fp16 -> fp16: fp32 accumulation in the MAC array, one fp16 rounding at the output
    (NUMERICS.md 4.6), so C is the exact product rounded to fp16 within one fp16 ulp plus the fp32
    sum's own error bound K 2^-24 sum|a||b| (which matters where the sum cancels: hypothesis found
    -0.001686 from products of size 1, M=5, K=128, N=32, seed 1878), and exact for most elements."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(M, K)).astype(np.float16)
    B = rng.normal(size=(K, N)).astype(np.float16)
    ctx = MatmulContext(M, K, N, "fp16xfp16->fp16")
    C = ctx.run(A, B)
    assert C.dtype == np.float16 and C.shape == (M, N)
    exact = A.astype(np.float64) @ B.astype(np.float64)
    rounded = exact.astype(np.float16)
    ulp = np.spacing(np.abs(rounded)).astype(np.float64)
    accumulation = K * 2.0**-24 * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)))
    assert np.all(np.abs(C.astype(np.float64) - rounded.astype(np.float64)) <= ulp + accumulation)
    assert np.mean(C == rounded) >= 0.95
    assert ctx.perf.macs == M * K * N and ctx.perf.cycles > 0
