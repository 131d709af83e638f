"""The compiled loops of the runtime's input store (emulator/input_store.py, issue 20): one channel
group of a graph input -> its NC1HWC2 atoms in memory, converted on the way.

The group's lane count and its atom size are compile-time constants - the lengths of the tuples
the kernels take (the channels' rows; one placeholder per 64-bit word of an atom) - so LLVM unrolls
the lanes and vectorises over the pixels: ``atoms_as_words`` builds atoms of 8, 16, 32 bytes as
64-bit words (padding lanes zero bits), ``atoms_as_lanes`` writes packed atoms (C2 = the channels,
e.g. 3 bytes) as interleaved lanes. The element conversion (``_element``) is the type's:

- int8 (``how`` = (scale, zero point)): the reference's float64 operations - x / scale (a true
  division: x * (1 / scale) rounds differently next to ties), round half to even, + zero point,
  clamp to -128..127 -, a NaN flagged;
- float16 (``how`` = None): numpy's ``astype(np.float16)`` for every value but NaN (flagged: numpy
  decides NaN payloads): float32 through ``fp16.fp32_bits_to_fp16_bits_native`` (round to nearest
  even); float64 first rounded to odd into float32, which keeps the one rounding exact.

Here, in the kernels package, so that kernels/stale_cache.py drops their Numba cache when
``fp16.py`` (inlined) changes.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from npuemu.emulator.kernels.fp16 import fp32_bits_to_fp16_bits_native


@intrinsic
def _float32_bits(typingctx, value):
    """The bits of a float32 as a uint32 (a register bitcast)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


def _element(value, how):
    """(the stored bits of ``value`` as a uint64, whether it is a NaN); ``how``: (scale, zero
    point) for int8, None for float16."""
    raise NotImplementedError  # only called from Numba code (see the overload below)


def _lane_bits(how):
    """Bits of a stored element: 8 (int8, ``how`` a (scale, zero point) pair) or 16 (float16)."""
    raise NotImplementedError  # only called from Numba code (see the overload below)


@overload(_lane_bits, inline="always")
def _lane_bits_overload(how):
    if isinstance(how, types.NoneType):
        return lambda how: 16
    return lambda how: 8


@overload(_element, inline="always")
def _element_overload(value, how):
    if not isinstance(how, types.NoneType):
        def quantize(value, how):
            # the reference's float64 operations; min/max after the NaN test (a NaN is refused)
            q = np.rint(value / how[0]) + how[1]
            return np.uint64(np.uint8(np.int8(min(max(q, -128.0), 127.0)))), q != q
        return quantize
    if value == types.float32:
        return lambda value, how: (np.uint64(fp32_bits_to_fp16_bits_native(_float32_bits(value))), value != value)

    def halve_double(value, how):
        # float64 -> float32 rounded to odd (truncated, its last bit set if anything was cut): the
        # fp16 rounding of that is the fp16 rounding of the float64 itself (float32 keeps 13 bits
        # past fp16's), no double rounding
        single = np.float32(value)
        back = np.float64(single)
        bits = np.uint32((_float32_bits(single) - np.uint32(abs(back) > abs(value))) | np.uint32(back != value))
        return np.uint64(fp32_bits_to_fp16_bits_native(bits)), value != value
    return halve_double


@njit(cache=True, error_model="numpy")
def atoms_as_words(rows, how, out, words):
    """The atoms of one channel group as 64-bit words: ``rows`` its real channels' values
    (len(rows) lanes), ``out`` uint64 [surface x len(words)] (``words``: a tuple whose length is
    the words an atom takes); lanes past the rows and pixels past theirs 0. False on a NaN."""
    lanes, per_atom, width = len(rows), len(words), _lane_bits(how)
    per_word = 64 // width
    pixels = rows[0].shape[0]
    nan = False
    for pixel in range(pixels):
        for word in range(per_atom):
            bits = np.uint64(0)
            for slot in range(per_word):
                lane = word * per_word + slot
                if lane < lanes:  # (constant: the loops unroll, LLVM vectorises over the pixels)
                    value, bad = _element(rows[lane][pixel], how)
                    nan |= bad
                    bits |= value << np.uint64(slot * width)
            out[pixel * per_atom + word] = bits
    for index in range(pixels * per_atom, out.shape[0]):
        out[index] = 0
    return not nan


@njit(cache=True, error_model="numpy")
def atoms_as_lanes(rows, how, out):
    """The packed atoms (C2 = the group's channels) of one channel group: ``rows`` its channels'
    values, ``out`` [surface x len(rows)] of the stored bits' type; pixels past the rows' 0.
    False on a NaN."""
    lanes = len(rows)
    pixels = rows[0].shape[0]
    nan = False
    for pixel in range(pixels):
        for lane in range(lanes):
            value, bad = _element(rows[lane][pixel], how)
            nan |= bad
            out[pixel * lanes + lane] = value
    for index in range(pixels * lanes, out.shape[0]):
        out[index] = 0
    return not nan
