"""CNA fetch and the CORE MAC array: the shared convolution pieces and the fp16 convolution.

The emulator's CNA runs int8/int4 convolutions pixel-major, straight from the NC1HWC2 atoms
(``conv_pixels``, ``depthwise``); they take from here the geometry (``ConvGeometry``), the exact
reduction chunks of an int8 weight matrix (:func:`exact_chunk_bounds`: every partial sum of a
chunk is an integer of magnitude <= 128 * sum(|w|) <= 2**24, so float32 holds it exactly
whatever the summation order; NUMERICS.md 3.2, 3.5) and the BLAS thread choice
(:func:`choose_blas_threads`). fp16 convolutions run here on padded [C][H][W] planes
(:func:`fetch_padded_input`, :func:`conv2d_fp16`): float32 matrix products summed k after k
(``gemm_fp32_seq``) over the planes' taps read in place, or a direct Numba loop for depthwise-like
convolutions - the same order, so the same bits (NUMERICS.md 3.3).

Geometry follows the registers: explicit top/left padding, bottom/right implied by the output
size (rknpu-isa.md 3, PAD_CON0 note), every padded position holding the pad value.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from npuemu.emulator.kernels import gemm_fp32_seq
from npuemu.emulator.kernels.canonical_nan import canonical_nans
from npuemu.emulator.kernels.fp16 import fp16_bits_to_fp32_bits_native, native_halves, widening_table
from npuemu.emulator.memo import Memo
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
    phases = np.empty((padded.shape[0], stride_y, stride_x, -(-rows // stride_y) * pitch), np.float32)
    _fill_phase_planes(padded, stride_y, stride_x, rows, pitch, phases)
    return phases


@njit(cache=True)
def _fill_phase_planes(padded, stride_y, stride_x, rows, pitch, phases):
    # _phase_planes into ``phases`` [C][SY][SX][HQ * pitch]
    channels, _, padded_w = padded.shape
    phase_rows = -(-rows // stride_y)
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
        canonical_nans(line)  # a NaN sum stored as the canonical NaN (NUMERICS.md 3.3)
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
# Orchestration (the int8 callers' BLAS threads; the fp16 products in gemm_fp32_seq)
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


def operands_fit(planes_shape: tuple, weights: np.ndarray, geometry: ConvGeometry) -> bool:
    """Whether ``_check_operands`` passes for padded planes of ``planes_shape`` (its checks read only
    the shapes): the prepared paths' test before they take a convolution ``conv2d_fp16`` would refuse."""
    try:
        _check_operands(np.broadcast_to(np.float32(0), planes_shape), weights, geometry)
    except EmulationError:
        return False
    return True


class GemmLayout(NamedTuple):
    """How ``gemm_products`` feeds a convolution to ``gemm_fp32_seq.products`` (fixed by the shapes; the
    sums are k after k over the whole (c, ky, kx) reduction whatever the layout, NUMERICS.md 3.3).

    ``taps``: row k = (c, ky, kx) of the product's B is tap (ky, kx)'s run over channel c's plane - the
    padded planes themselves at stride 1, else their phase planes (``_phase_planes``: ``phases``
    elements, ``phase_rows`` rows a phase) - read in place at byte ``offsets[k]`` (+ the group's first
    channel, ``group_bytes`` a group), one output row every ``pitch`` columns; where ``pitch`` > OW the
    results go to a ``wide`` [M][OH * pitch] buffer first, the columns past OW dropped after. Otherwise
    (a 1x1 kernel at a stride) B is the im2col ``columns`` gathered per block of ``rows_per_block``
    output rows (``offsets[k]`` = k rows of the buffer). ``narrow``: products of at most
    ``gemm_fp32_seq.NARROW`` columns, whose weights take ``gemm_fp32_seq.pack``'s narrow form."""

    taps: bool
    pitch: int
    phase_rows: int
    rows_per_block: int
    columns: tuple[int, int] | None
    wide: tuple[int, int] | None
    phases: int | None
    offsets: np.ndarray
    group_bytes: int
    narrow: bool


