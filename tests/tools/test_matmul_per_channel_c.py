"""int8 x int8 -> int8 with per-column C scales (tools/MATMUL.md, "Per-channel C").

The reference is the testing kit's independent int8 conv arithmetic (tools/testing_reference.py,
NUMERICS.md 9), given the documented per-channel factor: the weight scale r[n] = b_s[n] / c_s[n]
(float32) with C's scale 1, so BS MUL[n] = round(2^14 r[n] / max r) and OUT_CVT = a_s max r.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.isa.errors import InputError
from npuemu.tools.matmul import MatmulContext
from npuemu.tools.testing_reference import Quant, reference_conv


def _reference(A, B, a_s, b_s, c_s, c_zp):
    r = (np.asarray(b_s, np.float32) / np.asarray(c_s, np.float32)).astype(np.float32)
    x = A.T.reshape(A.shape[1], A.shape[0], 1)  # [K, M, 1]: M rows of one pixel
    w = B.T.reshape(B.shape[1], B.shape[0], 1, 1)
    out = reference_conv(x, w, None, input_quant=Quant(np.float32(a_s), 0), weight_quant=Quant(r, 0),
                         output_quant=Quant(np.float32(1.0), c_zp))
    return out.reshape(B.shape[1], A.shape[0]).T


@settings(max_examples=5, deadline=None)
@given(st.integers(1, 6), st.sampled_from([32, 64]), st.sampled_from([32, 64]), st.integers(-5, 5),
       st.integers(0, 2**31))
def test_per_channel_c_is_exact(M, K, N, c_zp, seed):
    rng = np.random.default_rng(seed)
    A = rng.integers(-128, 128, (M, K)).astype(np.int8)
    B = rng.integers(-128, 128, (K, N)).astype(np.int8)
    b_s = rng.uniform(0.002, 0.01, N).astype(np.float32)
    c_s = rng.uniform(0.01, 0.2, N).astype(np.float32)
    ctx = MatmulContext(M, K, N, a_scale=1 / 128, b_scale=b_s, c_scale=c_s, c_zero_point=c_zp)
    C = ctx.run(A, B)
    assert C.dtype == np.int8 and C.shape == (M, N)
    np.testing.assert_array_equal(C, _reference(A, B, 1 / 128, b_s, c_s, c_zp))
    # last_float in real units: column n scaled by its own c_scale
    np.testing.assert_allclose(ctx.last_float, c_s[None, :] * (C.astype(np.float32) - c_zp), rtol=1e-6)


def test_per_channel_c_differs_from_per_layer():
    """A column with a 4x larger C scale holds a 4x smaller code (not one shared scale)."""
    M, K, N = 2, 32, 32
    A = np.full((M, K), 3, np.int8)
    B = np.full((K, N), 2, np.int8)
    c_s = np.full(N, 0.05, np.float32)
    c_s[1] = 0.2
    C = MatmulContext(M, K, N, a_scale=1 / 128, b_scale=1 / 128, c_scale=c_s).run(A, B)
    # real C = 32 * 3 * 2 / 128^2 = 0.01171875 -> 0.234 codes at 0.05, 0.059 at 0.2: both round to 0
    A = np.full((M, K), 100, np.int8)
    C = MatmulContext(M, K, N, a_scale=1 / 128, b_scale=1 / 128, c_scale=c_s).run(A, B)
    # real 0.390625: 7.8 -> 8 codes at 0.05, 1.95 -> 2 at 0.2
    assert C[0, 0] == 8 and C[0, 1] == 2


def test_per_channel_c_errors():
    with pytest.raises(InputError, match=r"c_scale has shape \(16,\); per-channel needs \(32,\)"):
        MatmulContext(2, 32, 32, c_scale=np.ones(16, np.float32))
    with pytest.raises(InputError, match="c_scale must be positive"):
        MatmulContext(2, 32, 32, c_scale=np.zeros(32, np.float32))
    with pytest.raises(InputError, match="c_zero_point is per layer"):
        MatmulContext(2, 32, 32, c_scale=np.ones(32, np.float32), c_zero_point=np.zeros(32, int))
    with pytest.raises(InputError, match="int8 C only"):
        MatmulContext(2, 32, 32, "int8xint8->int32", c_scale=np.ones(32, np.float32))
