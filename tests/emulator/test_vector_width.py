"""``kernels/vector_width.wide_vectors`` (issue 20, NUMERICS.md 84): the mark reaches the LLVM function
of the kernel that calls it, the kernels that take it carry it, the loops become 512-bit where the host
has AVX-512, and a loop compiled with and without it gives the same bits (the folded DPU chain's own
formula, on values up to its bounds: the width changes how many elements an instruction takes, never
an element's operations; the fp chain's fused loops likewise, NaN payloads and all)."""

import types

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba import types as nbtypes
from numba.extending import intrinsic

from npuemu.emulator.kernels import dpu_folded_lines as fl
from npuemu.emulator.kernels import dpu_fp_fused as fused
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels.dpu_fp_chain import NO_LUT
from npuemu.emulator.kernels.host_cpu import host_features
from npuemu.emulator.kernels.lut_fp import prepared
from npuemu.emulator.kernels.vector_width import ATTRIBUTE, wide_vectors
from tests.emulator import test_dpu_fp_fused as tfused


@njit(inline="always")
def _chain(values, mul, k, offset, out):
    for i in range(values.shape[0]):
        out[i] = dp._folded_out(dp._folded_bs(values[i], 0.0, 0.0, 3.0, mul, True), k, offset, -128.0, 127.0, True)


@njit(fastmath={"contract"})
def _plain(values, mul, k, offset, out):
    _chain(values, mul, k, offset, out)


@njit(fastmath={"contract"})
def _wide(values, mul, k, offset, out):
    wide_vectors()
    _chain(values, mul, k, offset, out)
_ARGS = (np.arange(64, dtype=np.int32), 0.5, 0.25, 1.0, np.zeros(64, np.int8))


def test_the_mark_reaches_the_calling_function_only():
    _plain(*_ARGS)
    _wide(*_ARGS)
    wide_ir, plain_ir = (f.inspect_llvm(f.signatures[0]) for f in (_wide, _plain))
    assert ATTRIBUTE in wide_ir
    assert ATTRIBUTE not in plain_ir


def test_the_folded_lines_kernels_carry_it():
    # (their Python source: the compiled form may come from the cache, without IR to look at)
    import inspect
    from npuemu.emulator.kernels import lut_folded
    for kernel in (fl._channel_relu, fl._channel_plain, fl._shared_relu, fl._shared_plain, fl.ew_lines, fused._loops,
                   fused._flat, lut_folded._narrow_lines):
        assert "wide_vectors()" in inspect.getsource(kernel.py_func), kernel


def test_512_bit_vectors_where_the_host_has_avx512():
    _wide(*_ARGS)
    asm = _wide.inspect_asm(_wide.signatures[0])
    assert ("zmm" in asm) == ("+avx512f" in host_features())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 300), st.sampled_from([2.0**-k for k in range(0, 40, 3)]),
       st.floats(2.0**-24, 4.0), st.integers(-128, 127))
def test_wide_and_plain_loops_give_the_same_bits(seed, count, mul, k, offset):
    rng = np.random.default_rng(seed)
    values = rng.integers(-2**31, 2**31, count, dtype=np.int64).astype(np.int32)
    values[: count // 3] = rng.integers(-300, 300, count // 3)  # (around the rounding points too)
    wide, plain = np.zeros(count, np.int8), np.zeros(count, np.int8)
    _wide(values, mul, k, float(offset), wide)
    _plain(values, mul, k, float(offset), plain)
    np.testing.assert_array_equal(wide, plain)


def _unmarked(module, *names):
    """``module``'s functions ``names`` compiled afresh (no cache) with ``wide_vectors()`` a no-op: the
    kernel as it was before the mark, for a bit-for-bit comparison (the first name the entry point,
    the others the callees of it in that module that carry the mark)."""
    namespace = dict(vars(module), wide_vectors=_no_mark)
    compiled = {}
    for name in names:
        dispatcher = getattr(module, name)
        function = types.FunctionType(dispatcher.py_func.__code__, namespace, name)
        options = {k: v for k, v in dispatcher.targetoptions.items() if k not in ("cache", "nopython")}
        compiled[name] = njit(**options)(function)
    namespace.update(compiled)
    return compiled[names[0]]


@intrinsic
def _no_mark(typingctx):
    def codegen(context, builder, signature, args):
        return context.get_dummy_value()
    return nbtypes.none(), codegen


_FUSED_PLAIN = []  # (compiled once, on first use: no @njit call at import)


@settings(max_examples=80, deadline=None)
@given(tfused.cases())
def test_the_fused_fp_chain_gives_the_same_bits_as_without_the_mark(case):
    # an fp32 loop (every form of dpu_fp_fused: selects, min / max, the LUT's gathers) on NaN / inf / -0 /
    # subnormal inputs: the marked kernel and the kernel compiled without the mark agree bit for bit
    if not _FUSED_PLAIN:
        _FUSED_PLAIN.append(_unmarked(fused, "fused_chain", "_loops", "_flat", "_shaped", "_plain"))
    index, data, stages, ew, lut = case
    chain = tfused._chain(data, stages, ew)
    x_params, x_relux, alu, mul, _, e_params, e_relux, _ = chain.settings()
    packed, params = NO_LUT if lut is None else prepared(*lut)
    operand = (np.ones((1, 1, 1), np.float32) if ew is None else ew[1]).reshape(-1)
    outs = []
    for kernel in (fused.fused_chain, _FUSED_PLAIN[0]):
        out = np.full(data.size, np.nan, np.float32)
        done = kernel(data.reshape(-1), out, data.shape[0], data.shape[1] * data.shape[2], x_params.reshape(-1),
                      x_relux, alu.reshape(-1), mul.reshape(-1), e_params, e_relux, index, operand.size == data.size,
                      packed, params, operand)
        outs.append((done, out.view(np.uint32)))
    assert outs[0][0] == outs[1][0]
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
