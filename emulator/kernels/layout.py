"""Feature-map layouts: NCHW / NHWC <-> NC1HWC2.

The NPU stores feature maps as NC1HWC2: C1 = ceil(C / C2) channel groups, each pixel of a
group one C2-wide atom, padding channels zero (hardware.md 2; rknpu-isa.md 4). C2 is
16 bytes / element size (int8 16, fp16 8, int32 4) - except the first layer's packed input,
whose C2 is its real channel count (3 bytes per pixel, hardware.md 2 and vendor-corpus 5) -
and depthwise outputs are allocated with C rounded up to 64 channels (vendor-corpus 4.3).
The caller chooses C2 and, for over-allocated outputs, C1; see NUMERICS.md section 8.

float16 arrays are handled as their uint16 bits (Numba has no float16 arithmetic).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.isa.errors import EmulationError

#: Channel multiple of a depthwise convolution's output allocation (vendor-corpus 4.3).
DEPTHWISE_OUTPUT_CHANNEL_ALIGN = 64


def channel_groups(channels: int, c2: int, channel_align: int | None = None) -> int:
    """C1 for ``channels`` stored C2-wide; ``channel_align`` rounds C up first (depthwise: 64)."""
    if channels <= 0 or c2 <= 0:
        raise EmulationError(f"channel count {channels} and C2 {c2} must be positive")
    if channel_align:
        if channel_align % c2:
            raise EmulationError(f"channel alignment {channel_align} is not a multiple of C2 {c2}")
        channels = -(-channels // channel_align) * channel_align
    return -(-channels // c2)


@njit(cache=True)
def _chw_to_c1hwc2(source, destination):
    channels, height, width = source.shape
    c2 = destination.shape[3]
    for c in range(channels):
        group, lane = c // c2, c % c2
        for y in range(height):
            for x in range(width):
                destination[group, y, x, lane] = source[c, y, x]


@njit(cache=True)
def _c1hwc2_to_chw(source, destination):
    channels, height, width = destination.shape
    c2 = source.shape[3]
    for c in range(channels):
        group, lane = c // c2, c % c2
        for y in range(height):
            for x in range(width):
                destination[c, y, x] = source[group, y, x, lane]


@njit(cache=True)
def _hwc_to_c1hwc2(source, destination):
    height, width, channels = source.shape
    c2 = destination.shape[3]
    for y in range(height):
        for x in range(width):
            for c in range(channels):
                destination[c // c2, y, x, c % c2] = source[y, x, c]


@njit(cache=True)
def _c1hwc2_to_hwc(source, destination):
    height, width, channels = destination.shape
    c2 = source.shape[3]
    for y in range(height):
        for x in range(width):
            for c in range(channels):
                destination[y, x, c] = source[c // c2, y, x, c % c2]


def _as_numba(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    return array.view(np.uint16) if array.dtype == np.float16 else array


def _as_batched(array: np.ndarray, rank: int, name: str) -> tuple[np.ndarray, bool]:
    if array.ndim == rank:
        return array[None], False
    if array.ndim == rank + 1:
        return array, True
    raise EmulationError(
        f"{name} must have {rank} or {rank + 1} dimensions, got shape {array.shape}")


def _convert_to_nc1hwc2(array, kernel, rank, name, c2, c1, channel_axis):
    batched, has_batch = _as_batched(array, rank, name)
    channels = batched.shape[1 + channel_axis]
    needed = channel_groups(channels, c2)
    groups = needed if c1 is None else c1
    if groups < needed:
        raise EmulationError(f"C1 {groups} cannot hold {channels} channels at C2 {c2}")
    height, width = batched.shape[2:4] if channel_axis == 0 else batched.shape[1:3]
    result = np.zeros((batched.shape[0], groups, height, width, c2), dtype=batched.dtype)
    for n in range(batched.shape[0]):
        kernel(_as_numba(batched[n]), _as_numba(result[n]))
    return result if has_batch else result[0]


def _convert_from_nc1hwc2(array, kernel, name, channels, channel_axis):
    batched, has_batch = _as_batched(array, 4, name)
    _, groups, height, width, c2 = batched.shape
    if channels <= 0 or channels > groups * c2:
        raise EmulationError(f"{name} of shape {array.shape} cannot hold {channels} channels")
    shape = (channels, height, width) if channel_axis == 0 else (height, width, channels)
    result = np.empty((batched.shape[0],) + shape, dtype=batched.dtype)
    for n in range(batched.shape[0]):
        kernel(_as_numba(batched[n]), _as_numba(result[n]))
    return result if has_batch else result[0]


def nchw_to_nc1hwc2(array: np.ndarray, c2: int, c1: int | None = None) -> np.ndarray:
    """[N][C][H][W] (or [C][H][W]) -> [N][C1][H][W][C2], padding channels zero."""
    return _convert_to_nc1hwc2(array, _chw_to_c1hwc2, 3, "NCHW array", c2, c1, 0)


def nhwc_to_nc1hwc2(array: np.ndarray, c2: int, c1: int | None = None) -> np.ndarray:
    """[N][H][W][C] (or [H][W][C]) -> [N][C1][H][W][C2], padding channels zero."""
    return _convert_to_nc1hwc2(array, _hwc_to_c1hwc2, 3, "NHWC array", c2, c1, 2)


def nc1hwc2_to_nchw(array: np.ndarray, channels: int) -> np.ndarray:
    """[N][C1][H][W][C2] (or without N) -> [N][C][H][W], keeping the first ``channels``."""
    return _convert_from_nc1hwc2(array, _c1hwc2_to_chw, "NC1HWC2 array", channels, 0)


def nc1hwc2_to_nhwc(array: np.ndarray, channels: int) -> np.ndarray:
    """[N][C1][H][W][C2] (or without N) -> [N][H][W][C], keeping the first ``channels``."""
    return _convert_from_nc1hwc2(array, _c1hwc2_to_hwc, "NC1HWC2 array", channels, 2)
