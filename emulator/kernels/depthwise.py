"""int8 depthwise convolution straight from the NC1HWC2 feature atoms (issue 8).

The general path pads the fetched cube into float32 planes first (``mac.fetch_padded_input``)
and then runs a loop per channel; for depthwise layers that copy and the per-channel loops
cost more than the arithmetic. Here one Numba loop reads the int8 atoms [C1][H][W][C2] as the
CNA fetched them, treats every position outside the input as the pad value (NUMERICS.md 3.1),
multiplies the C2 lanes of an atom by their channels' weights, and applies the CORE stage
(34-bit saturation, CLIP_TRUNCATE) on the way out. Sums are int32: a window of ``taps``
products of |p| <= 2**14 stays below 2**31 while taps < 2**17 (checked), so they are exact.
The window sums the BS CPEND term needs come from the same pass (NUMERICS.md 3.4).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.isa.errors import EmulationError

#: Taps per window below which int32 sums of int8 products cannot overflow (2**31 / 2**14).
MAX_EXACT_TAPS = 1 << 17


@njit(cache=True)
def _accumulate_run(acc, total, weights, src, count):
    # one contiguous run of count * C2 lanes: weights repeat every C2 lanes (pre-tiled)
    for i in range(count):
        value = np.int32(src[i])
        acc[i] += weights[i] * value
        total[i] += value


@njit(cache=True)
def _depthwise_atoms(feature, words, phased, phased_words, weights, pad_value, kernel_h, kernel_w,
                     stride_y, stride_x, dilation_y, dilation_x, pad_top, pad_left, clip_truncate,
                     mode, out, sums):
    groups, height, width, c2 = feature.shape
    channels = weights.shape[0]
    _, out_h, out_w = out.shape
    acc = np.empty(out_w * c2, np.int32)
    total = np.empty(out_w * c2, np.int32)
    # per tap, its lane weights tiled over a whole output row: each run below is one plain
    # loop that LLVM vectorises
    tiled = np.zeros((kernel_h, kernel_w, out_w * c2), np.int32)
    # ``phased``: the group's rows split by column phase (x mod stride_x), so that a tap reads
    # a contiguous run of atoms whatever the stride; atoms move as 8-byte words (``words`` and
    # ``phased_words`` view the same bytes)
    atom_words = words.shape[3]
    flat = feature.reshape(groups, height, width * c2)
    pad = np.int32(pad_value)
    for g in range(groups):
        lanes = min(c2, channels - g * c2)
        if lanes <= 0:
            break
        tiled[:, :, :] = 0
        for lane in range(lanes):
            for ky in range(kernel_h):
                for kx in range(kernel_w):
                    w = np.int32(weights[g * c2 + lane, 0, ky, kx])
                    for ox in range(out_w):
                        tiled[ky, kx, ox * c2 + lane] = w
        if stride_x > 1:
            for y in range(height):
                for p in range(stride_x):
                    j = 0
                    for x in range(p, width, stride_x):
                        for word in range(atom_words):
                            phased_words[y, p, j * atom_words + word] = words[g, y, x, word]
                        j += 1
        for oy in range(out_h):
            acc[:] = 0
            total[:] = 0
            for ky in range(kernel_h):
                iy = oy * stride_y + ky * dilation_y - pad_top
                row_inside = 0 <= iy < height
                for kx in range(kernel_w):
                    w = tiled[ky, kx]
                    # output column ox reads input column ox * stride_x + offset: phase p,
                    # index ox + shift within it; [lo, hi) fall inside the input row
                    offset = kx * dilation_x - pad_left
                    p = offset % stride_x
                    shift = (offset - p) // stride_x
                    count = (width - p + stride_x - 1) // stride_x
                    lo, hi = out_w, out_w
                    if row_inside:
                        lo = min(out_w, max(0, -shift))
                        hi = max(lo, min(out_w, count - shift))
                    for ox in range(out_w):
                        if lo <= ox < hi:
                            continue
                        for lane in range(c2):
                            acc[ox * c2 + lane] += w[ox * c2 + lane] * pad
                            total[ox * c2 + lane] += pad
                    if hi > lo:
                        if stride_x == 1:
                            src = flat[g, iy, (lo + shift) * c2:(hi + shift) * c2]
                        else:
                            src = phased[iy, p, (lo + shift) * c2:(hi + shift) * c2]
                        _accumulate_run(acc[lo * c2:hi * c2], total[lo * c2:hi * c2],
                                        w[lo * c2:hi * c2], src, (hi - lo) * c2)
            for lane in range(lanes):
                c = g * c2 + lane
                for ox in range(out_w):
                    sums[c, oy, ox] = total[ox * c2 + lane]
                if clip_truncate == 0:  # int32 sums: the CORE stage leaves them as they are
                    for ox in range(out_w):
                        out[c, oy, ox] = acc[ox * c2 + lane]
                else:
                    for ox in range(out_w):
                        out[c, oy, ox] = nm.core_output(acc[ox * c2 + lane], clip_truncate, mode)


def depthwise_int8_atoms(feature: np.ndarray, weights: np.ndarray, geometry: ConvGeometry,
                         pad_value: int, clip_truncate: int, round_mode: int,
                         out_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """CORE outputs int32 [out_channels][OH][OW] and window sums int32 [out_channels][OH][OW] of
    an int8 depthwise convolution of ``feature`` (int8 [C1][H][W][C2], channels past the real
    ones already zero) with ``weights`` int8 [C][1][KH][KW]; channels from C on are 0 (no
    weights in the CBUF, REGISTER_SEMANTICS 2.5)."""
    if feature.ndim != 4 or feature.dtype != np.int8 or weights.dtype != np.int8:
        raise EmulationError(f"depthwise: expected int8 atoms [C1][H][W][C2] and int8 weights, got "
                             f"{feature.dtype} {feature.shape} and {weights.dtype} {weights.shape}")
    channels = weights.shape[0]
    if weights.shape[1:] != (1, geometry.kernel_h, geometry.kernel_w) \
            or channels > feature.shape[0] * feature.shape[3] or channels > out_channels:
        raise EmulationError(f"depthwise: weights {weights.shape} do not fit atoms {feature.shape}, "
                             f"a {geometry.kernel_h}x{geometry.kernel_w} kernel and {out_channels} outputs")
    if geometry.kernel_h * geometry.kernel_w >= MAX_EXACT_TAPS:
        raise EmulationError(f"depthwise: {geometry.kernel_h}x{geometry.kernel_w} taps exceed the "
                             f"int32-exact bound of {MAX_EXACT_TAPS}")
    shape = (out_channels, geometry.out_h, geometry.out_w)
    out = np.empty(shape, np.int32)
    sums = np.empty(shape, np.int32)  # |sum| <= 128 * taps < 2**24: int32 halves the traffic
    out[channels:] = 0
    sums[channels:] = 0
    feature = np.ascontiguousarray(feature)
    groups, height, width, c2 = feature.shape
    if c2 % 8:
        raise EmulationError(f"depthwise: atoms of {c2} int8 lanes are not whole 8-byte words")
    stride = geometry.stride_x
    phased_words = np.empty((height, stride, -(-width // stride) * c2 // 8), np.uint64)
    _depthwise_atoms(feature, feature.view(np.uint64), phased_words.view(np.int8), phased_words,
                     np.ascontiguousarray(weights), int(pad_value),
                     geometry.kernel_h, geometry.kernel_w, geometry.stride_y, geometry.stride_x,
                     geometry.dilation_y, geometry.dilation_x, geometry.pad_top, geometry.pad_left,
                     clip_truncate, round_mode, out, sums)
    return out, sums
