"""tools/matmul_layout.py against the element mapping of the guide's reference code.

The reference below is written from rknn-toolkit2 rknpu2/examples/rknn_matmul_api_demo/src/
matmul_utils.cpp (airockchip/rknn-toolkit2, commits 77b71094 and deaba85f, same mapping):
- A, norm_layout_to_perf_layout: dst[i*M*subK + m*subK + j] = src[m*K + i*subK + j], zero when
  i*subK + j >= K; int4: an even dst index fills the low nibble, an odd one the high nibble.
- B, norm_layout_to_native_layout: dst[((i*K1 + j)*subN + n)*subK + k] = src[(j*subK + k)*N +
  i*subN + n], zero outside K x N; int4: an even dst index fills the HIGH nibble (int4 << 4).
- C, perf_layout_to_norm_layout: dst[m*N + i*subN + j] = src[i*M*subN + m*subN + j].
The block sizes are table 3-5 (shared/docs/hardware.md 2), restated here, not read from the module.
Flat element-by-element loops, deliberately unlike the module's reshape/transpose code.
"""
import numpy as np
from hypothesis import given, settings, strategies as st

from npuemu.tools import matmul_layout as L
from npuemu.tools.matmul_types import TYPES

# table 3-5: chip -> element type -> A subK / B (subN, subK) / C subN
TABLE_3_5 = {
    "rk3588": {"A": {"int4": 32, "int8": 16, "fp16": 8}, "B": {"int4": (64, 32), "int8": (32, 32), "fp16": (16, 32)},
               "C": {"int16": 8, "int32": 4, "fp32": 4}},
    "rk3576": {"A": {"int8": 16, "fp16": 8}, "B": {"int8": (32, 32), "fp16": (16, 32)}, "C": {"int32": 4, "fp32": 4}},
    "rk3562": {"A": {"int8": 16, "fp16": 8}, "B": {"int8": (16, 32), "fp16": (8, 32)}, "C": {"int32": 4, "fp32": 4}},
    "rk3566": {"A": {"int8": 8, "fp16": 4}, "B": {"int8": (16, 32), "fp16": (8, 16)}, "C": {"int32": 4, "fp32": 4}},
    "rk3568": {"A": {"int8": 8, "fp16": 4}, "B": {"int8": (16, 32), "fp16": (8, 16)}, "C": {"int32": 4, "fp32": 4}},
}
CASES = [(chip, t) for chip in TABLE_3_5 for t in sorted(TYPES) if "int4" not in t or chip == "rk3588"]


def _ceil(a, b):
    return -(-a // b)


def _nibble(dst, index, value, high_first):
    """Store one int4 value at element ``index`` of a packed byte buffer, as the demo does."""
    nib = int(value) & 0xF
    even = index % 2 == 0
    if high_first:
        dst[index // 2] = (nib << 4) if even else dst[index // 2] | nib
    else:
        dst[index // 2] = nib if even else dst[index // 2] | (nib << 4)


def ref_a(src, M, K, subK, int4):
    K1 = _ceil(K, subK)
    dst = [0] * (K1 * M * subK // (2 if int4 else 1))
    for i in range(K1):
        for m in range(M):
            for j in range(subK):
                ki = i * subK + j
                value = src[m * K + ki] if ki < K else 0
                out = i * M * subK + m * subK + j
                if int4:
                    _nibble(dst, out, value, high_first=False)
                else:
                    dst[out] = value
    return dst


def ref_b(src, K, N, subN, subK, int4):
    N1, K1 = _ceil(N, subN), _ceil(K, subK)
    dst = [0] * (N1 * K1 * subN * subK // (2 if int4 else 1))
    for i in range(N1):
        for j in range(K1):
            for n in range(subN):
                for k in range(subK):
                    ni, ki = i * subN + n, j * subK + k
                    value = src[ki * N + ni] if ki < K and ni < N else 0
                    out = ((i * K1 + j) * subN + n) * subK + k
                    if int4:
                        _nibble(dst, out, value, high_first=True)
                    else:
                        dst[out] = value
    return dst


def ref_c_to_norm(src, M, N, subN):
    dst = [None] * (M * N)
    for i in range(_ceil(N, subN)):
        for j in range(subN):
            for m in range(M):
                if i * subN + j < N:
                    dst[m * N + i * subN + j] = src[i * M * subN + m * subN + j]
    return dst


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(CASES), st.integers(1, 5), st.integers(1, 80), st.integers(1, 140), st.integers(0, 2**31))
def test_layouts_follow_the_reference_code(case, M, K, N, seed):
    chip, name = case
    t = TYPES[name]
    rng = np.random.default_rng(seed)
    A = rng.integers(-8, 8, (M, K)).astype(np.int8)
    B = rng.integers(-8, 8, (K, N)).astype(np.int8)
    table = TABLE_3_5[chip]
    a_int4, b_int4 = t.a == "int4", t.b == "int4"

    want_a = ref_a(A.reshape(-1).tolist(), M, K, table["A"][t.a], a_int4)
    got_a = L.a_to_native(A, M, K, name, chip, packed=a_int4)
    assert [int(v) & 0xFF for v in got_a.reshape(-1)] == [v & 0xFF for v in want_a]
    np.testing.assert_array_equal(L.a_from_native(got_a, M, K, name, chip), A)

    subN, subK = table["B"][t.b]
    (got_b,) = L.b_to_native(B, K, N, name, chip, packed=b_int4)
    want_b = ref_b(B.reshape(-1).tolist(), K, N, subN, subK, b_int4)
    assert [int(v) & 0xFF for v in got_b.reshape(-1)] == [v & 0xFF for v in want_b]
    np.testing.assert_array_equal(L.b_from_native([got_b], K, N, name, chip), B)

    if t.c in table["C"]:
        C = rng.integers(-1000, 1000, (M, N)).astype(np.int32)
        native = L.c_to_native(C, M, N, name, chip)
        assert ref_c_to_norm(native.reshape(-1).tolist(), M, N, table["C"][t.c]) == C.reshape(-1).tolist()
        np.testing.assert_array_equal(L.c_from_native(native, M, N, name, chip), C)


def test_int4_nibble_orders():
    """The demo's two nibble orders on one hand-checked byte: values (1, -2) -> A 0xE1, B 0x1E."""
    pair = np.array([1, -2], np.int8)
    assert L.pack_int4(pair, L.INT4_HIGH_FIRST["A"]).tolist() == [0xE1]
    assert L.pack_int4(pair, L.INT4_HIGH_FIRST["B"]).tolist() == [0x1E]
    np.testing.assert_array_equal(L.unpack_int4(np.array([0x1E], np.uint8), True), pair)
