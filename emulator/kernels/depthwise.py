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

With an int8 pad value (every int8 model's) the input is padded once instead (``run_padded``,
NUMERICS.md 3.7): no border cases, a 3x3 kernel's nine taps of an element in one expression
(``_depthwise3x3``, MobileNetV2's depthwise layers), any other kernel's taps three at a time
(``_depthwise_rows``, issue 20: 1.5-2x the general kernel's speed on PP-OCR det's 1x1, 5x5 and
7x7 layers), products formed in 16 bits (exact: |w * x| <= 2**14), the CORE stage after the
sums where CLIP_TRUNCATE shifts. The general kernel above remains for pad values past int8.
Where the host has AVX-512 VNNI (``depthwise_vnni.available``) the prepared tasks hand
``run_padded`` packed weights and every kernel of up to 52 taps runs on ``vpdpbusd`` instead
(``depthwise_vnni.rows``, NUMERICS.md 45: the same exact sums, ~2x the arithmetic rate).

Sums are int32: a window of ``taps`` products of |p| <= 2**14 stays below 2**31 while
taps < 2**17 (checked), so they are exact.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import depthwise_vnni as vnni
from npuemu.emulator.kernels.conv_pixels import working_buffer
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
def _scatter_pixels(words, phased_words, pad_top, pad_left):
    # atoms [S][H][W][atom words] -> [Hp][phase][Wp / phase][S * atom words], 8-byte words:
    # input pixel (y, x) at padded row y + pad_top, column X = x + pad_left, which is in phase
    # X mod stride_x at X // stride_x. Per row and phase its columns are every stride_x-th
    # input column at consecutive positions: no division per pixel (issue 20: a 64-bit
    # division per pixel was most of this pass)
    surfaces, height, width, atom_words = words.shape
    source = words.reshape(-1)
    target = phased_words.reshape(-1)
    count, step = np.uint64(atom_words), np.uint64(phased_words.shape[1])
    phase_w, row = np.uint64(phased_words.shape[2]), np.uint64(surfaces * atom_words)
    plane, line = np.uint64(height * width * atom_words), np.uint64(width * atom_words)
    top, left = np.uint64(pad_top), np.uint64(pad_left)
    if width // phased_words.shape[1] >= surfaces:  # long rows: a surface's run at a time
        _scatter_runs(source, target, surfaces, height, width, atom_words, phased_words.shape[1], phased_words.shape[2],
                      pad_top, pad_left)
        return
    for y in range(np.uint64(height)):
        for phase in range(step):
            # the first input column in this phase, and its position there
            x = (phase + step - left % step) % step
            first = (((y + top) * step + phase) * phase_w + (x + left) // step) * row
            pixel = y * line + x * count
            while x < np.uint64(width):
                if atom_words == 2:  # 16-byte atoms: a fixed count LLVM unrolls
                    for s in range(np.uint64(surfaces)):
                        target[first + s * count] = source[s * plane + pixel]
                        target[first + s * count + np.uint64(1)] = source[s * plane + pixel + np.uint64(1)]
                else:
                    for s in range(np.uint64(surfaces)):
                        for word in range(count):
                            target[first + s * count + word] = source[s * plane + pixel + word]
                x += step
                first += row
                pixel += step * count


@njit(cache=True)
def _scatter_runs(source, target, surfaces, height, width, atom_words, stride, phase_w, pad_top, pad_left):
    # ``_scatter_pixels`` (flat words) with the surfaces outside: per row, phase and surface one
    # strided run of pixels (issue 20: ~2x faster where the rows are long and surfaces few)
    count, step = np.uint64(atom_words), np.uint64(stride)
    row = np.uint64(surfaces * atom_words)
    plane, line = np.uint64(height * width * atom_words), np.uint64(width * atom_words)
    top, left, wide = np.uint64(pad_top), np.uint64(pad_left), np.uint64(width)
    for y in range(np.uint64(height)):
        for phase in range(step):
            x = (phase + step - left % step) % step  # the first input column in this phase
            if x >= wide:
                continue
            pixels = (wide - x + step - np.uint64(1)) // step
            first = (((y + top) * step + phase) * np.uint64(phase_w) + (x + left) // step) * row
            pixel = y * line + x * count
            for s in range(np.uint64(surfaces)):
                at, start = first + s * count, s * plane + pixel
                if atom_words == 2:  # 16-byte atoms: a fixed count LLVM unrolls
                    for k in range(pixels):
                        target[at + k * row] = source[start + k * step * count]
                        target[at + k * row + np.uint64(1)] = source[start + k * step * count + np.uint64(1)]
                else:
                    for k in range(pixels):
                        for word in range(count):
                            target[at + k * row + word] = source[start + k * step * count + word]


@njit(cache=True)
def _to_pixel_major(words, phased_words):
    # atoms [S][H][W][atom words] -> [H][phase][W / phase][S * atom words], 8-byte words
    _scatter_pixels(words, phased_words, 0, 0)


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


@njit(cache=True)
def _pad_pixels(words, pad_word, phased_words, pad_top, pad_left):
    # atoms [S][H][W][atom words] -> [Hp][phase][Wp / phase][S * atom words] (8-byte words):
    # padded column X in phase X mod stride_x at X // stride_x, the input at (pad_top,
    # pad_left) (``_scatter_pixels``), every other word ``pad_word`` (the pad value in each
    # byte): the rows above and below the input whole, and in the input's rows the positions
    # left and right of it (each word written once; flat unsigned runs: the fills vectorise)
    height, width = words.shape[1], words.shape[2]
    padded_h, step, phase_w, row = phased_words.shape
    target = phased_words.reshape(-1)
    line, size = np.uint64(phase_w * row), np.uint64(row)
    for y in range(padded_h):
        inside = pad_top <= y < pad_top + height
        for phase in range(step):
            at = np.uint64(y * step + phase) * line
            # positions j < lo lie left of the input, j >= hi right of it (column j * step + phase)
            lo = min(max(-(-(pad_left - phase) // step), 0), phase_w)
            hi = min(max(-(-(pad_left + width - phase) // step), lo), phase_w)
            if not inside:
                lo, hi = phase_w, phase_w
            for i in range(np.uint64(lo) * size):
                target[at + i] = pad_word
            for i in range(np.uint64(hi) * size, line):
                target[at + i] = pad_word
    _scatter_pixels(words, phased_words, pad_top, pad_left)


@njit(cache=True, inline="always")
def _product16(weight, value):
    # int8 weight times int8 input as int16, widened: |w * x| <= 128 * 128 = 2**14 fits int16,
    # so the product truncated to 16 bits is exact, and LLVM then multiplies 16-bit lanes
    # (twice as many per vector as 32-bit ones; issue 20: the 3x3 rows ~15% faster)
    return np.int32(np.int16(weight * value))


@njit(cache=True)
def _depthwise3x3_rows(phased, tiled, out_h, out_w, stride_y, dilation_y, starts, acc, total):
    # output pixel ox, lane c reads tap (ky, kx) at flat index (ox + shift_kx) * L + c of input
    # row oy * stride_y + ky * dy in the column phase of kx (``starts`` [3][2]: phase, shift):
    # an output row is one run per tap. All nine taps of an element in one expression, the
    # window sum in a second loop (one written array per loop keeps LLVM's overlap checks few
    # enough to vectorise); every index comes from ``range`` or a slice (no wraparound branch).
    lanes = phased.shape[3]
    size = out_w * lanes
    p0, p1, p2 = starts[0, 0], starts[1, 0], starts[2, 0]
    s0, s1, s2 = starts[0, 1] * lanes, starts[1, 1] * lanes, starts[2, 1] * lanes
    for oy in range(out_h):
        iy = oy * stride_y
        top0, top1, top2 = phased[iy, p0].reshape(-1), phased[iy, p1].reshape(-1), phased[iy, p2].reshape(-1)
        iy += dilation_y
        mid0, mid1, mid2 = phased[iy, p0].reshape(-1), phased[iy, p1].reshape(-1), phased[iy, p2].reshape(-1)
        iy += dilation_y
        low0, low1, low2 = phased[iy, p0].reshape(-1), phased[iy, p1].reshape(-1), phased[iy, p2].reshape(-1)
        a0, a1, a2 = top0[s0:s0 + size], top1[s1:s1 + size], top2[s2:s2 + size]
        b0, b1, b2 = mid0[s0:s0 + size], mid1[s1:s1 + size], mid2[s2:s2 + size]
        c0, c1, c2 = low0[s0:s0 + size], low1[s1:s1 + size], low2[s2:s2 + size]
        row = acc[oy * out_w:(oy + 1) * out_w].reshape(-1)
        for i in range(size):
            row[i] = (_product16(tiled[0, i], a0[i]) + _product16(tiled[1, i], a1[i])
                      + _product16(tiled[2, i], a2[i]) + _product16(tiled[3, i], b0[i])
                      + _product16(tiled[4, i], b1[i]) + _product16(tiled[5, i], b2[i])
                      + _product16(tiled[6, i], c0[i]) + _product16(tiled[7, i], c1[i])
                      + _product16(tiled[8, i], c2[i]))
        row = total[oy * out_w:(oy + 1) * out_w].reshape(-1)
        for i in range(size):
            row[i] = (np.int32(a0[i]) + np.int32(a1[i]) + np.int32(a2[i]) + np.int32(b0[i])
                      + np.int32(b1[i]) + np.int32(b2[i]) + np.int32(c0[i]) + np.int32(c1[i])
                      + np.int32(c2[i]))


@njit(cache=True)
def _depthwise_rows(phased, tiled, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y, starts, acc, total):
    # any kernel over the padded input (``_depthwise3x3_rows``' layout; ``starts`` [KW][2]): per
    # output row, the taps of a kernel row added three at a time (a third of the accumulator
    # traffic per product), the window sums in loops of their own (one written array per loop)
    lanes = phased.shape[3]
    size = out_w * lanes
    for oy in range(out_h):
        row = acc[oy * out_w:(oy + 1) * out_w].reshape(-1)
        sums = total[oy * out_w:(oy + 1) * out_w].reshape(-1)
        row[:] = 0
        sums[:] = 0
        for ky in range(kernel_h):
            iy = oy * stride_y + ky * dilation_y
            for kx in range(0, kernel_w, 3):
                t, left = ky * kernel_w + kx, kernel_w - kx
                x0 = _tap_run(phased, iy, starts, kx, size)
                if left >= 3:
                    x1, x2 = _tap_run(phased, iy, starts, kx + 1, size), _tap_run(phased, iy, starts, kx + 2, size)
                    w0, w1, w2 = tiled[t], tiled[t + 1], tiled[t + 2]
                    for i in range(size):
                        row[i] += _product16(w0[i], x0[i]) + _product16(w1[i], x1[i]) + _product16(w2[i], x2[i])
                    for i in range(size):
                        sums[i] += np.int32(x0[i]) + np.int32(x1[i]) + np.int32(x2[i])
                elif left == 2:
                    x1, w0, w1 = _tap_run(phased, iy, starts, kx + 1, size), tiled[t], tiled[t + 1]
                    for i in range(size):
                        row[i] += _product16(w0[i], x0[i]) + _product16(w1[i], x1[i])
                    for i in range(size):
                        sums[i] += np.int32(x0[i]) + np.int32(x1[i])
                else:
                    w0 = tiled[t]
                    for i in range(size):
                        row[i] += _product16(w0[i], x0[i])
                    for i in range(size):
                        sums[i] += np.int32(x0[i])


#: lanes (surfaces x C2) from which ``run_padded`` runs a kernel other than 3x3 a pixel at a time
#: (``_depthwise_pixel_rows``): below, the rows' longer loops win (measured on ppocr_cls's 5x5 layers)
PIXEL_LANES = 64


@njit(cache=True)
def _depthwise_pixel_rows(phased, weights, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y, starts, acc,
                          total):
    # ``_depthwise_rows`` a pixel at a time with the lane weights as they are ([taps][L], not tiled
    # over an output row): wide atoms' tiled weights (taps x OW x L int16: 1 MiB for ppocr_cls's
    # widest 5x5) come from memory on each run, these stay in L1 (issue 20: ~1.7x on those layers,
    # cache cold); the same exact int32 sums (no product or sum can overflow: MAX_EXACT_TAPS)
    lanes = phased.shape[3]
    size = out_w * lanes
    for oy in range(out_h):
        rows, sum_rows = acc[oy * out_w:(oy + 1) * out_w], total[oy * out_w:(oy + 1) * out_w]
        rows[:] = 0
        sum_rows[:] = 0
        for ky in range(kernel_h):
            iy = oy * stride_y + ky * dilation_y
            for kx in range(0, kernel_w, 3):
                t, left = ky * kernel_w + kx, kernel_w - kx
                x0 = _tap_run(phased, iy, starts, kx, size)
                if left >= 3:
                    x1, x2 = _tap_run(phased, iy, starts, kx + 1, size), _tap_run(phased, iy, starts, kx + 2, size)
                    w0, w1, w2 = weights[t], weights[t + 1], weights[t + 2]
                    for ox in range(out_w):
                        row, sums, at = rows[ox], sum_rows[ox], ox * lanes
                        a, b, c = x0[at:at + lanes], x1[at:at + lanes], x2[at:at + lanes]
                        for i in range(lanes):
                            row[i] += _product16(w0[i], a[i]) + _product16(w1[i], b[i]) + _product16(w2[i], c[i])
                        for i in range(lanes):
                            sums[i] += np.int32(a[i]) + np.int32(b[i]) + np.int32(c[i])
                elif left == 2:
                    x1, w0, w1 = _tap_run(phased, iy, starts, kx + 1, size), weights[t], weights[t + 1]
                    for ox in range(out_w):
                        row, sums, at = rows[ox], sum_rows[ox], ox * lanes
                        a, b = x0[at:at + lanes], x1[at:at + lanes]
                        for i in range(lanes):
                            row[i] += _product16(w0[i], a[i]) + _product16(w1[i], b[i])
                        for i in range(lanes):
                            sums[i] += np.int32(a[i]) + np.int32(b[i])
                else:
                    w0 = weights[t]
                    for ox in range(out_w):
                        row, sums, a = rows[ox], sum_rows[ox], x0[ox * lanes:(ox + 1) * lanes]
                        for i in range(lanes):
                            row[i] += _product16(w0[i], a[i])
                        for i in range(lanes):
                            sums[i] += np.int32(a[i])


@njit(cache=True)
def _tap_run(phased, iy, starts, kx, size):
    # the inputs tap kx reads for a whole output row: one run of padded row iy's phase
    first = starts[kx, 1] * phased.shape[3]
    return phased[iy, starts[kx, 0]].reshape(-1)[first:first + size]


@njit(cache=True)
def _core_stage(values, clip_truncate, mode):
    # the CORE stage in place on exact int32 sums [P][L] (CLIP_TRUNCATE != 0)
    flat = values.reshape(-1)
    for i in range(flat.shape[0]):
        flat[i] = nm.core_output(np.int64(flat[i]), clip_truncate, mode)


def padded_layout(feature_shape: tuple[int, int, int, int], geometry: ConvGeometry) -> tuple[int, int, np.ndarray]:
    """The padded input's rows and positions per phase ([Hp][stride_x][Wp / stride_x][L]: every
    window inside) and per kernel column the (phase, shift) its taps read: tap kx of output
    column ox reads padded column ox * stride_x + kx * dilation_x."""
    _, height, width, _ = feature_shape
    stride = geometry.stride_x
    padded_h = max(height + geometry.pad_top,
                   (geometry.out_h - 1) * geometry.stride_y + (geometry.kernel_h - 1) * geometry.dilation_y + 1)
    padded_w = max(width + geometry.pad_left,
                   (geometry.out_w - 1) * stride + (geometry.kernel_w - 1) * geometry.dilation_x + 1)
    starts = np.array([divmod(kx * geometry.dilation_x, stride)[::-1] for kx in range(geometry.kernel_w)], np.int64)
    return padded_h, -(-padded_w // stride), starts


def run_padded(feature: np.ndarray, tiled: np.ndarray, geometry: ConvGeometry, pad_value: int, clip_truncate: int,
               round_mode: int, layout: tuple[int, int, np.ndarray], out: np.ndarray, sums: np.ndarray,
               lane_weights: np.ndarray | None = None, phased_words: np.ndarray | None = None,
               packed: np.ndarray | None = None) -> None:
    """The input padded once at the pad value and split by column phase (``padded_layout``), then
    the windows with no border cases - 3x3 kernels all nine taps in one expression
    (``_depthwise3x3_rows``, NUMERICS.md 3.7), others ``_depthwise_rows`` - into ``out`` and
    ``sums`` [OH*OW][L] int32; the CORE stage applied where CLIP_TRUNCATE is set. ``tiled``:
    int16 lane weights [taps][OW * L] (``_product16``); from PIXEL_LANES lanes on, other kernels
    run a pixel at a time (``_depthwise_pixel_rows``) on ``lane_weights``, its first L columns
    (contiguous; made here when not given). ``phased_words``: the padded input's buffer
    [Hp][stride_x][Wp / stride_x][L / 8] uint64 (default the thread's working buffer). ``packed``:
    ``depthwise_vnni.pack`` of the lane weights, given only where ``depthwise_vnni.available()``:
    any kernel then runs on ``vpdpbusd`` (``depthwise_vnni.rows``, the same exact sums;
    ``out`` and ``sums`` C-contiguous)."""
    padded_h, phase_w, starts = layout
    surfaces, _, _, c2 = feature.shape
    lanes, stride = surfaces * c2, geometry.stride_x
    if phased_words is None:
        phased_words = working_buffer("depthwise padded", padded_h * stride * phase_w * (lanes // 8),
                                      np.uint64).reshape(padded_h, stride, phase_w, lanes // 8)
    pad_word = np.uint64((pad_value & 0xFF) * 0x0101010101010101)
    _pad_pixels(feature.view(np.uint64), pad_word, phased_words, geometry.pad_top, geometry.pad_left)
    phased = phased_words.view(np.int8).reshape(padded_h, stride, phase_w, lanes)
    if packed is not None:
        weights = np.ascontiguousarray(tiled[:, :lanes]) if lane_weights is None else lane_weights
        vnni.rows(phased, packed, weights, geometry.kernel_h, geometry.kernel_w, geometry.out_h, geometry.out_w,
                  geometry.stride_y, geometry.dilation_y, starts, out, sums)
    elif geometry.kernel_h == geometry.kernel_w == 3:
        _depthwise3x3_rows(phased, tiled, geometry.out_h, geometry.out_w, geometry.stride_y, geometry.dilation_y,
                           starts, out, sums)
    elif lanes >= PIXEL_LANES:
        weights = np.ascontiguousarray(tiled[:, :lanes]) if lane_weights is None else lane_weights
        _depthwise_pixel_rows(phased, weights, geometry.kernel_h, geometry.kernel_w, geometry.out_h, geometry.out_w,
                              geometry.stride_y, geometry.dilation_y, starts, out, sums)
    else:
        _depthwise_rows(phased, tiled, geometry.kernel_h, geometry.kernel_w, geometry.out_h, geometry.out_w,
                        geometry.stride_y, geometry.dilation_y, starts, out, sums)
    if clip_truncate != 0:
        _core_stage(out, clip_truncate, round_mode)


def _tiled(lane_weights: np.ndarray, out_w: int, name: str | None = None) -> np.ndarray:
    """Per-tap lane weights [taps][L] repeated over an output row: [taps][OW][L] (in the thread's
    working buffer ``name`` if given: a fresh array of a wide layer is fresh pages that fault)."""
    taps, lanes = lane_weights.shape
    if name is None:
        return np.ascontiguousarray(np.broadcast_to(lane_weights[:, None, :], (taps, out_w, lanes)))
    tiled = working_buffer(name, taps * out_w * lanes, lane_weights.dtype).reshape(taps, out_w, lanes)
    tiled[:] = lane_weights[:, None, :]
    return tiled


def _depthwise3x3(feature: np.ndarray, tiled: np.ndarray, geometry: ConvGeometry, pad_value: int, out: np.ndarray,
                  sums: np.ndarray) -> None:
    """The common depthwise (NUMERICS.md 3.7): a 3x3 kernel with CLIP_TRUNCATE 0, over the input
    padded once (``run_padded``)."""
    run_padded(feature, tiled, geometry, pad_value, 0, nm.ROUND_HALF_EVEN, padded_layout(feature.shape, geometry),
               out, sums)


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
    lane_weights = np.zeros((taps, lanes), np.int32)
    lane_weights[:, :channels] = weights.reshape(channels, taps).T
    out = np.empty((out_h * out_w, out_channels), np.int32)
    # pixel-major like the output, handed over as its [C][OH][OW] view (the DPU reads the
    # buffer as it is); |sum| <= 128 * taps < 2**24
    sums = np.empty((out_h * out_w, out_channels), np.int32)
    if -128 <= pad_value <= 127 and geometry.pad_top >= 0 and geometry.pad_left >= 0:
        # the input padded once (NUMERICS.md 3.7; since issue 20 any kernel and CORE shift)
        tiled = _tiled(lane_weights.astype(np.int16), out_w, "depthwise tiled int16").reshape(taps, -1)
        if geometry.kernel_h == geometry.kernel_w == 3 and clip_truncate == 0:
            def compute(values: np.ndarray, window: np.ndarray) -> None:
                _depthwise3x3(feature, tiled, geometry, int(pad_value), values, window)
        else:
            layout = padded_layout(feature.shape, geometry)

            def compute(values: np.ndarray, window: np.ndarray) -> None:
                run_padded(feature, tiled, geometry, int(pad_value), clip_truncate, round_mode, layout, values, window)
        if out_channels == lanes:
            compute(out, sums)
        else:
            values = working_buffer("depthwise values", 2 * out_h * out_w * lanes, np.int32).reshape(2, -1, lanes)
            compute(values[0], values[1])
            kept = min(lanes, out_channels)
            out[:, :kept], sums[:, :kept] = values[0, :, :kept], values[1, :, :kept]
            out[:, kept:], sums[:, kept:] = 0, 0
        sums[:, channels:lanes] = 0
        return out, sums.T.reshape(out_channels, out_h, out_w)
    phase_w = -(-width // stride)
    phased_words = working_buffer("depthwise phased", height * stride * phase_w * (lanes // 8),
                                  np.uint64).reshape(height, stride, phase_w, lanes // 8)
    _depthwise_pixels(feature.view(np.uint64), phased_words,
                      phased_words.view(np.int8).reshape(height, stride, phase_w, lanes),
                      _tiled(lane_weights, out_w, "depthwise tiled").reshape(taps, -1), int(pad_value), geometry.kernel_h, geometry.kernel_w,
                      geometry.stride_y, stride, geometry.dilation_y, geometry.dilation_x,
                      geometry.pad_top, geometry.pad_left, clip_truncate, round_mode, (out_h, out_w),
                      out, sums)
    sums[:, channels:lanes] = 0  # lanes past C summed their inputs; their outputs are 0 (0 weights)
    return out, sums.T.reshape(out_channels, out_h, out_w)
