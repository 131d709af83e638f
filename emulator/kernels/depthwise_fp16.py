"""fp16 depthwise convolution straight from the CBUF's float16 atoms (issue 20; NUMERICS.md 36).

``mac.conv2d_fp16``'s direct loop (``mac._conv_direct_float``) runs a channel at a time on padded
float32 planes that ``mac.fetch_padded_input`` transposes out of the atoms first (plus, at stride 2,
a copy into phase planes); on the small maps of a mobile network's late layers (7x7, 14x14) a
channel's runs are a few dozen elements and its fixed costs dominate. :func:`depthwise_fp16_atoms`
keeps the atoms' order: per group of 8 channels (one atom a pixel) the input is widened once into
pixel-major phase planes ([SY][SX][rows][pitch][8], ``mac._phase_planes``' phases with the 8 lanes
innermost; stride 1: the padded map itself), and each tap is one multiply-add pass over a "wide" line
of ``pitch`` pixels a row (NUMERICS.md 33), 8 channels a pixel, with each lane's weight repeated
along the line (``lane_tiles``). Each output element gets +0, then its products in (ky, kx) order,
one fp32 rounding per add - the direct loop's order (NUMERICS.md 3.3, 30) - on the same operands:
inputs widened exactly from their fp16 bits (section 7), the pad value wherever the padded planes
hold it. So the bits are the direct loop's.

Where Numba's target has F16C, ``conv_fp16_plan`` runs ``depthwise_fp16_rows`` instead (the same bits,
accumulators in registers; NUMERICS.md 49): this kernel is the portable path, and its 1x1 scaling loop
(``_scale_unzip8``) still takes the long runs there.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels.canonical_nan import canonical_nans, canonical_rows
from npuemu.emulator.kernels.fp16 import fp16_bits_to_float32_native

#: lanes of an fp16 atom (C2): 8 channels a pixel
LANES = 8
#: line length (floats) from which a 5- or 7-wide kernel row goes in one pass (``_add_taps5``; measured:
#: 14x14 maps ~20% faster, 7x7 ones slower), and a 3x3 kernel's nine taps (``_add_taps9``)
_LONG_LINE = 1024
#: longest run of a tap's repeated lane weights (``lane_tiles``): the multiply-add pass goes in runs of
#: it (measured 128 / 256 / 512: 256 fastest, ~25% ahead of 128 on 56x56 maps)
TILE = 256


def phase_layout(geometry) -> tuple[int, int, int]:
    """(rows a phase, pitch, line length in pixels) of ``geometry`` (``mac._conv_direct_float``'s)."""
    pitch = -(-((geometry.out_w - 1) * geometry.stride_x + (geometry.kernel_w - 1) * geometry.dilation_x + 1)
              // geometry.stride_x)
    rows = (geometry.out_h - 1) * geometry.stride_y + (geometry.kernel_h - 1) * geometry.dilation_y + 1
    return -(-rows // geometry.stride_y), pitch, (geometry.out_h - 1) * pitch + geometry.out_w


def lane_tiles(matrices: np.ndarray, geometry) -> np.ndarray:
    """float32 [C1][KH * KW][T] of depthwise float32 weights [K][1][KH][KW]: tap t of kernel 8 g + lane
    at [g][t][8 i + lane] for every i (lanes past K hold 0); T = min(TILE, the line's 8 lanes a pixel)."""
    kernels, taps = matrices.shape[0], matrices.shape[2] * matrices.shape[3]
    groups, length = -(-kernels // LANES), min(TILE, phase_layout(geometry)[2] * LANES)
    lanes = np.zeros((groups * LANES, taps), np.float32)
    lanes[:kernels] = matrices.reshape(kernels, taps)
    per_group = lanes.reshape(groups, LANES, taps).transpose(0, 2, 1)  # [g][tap][lane]
    return np.ascontiguousarray(np.tile(per_group, (1, 1, length // LANES)))


@njit(cache=True)
def _widen_phases(source, pixels, stride_y, stride_x, pad_top, pad_left, pad, phase_rows, pitch, phases, gathered):
    # phases [SY][SX][phase_rows][pitch][8] (flat) of one group's atoms ``source`` [H][W][8] (``pixels``:
    # the same bits as uint64 [H][W][2], two a pixel): phase (py, px) holds the padded map's pixel
    # (r SY + py, q SX + px) at (r, q), the pad value outside the input. A row's atoms are widened in
    # one contiguous run (vcvtph2ps); at a stride they are first gathered into ``gathered`` (uint64
    # [pitch][2], its uint16 view ``gathered.view``), 16 bytes a pixel
    height, width, _ = source.shape
    flat, halves = source.reshape(-1), gathered.reshape(-1).view(np.uint16)
    plane = phase_rows * pitch * LANES
    for py in range(stride_y):
        for px in range(stride_x):
            base = (py * stride_x + px) * plane
            lo = min(pitch, max(0, -((px - pad_left) // stride_x)))  # q with 0 <= q SX + px - pad_left < W
            hi = min(pitch, max(lo, -((px - pad_left - width) // stride_x)))
            for r in range(phase_rows):
                y = r * stride_y + py - pad_top
                line = phases[base + r * pitch * LANES:base + (r + 1) * pitch * LANES]
                if y < 0 or y >= height:
                    line[:] = pad
                    continue
                line[:lo * LANES] = pad
                line[hi * LANES:] = pad
                if stride_x == 1:  # a contiguous run of atoms
                    start = (y * width + lo - pad_left) * LANES
                    _widen_run(flat[start:start + (hi - lo) * LANES], line[lo * LANES:hi * LANES])
                    continue
                row = pixels[y]
                for q in range(lo, hi):
                    x = q * stride_x + px - pad_left
                    gathered[q, 0] = row[x, 0]
                    gathered[q, 1] = row[x, 1]
                _widen_run(halves[lo * LANES:hi * LANES], line[lo * LANES:hi * LANES])


@njit(cache=True, inline="always")
def _widen_run(run, target):
    for i in range(run.shape[0]):
        target[i] = fp16_bits_to_float32_native(run[i])


@njit(cache=True)
def _depthwise_atoms(bits16, pixels, tiles, kernel_h, kernel_w, stride_y, stride_x, dilation_y, dilation_x, pad_top,
                     pad_left, pad, phase_rows, pitch, phases, gathered, line, out):
    # bits16 [C1][H][W][8] (uint16), ``pixels`` its uint64 view [C1][H][W][2]; tiles [C1][KH * KW][T];
    # phases and line float32 scratch of SY SX phase_rows pitch 8 and ((OH - 1) pitch + OW) 8 elements;
    # gathered uint64 [pitch][2]; out float32 [K][OH][OW]
    kernels, out_h, out_w = out.shape
    if kernel_h == kernel_w == stride_y == stride_x == 1 and pad_top == pad_left == 0 \
            and out_h <= bits16.shape[1] and out_w <= bits16.shape[2]:  # a 1x1 kernel on the input itself
        _scaled_atoms(bits16, tiles, out)
        return
    length = ((out_h - 1) * pitch + out_w) * LANES
    plane = phase_rows * pitch * LANES
    acc = line[:length]
    for g in range(min(bits16.shape[0], -(-kernels // LANES))):
        _widen_phases(bits16[g], pixels[g], stride_y, stride_x, pad_top, pad_left, pad, phase_rows, pitch, phases,
                      gathered)
        if kernel_h == kernel_w == 3 and length >= _LONG_LINE:  # the nine taps in one pass (same adds, same order)
            r0, p0 = divmod(0, stride_y)
            r1, p1 = divmod(dilation_y, stride_y)
            r2, p2 = divmod(2 * dilation_y, stride_y)
            _add_taps9(acc, phases, tiles[g],
                       _start(p0, r0, 0, dilation_x, stride_x, plane, pitch),
                       _start(p0, r0, 1, dilation_x, stride_x, plane, pitch),
                       _start(p0, r0, 2, dilation_x, stride_x, plane, pitch),
                       _start(p1, r1, 0, dilation_x, stride_x, plane, pitch),
                       _start(p1, r1, 1, dilation_x, stride_x, plane, pitch),
                       _start(p1, r1, 2, dilation_x, stride_x, plane, pitch),
                       _start(p2, r2, 0, dilation_x, stride_x, plane, pitch),
                       _start(p2, r2, 1, dilation_x, stride_x, plane, pitch),
                       _start(p2, r2, 2, dilation_x, stride_x, plane, pitch))
        elif kernel_w != 3:
            acc[:] = 0
        for ky in range(0 if kernel_h == kernel_w == 3 and length >= _LONG_LINE else kernel_h):
            row, py = divmod(ky * dilation_y, stride_y)
            if kernel_w == 3:  # a kernel row's three taps in one pass (the same adds in the same order)
                _add_taps3(acc, phases, tiles[g, ky * 3], tiles[g, ky * 3 + 1], tiles[g, ky * 3 + 2],
                           _start(py, row, 0, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 1, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 2, dilation_x, stride_x, plane, pitch), ky == 0)
                continue
            # 5 and 7 taps a pass: ~2.4 memory accesses a product instead of 4 (session 16); on short
            # lines the vector loop's overlap checks of 15 streams cost more than they save
            if kernel_w == 5 and length >= _LONG_LINE:
                _add_taps5(acc, phases, tiles[g], ky * 5, _start(py, row, 0, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 1, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 2, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 3, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 4, dilation_x, stride_x, plane, pitch))
                continue
            if kernel_w == 7 and length >= _LONG_LINE:
                _add_taps7(acc, phases, tiles[g], ky * 7, _start(py, row, 0, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 1, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 2, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 3, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 4, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 5, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 6, dilation_x, stride_x, plane, pitch))
                continue
            for kx in range(kernel_w):
                _add_tap(acc, phases, tiles[g, ky * kernel_w + kx], _start(py, row, kx, dilation_x, stride_x, plane,
                                                                          pitch))
        canonical_nans(acc)  # a NaN sum stored as the canonical NaN (NUMERICS.md 3.3)
        lanes = min(LANES, kernels - g * LANES)
        for oy in range(out_h):
            source = acc[oy * pitch * LANES:(oy * pitch + out_w) * LANES]
            if lanes == LANES:
                _unzip8(source, out[g * LANES:(g + 1) * LANES, oy])
                continue
            for lane in range(lanes):
                target = out[g * LANES + lane, oy]
                for ox in range(out_w):
                    target[ox] = source[ox * LANES + lane]


@njit(cache=True)
def _scaled_atoms(bits16, tiles, out):
    # a 1x1 depthwise kernel at stride 1 without padding: out[8 g + lane, y, x] = +0 + w * x (one
    # rounding: the product is exact), widened and unzipped from the atoms in one pass, no phase
    # planes and no line (session 16: ppocr_det's 1x1 depthwise scalings, ~0.5 -> ~0.1 ns an element)
    kernels, out_h, out_w = out.shape
    width = bits16.shape[2]
    for g in range(min(bits16.shape[0], -(-kernels // LANES))):
        lanes = min(LANES, kernels - g * LANES)
        weights = tiles[g, 0]
        if lanes == LANES and out_w == width:  # whole rows back to back: one run
            _scale_unzip8(bits16[g, :out_h].reshape(-1), weights, out[g * LANES:(g + 1) * LANES].reshape(LANES, -1))
            continue
        for y in range(out_h):
            source = bits16[g, y, :out_w].reshape(-1)
            if lanes == LANES:
                _scale_unzip8(source, weights, out[g * LANES:(g + 1) * LANES, y])
                continue
            zero = np.float32(0)
            for lane in range(lanes):
                target, weight = out[g * LANES + lane, y], weights[lane]
                for x in range(out_w):
                    target[x] = zero + weight * fp16_bits_to_float32_native(source[x * LANES + lane])
                canonical_nans(target)  # (NUMERICS.md 3.3: the canonical NaN)


@njit(cache=True, inline="always")
def _scale_unzip8(source, weights, targets):
    # targets[lane][x] = +0 + weights[lane] * the fp16 source[8 x + lane] widened: eight strided reads
    # of one stride in one loop (mac._widen_atoms8's form, which LLVM vectorises)
    t0, t1, t2, t3 = targets[0], targets[1], targets[2], targets[3]
    t4, t5, t6, t7 = targets[4], targets[5], targets[6], targets[7]
    w0, w1, w2, w3 = weights[0], weights[1], weights[2], weights[3]
    w4, w5, w6, w7 = weights[4], weights[5], weights[6], weights[7]
    zero = np.float32(0)
    for x in range(t0.shape[0]):
        t0[x] = zero + w0 * fp16_bits_to_float32_native(source[8 * x])
        t1[x] = zero + w1 * fp16_bits_to_float32_native(source[8 * x + 1])
        t2[x] = zero + w2 * fp16_bits_to_float32_native(source[8 * x + 2])
        t3[x] = zero + w3 * fp16_bits_to_float32_native(source[8 * x + 3])
        t4[x] = zero + w4 * fp16_bits_to_float32_native(source[8 * x + 4])
        t5[x] = zero + w5 * fp16_bits_to_float32_native(source[8 * x + 5])
        t6[x] = zero + w6 * fp16_bits_to_float32_native(source[8 * x + 6])
        t7[x] = zero + w7 * fp16_bits_to_float32_native(source[8 * x + 7])
    canonical_rows(targets)  # a NaN product stored as the canonical NaN (NUMERICS.md 3.3)


@njit(cache=True, inline="always")
def _unzip8(source, targets):
    # pixel-major source [OW][8] -> targets [8][OW]: eight strided reads of one stride in one loop
    # (mac._widen_atoms8's form: LLVM turns it into wide loads and shuffles)
    t0, t1, t2, t3 = targets[0], targets[1], targets[2], targets[3]
    t4, t5, t6, t7 = targets[4], targets[5], targets[6], targets[7]
    for x in range(t0.shape[0]):
        t0[x] = source[8 * x]
        t1[x] = source[8 * x + 1]
        t2[x] = source[8 * x + 2]
        t3[x] = source[8 * x + 3]
        t4[x] = source[8 * x + 4]
        t5[x] = source[8 * x + 5]
        t6[x] = source[8 * x + 6]
        t7[x] = source[8 * x + 7]


@njit(cache=True, inline="always")
def _start(py, row, kx, dilation_x, stride_x, plane, pitch):
    # where tap (py phase row ``row``, kx) starts in the flat phases: mac._tap_run's run, 8 lanes a pixel
    column, px = divmod(kx * dilation_x, stride_x)
    return (py * stride_x + px) * plane + (row * pitch + column) * LANES


@njit(cache=True, inline="always")
def _add_tap(acc, phases, tile, start):
    for first in range(0, acc.shape[0], tile.shape[0]):
        count = min(tile.shape[0], acc.shape[0] - first)
        target, source = acc[first:first + count], phases[start + first:start + first + count]
        for i in range(count):
            target[i] += tile[i] * source[i]


@njit(cache=True, inline="always")
def _add_taps3(acc, phases, tile0, tile1, tile2, start0, start1, start2, fresh):
    # mac._add_row3's adds: each accumulator + its three products in kx order, one rounding per add;
    # ``fresh`` (the first kernel row): the accumulator is +0, not read (no pass zeroing the line;
    # +0 + p is not folded to p: no fast-math flags, and it turns a -0 product into +0)
    zero = np.float32(0)
    for first in range(0, acc.shape[0], tile0.shape[0]):
        count = min(tile0.shape[0], acc.shape[0] - first)
        target = acc[first:first + count]
        first0 = phases[start0 + first:start0 + first + count]
        first1 = phases[start1 + first:start1 + first + count]
        first2 = phases[start2 + first:start2 + first + count]
        if fresh:
            for i in range(count):
                value = zero + tile0[i] * first0[i]
                value = value + tile1[i] * first1[i]
                target[i] = value + tile2[i] * first2[i]
            continue
        for i in range(count):
            value = target[i] + tile0[i] * first0[i]
            value = value + tile1[i] * first1[i]
            target[i] = value + tile2[i] * first2[i]


@njit(cache=True, inline="always")
def _add_taps9(acc, phases, tiles, start0, start1, start2, start3, start4, start5, start6, start7, start8):
    # a 3x3 kernel's nine taps in one pass: each accumulator +0, then its products in (ky, kx) order,
    # one rounding per add - _add_taps3's three passes without reading and writing the line between
    # them (session 16: ~20-25 % faster on lines of 28x28 maps and wider)
    zero = np.float32(0)
    t0, t1, t2, t3, t4 = tiles[0], tiles[1], tiles[2], tiles[3], tiles[4]
    t5, t6, t7, t8 = tiles[5], tiles[6], tiles[7], tiles[8]
    for first in range(0, acc.shape[0], t0.shape[0]):
        count = min(t0.shape[0], acc.shape[0] - first)
        target = acc[first:first + count]
        s0 = phases[start0 + first:start0 + first + count]
        s1 = phases[start1 + first:start1 + first + count]
        s2 = phases[start2 + first:start2 + first + count]
        s3 = phases[start3 + first:start3 + first + count]
        s4 = phases[start4 + first:start4 + first + count]
        s5 = phases[start5 + first:start5 + first + count]
        s6 = phases[start6 + first:start6 + first + count]
        s7 = phases[start7 + first:start7 + first + count]
        s8 = phases[start8 + first:start8 + first + count]
        for i in range(count):
            value = zero + t0[i] * s0[i]
            value = value + t1[i] * s1[i]
            value = value + t2[i] * s2[i]
            value = value + t3[i] * s3[i]
            value = value + t4[i] * s4[i]
            value = value + t5[i] * s5[i]
            value = value + t6[i] * s6[i]
            value = value + t7[i] * s7[i]
            target[i] = value + t8[i] * s8[i]


@njit(cache=True, inline="always")
def _add_taps5(acc, phases, tiles, tap, start0, start1, start2, start3, start4):
    # _add_taps3's adds for a 5-wide kernel row (taps tiles[tap..tap + 4]): each accumulator + its
    # five products in kx order, one rounding per add (the line was zeroed: +0 first)
    t0, t1, t2, t3, t4 = tiles[tap], tiles[tap + 1], tiles[tap + 2], tiles[tap + 3], tiles[tap + 4]
    for first in range(0, acc.shape[0], t0.shape[0]):
        count = min(t0.shape[0], acc.shape[0] - first)
        target = acc[first:first + count]
        s0 = phases[start0 + first:start0 + first + count]
        s1 = phases[start1 + first:start1 + first + count]
        s2 = phases[start2 + first:start2 + first + count]
        s3 = phases[start3 + first:start3 + first + count]
        s4 = phases[start4 + first:start4 + first + count]
        for i in range(count):
            value = target[i] + t0[i] * s0[i]
            value = value + t1[i] * s1[i]
            value = value + t2[i] * s2[i]
            value = value + t3[i] * s3[i]
            target[i] = value + t4[i] * s4[i]


@njit(cache=True, inline="always")
def _add_taps7(acc, phases, tiles, tap, start0, start1, start2, start3, start4, start5, start6):
    # _add_taps5 for a 7-wide kernel row
    t0, t1, t2, t3 = tiles[tap], tiles[tap + 1], tiles[tap + 2], tiles[tap + 3]
    t4, t5, t6 = tiles[tap + 4], tiles[tap + 5], tiles[tap + 6]
    for first in range(0, acc.shape[0], t0.shape[0]):
        count = min(t0.shape[0], acc.shape[0] - first)
        target = acc[first:first + count]
        s0 = phases[start0 + first:start0 + first + count]
        s1 = phases[start1 + first:start1 + first + count]
        s2 = phases[start2 + first:start2 + first + count]
        s3 = phases[start3 + first:start3 + first + count]
        s4 = phases[start4 + first:start4 + first + count]
        s5 = phases[start5 + first:start5 + first + count]
        s6 = phases[start6 + first:start6 + first + count]
        for i in range(count):
            value = target[i] + t0[i] * s0[i]
            value = value + t1[i] * s1[i]
            value = value + t2[i] * s2[i]
            value = value + t3[i] * s3[i]
            value = value + t4[i] * s4[i]
            value = value + t5[i] * s5[i]
            target[i] = value + t6[i] * s6[i]


def depthwise_fp16_atoms(bits16: np.ndarray, tiles: np.ndarray, geometry, pad_value: float, out: np.ndarray,
                         phases: np.ndarray, gathered: np.ndarray, line: np.ndarray) -> None:
    """``out`` [K][OH][OW] = the depthwise convolution (kernel k on channel k) of float16 atoms
    ``bits16`` [C1][H][W][8] (their uint16 bits, C-contiguous) with ``lane_tiles`` ``tiles``: the
    values of ``mac.conv2d_fp16``'s direct loop on ``mac.fetch_padded_input``'s planes. Scratch
    (``phase_layout``): ``phases`` float32 of at least SY * SX * rows * pitch * 8 elements,
    ``gathered`` uint64 [pitch][2], ``line`` float32 of at least line * 8."""
    phase_rows, pitch, length = phase_layout(geometry)
    _depthwise_atoms(bits16, bits16.view(np.uint64), tiles, geometry.kernel_h, geometry.kernel_w,
                     geometry.stride_y, geometry.stride_x, geometry.dilation_y, geometry.dilation_x, geometry.pad_top,
                     geometry.pad_left, np.float32(pad_value), phase_rows, pitch,
                     phases[:geometry.stride_y * geometry.stride_x * phase_rows * pitch * LANES], gathered[:pitch],
                     line[:length * LANES], out)
