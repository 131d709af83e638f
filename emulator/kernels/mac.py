"""CNA fetch and the CORE MAC array: convolution on NC1HWC2 features.

Integer results are exact. The bulk of an int8 convolution runs as float32 matrix products
(numpy BLAS) over reduction chunks cut from the weights (:func:`exact_chunk_bounds`): every
partial sum of a chunk is an integer of magnitude <= 128 * sum(|w|) <= 2**24, so float32 holds
it exactly whatever the summation order (worst case, all -128: chunks of
``EXACT_FLOAT32_REDUCTION`` = 1024); several chunks add in float64 (NUMERICS.md 3.2, 3.5). The
window sums ride along as an extra row of ones. Gathering (im2col) and the direct path for
depthwise-like convolutions are Numba loops.

The emulator's CNA runs int8/int4 convolutions pixel-major (``conv_pixels``, ``depthwise``) and
uses this module for fp16 (``fetch_padded_input``, ``conv2d_fp16``) and for the shared pieces
(``ConvGeometry``, ``exact_chunk_bounds``, ``choose_blas_threads``, ``OperandCache``). The int8
planar functions (``conv2d_int8*``, ``core_outputs``, ``window_sums``) are a second, tested
implementation of the same integers on [C][H][W] planes, kept as a library API.

Geometry follows the registers: explicit top/left padding, bottom/right implied by the output
size (rknpu-isa.md 3, PAD_CON0 note), every padded position holding the pad value.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from npuemu.emulator.kernels import tap_gemm
from npuemu.emulator.numerics import EXACT_FLOAT32_REDUCTION, ROUND_HALF_AWAY, core_output
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
def _fetch_padded(feature, channels, pad_top, pad_left, pad_value, padded):
    groups, height, width, c2 = feature.shape
    _, padded_h, padded_w = padded.shape
    # the pad value on the border and wherever the output reaches past the input
    for c in range(channels):
        for py in range(padded_h):
            y = py - pad_top
            if y < 0 or y >= height:
                padded[c, py, :] = pad_value
            else:
                padded[c, py, :min(pad_left, padded_w)] = pad_value
                if pad_left + width < padded_w:
                    padded[c, py, pad_left + width:] = pad_value
    # then the input, an atom row at a time (its lanes go to C2 planes)
    rows, columns = min(height, padded_h - pad_top), min(width, padded_w - pad_left)
    for group in range(groups):
        for y in range(rows):
            source = feature[group, y]
            for lane in range(min(c2, channels - group * c2)):
                target = padded[group * c2 + lane, y + pad_top]
                for x in range(columns):
                    target[x + pad_left] = source[x, lane]


def fetch_padded_input(feature: np.ndarray, channels: int, geometry: ConvGeometry,
                       pad_value: float) -> np.ndarray:
    """CNA feature fetch: [C1][H][W][C2] (int8 or float16) -> float32 [C][Hp][Wp] with the
    pad value on the top/left border and wherever the output reaches past the input."""
    if feature.ndim != 4:
        raise EmulationError(f"feature must be [C1][H][W][C2], got shape {feature.shape}")
    if channels <= 0 or channels > feature.shape[0] * feature.shape[3]:
        raise EmulationError(f"feature of shape {feature.shape} cannot hold {channels} channels")
    source = np.ascontiguousarray(feature)
    if source.dtype == np.float16:
        source = source.astype(np.float32)  # exact: every binary16 value is a binary32 value
    padded = np.empty((channels, geometry.padded_h, geometry.padded_w), np.float32)
    _fetch_padded(source, channels, geometry.pad_top, geometry.pad_left, np.float32(pad_value),
                  padded)
    return padded


# ---------------------------------------------------------------------------------------------
# Numba loops
# ---------------------------------------------------------------------------------------------
@njit(cache=True)
def _im2col(padded, channel0, k0, k1, kernel_h, kernel_w, stride_y, stride_x, dilation_y,
            dilation_x, row0, row1, out_w, columns):
    taps = kernel_h * kernel_w
    for k in range(k0, k1):
        c = channel0 + k // taps
        ky = (k % taps) // kernel_w
        kx = k % kernel_w
        n = 0
        for oy in range(row0, row1):
            py = oy * stride_y + ky * dilation_y
            px = kx * dilation_x
            if stride_x == 1:  # a contiguous run: copied as a slice (vectorised)
                columns[k - k0, n:n + out_w] = padded[c, py, px:px + out_w]
            else:
                for ox in range(out_w):
                    columns[k - k0, n + ox] = padded[c, py, px + ox * stride_x]
            n += out_w


@njit(cache=True)
def _conv_direct_int(padded, weights, groups, stride_y, stride_x, dilation_y, dilation_x, acc):
    out_channels, group_inputs, kernel_h, kernel_w = weights.shape
    _, out_h, out_w = acc.shape
    kernels_per_group = out_channels // groups
    for o in range(out_channels):
        channel0 = (o // kernels_per_group) * group_inputs
        for ci in range(group_inputs):
            c = channel0 + ci
            for ky in range(kernel_h):
                for kx in range(kernel_w):
                    weight = np.int64(weights[o, ci, ky, kx])
                    if weight == 0:
                        continue
                    for oy in range(out_h):
                        py = oy * stride_y + ky * dilation_y
                        for ox in range(out_w):
                            acc[o, oy, ox] += weight * np.int64(
                                padded[c, py, ox * stride_x + kx * dilation_x])


@njit(cache=True)
def _conv_direct_float(padded, weights, groups, stride_y, stride_x, dilation_y, dilation_x, acc):
    out_channels, group_inputs, kernel_h, kernel_w = weights.shape
    _, out_h, out_w = acc.shape
    kernels_per_group = out_channels // groups
    for o in range(out_channels):
        channel0 = (o // kernels_per_group) * group_inputs
        for ci in range(group_inputs):
            c = channel0 + ci
            for ky in range(kernel_h):
                for kx in range(kernel_w):
                    weight = np.float32(weights[o, ci, ky, kx])
                    for oy in range(out_h):
                        py = oy * stride_y + ky * dilation_y
                        for ox in range(out_w):
                            px = ox * stride_x + kx * dilation_x
                            acc[o, oy, ox] += weight * padded[c, py, px]


@njit(cache=True)
def _window_sums(padded, groups, kernel_h, kernel_w, stride_y, stride_x, dilation_y,
                 dilation_x, sums):
    channels, padded_h, padded_w = padded.shape
    group_inputs = channels // groups
    _, out_h, out_w = sums.shape
    plane = np.zeros((padded_h, padded_w), np.int64)
    for g in range(groups):
        plane[:, :] = 0
        for c in range(g * group_inputs, (g + 1) * group_inputs):
            for y in range(padded_h):
                for x in range(padded_w):
                    plane[y, x] += np.int64(padded[c, y, x])
        for oy in range(out_h):
            for ox in range(out_w):
                total = np.int64(0)
                for ky in range(kernel_h):
                    for kx in range(kernel_w):
                        total += plane[oy * stride_y + ky * dilation_y,
                                       ox * stride_x + kx * dilation_x]
                sums[g, oy, ox] = total


@njit(cache=True)
def _axpy(dst, weight, src):
    for i in range(dst.size):
        dst[i] += weight * src[i]


@njit(cache=True)
def _conv_direct_flat(padded, weights, kernels_per_group, dilation_y, dilation_x, with_sums, acc,
                      sums):
    # Stride 1: on a plane flattened with the padded row pitch, every tap is one long axpy at a
    # fixed offset; the columns past out_w of each row are junk and dropped when copying out.
    channels, padded_h, padded_w = padded.shape
    out_channels, group_inputs, kernel_h, kernel_w = weights.shape
    _, out_h, out_w = acc.shape
    length = (out_h - 1) * padded_w + out_w
    flat = padded.reshape(channels, padded_h * padded_w)
    plane = np.empty(length, np.float32)
    total = np.empty(length, np.float32)
    one = np.float32(1.0)
    for o in range(out_channels):
        g = o // kernels_per_group
        summing = with_sums and o == g * kernels_per_group
        plane[:] = 0
        if summing:
            total[:] = 0
        for ci in range(group_inputs):
            c = g * group_inputs + ci
            for ky in range(kernel_h):
                for kx in range(kernel_w):
                    offset = ky * dilation_y * padded_w + kx * dilation_x
                    src = flat[c, offset:offset + length]
                    _axpy(plane, np.float32(weights[o, ci, ky, kx]), src)
                    if summing:
                        _axpy(total, one, src)
        for oy in range(out_h):
            acc[o, oy, :] = plane[oy * padded_w:oy * padded_w + out_w]
            if summing:
                sums[g, oy, :] = total[oy * padded_w:oy * padded_w + out_w]


@njit(cache=True)
def _conv_direct_exact(padded, weights, groups, stride_y, stride_x, dilation_y, dilation_x,
                       with_sums, acc, sums):
    # int8 weights, float32 sums over at most EXACT_FLOAT32_REDUCTION products per output
    # (exact in any order); the first kernel of each group also sums its inputs (window sums).
    # The inner loop runs over a row slice: with a unit stride LLVM vectorises it.
    out_channels, group_inputs, kernel_h, kernel_w = weights.shape
    _, out_h, out_w = acc.shape
    kernels_per_group = out_channels // groups
    span = (out_w - 1) * stride_x + 1
    one = np.float32(1.0)
    if stride_x == 1 and stride_y == 1:
        _conv_direct_flat(padded, weights, kernels_per_group, dilation_y, dilation_x, with_sums,
                          acc, sums)
        return
    for o in range(out_channels):
        g = o // kernels_per_group
        summing = with_sums and o == g * kernels_per_group
        for oy in range(out_h):
            dst = acc[o, oy]
            total = sums[g if with_sums else 0, oy]
            for ci in range(group_inputs):
                c = g * group_inputs + ci
                for ky in range(kernel_h):
                    src = padded[c, oy * stride_y + ky * dilation_y]
                    for kx in range(kernel_w):
                        weight = np.float32(weights[o, ci, ky, kx])
                        px = kx * dilation_x
                        if stride_x == 1:
                            _axpy(dst, weight, src[px:px + out_w])
                            if summing:
                                _axpy(total, one, src[px:px + out_w])
                        else:
                            _axpy(dst, weight, src[px:px + span:stride_x])
                            if summing:
                                _axpy(total, one, src[px:px + span:stride_x])


@njit(cache=True)
def _core_outputs(exact, clip_truncate, mode, out):
    # ``exact`` is int64, or float32/float64 holding integers exactly (the GEMM path)
    for i in range(exact.shape[0]):
        out[i] = core_output(np.int64(exact[i]), clip_truncate, mode)


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


def _is_pointwise(geometry: ConvGeometry, padded: np.ndarray) -> bool:
    # A 1x1 stride-1 convolution reads the padded planes as they are: no gather needed.
    return (geometry.kernel_h == geometry.kernel_w == 1
            and geometry.stride_y == geometry.stride_x == 1
            and padded.shape[1] == geometry.out_h and padded.shape[2] == geometry.out_w)


def _conv_gemm(padded: np.ndarray, matrices: np.ndarray, geometry: ConvGeometry,
               accumulator_dtype: type, bounds: tuple[int, ...] | None = None,
               integer: bool = False) -> np.ndarray:
    """Convolution as float32 matrix products: ``matrices`` [groups][M][K] (K in c, ky, kx
    order) times the gathered input, one product per group, row block and reduction chunk
    ``[bounds[i], bounds[i+1])`` (default: chunks of EXACT_FLOAT32_REDUCTION); chunk results add
    in ``accumulator_dtype``. Returns [groups * M][OH][OW]."""
    choose_blas_threads()
    groups, rows, reduction = matrices.shape
    kernel_h, kernel_w, out_h, out_w = (geometry.kernel_h, geometry.kernel_w, geometry.out_h,
                                        geometry.out_w)
    group_inputs = reduction // (kernel_h * kernel_w)
    if bounds is None:
        bounds = tuple(range(0, reduction, EXACT_FLOAT32_REDUCTION)) + (reduction,)
    chunk = max(b - a for a, b in zip(bounds, bounds[1:]))
    rows_per_block = max(1, min(out_h, _COLUMN_BUDGET // (chunk * out_w)))
    pointwise = _is_pointwise(geometry, padded)
    planes = padded.reshape(padded.shape[0], -1) if pointwise else None
    columns = None if pointwise else np.empty((chunk, rows_per_block * out_w), np.float32)
    if integer and groups == 1 and len(bounds) == 2 and rows_per_block == out_h:
        # One product covers everything: it is the result (integer sums: no -0.0 to clear).
        if not pointwise:
            _im2col(padded, 0, 0, reduction, kernel_h, kernel_w, geometry.stride_y,
                    geometry.stride_x, geometry.dilation_y, geometry.dilation_x, 0, out_h, out_w,
                    columns)
        return np.matmul(matrices[0], planes if pointwise else columns).reshape(rows, out_h, out_w)
    acc = np.zeros((groups * rows, out_h * out_w), accumulator_dtype)
    product = np.empty((rows, rows_per_block * out_w), np.float32)
    for g in range(groups):
        pieces = [np.ascontiguousarray(matrices[g][:, k0:k1]) for k0, k1 in zip(bounds, bounds[1:])]
        for row0 in range(0, out_h, rows_per_block):
            row1 = min(out_h, row0 + rows_per_block)
            width = (row1 - row0) * out_w
            target = acc[g * rows:(g + 1) * rows, row0 * out_w:row1 * out_w]
            for piece, k0, k1 in zip(pieces, bounds, bounds[1:]):
                if pointwise:
                    block = planes[g * group_inputs + k0:g * group_inputs + k1,
                                   row0 * out_w:row1 * out_w]
                else:
                    _im2col(padded, g * group_inputs, k0, k1, kernel_h, kernel_w,
                            geometry.stride_y, geometry.stride_x, geometry.dilation_y,
                            geometry.dilation_x, row0, row1, out_w, columns)
                    block = columns[:k1 - k0, :width]
                np.matmul(piece, block, out=product[:, :width])
                # float32 -> the accumulator type is exact here; chunks add there
                np.add(target, product[:, :width], out=target, casting="unsafe")
    return acc.reshape(groups * rows, out_h, out_w)


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


@dataclass(frozen=True)
class _GemmOperands:
    """An int8 weight set ready for the GEMM path: float32 matrices [groups][M][K], where a
    single group gets one extra row of ones (its product is the window sum), and the exact
    reduction chunks of those matrices."""

    matrices: np.ndarray
    bounds: tuple[int, ...]
    sums_row: bool
    #: [taps][M][C] for the per-tap products (kernels/tap_gemm.py): a single group of a
    #: kernel wider than 1x1 whose reduction is one exact chunk; None otherwise
    taps: np.ndarray | None = None
    #: the operands of the first input channels alone, when every later channel has only zero
    #: weights (the image input's padding lanes): their products are all 0, so the products
    #: skip them (the window sums still count them); None otherwise
    trimmed: _GemmOperands | None = None

    @classmethod
    def build(cls, weights: np.ndarray, groups: int) -> _GemmOperands:
        operands = cls._make(weights, groups, sums_row=groups == 1)
        if groups == 1:
            used = np.flatnonzero(weights.any(axis=(0, 2, 3)))
            live = int(used[-1]) + 1 if used.size else 1
            if live < weights.shape[1]:
                trimmed = cls._make(np.ascontiguousarray(weights[:, :live]), 1, sums_row=False)
                return dataclasses.replace(operands, trimmed=trimmed)
        return operands

    @classmethod
    def _make(cls, weights: np.ndarray, groups: int, sums_row: bool) -> _GemmOperands:
        out_channels, group_inputs, kernel_h, kernel_w = weights.shape
        matrices = weights.reshape(groups, out_channels // groups, -1).astype(np.float32)
        if sums_row:
            matrices = np.concatenate([matrices, np.ones((1, 1, matrices.shape[2]), np.float32)],
                                      axis=1)
        bounds = exact_chunk_bounds(matrices.reshape(-1, matrices.shape[2]))
        taps = None
        if groups == 1 and len(bounds) == 2 and kernel_h * kernel_w > 1 and tap_gemm.available():
            taps = tap_gemm.tap_weights(matrices[0], group_inputs, kernel_h * kernel_w)
        return cls(matrices, bounds, sums_row, taps)


class OperandCache:
    """Operands ``build(weights, variant)`` (``variant``: an int, e.g. the group count) per
    immutable weight array, built once: weights from the memory's derived cache are read-only
    and live as long as their bytes do; writable arrays are not cached."""

    def __init__(self, build: Callable[[np.ndarray, int], Any]) -> None:
        self._build = build
        self._entries: dict[tuple[int, int], tuple[weakref.ref, Any]] = {}

    def get(self, weights: np.ndarray, variant: int) -> Any:
        if weights.flags.writeable:
            return self._build(weights, variant)
        key = (id(weights), variant)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is weights:
            return entry[1]
        operands = self._build(weights, variant)
        self._entries[key] = (weakref.ref(weights, lambda _, key=key: self._entries.pop(key, None)),
                              operands)
        return operands


_OPERANDS = OperandCache(_GemmOperands.build)


def _use_direct(weights: np.ndarray, geometry: ConvGeometry, method: str) -> bool:
    if method not in ("auto", "gemm", "direct"):
        raise EmulationError(
            f"unknown convolution method {method!r}: expected auto, gemm or direct")
    if method == "auto":
        return weights.shape[0] // geometry.groups <= _DIRECT_MAX_KERNELS_PER_GROUP
    return method == "direct"


def _conv_int8_sums(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry,
                    method: str, with_window_sums: bool = False
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """Exact integer sums [OC][OH][OW] (int64, or float32/float64 holding integers exactly) and,
    if asked, the window sums [groups][OH][OW] (any of those dtypes, integer-valued).

    float32 is used only where NUMERICS.md 3.2 proves it exact: GEMM chunks from
    :func:`exact_chunk_bounds` (added in float64, exact below 2**53) and direct loops over at
    most EXACT_FLOAT32_REDUCTION products per output."""
    _check_operands(padded, weights, geometry)
    if weights.dtype != np.int8:
        raise EmulationError(f"int8 convolution needs int8 weights, got {weights.dtype}")
    out_channels, group_inputs, kernel_h, kernel_w = weights.shape
    shape = (out_channels, geometry.out_h, geometry.out_w)
    if _use_direct(weights, geometry, method):
        if group_inputs * kernel_h * kernel_w <= EXACT_FLOAT32_REDUCTION:
            acc = np.zeros(shape, np.float32)
            sums = np.zeros((geometry.groups if with_window_sums else 1,) + shape[1:], np.float32)
            _conv_direct_exact(padded, weights, geometry.groups, geometry.stride_y,
                               geometry.stride_x, geometry.dilation_y, geometry.dilation_x,
                               with_window_sums, acc, sums)
            return acc, sums if with_window_sums else None
        acc = np.zeros(shape, np.int64)
        _conv_direct_int(padded, weights, geometry.groups, geometry.stride_y, geometry.stride_x,
                         geometry.dilation_y, geometry.dilation_x, acc)
        return acc, window_sums(padded, geometry) if with_window_sums else None
    operands = _OPERANDS.get(weights, geometry.groups)
    if operands.trimmed is not None:
        live = operands.trimmed.matrices.shape[2] // (kernel_h * kernel_w)
        result = _gemm_sums(padded[:live], operands.trimmed, geometry)
        return result, window_sums(padded, geometry) if with_window_sums else None
    result = _gemm_sums(padded, operands, geometry)
    if operands.sums_row:
        sums = result[out_channels:] if with_window_sums else None
        return result[:out_channels], sums
    return result, window_sums(padded, geometry) if with_window_sums else None


def _gemm_sums(padded: np.ndarray, operands: _GemmOperands, geometry: ConvGeometry) -> np.ndarray:
    """The products of the GEMM operands with the padded input: [groups * M][OH][OW]."""
    if operands.taps is not None and geometry.stride_y == geometry.stride_x == 1 \
            and padded.dtype == np.float32 and padded.flags.c_contiguous:
        # stride 1: one accumulating product per tap, no im2col (tap_gemm.py; exact: one chunk)
        choose_blas_threads()
        return tap_gemm.tap_products(padded, operands.taps, geometry.kernel_w, geometry.dilation_y,
                                     geometry.dilation_x, geometry.out_h, geometry.out_w)
    single = len(operands.bounds) == 2
    return _conv_gemm(padded, operands.matrices, geometry, np.float32 if single else np.float64,
                      operands.bounds, integer=True)


def conv2d_int8_exact(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry,
                      method: str = "auto") -> np.ndarray:
    """Exact int64 sums [OC][OH][OW] of an int8 convolution (before the CORE's 34/32-bit
    saturation and truncation). ``padded`` comes from :func:`fetch_padded_input`."""
    return _conv_int8_sums(padded, weights, geometry, method)[0].astype(np.int64)


def core_outputs(exact: np.ndarray, clip_truncate: int = 0,
                 round_mode: int = ROUND_HALF_AWAY) -> np.ndarray:
    """CORE accumulator stage on exact sums (int64, or integer-valued float32/float64 from the
    GEMM): 34-bit saturation, CLIP_TRUNCATE, int32."""
    if exact.dtype not in (np.float32, np.float64):
        exact = exact.astype(np.int64)
    exact = np.ascontiguousarray(exact)
    out = np.empty(exact.shape, np.int32)
    _core_outputs(exact.reshape(-1), clip_truncate, round_mode, out.reshape(-1))
    return out


def conv2d_int8(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry, *,
                clip_truncate: int = 0, round_mode: int = ROUND_HALF_AWAY,
                method: str = "auto") -> np.ndarray:
    """int8 convolution -> int32 CORE outputs [OC][OH][OW] (the DPU's input)."""
    return core_outputs(_conv_int8_sums(padded, weights, geometry, method)[0], clip_truncate,
                        round_mode)


def conv2d_int8_with_window_sums(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry,
                                 *, clip_truncate: int = 0, round_mode: int = ROUND_HALF_AWAY,
                                 method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """:func:`conv2d_int8` and :func:`window_sums` in one pass over the input (the GEMM gets a
    row of ones, the direct loop sums as it goes): int32 [OC][OH][OW], int64 [groups][OH][OW]."""
    acc, sums = _conv_int8_sums(padded, weights, geometry, method, with_window_sums=True)
    return core_outputs(acc, clip_truncate, round_mode), sums.astype(np.int64)


def window_sums(padded: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
    """Per group and output pixel, the sum of the input over the kernel window, padding
    included at the pad value: the Σx that BS multiplies by CPEND. int64 [groups][OH][OW]."""
    if padded.ndim != 3 or padded.shape[0] % geometry.groups:
        raise EmulationError(f"padded input of shape {padded.shape} does not split into "
                             f"{geometry.groups} groups")
    sums = np.empty((geometry.groups, geometry.out_h, geometry.out_w), np.int64)
    _window_sums(padded, geometry.groups, geometry.kernel_h, geometry.kernel_w,
                 geometry.stride_y, geometry.stride_x, geometry.dilation_y, geometry.dilation_x,
                 sums)
    return sums


def conv2d_fp16(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry,
                method: str = "auto") -> np.ndarray:
    """fp16 x fp16 convolution with fp32 accumulation -> float32 [OC][OH][OW].

    Products are exact in fp32; the summation order is the BLAS order (or the direct loop's),
    so results lie within the bound of NUMERICS.md 3.3 of the exact sum."""
    _check_operands(padded, weights, geometry)
    if weights.dtype != np.float16:
        raise EmulationError(f"fp16 convolution needs float16 weights, got {weights.dtype}")
    if _use_direct(weights, geometry, method):
        acc = np.zeros((weights.shape[0], geometry.out_h, geometry.out_w), np.float32)
        _conv_direct_float(padded, weights.astype(np.float32), geometry.groups, geometry.stride_y,
                           geometry.stride_x, geometry.dilation_y, geometry.dilation_x, acc)
        return acc
    groups = geometry.groups
    matrices = weights.reshape(groups, weights.shape[0] // groups, -1).astype(np.float32)
    return _conv_gemm(padded, matrices, geometry, np.float32)