def gemm_layout(matrices: np.ndarray, geometry: ConvGeometry, planes_shape: tuple) -> GemmLayout:
    """The ``GemmLayout`` of ``matrices`` [groups][M][K] over padded planes of ``planes_shape``."""
    return _layout(*matrices.shape[1:], geometry, tuple(planes_shape))


@functools.lru_cache(maxsize=1024)
def _layout(rows: int, reduction: int, geometry: ConvGeometry, planes_shape: tuple) -> GemmLayout:
    # (worked out once per shape: the tap offsets cost ~50 us, and the fp16 convolutions whose weights
    # are fetched each run - new objects, no prepared plan - come here every run; the offsets are shared)
    kernel_h, kernel_w, out_h, out_w = geometry.kernel_h, geometry.kernel_w, geometry.out_h, geometry.out_w
    stride_y, stride_x, dilation_y, dilation_x = geometry.stride_y, geometry.stride_x, geometry.dilation_y, geometry.dilation_x
    group_inputs = reduction // (kernel_h * kernel_w)
    if kernel_h == kernel_w == 1 and (stride_y, stride_x) != (1, 1):  # only phase (0, 0) read: gather it
        rows_per_block = max(1, min(out_h, _COLUMN_BUDGET // (reduction * out_w)))
        width = rows_per_block * out_w
        return GemmLayout(False, out_w, 0, rows_per_block, (reduction, width), None, None,
                          _shared(gemm_fp32_seq.row_offsets(reduction, width)), 0, width <= gemm_fp32_seq.NARROW)
    channel, ky, kx = np.unravel_index(np.arange(reduction), (group_inputs, kernel_h, kernel_w))
    row, py = np.divmod(ky * dilation_y, stride_y)
    column, px = np.divmod(kx * dilation_x, stride_x)
    if (stride_y, stride_x) == (1, 1):  # the planes are their own single phase
        pitch, phase_rows, phases = planes_shape[2], planes_shape[1], None
        plane = pitch * phase_rows
    else:
        pitch = -(-geometry.padded_w // stride_x)
        phase_rows = -(-geometry.padded_h // stride_y)
        plane = stride_y * stride_x * phase_rows * pitch
        phases = planes_shape[0] * plane
    offsets = (channel * plane + (py * stride_x + px) * phase_rows * pitch + row * pitch + column) * 4
    wide = None if pitch == out_w else (rows, out_h * pitch)
    narrow = (out_h - 1) * pitch + out_w <= gemm_fp32_seq.NARROW
    return GemmLayout(True, pitch, phase_rows, out_h, None, wide, phases, _shared(offsets.astype(np.int64)),
                      group_inputs * plane * 4, narrow)


def _shared(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def gemm_products(padded: np.ndarray, geometry: ConvGeometry, packed: tuple[np.ndarray, ...], layout: GemmLayout,
                  acc: np.ndarray, columns: np.ndarray | None = None, wide: np.ndarray | None = None,
                  phases: np.ndarray | None = None) -> None:
    """The products of ``_conv_gemm`` into ``acc`` [groups * M][OH * OW]: per group, its packed weights
    (``gemm_fp32_seq.pack``) times the planes' taps or gathered columns (``GemmLayout``), every sum +0
    then the products k after k in (c, ky, kx) order, one float32 rounding an add (NUMERICS.md 3.3).
    ``padded`` C-contiguous; ``columns``, ``wide`` and ``phases`` buffers of the layout's shapes (made
    here when None)."""
    out_h, out_w = geometry.out_h, geometry.out_w
    rows = acc.shape[0] // len(packed)
    if not layout.taps:
        _column_products(padded, geometry, packed, layout, acc, columns)
        return
    source = padded
    if layout.phases is not None:
        source = np.empty(layout.phases, np.float32) if phases is None else phases
        _fill_phase_planes(padded, geometry.stride_y, geometry.stride_x, geometry.padded_h, layout.pitch,
                           source.reshape(padded.shape[0], geometry.stride_y, geometry.stride_x, -1))
    length = (out_h - 1) * layout.pitch + out_w
    flat = source.reshape(-1)
    if layout.wide is not None:
        wide = np.empty(layout.wide, np.float32) if wide is None else wide
    for g, weights in enumerate(packed):
        target = acc[g * rows:(g + 1) * rows]
        into = target if wide is None else wide
        gemm_fp32_seq.run(weights, layout.offsets, flat, g * layout.group_bytes, into[:, :length])
        if wide is not None:  # the columns past OW of each row dropped
            target.reshape(rows, out_h, out_w)[...] = wide.reshape(rows, out_h, layout.pitch)[:, :, :out_w]


def _column_products(padded: np.ndarray, geometry: ConvGeometry, packed: tuple[np.ndarray, ...], layout: GemmLayout,
                     acc: np.ndarray, columns: np.ndarray | None) -> None:
    """``gemm_products`` over im2col columns gathered a block of output rows at a time."""
    out_h, out_w = geometry.out_h, geometry.out_w
    rows = acc.shape[0] // len(packed)
    reduction = layout.offsets.shape[0]
    group_inputs = reduction // (geometry.kernel_h * geometry.kernel_w)
    columns = np.empty(layout.columns, np.float32) if columns is None else columns
    for g, weights in enumerate(packed):
        for row0 in range(0, out_h, layout.rows_per_block):
            row1 = min(out_h, row0 + layout.rows_per_block)
            _im2col(padded, g * group_inputs, 0, reduction, geometry.kernel_h, geometry.kernel_w, geometry.stride_y,
                    geometry.stride_x, geometry.dilation_y, geometry.dilation_x, row0, row1, out_w, columns)
            gemm_fp32_seq.run(weights, layout.offsets, columns.reshape(-1), 0,
                              acc[g * rows:(g + 1) * rows, row0 * out_w:row1 * out_w])


def _conv_gemm(padded: np.ndarray, matrices: np.ndarray, geometry: ConvGeometry, packed: tuple[np.ndarray, ...],
               layout: GemmLayout) -> np.ndarray:
    """Convolution as sequential-order float32 matrix products: ``matrices`` [groups][M][K] (K in c, ky,
    kx order; ``packed`` their ``_pack_groups``) times the planes' taps (``gemm_products``). Returns
    float32 [groups * M][OH][OW]."""
    padded = np.ascontiguousarray(padded)  # (read flat)
    groups, rows = matrices.shape[:2]
    acc = np.empty((groups * rows, geometry.out_h * geometry.out_w), np.float32)
    gemm_products(padded, geometry, packed, layout, acc)
    return acc.reshape(groups * rows, geometry.out_h, geometry.out_w)


def _pack_groups(matrices: np.ndarray, narrow: bool) -> tuple[np.ndarray, ...]:
    return tuple(gemm_fp32_seq.pack(matrix, narrow) for matrix in matrices)


#: the packed weights of memoised (shared, never written) weight matrices, made once
_PACKED: Memo[tuple] = Memo(_pack_groups, identity=1, limit=1024)


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

    Products are exact in fp32; every output is +0 plus its products in (input channel, ky, kx)
    order, one fp32 rounding an add, on either method (NUMERICS.md 3.3: the vendor simulator's order)."""
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
    layout = gemm_layout(matrices, geometry, padded.shape)
    narrow = layout.narrow
    packed = _pack_groups(matrices, narrow) if weights.flags.writeable else _PACKED(matrices, narrow)
    return _conv_gemm(padded, matrices, geometry, packed, layout)


def _widen(weights: np.ndarray, groups: int) -> np.ndarray:
    # shared by every task of these weights and only read; left writeable so that the Numba
    # direct loop keeps its one compiled (C-contiguous, writeable) signature
    return weights.reshape(groups, weights.shape[0] // groups, -1).astype(np.float32)


#: float32 copies of read-only weight arrays (the CNA's unpacked weights are shared by every
#: run of their task: converted once, emulator/memo.py)
_WIDENED: Memo[np.ndarray] = Memo(_widen, identity=1, limit=1024)


def _widened(weights: np.ndarray, groups: int) -> np.ndarray:
    return _widen(weights, groups) if weights.flags.writeable else _WIDENED(weights, groups)
