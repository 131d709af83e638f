"""The PPU's fp16 max and min pools on the fp16 bits (issue 20; NUMERICS.md, section on fp16 max pools).

``ppu.pool_nc1hwc2`` pools an fp16 cube in fp32 (``_pool_float``: widened, compared in fp32, rounded
back with every NaN the canonical 0x7E00), lane by lane in a scalar loop, with a widening pass and a
rounding pass around it: ~100 us for ppocr_cls fp16's one 2x2 max pool (38,400 elements). A max or
min picks one of its window's values, and fp16 -> fp32 -> fp16 is exact, so the result is the picked
value's own fp16 bits. :func:`pool_extreme` picks it on the bits, a window's lanes together:

- a non-NaN fp16 orders as its sign times its magnitude bits (bits 14:0; infinity 0x7C00 the
  largest), and -0 and +0 both give 0: equal, as in fp32;
- the window's first inside value starts the pick, a later one replaces it only when it is greater
  (max) or smaller (min) and neither is a NaN - ``_pool_float``'s ``value > best`` / ``value < best``,
  false whenever a NaN takes part: a NaN first stays, a NaN later is skipped;
- a picked NaN is stored as 0x7E00 and a window with no inside position stores the pad value (its
  fp16 bits, NaN canonical), as ``fp32_to_fp16_canonical`` does.

So the bits are ``_pool_float``'s (tests/emulator/test_ppu_fp16_extreme.py against a numpy model).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm

_MAGNITUDE, _SIGN, _INFINITY, _CANONICAL_NAN = 0x7FFF, 0x8000, 0x7C00, 0x7E00


@njit(cache=True)
def _pool_bits(source, greater, kernel_h, kernel_w, stride_y, stride_x, pad_top, pad_left, pad_bits, out):
    # the module's pick over uint16 [G][H][W][C2] into [G][OH][OW][C2] (``greater``: a max pool); a
    # window's inside positions are a rectangle, taken row by row, the first one starting the pick
    groups, height, width, c2 = source.shape
    _, out_h, out_w, _ = out.shape
    flat, target = source.reshape(-1), out.reshape(-1)
    key, bits = np.empty(c2, np.int32), np.empty(c2, np.int32)
    at = 0
    for g in range(groups):
        for oy in range(out_h):
            y0, y1 = max(oy * stride_y - pad_top, 0), min(oy * stride_y - pad_top + kernel_h, height)
            for ox in range(out_w):
                x0, x1 = max(ox * stride_x - pad_left, 0), min(ox * stride_x - pad_left + kernel_w, width)
                if y0 >= y1 or x0 >= x1:
                    target[at:at + c2] = pad_bits
                else:
                    _window(flat, ((g * height + y0) * width + x0) * c2, y1 - y0, x1 - x0, width * c2, c2, key, bits,
                            greater)
                    for lane in range(c2):
                        b = bits[lane]
                        target[at + lane] = _CANONICAL_NAN if b & _MAGNITUDE > _INFINITY else b
                at += c2


@njit(cache=True)
def _window(flat, first, rows, columns, line, c2, key, bits, greater):
    # the pick of one window's inside rectangle (``rows`` x ``columns`` positions from element ``first``)
    for lane in range(c2):
        b = np.int32(flat[first + lane])
        bits[lane], key[lane] = b, _key(b)
    for r in range(rows):
        for column in range(1 if r == 0 else 0, columns):
            _pick(flat, first + r * line + column * c2, key, bits, greater, c2)


@njit(cache=True, inline="always")
def _key(b):
    # a non-NaN fp16's order: its sign times its magnitude bits (-0 and +0 both 0)
    magnitude = b & _MAGNITUDE
    return -magnitude if b & _SIGN else magnitude


@njit(cache=True, inline="always")
def _pick(flat, at, key, bits, greater, lanes):
    # one inside position's lanes (from element ``at``) against the picks: replaced where greater (max) /
    # smaller (min), neither a NaN (a NaN's magnitude is above infinity's)
    for lane in range(lanes):
        b = np.int32(flat[at + lane])
        k, held = _key(b), key[lane]
        better = k > held if greater else k < held
        take = better & (b & _MAGNITUDE <= _INFINITY) & (bits[lane] & _MAGNITUDE <= _INFINITY)
        key[lane] = k if take else held  # (selects, not a branch: picks in random data mispredict)
        bits[lane] = b if take else bits[lane]


def pad_bits(pad_value: float) -> int:
    """The fp16 bits an empty window stores: the pad value rounded to fp16, a NaN the canonical 0x7E00
    (numpy scalar work of ~1.3 us: kept for the pad values seen, by value and sign - -0.0 equals 0.0)."""
    return _pad_bits(pad_value, math.copysign(1.0, pad_value))


@lru_cache(maxsize=64)
def _pad_bits(pad_value: float, sign: float) -> int:
    value = np.float16(np.float32(pad_value))
    return _CANONICAL_NAN if np.isnan(value) else int(value.view(np.uint16))


def pool_extreme(feature: np.ndarray, config) -> np.ndarray:
    """A max or min pool (``config``: a ``ppu.PoolConfig``) of a float16 [C1][H][W][C2] cube ->
    float16 [C1][OH][OW][C2], the bits of ``ppu._pool_float`` then ``fp32_to_fp16_canonical``."""
    out = np.empty((feature.shape[0], config.out_h, config.out_w, feature.shape[3]), np.float16)
    _pool_bits(np.ascontiguousarray(feature).view(np.uint16), config.method == nm.POOL_MAX, config.kernel_h,
               config.kernel_w, config.stride_y, config.stride_x, config.pad_top, config.pad_left,
               pad_bits(config.pad_value), out.view(np.uint16))
    return out
