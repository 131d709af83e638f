"""CNA fetch and the CORE MAC array: the shared convolution pieces and the fp16 convolution.

The emulator's CNA runs int8/int4 convolutions pixel-major, straight from the NC1HWC2 atoms
(``conv_pixels``, ``depthwise``); they take from here the geometry (``ConvGeometry``), the exact
reduction chunks of an int8 weight matrix (:func:`exact_chunk_bounds`: every partial sum of a
chunk is an integer of magnitude <= 128 * sum(|w|) <= 2**24, so float32 holds it exactly
whatever the summation order; NUMERICS.md 3.2, 3.5) and the BLAS thread choice
(:func:`choose_blas_threads`). fp16 convolutions run here on padded [C][H][W] planes
(:func:`fetch_padded_input`, :func:`conv2d_fp16`): float32 matrix products (numpy BLAS) over an
im2col gather, or a direct Numba loop for depthwise-like convolutions.

Geometry follows the registers: explicit top/left padding, bottom/right implied by the output
size (rknpu-isa.md 3, PAD_CON0 note), every padded position holding the pad value.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from npuemu.emulator.kernels.fp16 import fp16_bits_to_fp32_bits_native, native_halves, widening_table
from npuemu.emulator.memo import Memo
from npuemu.emulator.numerics import EXACT_FLOAT32_REDUCTION
from npuemu.isa.errors import EmulationError

#: BLAS threads for the float32 products when the user set none (NPUEMU_BLAS_THREADS, or
#: OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, which OpenBLAS reads itself). Measured on the 2-core
#: dev box with other processes running: numpy's default of 2 OpenBLAS threads made MobileNetV2
#: (batch 3) emulation 4-6x slower in CPU and wall time than 1 (idle threads spin); the
#: emulator's products are small.
DEFAULT_BLAS_THREADS = 1
_BLAS_THREAD_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads_64_",
                        "openblas_set_num_threads64_", "openblas_set_num_threads")
_blas_threads_chosen = False
#: im2col working-buffer budget in float32 elements (16 MiB): bounds memory on big layers.
_COLUMN_BUDGET = 1 << 22
#: Longest reduction chunk (im2col rows) however small the weights: bounds the buffer of one
#: output row block when rows_per_block bottoms out at 1.
_MAX_CHUNK = 8192
#: Convolutions with at most this many kernels per group run on the direct Numba path.
_DIRECT_MAX_KERNELS_PER_GROUP = 4
#: padded fetch rows at least this wide widen a row of atoms per loop (_widen_atoms8; narrower rows:
#: the table loop, whose per-row cost is lower - measured 0.45 vs 0.47 ns an element at 40 wide)
_WIDE_FETCH = 48


@dataclass(frozen=True)
class ConvGeometry:
    """Convolution geometry as the CNA/CORE registers give it."""

    kernel_h: int
    kernel_w: int
    out_h: int
    out_w: int
    stride_y: int = 1
    stride_x: int = 1
    dilation_y: int = 1
    dilation_x: int = 1
    pad_top: int = 0
    pad_left: int = 0
    groups: int = 1

    def __post_init__(self) -> None:
        positive = ("kernel_h", "kernel_w", "out_h", "out_w", "stride_y", "stride_x",
                    "dilation_y", "dilation_x", "groups")
        bad = [name for name in positive if getattr(self, name) <= 0]
        if bad or self.pad_top < 0 or self.pad_left < 0:
            problem = bad or "negative padding"
            raise EmulationError(f"invalid convolution geometry {self}: {problem}")

    @property
    def padded_h(self) -> int:
        """Rows the output needs, counted from the first (padded) row."""
        return (self.out_h - 1) * self.stride_y + (self.kernel_h - 1) * self.dilation_y + 1

    @property
    def padded_w(self) -> int:
        return (self.out_w - 1) * self.stride_x + (self.kernel_w - 1) * self.dilation_x + 1


# ---------------------------------------------------------------------------------------------
# CNA: NC1HWC2 -> padded planar
# ---------------------------------------------------------------------------------------------
@njit(cache=True)
def _pad_border(padded, channels, height, width, pad_top, pad_left, value):
    """The pad value on the border and wherever the output reaches past the input."""
    _, padded_h, padded_w = padded.shape
    for c in range(channels):
        for py in range(padded_h):
            y = py - pad_top
            if y < 0 or y >= height:
                padded[c, py, :] = value
            else:
                padded[c, py, :min(pad_left, padded_w)] = value
                if pad_left + width < padded_w:
                    padded[c, py, pad_left + width:] = value


@njit(cache=True)
def _fetch_padded(feature, channels, pad_top, pad_left, pad_value, padded):
    groups, height, width, c2 = feature.shape
    _, padded_h, padded_w = padded.shape
    _pad_border(padded, channels, height, width, pad_top, pad_left, pad_value)
    # then the input, an atom row at a time (its lanes go to C2 planes)
    rows, columns = min(height, padded_h - pad_top), min(width, padded_w - pad_left)
    for group in range(groups):
        for y in range(rows):
            source = feature[group, y]
            for lane in range(min(c2, channels - group * c2)):
                target = padded[group * c2 + lane, y + pad_top]
                for x in range(columns):
                    target[x + pad_left] = source[x, lane]


@njit(cache=True)
def _fetch_padded_half(bits16, channels, pad_top, pad_left, pad_bits, padded_bits, table):
    # _fetch_padded of float16 atoms (their bits) into float32 planes (their bits), each value
    # widened on the way (exact: ``table`` is fp16.widening_table, numerics.fp16_bits_to_fp32_bits
    # of every pattern, a lookup ~5x faster than the branches): no float32 copy of the atoms
    groups, height, width, c2 = bits16.shape
    _, padded_h, padded_w = padded_bits.shape
    _pad_border(padded_bits, channels, height, width, pad_top, pad_left, pad_bits)
    rows, columns = min(height, padded_h - pad_top), min(width, padded_w - pad_left)
    for group in range(groups):
        lanes = min(c2, channels - group * c2)
        if lanes == 8 and c2 == 8 and native_halves():  # whole fp16 atoms, the CPU's widening
            planes = padded_bits[group * 8:group * 8 + 8].reshape(8, padded_h * padded_w)
            if pad_left == 0 and columns == width == padded_w:  # rows back to back: one run
                _widen_atoms8(bits16[group, :rows].reshape(-1), planes, pad_top * padded_w, rows * width)
                continue
            if columns >= _WIDE_FETCH:
                for y in range(rows):
                    _widen_atoms8(bits16[group, y].reshape(-1), planes, (y + pad_top) * padded_w + pad_left,
                                  columns)
                continue
        for y in range(rows):
            source = bits16[group, y]
            if lanes == 8 and c2 == 8:  # fp16's whole atoms: pixel by pixel, a constant 8 lanes (~15% faster)
                for x in range(columns):
                    for lane in range(8):
                        padded_bits[group * 8 + lane, y + pad_top, x + pad_left] = table[source[x, lane]]
                continue
            for lane in range(lanes):
                target = padded_bits[group * c2 + lane, y + pad_top]
                for x in range(columns):
                    target[x + pad_left] = table[source[x, lane]]


@njit(cache=True, inline="always")
def _widen_atoms8(source, planes, start, count):
    # ``count`` atoms of 8 fp16 lanes (uint16 bits, pixel-major) widened into planes[lane][start + x]:
    # eight strided reads of one stride in one loop, which LLVM turns into wide loads, shuffles and
    # vcvtph2ps (0.15-0.2 ns an element on rows of 160 and more against 0.5 for the table loop)
    t0, t1 = planes[0, start:start + count], planes[1, start:start + count]
    t2, t3 = planes[2, start:start + count], planes[3, start:start + count]
    t4, t5 = planes[4, start:start + count], planes[5, start:start + count]
    t6, t7 = planes[6, start:start + count], planes[7, start:start + count]
    for x in range(count):
        t0[x] = fp16_bits_to_fp32_bits_native(source[8 * x])
        t1[x] = fp16_bits_to_fp32_bits_native(source[8 * x + 1])
        t2[x] = fp16_bits_to_fp32_bits_native(source[8 * x + 2])
        t3[x] = fp16_bits_to_fp32_bits_native(source[8 * x + 3])
        t4[x] = fp16_bits_to_fp32_bits_native(source[8 * x + 4])
        t5[x] = fp16_bits_to_fp32_bits_native(source[8 * x + 5])
        t6[x] = fp16_bits_to_fp32_bits_native(source[8 * x + 6])
        t7[x] = fp16_bits_to_fp32_bits_native(source[8 * x + 7])


def fetch_padded_input(feature: np.ndarray, channels: int, geometry: ConvGeometry,
                       pad_value: float) -> np.ndarray:
    """CNA feature fetch: [C1][H][W][C2] (int8 or float16) -> float32 [C][Hp][Wp] with the
    pad value on the top/left border and wherever the output reaches past the input."""
    if feature.ndim != 4:
        raise EmulationError(f"feature must be [C1][H][W][C2], got shape {feature.shape}")
    if channels <= 0 or channels > feature.shape[0] * feature.shape[3]:
        raise EmulationError(f"feature of shape {feature.shape} cannot hold {channels} channels")
    source = np.ascontiguousarray(feature)
    padded = np.empty((channels, geometry.padded_h, geometry.padded_w), np.float32)
    if source.dtype == np.float16:  # exact: every binary16 value is a binary32 value
        _fetch_padded_half(source.view(np.uint16), channels, geometry.pad_top, geometry.pad_left,
                           np.float32(pad_value).view(np.uint32), padded.view(np.uint32), widening_table())
        return padded
    _fetch_padded(source, channels, geometry.pad_top, geometry.pad_left, np.float32(pad_value),
                  padded)
    return padded


# ---------------------------------------------------------------------------------------------
# Numba loops
# ---------------------------------------------------------------------------------------------
@njit(cache=True)
def _im2col(padded, channel0, k0, k1, kernel_h, kernel_w, stride_y, stride_x, dilation_y, dilation_x,
            row0, row1, out_w, columns):
    # row k - k0 of ``columns``: tap (ky, kx) of channel channel0 + k // taps over output rows
    # row0..row1, out_w a row. Runs located by offsets into the flat planes (a 2-D slice per run cost
    # more than its copy: 4x slower on det's 160-wide rows); each tap's first source offset and its
    # target row worked out once, a run one slice of each (session 16: 3.5-7x faster on 7x7-28x28
    # maps than slicing the tap's target row again per run, where the per-run cost dominated)
    taps = kernel_h * kernel_w
    _, padded_h, padded_w = padded.shape
    flat, width = padded.reshape(-1), columns.shape[1]
    targets = columns.reshape(-1)
    span, step = (out_w - 1) * stride_x + 1, stride_y * padded_w
    for k in range(k0, k1):
        c = channel0 + k // taps
        ky = (k % taps) // kernel_w
        kx = k % kernel_w
        first = (c * padded_h + row0 * stride_y + ky * dilation_y) * padded_w + kx * dilation_x
        row = (k - k0) * width
        for oy in range(row1 - row0):
            start, at = first + oy * step, row + oy * out_w
            source, run = flat[start:start + span], targets[at:at + out_w]
            if stride_x == 1:  # a contiguous run (vectorised)
                for ox in range(out_w):
                    run[ox] = source[ox]
            else:
                for ox in range(out_w):
                    run[ox] = source[ox * stride_x]


@njit(cache=True)
def _column_phases(padded, stride_x, phases):
    # phases [C][Hp][SX][pitch] (flat): phases[c, y, px, q] = padded[c, y, q SX + px], 0 past the row
    # (never read by _im2col_phased): one strided pass over the planes, after which every im2col run of
    # a stride-SX convolution is a contiguous copy (each input column is gathered once, not once a tap)
    channels, padded_h, padded_w = padded.shape
    pitch = -(-padded_w // stride_x)
    for c in range(channels):
        for y in range(padded_h):
            source = padded[c, y]
            for px in range(stride_x):
                at = ((c * padded_h + y) * stride_x + px) * pitch
                line = phases[at:at + pitch]
                inside = -(-(padded_w - px) // stride_x)  # q with q SX + px < Wp
                for q in range(inside):
                    line[q] = source[q * stride_x + px]
                for q in range(inside, pitch):
                    line[q] = 0


@njit(cache=True)
def _im2col_phased(phases, padded_h, pitch, stride_x, channel0, k0, k1, kernel_h, kernel_w, stride_y, dilation_y,
                   dilation_x, row0, row1, out_w, columns):
    # _im2col's columns read from _column_phases' [C][Hp][SX][pitch] planes: tap (ky, kx) of output
    # column ox reads padded column ox SX + kx DX = phase (kx DX % SX) at ox + kx DX // SX, a
    # contiguous run of out_w whatever the stride
    taps = kernel_h * kernel_w
    width = columns.shape[1]
    targets = columns.reshape(-1)
    step = stride_y * stride_x * pitch
    for k in range(k0, k1):
        c = channel0 + k // taps
        ky = (k % taps) // kernel_w
        kx = k % kernel_w
        column, px = divmod(kx * dilation_x, stride_x)
        first = ((c * padded_h + row0 * stride_y + ky * dilation_y) * stride_x + px) * pitch + column
        row = (k - k0) * width
        for oy in range(row1 - row0):
            start, at = first + oy * step, row + oy * out_w
            source, run = phases[start:start + out_w], targets[at:at + out_w]
            for ox in range(out_w):
                run[ox] = source[ox]


@njit(cache=True)
def _conv_direct_float(padded, weights, groups, stride_y, stride_x, dilation_y, dilation_x, acc):
    # acc = +0 + each product in (input channel, ky, kx) order, per output element
    out_channels, _, kernel_h, kernel_w = weights.shape
    _, out_h, out_w = acc.shape
    channels, padded_h, padded_w = padded.shape
    if stride_y == 1 and stride_x == 1:  # the planes are their own single phase
        phases = padded.reshape(channels, 1, 1, padded_h * padded_w)
        pitch = padded_w
    else:
        pitch = -(-((out_w - 1) * stride_x + (kernel_w - 1) * dilation_x + 1) // stride_x)
        phases = _phase_planes(padded, stride_y, stride_x, (out_h - 1) * stride_y + (kernel_h - 1) * dilation_y + 1,
                               pitch)
    _conv_direct_wide(phases, pitch, weights, out_channels // groups, stride_y, stride_x, dilation_y, dilation_x,
                      acc)


@njit(cache=True)
def _phase_planes(padded, stride_y, stride_x, rows, pitch):
    """[C][SY][SX][HQ * pitch]: phase (py, px) holds padded[c, r SY + py, q SX + px] at r * pitch + q,
    for the ``rows`` padded rows the output reads (HQ = ceil(rows / SY)); 0 past them."""
    channels, _, padded_w = padded.shape
    phase_rows = -(-rows // stride_y)
    phases = np.empty((channels, stride_y, stride_x, phase_rows * pitch), np.float32)
    for c in range(channels):
        for py in range(stride_y):
            for px in range(stride_x):
                target = phases[c, py, px]
                inside = min(pitch, max(0, -(-(padded_w - px) // stride_x)))  # q with q SX + px < Wp
                for r in range(phase_rows):
                    y, line = r * stride_y + py, target[r * pitch:(r + 1) * pitch]
                    if y >= rows:
                        line[:] = 0
                        continue
                    source = padded[c, y]
                    for q in range(inside):
                        line[q] = source[q * stride_x + px]
                    line[inside:] = 0
    return phases


@njit(cache=True)
def _conv_direct_wide(phases, pitch, weights, kernels_per_group, stride_y, stride_x, dilation_y, dilation_x, acc):
    # Output (oy, ox) of tap (ky, kx) reads padded[(oy SY + ky DY), (ox SX + kx DX)] = element
    # (oy + ky DY // SY) * pitch + ox + kx DX // SX of phase (ky DY % SY, kx DX % SX) (_phase_planes;
    # stride 1: the planes themselves), so each tap is one run over a "wide" output of ``pitch``
    # columns per row (the columns past OW are computed and dropped): long vector runs however narrow
    # the planes (7x7, 14x14) and whatever the stride. Each kept element gets the same additions in the
    # same order as a row-by-row loop's.
    out_channels, group_inputs, kernel_h, kernel_w = weights.shape
    _, out_h, out_w = acc.shape
    length = (out_h - 1) * pitch + out_w
    line = np.empty(length, np.float32)
    for o in range(out_channels):
        if pitch == out_w:  # no dropped columns: the line is the output plane itself
            line = acc[o].reshape(length)
        line[:] = 0
        channel0 = (o // kernels_per_group) * group_inputs
        for ci in range(group_inputs):
            planes = phases[channel0 + ci]
            for ky in range(kernel_h):
                row, py = divmod(ky * dilation_y, stride_y)
                taps = weights[o, ci, ky]
                if kernel_w == 3:  # a kernel row's taps in one pass over the line (same adds, same order)
                    _add_row3(line, _tap_run(planes, py, row * pitch, dilation_x, stride_x, 0, length),
                              _tap_run(planes, py, row * pitch, dilation_x, stride_x, 1, length),
                              _tap_run(planes, py, row * pitch, dilation_x, stride_x, 2, length),
                              np.float32(taps[0]), np.float32(taps[1]), np.float32(taps[2]))
                    continue
                for kx in range(kernel_w):
                    _add_products(line, _tap_run(planes, py, row * pitch, dilation_x, stride_x, kx, length),
                                  np.float32(taps[kx]))
        if pitch != out_w:
            for oy in range(out_h):
                acc[o, oy] = line[oy * pitch:oy * pitch + out_w]


@njit(cache=True, inline="always")
def _tap_run(planes, py, start, dilation_x, stride_x, kx, length):
    # the ``length`` inputs of tap kx along the wide line (a slice: an index start + i would take
    # Numba's negative-index wraparound and stay scalar)
    column, px = divmod(kx * dilation_x, stride_x)
    return planes[py, px, start + column:start + column + length]


@njit(cache=True, inline="always")
def _add_row3(line, first, second, third, w0, w1, w2):
    # three taps' products into each accumulator in kx order, one rounding per add: the bits of three
    # _add_products passes, one pass over the line instead of three (issue 20: depthwise 3x3)
    for i in range(line.shape[0]):
        value = line[i] + w0 * first[i]
        value = value + w1 * second[i]
        line[i] = value + w2 * third[i]


@njit(cache=True, inline="always")
def _add_products(target, row, weight):
    # one tap's products into a row of accumulators (each product exact in fp32, one rounding)
    for ox in range(target.shape[0]):
        target[ox] += weight * row[ox]


# ---------------------------------------------------------------------------------------------
# Orchestration (numpy BLAS for the products)
# ---------------------------------------------------------------------------------------------
def choose_blas_threads() -> int | None:
    """Set numpy's OpenBLAS thread count once per process, as DEFAULT_BLAS_THREADS says; returns
    the count set, or None when the user chose (environment) or no OpenBLAS is loaded. The
    setting is process-wide (numpy has one BLAS). Results never depend on it: the int8 sums
    are exact in any order, and fp16 uses the same call shapes either way."""
    global _blas_threads_chosen
    if _blas_threads_chosen:
        return None
    wanted = os.environ.get("NPUEMU_BLAS_THREADS")
    count = DEFAULT_BLAS_THREADS
    if wanted is not None:
        if not wanted.strip().isdigit() or int(wanted) < 1:
            raise EmulationError(f"NPUEMU_BLAS_THREADS={wanted!r}: expected a positive integer "
                                 f"(BLAS threads for the MAC kernel's products)")
        count = int(wanted)
    _blas_threads_chosen = True
    if wanted is None and ("OPENBLAS_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in os.environ):
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
        for path in sorted(paths):
            library = ctypes.CDLL(path)
            for name in _BLAS_THREAD_SETTERS:
                if hasattr(library, name):
                    getattr(library, name)(ctypes.c_int(count))
                    return count
    except OSError:
        pass  # no /proc (not Linux) or the library will not load: leave BLAS as it is
    return None


def _check_operands(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry) -> None:
    if padded.ndim != 3 or weights.ndim != 4:
        raise EmulationError(
            f"expected padded [C][Hp][Wp] and weights [OC][IC/groups][KH][KW], got shapes "
            f"{padded.shape} and {weights.shape}")
    out_channels, group_inputs, kernel_h, kernel_w = weights.shape
    if (kernel_h, kernel_w) != (geometry.kernel_h, geometry.kernel_w):
        raise EmulationError(f"weights are {kernel_h}x{kernel_w} but the geometry says "
                             f"{geometry.kernel_h}x{geometry.kernel_w}")
    if out_channels % geometry.groups or padded.shape[0] != group_inputs * geometry.groups:
        raise EmulationError(
            f"{padded.shape[0]} input channels and {out_channels} kernels of {group_inputs} "
            f"channels do not form {geometry.groups} groups")
    if padded.shape[1] < geometry.padded_h or padded.shape[2] < geometry.padded_w:
        raise EmulationError(f"padded input {padded.shape[1:]} is smaller than the "
                             f"{geometry.padded_h}x{geometry.padded_w} the output needs")


def _is_pointwise(geometry: ConvGeometry, planes_shape: tuple) -> bool:
    # A 1x1 stride-1 convolution reads the padded planes as they are: no gather needed.
    return (geometry.kernel_h == geometry.kernel_w == 1
            and geometry.stride_y == geometry.stride_x == 1
            and planes_shape[1] == geometry.out_h and planes_shape[2] == geometry.out_w)


def _chunk_bounds(reduction: int) -> tuple[int, ...]:
    # reduction chunks of EXACT_FLOAT32_REDUCTION: part of the fp16 summation order (NUMERICS.md 3.3)
    return tuple(range(0, reduction, EXACT_FLOAT32_REDUCTION)) + (reduction,)


def _split_pieces(matrices: np.ndarray) -> tuple[tuple[np.ndarray, ...], ...]:
    """[group][chunk]: contiguous copies of each group's columns of each reduction chunk."""
    bounds = _chunk_bounds(matrices.shape[2])
    return tuple(tuple(np.ascontiguousarray(matrix[:, k0:k1]) for k0, k1 in zip(bounds, bounds[1:]))
                 for matrix in matrices)


