"""fp16 <-> fp32 array conversions with the rounding of ``numerics`` (NUMERICS.md 7).

Numba has no float16, so these work on the raw bits: float32 as uint32, float16 as uint16.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm


@njit(cache=True)
def _fp32_to_fp16(bits32, bits16):
    for i in range(bits32.shape[0]):
        bits16[i] = nm.fp32_bits_to_fp16_bits(bits32[i])


@njit(cache=True)
def _fp16_to_fp32(bits16, bits32):
    for i in range(bits16.shape[0]):
        bits32[i] = nm.fp16_bits_to_fp32_bits(bits16[i])


def fp32_to_fp16(data: np.ndarray) -> np.ndarray:
    """fp32 -> fp16, round to nearest even, overflow to infinity."""
    source = np.ascontiguousarray(data, dtype=np.float32)
    out = np.empty(source.shape, np.float16)
    _fp32_to_fp16(source.view(np.uint32).reshape(-1), out.view(np.uint16).reshape(-1))
    return out


def fp16_to_fp32(data: np.ndarray) -> np.ndarray:
    """fp16 -> fp32, exact."""
    source = np.ascontiguousarray(data, dtype=np.float16)
    out = np.empty(source.shape, np.float32)
    _fp16_to_fp32(source.view(np.uint16).reshape(-1), out.view(np.uint32).reshape(-1))
    return out
