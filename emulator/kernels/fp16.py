"""fp16 <-> fp32 array conversions with the rounding of ``numerics`` (NUMERICS.md 7).

Numba has no float16, so these work on the raw bits: float32 as uint32, float16 as uint16.

Speed (issue 20): fp32 -> fp16 rounds with integer adds and a select instead of branches
(:func:`fp32_bits_to_fp16_bits_fast`, ~4x faster); fp16 -> fp32
reads a 65536-entry table of ``numerics.fp16_bits_to_fp32_bits`` (:func:`widening_table`).
Both give the bits of the per-element functions (tests/emulator/test_fp16_fast.py).

Where the CPU converts itself (x86 F16C: vcvtps2ph / vcvtph2ps, NUMERICS.md 33),
:func:`fp32_bits_to_fp16_bits_native` and :func:`fp16_bits_to_fp32_bits_native` use its
instructions, with the same bits (checked on all 2**32 fp32 patterns and all 2**16 fp16 ones;
tests/emulator/test_fp16_native_conversions.py): ~3x and ~5x faster in vector loops; elsewhere they are the
functions above. :func:`fp32_to_fp16` rounds with the first; :func:`fp32_to_fp16_canonical` (the DPU's and
PPU's stores) also makes every NaN the canonical 0x7E00.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.canonical_nan import BITS16 as CANONICAL16

#: fp32 bit patterns whose fp16 result is a normal number (half exponent 1..30 before the
#: carry): 2**-14 <= |x| < 2**16 (exponent field 113..142)
_NORMAL_LOW, _NORMAL_HIGH = 113 << 23, 143 << 23
#: -(127 - 15) << 23 modulo 2**32: rebiases the exponent field from fp32 to fp16
_REBIAS = (1 << 32) - (112 << 23)


@njit(cache=True, inline="always")
def fp32_bits_to_fp16_bits_fast(bits):
    """``numerics.fp32_bits_to_fp16_bits`` of uint32 ``bits`` as three candidates and a select
    (no branch on the data, so the array loops vectorise; ReLU outputs are mostly zeros):

    - normal results: the low 13 bits round up on a carry out of ``+ 0xFFF + odd`` (ties to
      even), a mantissa carry moves the exponent up (to 0x7C00 = infinity from 65520 on);
    - subnormal results and zero: the significand shifted right by 126 - exponent (at most 31:
      every shift past 24 gives 0, as does an fp32 zero or subnormal), rounded to nearest even
      the same way;
    - overflow and infinity 0x7C00, NaN quiet with the top of its payload."""
    magnitude = bits & np.uint32(0x7FFFFFFF)
    odd = (magnitude >> np.uint32(13)) & np.uint32(1)
    normal = (magnitude + np.uint32(_REBIAS) + np.uint32(0xFFF) + odd) >> np.uint32(13)
    # in 1..31 (a normal input's shift is never used, but stays a defined one)
    shift = min(np.uint32(126) - min(magnitude >> np.uint32(23), np.uint32(125)), np.uint32(31))
    significand = (magnitude & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
    small = (significand + ((np.uint32(1) << (shift - np.uint32(1))) - np.uint32(1))
             + ((significand >> shift) & np.uint32(1))) >> shift
    big = np.uint32(0x7C00) if magnitude <= np.uint32(0x7F800000) else \
        np.uint32(0x7E00) | ((magnitude >> np.uint32(13)) & np.uint32(0x3FF))
    half = small if magnitude < np.uint32(_NORMAL_LOW) else (normal if magnitude < np.uint32(_NORMAL_HIGH) else big)
    return np.uint16(half | ((bits >> np.uint32(16)) & np.uint32(0x8000)))


def converts_halves(context) -> bool:
    """Whether the machine code Numba makes for ``context`` has x86's F16C conversions (Numba's
    target features: the host's unless NUMBA_CPU_FEATURES says otherwise). Only F16C is taken: its
    rounding is checked on every pattern (the module docstring); other targets use the bit formulas."""
    features = getattr(context.codegen(), "_tm_features", "") or ""
    return "+f16c" in features.split(",")


@intrinsic
def native_halves(typingctx):
    """True in compiled code whose target converts halves itself (``converts_halves``), a constant
    LLVM folds: kernels pick a loop made for those instructions or one made for the table."""
    def codegen(context, builder, signature, args):
        return ir.IntType(1)(int(converts_halves(context)))
    return types.boolean(), codegen


@intrinsic
def fp32_bits_to_fp16_bits_native(typingctx, bits):
    """``fp32_bits_to_fp16_bits_fast`` of uint32 ``bits``: F16C's vcvtps2ph where the target has it
    (round to nearest even - MXCSR's default mode, which nothing here changes -, overflow to
    infinity, NaN quiet with the top of its payload: the same bits on all 2**32 inputs)."""
    if bits != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        if not converts_halves(context):
            return context.compile_internal(builder, fp32_bits_to_fp16_bits_fast.py_func, signature, args)
        half = builder.fptrunc(builder.bitcast(args[0], ir.FloatType()), ir.HalfType())
        return builder.bitcast(half, ir.IntType(16))
    return types.uint16(types.uint32), codegen


@intrinsic
def fp16_bits_to_fp32_bits_native(typingctx, bits):
    """``numerics.fp16_bits_to_fp32_bits`` of uint16 ``bits`` (exact): F16C's vcvtph2ps where the
    target has it, which quiets a signalling NaN (0x7C01..0x7DFF, sign either): its quiet bit
    (1 << 22) is cleared again, as the exact widening keeps it clear."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return _widened_bits(context, builder, args[0])
    return types.uint32(types.uint16), codegen


