"""fp16 conversions on the CPU's own instructions (``fp16.fp32_bits_to_fp16_bits_native``,
``fp16_bits_to_fp32_bits_native``; x86 F16C, NUMERICS.md 33) against test_fp16_fast's references
(float64 rounding with the quiet-NaN rule; the fp16 fields read arithmetically): every fp16 pattern,
fp32 patterns around each rounding edge and at random, the same bits on a target without F16C
(the bit formulas), and the fp16 fetch's whole-atom loop at C2 = 16. The widening without its
signalling-NaN repair is caught."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from npuemu.emulator.kernels.fp16 import fp16_bits_to_fp32_bits_native, fp32_bits_to_fp16_bits_native
from npuemu.emulator.kernels.mac import ConvGeometry, fetch_padded_input
from tests.emulator.test_fp16_fast import reference_to_half, reference_to_single
from tests.emulator.test_speed_fp16_fetch import reference as fetch_reference

#: fp32 patterns around every fp16 rounding edge: zero, the smallest subnormal's half (2**-25) and
#: ties below it, the subnormal / normal boundary (2**-14), a normal tie, the overflow edge (65520),
#: infinity and the NaNs after it
EDGES = (0x00000000, 0x33000000, 0x33400000, 0x337FFFFF, 0x38800000, 0x387FF000, 0x3F801000, 0x477FEFFF,
         0x477FF000, 0x7F800000, 0x7FC00000)


@njit
def narrow_all(bits, out):
    for i in range(bits.size):
        out[i] = fp32_bits_to_fp16_bits_native(bits[i])


@njit
def widen_all(bits, out):
    for i in range(bits.size):
        out[i] = fp16_bits_to_fp32_bits_native(bits[i])


def edge_patterns(spread: int = 4096) -> np.ndarray:
    around = np.concatenate([np.arange(edge - spread, edge + spread, dtype=np.int64) for edge in EDGES])
    around = around[(around >= 0) & (around < 1 << 31)].astype(np.uint32)
    return np.concatenate([around, around | np.uint32(0x80000000)])


def narrowed(bits: np.ndarray) -> np.ndarray:
    out = np.empty(bits.size, np.uint16)
    narrow_all(np.ascontiguousarray(bits, np.uint32), out)
    return out


def test_every_fp16_pattern_widens_exactly():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(halves.size, np.uint32)
    widen_all(halves, out)
    assert np.array_equal(out, reference_to_single(halves))


def test_fp32_patterns_at_the_rounding_edges():
    bits = edge_patterns()
    assert np.array_equal(narrowed(bits), reference_to_half(bits))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300))
def test_random_fp32_patterns_round_to_fp16(patterns):
    bits = np.array(patterns, np.uint32)
    assert np.array_equal(narrowed(bits), reference_to_half(bits))


@intrinsic
def _plain_widening(typingctx, bits):
    """Broken on purpose: the CPU's widening without the signalling-NaN repair."""
    def codegen(context, builder, signature, args):
        single = builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        return builder.bitcast(single, ir.IntType(32))
    return types.uint32(types.uint16), codegen


@njit
def _plain_widen_all(bits, out):
    for i in range(bits.size):
        out[i] = _plain_widening(bits[i])


def test_a_widening_that_quiets_signalling_nans_is_caught():
    if "+f16c" not in _target_features().split(","):
        pytest.skip("no F16C in Numba's target: the CPU's widening is not used")
    halves = np.arange(0x7C00, 0x7E00, dtype=np.uint16)
    out = np.empty(halves.size, np.uint32)
    _plain_widen_all(halves, out)
    assert not np.array_equal(out, reference_to_single(halves))


def _target_features() -> str:
    from numba.core.registry import cpu_target
    return getattr(cpu_target.target_context.codegen(), "_tm_features", "") or ""


_WITHOUT_F16C = """
import numpy as np
from tests.emulator.test_fp16_fast import reference_to_half, reference_to_single
from tests.emulator.test_fp16_native_conversions import edge_patterns, narrow_all, widen_all
bits, halves = edge_patterns(256), np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
narrow, wide = np.empty(bits.size, np.uint16), np.empty(halves.size, np.uint32)
narrow_all(bits, narrow)
widen_all(halves, wide)
assert np.array_equal(narrow, reference_to_half(bits)) and np.array_equal(wide, reference_to_single(halves))
assert "vcvtps2ph" not in narrow_all.inspect_asm(narrow_all.signatures[0])
from npuemu.emulator.kernels.mac import ConvGeometry, fetch_padded_input
from tests.emulator.test_speed_fp16_fetch import reference
atoms = halves.view(np.float16).reshape(2, 32, 128, 8)
for geometry in (ConvGeometry(1, 1, 32, 128), ConvGeometry(3, 3, 32, 128, pad_top=1, pad_left=1)):
    got = fetch_padded_input(atoms, 16, geometry, 0.5)
    assert np.array_equal(got.view(np.uint32), reference(atoms, 16, geometry, 0.5).view(np.uint32))
print("ok")
"""


def test_a_target_without_f16c_uses_the_bit_formulas():
    env = dict(os.environ, NUMBA_CPU_NAME="x86-64", NUMBA_CPU_FEATURES="+64bit,+cx8,+fxsr,+mmx,+sse,+sse2")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", _WITHOUT_F16C], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 12), st.integers(0, 2), st.integers(0, 2**31 - 1))
def test_fetch_of_sixteen_lane_atoms(groups, height, width, pad, seed):
    """C2 = 16 atoms (the fetch's lane loop) with channel counts that leave exactly 8 lanes in a
    surface, where the whole-atom loop (C2 = 8 only) must not be taken."""
    rng = np.random.default_rng(seed)
    atoms = rng.integers(0, 1 << 16, (groups, height, width, 16), dtype=np.uint32).astype(np.uint16).view(np.float16)
    channels = (groups - 1) * 16 + 8
    geometry = ConvGeometry(3, 3, height + 2 * pad - 2 if height + 2 * pad > 2 else 1,
                            width + 2 * pad - 2 if width + 2 * pad > 2 else 1, pad_top=pad, pad_left=pad)
    got = fetch_padded_input(atoms, channels, geometry, 0.5)
    assert np.array_equal(got.view(np.uint32), fetch_reference(atoms, channels, geometry, 0.5).view(np.uint32))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 200), st.integers(0, 2), st.integers(1, 3), st.integers(0, 2),
       st.integers(0, 2**31 - 1))
def test_fetch_of_wide_rows_and_whole_planes(groups, height, width, pad, kernel, missing, seed):
    """C2 = 8 atoms on rows wide enough for the CPU's widening (one run per plane when nothing pads
    the rows, one per row otherwise), with surfaces short of lanes (``missing``) taking the table."""
    rng = np.random.default_rng(seed)
    atoms = rng.integers(0, 1 << 16, (groups, height, width, 8), dtype=np.uint32).astype(np.uint16).view(np.float16)
    channels = max(1, groups * 8 - missing)
    out_h, out_w = max(1, height + 2 * pad - kernel + 1), max(1, width + 2 * pad - kernel + 1)
    geometry = ConvGeometry(kernel, kernel, out_h, out_w, pad_top=pad, pad_left=pad)
    got = fetch_padded_input(atoms, channels, geometry, -0.75)
    assert np.array_equal(got.view(np.uint32), fetch_reference(atoms, channels, geometry, -0.75).view(np.uint32))
