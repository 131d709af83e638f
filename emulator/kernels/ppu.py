"""PPU pooling on NC1HWC2: max, min and average (NUMERICS.md section 6).

Registers give kernel and stride (stored minus one), four pads, the pad value and, for the
average, RECIP_KERNEL_WIDTH/HEIGHT = 2**16 / k: an integer for int8/int16/int32 (vendor-corpus 4.3), the
fp16 bits of 2**16 / k for fp16 (NUMERICS.md 38). Positions of a window that
fall outside the input are padding: the average counts them at the pad value, max and min skip
them (rep07 programs pad value 0 for an input whose zero point is -91, so padding cannot take
part in a max).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import ppu_fp16
from npuemu.emulator.kernels.fp16 import fp32_to_fp16_canonical
from npuemu.isa.errors import EmulationError

_RANGES = {
    np.dtype(np.int8): (nm.INT8_MIN, nm.INT8_MAX),
    np.dtype(np.int16): (nm.INT16_MIN, nm.INT16_MAX),
    np.dtype(np.int32): (nm.INT32_MIN, nm.INT32_MAX),
}


@dataclass(frozen=True)
class PoolConfig:
    """Decoded PPU registers (kernel and stride as real sizes, not minus one)."""

    method: int
    kernel_h: int
    kernel_w: int
    out_h: int
    out_w: int
    stride_y: int = 1
    stride_x: int = 1
    pad_top: int = 0
    pad_bottom: int = 0
    pad_left: int = 0
    pad_right: int = 0
    pad_value: int | float = 0
    recip_kernel_w: int = 1 << 16
    recip_kernel_h: int = 1 << 16

    def __post_init__(self) -> None:
        if self.method not in (nm.POOL_AVERAGE, nm.POOL_MAX, nm.POOL_MIN):
            raise EmulationError(f"POOLING_METHOD {self.method} is not 0 (avg), 1 (max) or 2 (min)")
        sizes = (self.kernel_h, self.kernel_w, self.out_h, self.out_w, self.stride_y, self.stride_x)
        pads = (self.pad_top, self.pad_bottom, self.pad_left, self.pad_right)
        if min(sizes) <= 0 or min(pads) < 0:
            raise EmulationError(f"invalid pooling geometry {self}")


@njit(cache=True)
def _pool_int_lanes(source, method, kernel_h, kernel_w, stride_y, stride_x, pad_top, pad_left,
              pad_value, recip_w, recip_h, low, high, out):
    """Lane by lane, the taps innermost (the average pools: their running sum stays in a register
    per lane; the tap-major form of ``_pool_int`` measured slower for them)."""
    groups, height, width, c2 = source.shape
    _, out_h, out_w, _ = out.shape
    for g in range(groups):
        for oy in range(out_h):
            for ox in range(out_w):
                for lane in range(c2):
                    total = np.int64(0)
                    best = np.int64(0)
                    found = False
                    for ky in range(kernel_h):
                        y = oy * stride_y + ky - pad_top
                        for kx in range(kernel_w):
                            x = ox * stride_x + kx - pad_left
                            inside = 0 <= y < height and 0 <= x < width
                            if method == nm.POOL_AVERAGE:
                                total += np.int64(source[g, y, x, lane]) if inside else pad_value
                            elif inside:
                                value = np.int64(source[g, y, x, lane])
                                if not found or (value > best if method == nm.POOL_MAX
                                                 else value < best):
                                    best = value
                                    found = True
                    if method == nm.POOL_AVERAGE:
                        out[g, oy, ox, lane] = nm.pool_average_value(total, recip_w, recip_h, low,
                                                                     high)
                    else:
                        out[g, oy, ox, lane] = best if found else nm.saturate(pad_value, low, high)


@njit(cache=True)
def _pool_int(source, method, kernel_h, kernel_w, stride_y, stride_x, pad_top, pad_left,
              pad_value, recip_w, recip_h, low, high, out):
    """Max / min pools (average ones: ``_pool_int_lanes``) one output line at a time: for each of
    the kernel's taps in order (ky, kx), every output pixel of the line takes that tap's C2 lanes
    in one inner loop over its row of accumulators (issue 20: vectorised over the lanes; lane by
    lane with the taps innermost it ran ~7 ns an output element, now ~2). Each lane's value is the
    lane-by-lane one: each output pixel still sees its taps in the same order, and the running
    max / min of integers (the first inside tap, then each larger / smaller one) is the max / min
    of the inside taps; whether a tap is inside does not depend on the lane, so neither does
    ``found``."""
    if method == nm.POOL_AVERAGE:
        _pool_int_lanes(source, method, kernel_h, kernel_w, stride_y, stride_x, pad_top, pad_left, pad_value,
                        recip_w, recip_h, low, high, out)
        return
    groups, height, width, c2 = source.shape
    _, out_h, out_w, _ = out.shape
    acc = np.zeros((out_w, c2), np.int64)
    found = np.zeros(out_w, np.bool_)
    largest = method == nm.POOL_MAX
    empty = nm.saturate(np.int64(pad_value), low, high)
    for g in range(groups):
        for oy in range(out_h):
            found[:] = False  # (acc: written at each pixel's first inside tap before it is read)
            for ky in range(kernel_h):
                y = oy * stride_y + ky - pad_top
                row_inside = 0 <= y < height
                rows = source[g, y if row_inside else 0]
                for kx in range(kernel_w):
                    for ox in range(out_w):
                        x = ox * stride_x + kx - pad_left
                        inside = row_inside and 0 <= x < width
                        if inside:
                            total, tap = acc[ox], rows[x]
                            if not found[ox]:
                                for lane in range(c2):
                                    total[lane] = np.int64(tap[lane])
                                found[ox] = True
                            elif largest:
                                for lane in range(c2):
                                    total[lane] = max(total[lane], np.int64(tap[lane]))
                            else:
                                for lane in range(c2):
                                    total[lane] = min(total[lane], np.int64(tap[lane]))
            line = out[g, oy]
            for ox in range(out_w):
                o, total = line[ox], acc[ox]
                if found[ox]:
                    for lane in range(c2):
                        o[lane] = total[lane]
                else:
                    for lane in range(c2):
                        o[lane] = empty


@njit(cache=True)
def _pool_float(source, method, kernel_h, kernel_w, stride_y, stride_x, pad_top, pad_left,
                pad_value, recip_w, recip_h, out):
    groups, height, width, c2 = source.shape
    _, out_h, out_w, _ = out.shape
    for g in range(groups):
        for oy in range(out_h):
            for ox in range(out_w):
                for lane in range(c2):
                    total = np.float32(0)
                    best = np.float32(0)
                    found = False
                    for ky in range(kernel_h):
                        y = oy * stride_y + ky - pad_top
                        for kx in range(kernel_w):
                            x = ox * stride_x + kx - pad_left
                            inside = 0 <= y < height and 0 <= x < width
                            if method == nm.POOL_AVERAGE:
                                total += source[g, y, x, lane] if inside else pad_value
                            elif inside:
                                value = source[g, y, x, lane]
                                if not found or (value > best if method == nm.POOL_MAX
                                                 else value < best):
                                    best = value
                                    found = True
                    if method == nm.POOL_AVERAGE:
                        out[g, oy, ox, lane] = np.float32(np.float32(total * recip_w) * recip_h)
                    else:
                        out[g, oy, ox, lane] = best if found else pad_value


#: fp16 RECIP_KERNEL_*: bits 15:0 are an fp16 number whose top exponent (31) is 2**16, not infinity [V ORC]
FP16_RECIP_BITS = 16


def fp16_recip_value(bits: int) -> float:
    """The value of an fp16-mode RECIP_KERNEL_WIDTH/HEIGHT field (2**16 / k for the vendor's pools): IEEE
    fp16 bits with exponent 31 read as a normal number (0x7c00 = 2**16 for k = 1; NUMERICS.md 38)."""
    if bits >> FP16_RECIP_BITS:
        raise EmulationError(f"fp16 PPU RECIP_KERNEL value {bits:#x} sets bits above 15: the fp16 form "
                             f"holds the fp16 bits of 2**16 / k (0x7c00 for k = 1), not the integer form")
    exponent, mantissa = (bits >> 10) & 0x1F, bits & 0x3FF
    sign = -1.0 if bits >> 15 else 1.0
    if exponent == 0:
        return sign * mantissa * 2.0 ** -24
    return sign * (1024 + mantissa) * 2.0 ** (exponent - 25)


def pool_nc1hwc2(feature: np.ndarray, config: PoolConfig) -> np.ndarray:
    """Pool [C1][H][W][C2] int8/int16/int32 (or float16) -> [C1][OH][OW][C2] of the same type.

    Padding lanes (channels past the real count) are pooled like the others."""
    if feature.ndim != 4:
        raise EmulationError(f"PPU input must be [C1][H][W][C2], got shape {feature.shape}")
    shape = (feature.shape[0], config.out_h, config.out_w, feature.shape[3])
    args = (config.method, config.kernel_h, config.kernel_w, config.stride_y, config.stride_x,
            config.pad_top, config.pad_left)
    if feature.dtype == np.float16:
        if config.method != nm.POOL_AVERAGE:  # (max / min: the picked value's fp16 bits, kernels/ppu_fp16.py)
            return ppu_fp16.pool_extreme(feature, config)
        out32 = np.empty(shape, np.float32)
        # fp16 path: fp32 sum, times fp16 RECIP_W * 2**-16 then RECIP_H * 2**-16 in fp32, RNE to fp16
        average = config.method == nm.POOL_AVERAGE  # a max / min pool never reads the RECIP fields
        recip_w, recip_h = ((fp16_recip_value(config.recip_kernel_w), fp16_recip_value(config.recip_kernel_h))
                            if average else (0.0, 0.0))
        _pool_float(feature.astype(np.float32), *args, np.float32(config.pad_value),
                    np.float32(recip_w / 65536), np.float32(recip_h / 65536), out32)
        return fp32_to_fp16_canonical(out32)  # (every NaN 0x7E00: default-NaN mode, as the DPU's stores)
    dtype = np.dtype(feature.dtype)
    if dtype not in _RANGES:
        raise EmulationError(f"PPU pools int8, int16, int32 or float16 data, not {dtype}")
    out = np.empty(shape, dtype)
    low, high = _RANGES[dtype]
    _pool_int(np.ascontiguousarray(feature), *args, int(config.pad_value), config.recip_kernel_w,
              config.recip_kernel_h, low, high, out)
    return out