def _widened_bits(context, builder, bits):
    # fp16_bits_to_fp32_bits_native's code: F16C's widening and the signalling-NaN repair, or the formula
    if not converts_halves(context):
        return context.compile_internal(builder, nm.fp16_bits_to_fp32_bits.py_func,
                                        types.uint32(types.uint16), (bits,))
    wide = builder.bitcast(builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType()), ir.IntType(32))
    i16 = ir.IntType(16)
    nan_head = builder.icmp_unsigned("==", builder.and_(bits, i16(0x7E00)), i16(0x7C00))
    payload = builder.icmp_unsigned("!=", builder.and_(bits, i16(0x1FF)), i16(0))
    signalling = builder.zext(builder.and_(nan_head, payload), ir.IntType(32))
    return builder.xor(wide, builder.shl(signalling, ir.IntType(32)(22)))


@njit(cache=True, inline="always")
def fp32_bits_to_fp16_bits_canonical(bits):
    """``fp32_bits_to_fp16_bits_native`` of uint32 ``bits``, every NaN the canonical fp16 NaN 0x7E00
    (the DPU's / PPU's float stores, NUMERICS.md section on the canonical NaN of the DPU: default-NaN
    mode): one compare and select, vectorised with the conversion; finite values and infinities as
    the conversion gives them."""
    half = fp32_bits_to_fp16_bits_native(bits)
    return np.uint16(CANONICAL16) if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else half


@njit(cache=True)
def _fp32_to_fp16(bits32, bits16):
    for i in range(bits32.shape[0]):
        bits16[i] = fp32_bits_to_fp16_bits_native(bits32[i])


@njit(cache=True)
def _fp32_to_fp16_canonical(bits32, bits16):
    for i in range(bits32.shape[0]):
        bits16[i] = fp32_bits_to_fp16_bits_canonical(bits32[i])


@njit(cache=True)
def _fp16_to_fp32(bits16, bits32):
    for i in range(bits16.shape[0]):
        bits32[i] = nm.fp16_bits_to_fp32_bits(bits16[i])


@njit(cache=True)
def _widen_by_table(bits16, table, bits32):
    for i in range(bits16.shape[0]):
        bits32[i] = table[bits16[i]]


@functools.cache
def widening_table() -> np.ndarray:
    """uint32 [65536]: the fp32 bits of every fp16 bit pattern (``numerics.fp16_bits_to_fp32_bits``,
    exact); read-only, built once per process (256 KiB)."""
    table = np.empty(1 << 16, np.uint32)
    _fp16_to_fp32(np.arange(1 << 16, dtype=np.uint16), table)
    table.flags.writeable = False
    return table


def fp32_to_fp16(data: np.ndarray) -> np.ndarray:
    """fp32 -> fp16, round to nearest even, overflow to infinity."""
    source = np.ascontiguousarray(data, dtype=np.float32)
    out = np.empty(source.shape, np.float16)
    _fp32_to_fp16(source.view(np.uint32).reshape(-1), out.view(np.uint16).reshape(-1))
    return out


def fp32_to_fp16_canonical(data: np.ndarray) -> np.ndarray:
    """``fp32_to_fp16`` with every NaN the canonical fp16 NaN 0x7E00 (the DPU's and PPU's fp16 stores;
    the input quantisation and host ops keep ``fp32_to_fp16``)."""
    source = np.ascontiguousarray(data, dtype=np.float32)
    out = np.empty(source.shape, np.float16)
    _fp32_to_fp16_canonical(source.view(np.uint32).reshape(-1), out.view(np.uint16).reshape(-1))
    return out


def fp16_to_fp32(data: np.ndarray) -> np.ndarray:
    """fp16 -> fp32, exact."""
    source = np.ascontiguousarray(data, dtype=np.float16)
    out = np.empty(source.shape, np.float32)
    _widen_by_table(source.view(np.uint16).reshape(-1), widening_table(), out.view(np.uint32).reshape(-1))
    return out


@intrinsic
def fp16_bits_to_float32_native(typingctx, bits):
    """The float32 value of fp16 ``bits`` (uint16): ``fp16_bits_to_fp32_bits_native`` read as a float
    (a register bitcast, for kernels that compute on the value instead of storing its bits)."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(_widened_bits(context, builder, args[0]), ir.FloatType())
    return types.float32(types.uint16), codegen