#: the chunk copies of memoised (shared, never written) weight matrices, made once
_PIECES: Memo[tuple] = Memo(_split_pieces, identity=1, limit=1024)


class GemmLayout(NamedTuple):
    """How ``_conv_gemm`` cuts a convolution into products (fixed by the shapes alone: part of the
    fp16 summation order, NUMERICS.md 3.3): reduction chunk bounds, output rows per block, whether
    the planes are read as they are (1x1 stride 1), the im2col buffer's and the chunk-product
    buffer's shapes (None where not needed), and the column phases' length (``_column_phases``:
    kernels wider than one column at a column stride; the gather then copies contiguous runs; else
    None). The phases change how the columns are gathered, never their values."""

    bounds: tuple[int, ...]
    rows_per_block: int
    pointwise: bool
    columns: tuple[int, int] | None
    product: tuple[int, int] | None
    phases: int | None = None


def gemm_layout(matrices: np.ndarray, geometry: ConvGeometry, planes_shape: tuple) -> GemmLayout:
    """The ``GemmLayout`` of ``matrices`` [groups][M][K] over padded planes of ``planes_shape``."""
    rows, reduction = matrices.shape[1:]
    bounds = _chunk_bounds(reduction)
    chunk = max(b - a for a, b in zip(bounds, bounds[1:]))
    rows_per_block = max(1, min(geometry.out_h, _COLUMN_BUDGET // (chunk * geometry.out_w)))
    pointwise = _is_pointwise(geometry, planes_shape)
    width = rows_per_block * geometry.out_w
    phased = not pointwise and geometry.stride_x > 1 and geometry.kernel_w > 1
    phases = planes_shape[0] * planes_shape[1] * geometry.stride_x * -(-planes_shape[2] // geometry.stride_x)
    return GemmLayout(bounds, rows_per_block, pointwise, None if pointwise else (chunk, width),
                      (rows, width) if len(bounds) > 2 else None, phases if phased else None)


def _conv_gemm(padded: np.ndarray, matrices: np.ndarray, geometry: ConvGeometry,
               pieces: tuple[tuple[np.ndarray, ...], ...]) -> np.ndarray:
    """Convolution as float32 matrix products: ``matrices`` [groups][M][K] (K in c, ky, kx
    order; ``pieces`` its ``_split_pieces``) times the gathered input (``gemm_products``).
    Returns float32 [groups * M][OH][OW]."""
    choose_blas_threads()
    padded = np.ascontiguousarray(padded)  # (the gather reads it flat)
    groups, rows = matrices.shape[:2]
    layout = gemm_layout(matrices, geometry, padded.shape)
    columns = None if layout.columns is None else np.empty(layout.columns, np.float32)
    product = None if layout.product is None else np.empty(layout.product, np.float32)
    phases = None if layout.phases is None else np.empty(layout.phases, np.float32)
    acc = np.empty((groups * rows, geometry.out_h * geometry.out_w), np.float32)
    gemm_products(padded, geometry, pieces, layout, columns, product, acc, phases)
    return acc.reshape(groups * rows, geometry.out_h, geometry.out_w)


def gemm_products(padded: np.ndarray, geometry: ConvGeometry, pieces: tuple[tuple[np.ndarray, ...], ...],
                  layout: GemmLayout, columns: np.ndarray | None, product: np.ndarray | None,
                  acc: np.ndarray, phases: np.ndarray | None = None) -> None:
    """The products of ``_conv_gemm`` into ``acc`` [groups * M][OH * OW] (C-contiguous planes
    ``padded``; ``columns``, ``product`` and ``phases`` of the layout's shapes): one product per
    group, row block and reduction chunk of EXACT_FLOAT32_REDUCTION; chunk results add in float32,
    starting from +0.

    The first chunk's product goes straight into the accumulators and gets + 0 (which turns a
    -0 into the +0 that 0 + p gives and leaves every other value, NaN included, as it is): the
    same bits as zeroed accumulators plus a product buffer, without the buffer's pass."""
    kernel_h, kernel_w, out_h, out_w = (geometry.kernel_h, geometry.kernel_w, geometry.out_h,
                                        geometry.out_w)
    rows, bounds, rows_per_block = pieces[0][0].shape[0], layout.bounds, layout.rows_per_block
    group_inputs = bounds[-1] // (kernel_h * kernel_w)
    planes = padded.reshape(padded.shape[0], -1) if layout.pointwise else None
    if layout.phases is not None:  # (a column stride: the gather copies contiguous runs of these)
        phases = np.empty(layout.phases, np.float32) if phases is None else phases
        _column_phases(padded, geometry.stride_x, phases)
        pitch = -(-padded.shape[2] // geometry.stride_x)
    for g in range(len(pieces)):
        for row0 in range(0, out_h, rows_per_block):
            row1 = min(out_h, row0 + rows_per_block)
            width = (row1 - row0) * out_w
            target = acc[g * rows:(g + 1) * rows, row0 * out_w:row1 * out_w]
            for index, (piece, k0, k1) in enumerate(zip(pieces[g], bounds, bounds[1:])):
                if planes is not None:
                    block = planes[g * group_inputs + k0:g * group_inputs + k1,
                                   row0 * out_w:row1 * out_w]
                elif layout.phases is not None:
                    _im2col_phased(phases, padded.shape[1], pitch, geometry.stride_x, g * group_inputs, k0, k1,
                                   kernel_h, kernel_w, geometry.stride_y, geometry.dilation_y, geometry.dilation_x,
                                   row0, row1, out_w, columns)
                    block = columns[:k1 - k0, :width]
                else:
                    _im2col(padded, g * group_inputs, k0, k1, kernel_h, kernel_w,
                            geometry.stride_y, geometry.stride_x, geometry.dilation_y,
                            geometry.dilation_x, row0, row1, out_w, columns)
                    block = columns[:k1 - k0, :width]
                if index == 0:
                    np.matmul(piece, block, out=target)
                    np.add(target, np.float32(0), out=target)
                else:
                    np.matmul(piece, block, out=product[:, :width])
                    np.add(target, product[:, :width], out=target)


def exact_chunk_bounds(matrix: np.ndarray, input_bound: int = 128,
                       max_length: int = _MAX_CHUNK) -> tuple[int, ...]:
    """Reduction chunks ``[b[i], b[i+1])`` of an integer matrix ``[M][K]`` (one row per kernel,
    |values| <= 128) whose float32 products with any input column of |x| <= ``input_bound``
    are exact.

    Any partial sum of a chunk's products for row ``o`` is an integer of magnitude at most
    ``input_bound * sum(|matrix[o, k]|)`` over the chunk; while that stays <= 2**24 float32 holds
    every partial sum exactly, in any summation order and with or without fused multiply-add
    (NUMERICS.md 3.2). Chunks are cut greedily, at most ``max_length`` long (the im2col buffer
    holds one chunk); one product (<= 2**14) always fits, and with the worst-case weights (all
    -128) the chunks are exactly EXACT_FLOAT32_REDUCTION long."""
    magnitudes = np.abs(matrix.astype(np.int64))
    rows, reduction = magnitudes.shape
    limit = (1 << 24) // input_bound
    running = np.concatenate([np.zeros((rows, 1), np.int64), np.cumsum(magnitudes, axis=1)], axis=1)
    bounds = [0]
    while bounds[-1] < reduction:
        k0 = bounds[-1]
        widest = (running[:, k0 + 1:] - running[:, k0:k0 + 1]).max(axis=0)  # non-decreasing in k
        length = max(1, int(np.searchsorted(widest, limit, side="right")))
        bounds.append(k0 + min(length, max_length))
    return tuple(bounds)


def _use_direct(weights: np.ndarray, geometry: ConvGeometry, method: str) -> bool:
    if method not in ("auto", "gemm", "direct"):
        raise EmulationError(
            f"unknown convolution method {method!r}: expected auto, gemm or direct")
    if method == "auto":
        return weights.shape[0] // geometry.groups <= _DIRECT_MAX_KERNELS_PER_GROUP
    return method == "direct"


def conv2d_fp16(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry,
                method: str = "auto") -> np.ndarray:
    """fp16 x fp16 convolution with fp32 accumulation -> float32 [OC][OH][OW].

    Products are exact in fp32; the summation order is the BLAS order (or the direct loop's),
    so results lie within the bound of NUMERICS.md 3.3 of the exact sum."""
    _check_operands(padded, weights, geometry)
    if weights.dtype != np.float16:
        raise EmulationError(f"fp16 convolution needs float16 weights, got {weights.dtype}")
    groups = geometry.groups
    matrices = _widened(weights, groups)  # [groups][M][K] float32 (exact)
    if _use_direct(weights, geometry, method):
        acc = np.empty((weights.shape[0], geometry.out_h, geometry.out_w), np.float32)  # (every element written)
        _conv_direct_float(np.ascontiguousarray(padded), matrices.reshape(weights.shape), groups, geometry.stride_y,
                           geometry.stride_x, geometry.dilation_y, geometry.dilation_x, acc)
        return acc
    pieces = _split_pieces(matrices) if weights.flags.writeable else _PIECES(matrices)
    return _conv_gemm(padded, matrices, geometry, pieces)


def _widen(weights: np.ndarray, groups: int) -> np.ndarray:
    # shared by every task of these weights and only read; left writeable so that the Numba
    # direct loop keeps its one compiled (C-contiguous, writeable) signature
    return weights.reshape(groups, weights.shape[0] // groups, -1).astype(np.float32)


#: float32 copies of read-only weight arrays (the CNA's unpacked weights are shared by every
#: run of their task: converted once, emulator/memo.py)
_WIDENED: Memo[np.ndarray] = Memo(_widen, identity=1, limit=1024)


def _widened(weights: np.ndarray, groups: int) -> np.ndarray:
    return _widen(weights, groups) if weights.flags.writeable else _WIDENED(weights, groups)
