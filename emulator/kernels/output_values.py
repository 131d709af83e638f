"""The compiled loops of the runtime's output read (emulator/output_read.py, issue 20): float16 ->
float32 widening (exact, with a flag for signalling NaNs) and int8 dequantization (the reference's
float64 operations). Here, in the kernels package, so that kernels/stale_cache.py drops their Numba
cache when ``fp16.py`` (inlined) changes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels.fp16 import fp16_bits_to_float32_native


@njit(cache=True)
def widen_bits(bits, out):
    """float16 ``bits`` (uint16) -> float32 ``out``, exact (F16C where the target has it); False if
    a signalling NaN was among them (its quiet bit is then the caller's choice)."""
    signalling = False
    for index in range(bits.shape[0]):
        value = bits[index]
        out[index] = fp16_bits_to_float32_native(value)
        signalling |= ((value & np.uint16(0x7E00)) == np.uint16(0x7C00)) & ((value & np.uint16(0x1FF)) != 0)
    return not signalling


@njit(cache=True)
def dequantize_values(stored, scale, zero_point, out):
    """``out`` = float32((float64(stored) - zero_point) * scale), element by element."""
    for index in range(stored.shape[0]):
        out[index] = np.float32((np.float64(stored[index]) - zero_point) * scale)
