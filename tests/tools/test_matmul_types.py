"""Every Matmul type, both layouts, every chip with a Matmul API: C from the emulator equals
numpy's (exact for integer C, fp16/fp32 within the bound of tools/MATMUL.md "Accuracy")."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.isa.errors import CompileError, InputError
from npuemu.tools import matmul_layout as L
from npuemu.tools.matmul import MatmulContext
from npuemu.tools.matmul_limits import MatmulLimitError, limits
from npuemu.tools.matmul_types import MatmulTypeError, TYPES, get_type, types_for_chip

RUN_CHIPS = ["rk3588", "rk3576", "rk3568"]  # rk3562: test_rk3562_runs_every_type_without_int4
PAIRS = [(chip, t) for chip in RUN_CHIPS for t in types_for_chip(chip)]
_INT = {"int4": 8, "int8": 128}


def _operand(rng, element, shape):
    if element == "fp16":
        return rng.normal(size=shape).astype(np.float16)
    return rng.integers(-_INT[element], _INT[element], shape).astype(np.int8)


def _reference_check(t, C, A, B, b_scale, a_zp=0, b_zp=0):
    """Compare C with numpy, independently of the emulator: integer C = (A - a_zp) @ (B - b_zp)
    exactly (int16 saturated), float C within the fp32 sum's bound K 2^-24 sum|a||w| (plus one
    fp16 ulp for fp16 C), where w is B as the fp16 weights hold it: fp16((B - b_zp) * b_scale)
    for an integer B."""
    if t.b != "fp16":
        B = B.astype(np.int64) - b_zp
    if t.c in ("int32", "int16"):
        info = np.iinfo(np.int16 if t.c == "int16" else np.int32)
        want = np.clip((A.astype(np.int64) - a_zp) @ B, info.min, info.max)
        assert C.dtype == info.dtype
        np.testing.assert_array_equal(C, want)
        return
    W = B if t.b == "fp16" else (B.astype(np.float32) * np.float32(b_scale)).astype(np.float16)
    exact = A.astype(np.float64) @ W.astype(np.float64)
    K = A.shape[1]
    bound = K * 2.0**-24 * (np.abs(A.astype(np.float64)) @ np.abs(W.astype(np.float64)))
    if t.c == "fp16":
        assert C.dtype == np.float16
        rounded = exact.astype(np.float16).astype(np.float64)
        bound = bound + np.spacing(np.abs(exact.astype(np.float16))).astype(np.float64)
        assert np.all(np.abs(C.astype(np.float64) - rounded) <= bound)
    else:
        assert C.dtype == np.float32
        assert np.all(np.abs(C.astype(np.float64) - exact) <= bound + 1e-30)


@settings(max_examples=len(PAIRS) * 2, deadline=None)
@given(st.sampled_from(PAIRS), st.integers(1, 6), st.integers(1, 3), st.integers(1, 2), st.booleans(),
       st.booleans(), st.integers(0, 2**31))
def test_every_type_equals_numpy(pair, M, k_blocks, n_blocks, native, zero_points, seed):
    chip, name = pair
    t = get_type(name)
    lim = limits(name, chip)
    K, N = 32 * k_blocks, lim["N_align"] * n_blocks
    rng = np.random.default_rng(seed)
    A, B = _operand(rng, t.a, (M, K)), _operand(rng, t.b, (K, N))
    b_scale = 0.25 if t.b != "fp16" else 1.0
    # zero points: A per layer, B per channel (integer operands only)
    a_zp = int(rng.integers(-3, 4)) if zero_points and t.a != "fp16" else 0
    b_zp = rng.integers(-3, 4, N) if zero_points and t.b != "fp16" else np.zeros(N, np.int64)
    layout = "native" if native else "normal"
    ctx = MatmulContext(M, K, N, name, chip=chip, b_layout=layout, ac_layout=layout, b_scale=b_scale,
                        a_scale=1 / 64, a_zero_point=a_zp, b_zero_point=b_zp,
                        **({"c_scale": 0.5} if t.c == "int8" else {}))
    a_in = L.a_to_native(A, M, K, name, chip) if native else A
    b_in = L.b_to_native(B, K, N, name, chip) if native else B
    C = ctx.run(a_in, b_in)
    if native and t.c in ("int16", "int32", "fp32"):
        C = L.c_from_native(C, M, N, name, chip)
    assert C.shape == (M, N)
    if t.c == "int8":  # requantization: test_matmul_run checks it against the register arithmetic
        acc = (A.astype(np.int64) - a_zp) @ (B.astype(np.int64) - b_zp)
        # factor 2^-7 and BS MUL 2^14 >> 14 are exact: OUT_CVT's half-even rounding is all there is
        np.testing.assert_array_equal(C, np.clip(np.rint(acc / 128), -128, 127))
    else:
        _reference_check(t, C, A, B, b_scale, a_zp, b_zp)
    assert ctx.perf.macs >= M * K * N and ctx.perf.cycles > 0


def test_k_split_adds_the_segments_partial_results():
    """RK3588 splits B at K = 8192: two builds, int32 partial C added (exact)."""
    rng = np.random.default_rng(3)
    M, K, N = 1, 8192 + 32, 32
    A, B = _operand(rng, "int8", (M, K)), _operand(rng, "int8", (K, N))
    ctx = MatmulContext(M, K, N, "int8xint8->int32")
    np.testing.assert_array_equal(ctx.run(A, B), A.astype(np.int64) @ B.astype(np.int64))
    assert ctx.perf.macs >= M * K * N
    with pytest.raises(MatmulLimitError, match="K=8224 splits B into 2 segments"):
        MatmulContext(M, K, N, "int8xint8->int8")


def test_core_mask_spreads_rows_over_cores():
    rng = np.random.default_rng(4)
    M, K, N = 24, 64, 32
    A, B = _operand(rng, "int8", (M, K)), _operand(rng, "int8", (K, N))
    ctx = MatmulContext(M, K, N, "int8xint8->int32", core_mask="0_1_2")
    np.testing.assert_array_equal(ctx.run(A, B), A.astype(np.int64) @ B.astype(np.int64))
    assert sorted(step["core"] for step in ctx.last_model.trailer["schedule"]) == [0, 1, 2]
    one = MatmulContext(M, K, N, "int8xint8->int32", core_mask="1")
    one.run(A, B)
    assert [step["core"] for step in one.last_model.trailer["schedule"]] == [1]


def test_rk356x_splits_b_at_k_4096():
    """RK3566/68 (8-byte atoms) split B at K = 4096: two builds, int32 partial C added (exact)."""
    rng = np.random.default_rng(7)
    M, K, N = 2, 4096 + 32, 16
    A, B = _operand(rng, "int8", (M, K)), _operand(rng, "int8", (K, N))
    ctx = MatmulContext(M, K, N, "int8xint8->int32", chip="rk3566")
    assert len(L.b_segments(K, "rk3566")) == 2
    np.testing.assert_array_equal(ctx.run(A, B), A.astype(np.int64) @ B.astype(np.int64))


def test_refusals_name_the_reason():
    with pytest.raises(MatmulTypeError, match="no Matmul API"):
        MatmulContext(2, 32, 32, chip="rv1106")
    with pytest.raises(MatmulTypeError, match="only RK3588"):
        MatmulContext(2, 32, 64, "int4xint4->int16", chip="rk3576")
    with pytest.raises(MatmulLimitError, match="N=32 must be a multiple of 64"):
        MatmulContext(2, 32, 32, "int8xint4->int32")
    ctx = MatmulContext(2, 32, 64, "int4xint4->int16")
    with pytest.raises(InputError, match="outside the int4 range"):
        ctx.run(np.full((2, 32), 8, np.int8), np.zeros((32, 64), np.int8))
    with pytest.raises(InputError, match=r"a_zero_point=9 is outside \[-8, 7\] for int4 operands"):
        MatmulContext(2, 32, 64, "int4xint4->int16", a_zero_point=9)
    with pytest.raises(InputError, match=r"b_zero_point has shape \(3,\); per-channel needs \(32,\)"):
        MatmulContext(2, 32, 32, "int8xint8->int32", b_zero_point=[1, 2, 3])
    with pytest.raises(InputError, match="c_scale applies to an int8 C only"):
        MatmulContext(2, 32, 32, "int8xint8->int32", c_scale=0.1)
    from npuemu.isa.errors import ConfigError
    with pytest.raises(ConfigError, match="rk3576 has 2 NPU core"):
        MatmulContext(2, 32, 32, chip="rk3576", core_mask="2")
    assert len(TYPES) == 10


def test_a_shape_the_compiler_gives_the_cpu_is_refused(monkeypatch):
    """Without the B split, K = 8256 makes the partition run the conv on the CPU: the context must
    refuse rather than return the host's float result."""
    import npuemu.tools.matmul as matmul

    monkeypatch.setattr(matmul, "b_segments", lambda K, chip: [(0, K)])
    rng = np.random.default_rng(5)
    A, B = _operand(rng, "int8", (1, 8256)), _operand(rng, "int8", (8256, 32))
    # the build itself may refuse first (no int32 host tensors), else the context names the CPU step
    with pytest.raises(CompileError, match="runs Conv on the CPU|stores no host tensors of type int32"):
        MatmulContext(1, 8256, 32, "int8xint8->int32").run(A, B)


def test_rk3562_runs_every_type_without_int4():
    rng = np.random.default_rng(6)
    M, K, N = 3, 64, 32
    for name in types_for_chip("rk3562"):
        t = get_type(name)
        if t.c == "int8":
            continue
        A, B = _operand(rng, t.a, (M, K)), _operand(rng, t.b, (K, N))
        _reference_check(t, MatmulContext(M, K, N, name, chip="rk3562", b_scale=0.25).run(A, B), A, B, 0.25)


def test_cli_prints_the_error_and_perf(capsys):
    from npuemu.tools.cli import main

    assert main(["matmul", "--type", "int4xint4->int16", "-M", "8", "-K", "64", "-N", "64", "--core-mask", "0_1"]) == 0
    out = capsys.readouterr().out
    assert "int4xint4->int16 on rk3588 (cores [0, 1], native path)" in out and "max |C - numpy| = 0 " in out
    assert "cycles" in out
