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
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels.fp16 import fp16_bits_to_float32_native

#: lanes of an fp16 atom (C2): 8 channels a pixel
LANES = 8
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
    length = ((out_h - 1) * pitch + out_w) * LANES
    plane = phase_rows * pitch * LANES
    acc = line[:length]
    for g in range(min(bits16.shape[0], -(-kernels // LANES))):
        _widen_phases(bits16[g], pixels[g], stride_y, stride_x, pad_top, pad_left, pad, phase_rows, pitch, phases,
                      gathered)
        if kernel_w != 3:
            acc[:] = 0
        for ky in range(kernel_h):
            row, py = divmod(ky * dilation_y, stride_y)
            if kernel_w == 3:  # a kernel row's three taps in one pass (the same adds in the same order)
                _add_taps3(acc, phases, tiles[g, ky * 3], tiles[g, ky * 3 + 1], tiles[g, ky * 3 + 2],
                           _start(py, row, 0, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 1, dilation_x, stride_x, plane, pitch),
                           _start(py, row, 2, dilation_x, stride_x, plane, pitch), ky == 0)
                continue
            for kx in range(kernel_w):
                _add_tap(acc, phases, tiles[g, ky * kernel_w + kx], _start(py, row, kx, dilation_x, stride_x, plane,
                                                                          pitch))
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
