"""CNA fetch and the CORE MAC array: convolution on NC1HWC2 features.

Integer results are exact. The bulk of an int8 convolution runs as float32 matrix products
(numpy BLAS) over reduction chunks of at most ``EXACT_FLOAT32_REDUCTION`` = 1024 elements:
int8 x int8 products are integers with |p| <= 2**14, so every partial sum of such a chunk is an
integer of magnitude <= 2**24 and float32 holds it exactly whatever the summation order; the
chunks are then added in int64 (NUMERICS.md 3). Gathering (im2col), window sums and the
direct path for depthwise-like convolutions are Numba loops.

Geometry follows the registers: explicit top/left padding, bottom/right implied by the output
size (rknpu-isa.md 3, PAD_CON0 note), every padded position holding the pad value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from npuemu.emulator.numerics import EXACT_FLOAT32_REDUCTION, ROUND_HALF_AWAY, core_output
from npuemu.isa.errors import EmulationError

#: im2col working-buffer budget in float32 elements (16 MiB): bounds memory on big layers.
_COLUMN_BUDGET = 1 << 22
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
    _, height, width, c2 = feature.shape
    _, padded_h, padded_w = padded.shape
    for c in range(channels):
        group, lane = c // c2, c % c2
        for py in range(padded_h):
            y = py - pad_top
            for px in range(padded_w):
                x = px - pad_left
                if 0 <= y < height and 0 <= x < width:
                    padded[c, py, px] = feature[group, y, x, lane]
                else:
                    padded[c, py, px] = pad_value


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
            for ox in range(out_w):
                columns[k - k0, n] = padded[c, py, ox * stride_x + kx * dilation_x]
                n += 1


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
def _core_outputs(exact, clip_truncate, mode, out):
    for i in range(exact.shape[0]):
        out[i] = core_output(exact[i], clip_truncate, mode)


# ---------------------------------------------------------------------------------------------
# Orchestration (numpy BLAS for the products)
# ---------------------------------------------------------------------------------------------
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


def _conv_gemm(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry,
               accumulator_dtype: type) -> np.ndarray:
    out_channels, group_inputs, kernel_h, kernel_w = weights.shape
    groups, out_h, out_w = geometry.groups, geometry.out_h, geometry.out_w
    kernels_per_group = out_channels // groups
    reduction = group_inputs * kernel_h * kernel_w
    chunk = min(reduction, EXACT_FLOAT32_REDUCTION)
    rows_per_block = max(1, min(out_h, _COLUMN_BUDGET // (chunk * out_w)))
    acc = np.zeros((out_channels, out_h * out_w), accumulator_dtype)
    matrices = weights.reshape(groups, kernels_per_group, reduction).astype(np.float32)
    pointwise = _is_pointwise(geometry, padded)
    planes = padded.reshape(padded.shape[0], -1) if pointwise else None
    columns = None if pointwise else np.empty((chunk, rows_per_block * out_w), np.float32)
    product = np.empty((kernels_per_group, rows_per_block * out_w), np.float32)
    for g in range(groups):
        pieces = [np.ascontiguousarray(matrices[g][:, k0:k0 + chunk])
                  for k0 in range(0, reduction, chunk)]
        for row0 in range(0, out_h, rows_per_block):
            row1 = min(out_h, row0 + rows_per_block)
            width = (row1 - row0) * out_w
            target = acc[g * kernels_per_group:(g + 1) * kernels_per_group,
                         row0 * out_w:row1 * out_w]
            for index, piece in enumerate(pieces):
                k0 = index * chunk
                k1 = min(reduction, k0 + chunk)
                if pointwise:
                    block = planes[g * group_inputs + k0:g * group_inputs + k1,
                                   row0 * out_w:row1 * out_w]
                else:
                    _im2col(padded, g * group_inputs, k0, k1, kernel_h, kernel_w,
                            geometry.stride_y, geometry.stride_x, geometry.dilation_y,
                            geometry.dilation_x, row0, row1, out_w, columns)
                    block = columns[:k1 - k0, :width]
                np.matmul(piece, block, out=product[:, :width])
                # float32 -> int64 (or float32) is exact here; chunks add in the accumulator type
                np.add(target, product[:, :width], out=target, casting="unsafe")
    return acc.reshape(out_channels, out_h, out_w)


def _use_direct(weights: np.ndarray, geometry: ConvGeometry, method: str) -> bool:
    if method not in ("auto", "gemm", "direct"):
        raise EmulationError(
            f"unknown convolution method {method!r}: expected auto, gemm or direct")
    if method == "auto":
        return weights.shape[0] // geometry.groups <= _DIRECT_MAX_KERNELS_PER_GROUP
    return method == "direct"


def conv2d_int8_exact(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry,
                      method: str = "auto") -> np.ndarray:
    """Exact int64 sums [OC][OH][OW] of an int8 convolution (before the CORE's 34/32-bit
    saturation and truncation). ``padded`` comes from :func:`fetch_padded_input`."""
    _check_operands(padded, weights, geometry)
    if weights.dtype != np.int8:
        raise EmulationError(f"int8 convolution needs int8 weights, got {weights.dtype}")
    if _use_direct(weights, geometry, method):
        acc = np.zeros((weights.shape[0], geometry.out_h, geometry.out_w), np.int64)
        _conv_direct_int(padded, weights, geometry.groups, geometry.stride_y, geometry.stride_x,
                         geometry.dilation_y, geometry.dilation_x, acc)
        return acc
    return _conv_gemm(padded, weights, geometry, np.int64)


def core_outputs(exact: np.ndarray, clip_truncate: int = 0,
                 round_mode: int = ROUND_HALF_AWAY) -> np.ndarray:
    """CORE accumulator stage on exact sums: 34-bit saturation, CLIP_TRUNCATE, int32."""
    exact = np.ascontiguousarray(exact, dtype=np.int64)
    out = np.empty(exact.shape, np.int32)
    _core_outputs(exact.reshape(-1), clip_truncate, round_mode, out.reshape(-1))
    return out


def conv2d_int8(padded: np.ndarray, weights: np.ndarray, geometry: ConvGeometry, *,
                clip_truncate: int = 0, round_mode: int = ROUND_HALF_AWAY,
                method: str = "auto") -> np.ndarray:
    """int8 convolution -> int32 CORE outputs [OC][OH][OW] (the DPU's input)."""
    return core_outputs(conv2d_int8_exact(padded, weights, geometry, method), clip_truncate,
                        round_mode)


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
    return _conv_gemm(padded, weights, geometry, np.float32)
