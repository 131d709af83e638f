"""int8 depthwise convolution straight from the NC1HWC2 feature atoms, pixel-major (issue 8).

One Numba pass lays the int8 atoms [C1][H][W][C2] out pixel-major ([H][W][C], every channel of
a pixel contiguous; split by column phase x mod stride_x, so that a tap reads one contiguous
run of pixels whatever the stride). Then, per output row and kernel tap, one plain loop over
all the row's pixels and channels multiplies the inputs by their channels' weights (tiled over
the row) - the pad value wherever a tap falls outside the input (NUMERICS.md 3.1) - and sums
the inputs for the window sums (NUMERICS.md 3.4); where the three taps of a 1x3 kernel row
all read inside the input, one loop takes them together. The CORE stage (34-bit saturation,
CLIP_TRUNCATE) is applied on the way out. The output is pixel-major [OH*OW][C], the order of
the atoms the DPU writes.

Sums are int32: a window of ``taps`` products of |p| <= 2**14 stays below 2**31 while
taps < 2**17 (checked), so they are exact.
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
def _accumulate_run(acc, total, weights, src):
    # one contiguous run: weights repeat every C lanes (pre-tiled). Views, not offsets into
    # whole arrays: an index LLVM cannot prove non-negative carries Numba's wraparound branch,
    # which stops the vectorisation.
    for i in range(acc.size):
        value = np.int32(src[i])
        acc[i] += weights[i] * value
        total[i] += value


@njit(cache=True)
def _mac3(acc, w0, w1, w2, x0, x1, x2):
    # the three taps of a kernel row at once, where all three read inside the input: a third
    # of the accumulator traffic per product; the window sums in a loop of their own (one
    # written array per loop keeps LLVM's overlap checks few enough to vectorise)
    for i in range(acc.size):
        acc[i] += w0[i] * np.int32(x0[i]) + w1[i] * np.int32(x1[i]) + w2[i] * np.int32(x2[i])


@njit(cache=True)
def _sum3(total, x0, x1, x2):
    for i in range(total.size):
        total[i] += np.int32(x0[i]) + np.int32(x1[i]) + np.int32(x2[i])


@njit(cache=True)
def _source(phased, iy, phase, first, lanes, count):
    # ``count`` lanes of input row iy in its column phase, from pixel ``first`` of the phase
    return phased[iy, phase].reshape(-1)[first * lanes:first * lanes + count]


@njit(cache=True)
def _add_pad(acc, total, weights, pad):
    for i in range(acc.size):
        acc[i] += weights[i] * pad
        total[i] += pad


# The loops below that index with computed offsets use unsigned integers: Numba adds a
# negative-index wraparound branch to every signed computed index, which stops LLVM's
# vectorisation (and per-pixel views cost more than short copies); measured 3-4x.
@njit(cache=True)
def _to_pixel_major(words, phased_words):
    # atoms [S][H][W][atom words] -> [H][phase][W / phase][S * atom words], 8-byte words
    surfaces, height, width, atom_words = words.shape
    stride_x = phased_words.shape[1]
    source = words.reshape(-1)
    target = phased_words.reshape(-1)
    count, stride = np.uint64(atom_words), np.uint64(stride_x)
    phase_w, row = np.uint64(phased_words.shape[2]), np.uint64(surfaces * atom_words)
    plane = np.uint64(height * width * atom_words)
    for y in range(np.uint64(height)):
        for x in range(np.uint64(width)):
            first = ((y * stride + x % stride) * phase_w + x // stride) * row
            pixel = (y * np.uint64(width) + x) * count
            for s in range(np.uint64(surfaces)):
                for word in range(count):
                    target[first + s * count + word] = source[s * plane + pixel + word]


@njit(cache=True)
def _store_row(values, clip_truncate, mode, target):
    # ``values`` [OW * L] -> ``target`` [OW][C]: the first min(L, C) lanes of each pixel, 0 past L
    out_w, channels = target.shape
    lanes = values.size // out_w
    flat = target.reshape(-1)
    count, width, stride = np.uint64(min(lanes, channels)), np.uint64(channels), np.uint64(lanes)
    for ox in range(np.uint64(out_w)):
        first, source = ox * width, ox * stride
        if clip_truncate == 0:  # int32 sums: with CLIP_TRUNCATE 0 the CORE stage keeps them
            for c in range(count):
                flat[first + c] = values[source + c]
        else:
            for c in range(count):
                flat[first + c] = nm.core_output(values[source + c], clip_truncate, mode)
        for c in range(count, width):
            flat[first + c] = 0


@njit(cache=True)
def _depthwise_pixels(words, phased_words, phased, tiled, pad_value, kernel_h, kernel_w,
                      stride_y, stride_x, dilation_y, dilation_x, pad_top, pad_left,
                      clip_truncate, mode, out_size, out, sums):
    _to_pixel_major(words, phased_words)
    height = phased.shape[0]
    width = words.shape[2]
    out_h, out_w = out_size
    lanes = phased.shape[3]
    row = out_w * lanes
    acc = np.empty(row, np.int32)
    total = np.empty(row, np.int32)
    pad = np.int32(pad_value)
    # per kx: the column phase and shift its taps read (output column ox reads input column
    # ox * stride_x + offset: phase p, pixel ox + shift of it), and the columns [lo, hi) where
    # it reads inside the input row
    phases = np.empty(kernel_w, np.int64)
    shifts = np.empty(kernel_w, np.int64)
    lows = np.empty(kernel_w, np.int64)
    highs = np.empty(kernel_w, np.int64)
    for kx in range(kernel_w):
        offset = kx * dilation_x - pad_left
        p = offset % stride_x
        shift = (offset - p) // stride_x
        count = (width - p + stride_x - 1) // stride_x
        phases[kx], shifts[kx] = p, shift
        lows[kx] = min(out_w, max(0, -shift))
        highs[kx] = max(lows[kx], min(out_w, count - shift))
    # 1x3 kernel rows: the columns where all three taps read inside go through _mac3
    fused_lo, fused_hi = out_w, out_w
    if kernel_w == 3:
        fused_lo = max(lows[0], max(lows[1], lows[2]))
        fused_hi = max(fused_lo, min(highs[0], min(highs[1], highs[2])))
    for oy in range(out_h):
        acc[:] = 0
        total[:] = 0
        for ky in range(kernel_h):
            iy = oy * stride_y + ky * dilation_y - pad_top
            row_inside = 0 <= iy < height
            fused = row_inside and fused_hi > fused_lo
            if fused:
                a, b = fused_lo * lanes, fused_hi * lanes
                x0 = _source(phased, iy, phases[0], shifts[0] + fused_lo, lanes, b - a)
                x1 = _source(phased, iy, phases[1], shifts[1] + fused_lo, lanes, b - a)
                x2 = _source(phased, iy, phases[2], shifts[2] + fused_lo, lanes, b - a)
                _mac3(acc[a:b], tiled[ky * 3, a:b], tiled[ky * 3 + 1, a:b], tiled[ky * 3 + 2, a:b],
                      x0, x1, x2)
                _sum3(total[a:b], x0, x1, x2)
            for kx in range(kernel_w):
                weights = tiled[ky * kernel_w + kx]
                lo, hi = (lows[kx], highs[kx]) if row_inside else (out_w, out_w)
                a, b = lo * lanes, hi * lanes
                if a > 0:
                    _add_pad(acc[:a], total[:a], weights[:a], pad)
                if b < row:
                    _add_pad(acc[b:], total[b:], weights[b:], pad)
                # the inside columns the fused pass did not take
                for first, last in ((lo, fused_lo), (fused_hi, hi)) if fused else ((lo, hi), (hi, hi)):
                    if last > first:
                        a, b = first * lanes, last * lanes
                        _accumulate_run(acc[a:b], total[a:b], weights[a:b],
                                        _source(phased, iy, phases[kx], shifts[kx] + first, lanes, b - a))
        _store_row(acc, clip_truncate, mode, out[oy * out_w:(oy + 1) * out_w])
        _store_row(total, 0, mode, sums[oy * out_w:(oy + 1) * out_w])


def depthwise_int8_atoms(feature: np.ndarray, weights: np.ndarray, geometry: ConvGeometry,
                         pad_value: int, clip_truncate: int, round_mode: int,
                         out_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """CORE outputs int32 pixel-major [OH*OW][out_channels] (the channels of a pixel contiguous,
    the order of the atoms the DPU writes) and window sums int32 [out_channels][OH][OW] (a view
    of a pixel-major buffer) of an int8 depthwise convolution of ``feature`` (int8
    [C1][H][W][C2], channels past the real ones already zero) with ``weights`` int8
    [C][1][KH][KW]; channels from C on are 0 (no weights in the CBUF, REGISTER_SEMANTICS 2.5)."""
    if feature.ndim != 4 or feature.dtype != np.int8 or weights.dtype != np.int8:
        raise EmulationError(f"depthwise: expected int8 atoms [C1][H][W][C2] and int8 weights, got "
                             f"{feature.dtype} {feature.shape} and {weights.dtype} {weights.shape}")
    channels = weights.shape[0]
    if weights.shape[1:] != (1, geometry.kernel_h, geometry.kernel_w) \
            or channels > feature.shape[0] * feature.shape[3] or channels > out_channels:
        raise EmulationError(f"depthwise: weights {weights.shape} do not fit atoms {feature.shape}, "
                             f"a {geometry.kernel_h}x{geometry.kernel_w} kernel and {out_channels} outputs")
    taps = geometry.kernel_h * geometry.kernel_w
    if taps >= MAX_EXACT_TAPS:
        raise EmulationError(f"depthwise: {geometry.kernel_h}x{geometry.kernel_w} taps exceed the "
                             f"int32-exact bound of {MAX_EXACT_TAPS}")
    feature = np.ascontiguousarray(feature)
    surfaces, height, width, c2 = feature.shape
    if c2 % 8:
        raise EmulationError(f"depthwise: atoms of {c2} int8 lanes are not whole 8-byte words")
    lanes = surfaces * c2  # every lane of the atoms; those past C have zero weights
    out_h, out_w, stride = geometry.out_h, geometry.out_w, geometry.stride_x
    phase_w = -(-width // stride)
    phased_words = np.empty((height, stride, phase_w, lanes // 8), np.uint64)
    lane_weights = np.zeros((taps, lanes), np.int32)
    lane_weights[:, :channels] = weights.reshape(channels, taps).T
    tiled = np.ascontiguousarray(np.broadcast_to(lane_weights[:, None, :], (taps, out_w, lanes)))
    out = np.empty((out_h * out_w, out_channels), np.int32)
    # pixel-major like the output, handed over as its [C][OH][OW] view (the DPU reads the
    # buffer as it is); |sum| <= 128 * taps < 2**24
    sums = np.empty((out_h * out_w, out_channels), np.int32)
    _depthwise_pixels(feature.view(np.uint64), phased_words,
                      phased_words.view(np.int8).reshape(height, stride, phase_w, lanes),
                      tiled.reshape(taps, -1), int(pad_value), geometry.kernel_h, geometry.kernel_w,
                      geometry.stride_y, stride, geometry.dilation_y, geometry.dilation_x,
                      geometry.pad_top, geometry.pad_left, clip_truncate, round_mode, (out_h, out_w),
                      out, sums)
    sums[:, channels:lanes] = 0  # lanes past C summed their inputs; their outputs are 0 (0 weights)
    return out, sums.T.reshape(out_channels, out_h, out_w)
