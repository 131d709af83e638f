"""int8 convolution pixel-major, straight from the NC1HWC2 feature atoms (issue 8).

The CNA's atoms [C1][H][W][C2] already hold each pixel's channels together. One Numba pass
gathers, per output pixel, its window's channels into a float32 row (im2col, pixel-major: the
reduction in (ky, kx, c) order; a 1x1 stride-1 convolution is a plain copy of the atoms), with
the pad value wherever a tap falls outside the input (NUMERICS.md 3.1). A BLAS product with
the transposed weight matrix [K][M] then gives the sums pixel-major [P][M], and one more pass
applies the CORE stage into [P][out_channels] int32 - the order of the atoms the DPU writes.
No padded [C][Hp][Wp] planes and no transposition back. Stride-1 kernels wider than 1x1
whose reduction is one exact chunk gather the padded input once and run one accumulating
product per tap instead (``tap_gemm.tap_products_pixels``). Input channels past
DATAIN_CHANNEL_REAL (the image input's padding lanes) enter as one column per tap (see
``PixelOperands``), not one per channel.

Exactness is the one of NUMERICS.md 3.5: the reduction is cut into chunks by
``mac.exact_chunk_bounds`` (every partial sum of a chunk <= 2**24 in magnitude, exact in
float32 whatever the summation order); several chunks add in float64. The window sums (3.4)
come from an extra weight column of ones.

On CPUs with AVX-512 VNNI the prepared form (``prepare_conv_int8_pixels``) computes the same exact
sums in int32 instead (``gemm_conv_int8``, NUMERICS.md 29); this float32 path is the fallback.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import gemm_conv_int8, tap_gemm
from npuemu.emulator.kernels.mac import ConvGeometry, choose_blas_threads, exact_chunk_bounds
from npuemu.emulator.memo import Memo
from npuemu.isa.errors import EmulationError

#: Operand rows x reduction per block (float32 elements, 4 MiB): bounds memory on big layers
#: and keeps a block's operand near the caches.
BLOCK_ELEMENTS = 1 << 20
#: Largest padded input (float32 elements, 32 MiB) the per-tap path gathers whole; bigger layers
#: take the blocked im2col path.
TAP_OPERAND_ELEMENTS = 1 << 23
#: Largest operand or product block (elements) a prepared small layer keeps buffers of its own
#: for (``prepare_conv_int8_pixels``)
OWN_BUFFER_ELEMENTS = 1 << 14


@dataclass(frozen=True)
class PixelOperands:
    """An int8 weight set [M][C][KH][KW] for the pixel-major products, given how many input
    channels are real (DATAIN_CHANNEL_REAL): float32 [K][M + 1], K in (ky, kx, c) order over the
    real channels, then, when some are not, one column per tap for all of them together (the
    CNA feeds them 0 inside the input and the pad value outside it, so their products at a tap
    are the pad value times their summed weights, or 0); the last column is the window-sum
    column (1 per real channel, the count of the others per tap); and the exact chunks."""

    matrix: np.ndarray
    bounds: tuple[int, ...]
    channels: int  # real channels in the operand rows
    virtual: bool  # one column per tap for the channels past them
    #: [taps][channels (+ 1 with ``virtual``)][M + 1], for one product per tap
    #: (``tap_gemm.tap_products_pixels``): a kernel wider than 1x1 whose reduction is one exact
    #: chunk, when the CBLAS entry point is there; None otherwise
    taps: np.ndarray | None = None

    @classmethod
    def build(cls, weights: np.ndarray, real: int) -> PixelOperands:
        kernels, channels, kernel_h, kernel_w = weights.shape
        taps = kernel_h * kernel_w
        real = operand_channels(weights, real)
        wide = weights.astype(np.int32)  # the weights, and below their sums once bounded
        summed = wide[:, real:].sum(axis=1, dtype=np.int64).reshape(kernels, taps)
        columns = [wide[:, :real].transpose(0, 2, 3, 1).reshape(kernels, taps * real)]
        ones = [np.ones(taps * real, np.int32)]
        if real < channels:
            columns.append(summed.astype(np.int32))
            ones.append(np.full(taps, channels - real, np.int32))
        rows = np.concatenate([np.concatenate(columns, axis=1), np.concatenate(ones)[None]])
        matrix = np.ascontiguousarray(rows.T, dtype=np.float32)
        bounds = exact_chunk_bounds(rows)
        per_tap = None
        if taps > 1 and len(bounds) == 2 and tap_gemm.available():
            # tap t: its real channels' rows, then its summed row (the extra padded channel)
            per_tap = matrix[:taps * real].reshape(taps, real, -1)
            if real < channels:
                per_tap = np.concatenate([per_tap, matrix[taps * real:, None, :]], axis=1)
            per_tap = np.ascontiguousarray(per_tap)
        return cls(matrix, bounds, real, real < channels, per_tap)


def operand_channels(weights: np.ndarray, real: int) -> int:
    """The channels ``PixelOperands`` feeds as they are (``PixelOperands.channels``): the real
    ones, or all of them where one summed product of the others could leave float32's exact range."""
    channels = weights.shape[1]
    real = min(real, channels)
    if real < channels:
        summed = weights[:, real:].sum(axis=1, dtype=np.int64)
        if (np.abs(summed).max(initial=0) << 7) > 1 << 24:
            return channels
    return real


#: Per read-only weight array (unpacked once per weight bytes by the CNA, so the same object
#: every run) and real channel count.
_OPERANDS = Memo(PixelOperands.build, identity=1)


def pixel_operands(weights: np.ndarray, real: int) -> PixelOperands:
    """``PixelOperands.build``, memoised for read-only weights (a writable array may change)."""
    if weights.flags.writeable:
        return PixelOperands.build(weights, real)
    return _OPERANDS(weights, real)


_SCRATCH = threading.local()  # per thread: BLAS releases the GIL while it fills a buffer


def _scratch(name: str, size: int, dtype: type) -> np.ndarray:
    """A working buffer of at least ``size`` elements, kept between calls: a fresh multi-MiB
    array can be a fresh mapping whose pages all fault on first touch (measured on this
    machine: a 56x56, 32 -> 144 layer run alone took 4x longer with fresh buffers)."""
    buffers = _SCRATCH.__dict__
    buffer = buffers.get(name)
    if buffer is None or buffer.size < size:
        buffer = buffers[name] = np.empty(size, dtype)
    return buffer[:size]


#: the thread's working buffers, for other prepared kernels (kernels/depthwise_plan.py)
working_buffer = _scratch


@njit(cache=True)
def _gather(atoms, channels, virtual, pad_value, kernel_h, kernel_w, stride_y, stride_x,
            dilation_y, dilation_x, pad_top, pad_left, out_w, first, operand):
    # operand row n = output pixel first + n: for each tap (ky, kx), the first ``channels``
    # channels of the input pixel it reads, or the pad value outside the input; then, with
    # ``virtual``, per tap 0 inside and the pad value outside (PixelOperands)
    surfaces, height, width, c2 = atoms.shape
    pad = np.float32(pad_value)
    taps = kernel_h * kernel_w
    tail = taps * channels
    single = channels <= c2
    for n in range(operand.shape[0]):
        oy, ox = divmod(first + n, out_w)
        target = operand[n]
        for ky in range(kernel_h):
            iy = oy * stride_y + ky * dilation_y - pad_top
            for kx in range(kernel_w):
                ix = ox * stride_x + kx * dilation_x - pad_left
                tap = ky * kernel_w + kx
                base = tap * channels
                inside = 0 <= iy < height and 0 <= ix < width
                if inside and single:  # a few lanes (the image input): no views
                    for lane in range(channels):
                        target[base + lane] = atoms[0, iy, ix, lane]
                elif inside:  # a view per atom: its lanes copy as one vectorised run
                    for s in range(-(-channels // c2)):
                        count = min(c2, channels - s * c2)
                        source = atoms[s, iy, ix]
                        lanes = target[base + s * c2:base + s * c2 + count]
                        for lane in range(count):
                            lanes[lane] = source[lane]
                else:
                    for lane in range(channels):
                        target[base + lane] = pad
                if virtual:
                    target[tail + tap] = 0 if inside else pad


@njit(cache=True)
def _gather_pointwise(atoms, channels, virtual, first, operand):
    # _gather of a 1x1 stride-1 convolution whose output rows are the input's (no padding
    # reached): output pixel p is input pixel p, one run of lanes per surface
    surfaces, height, width, c2 = atoms.shape
    flat = atoms.reshape(surfaces, height * width * c2)
    target = operand.reshape(-1)
    reduction = operand.shape[1]
    for n in range(operand.shape[0]):
        p = (first + n) * c2
        for s in range(-(-channels // c2)):
            count = min(c2, channels - s * c2)
            source = flat[s, p:p + count]
            lanes = target[n * reduction + s * c2:n * reduction + s * c2 + count]
            for lane in range(count):
                lanes[lane] = source[lane]
        if virtual:
            target[n * reduction + channels] = 0


@njit(cache=True)
def _core_rows(acc, pitch, out_w, kernels, clip_truncate, mode, out, sums, exact=False):
    # CORE stage on integer-valued float sums, pixel (oy, ox) in row oy * pitch + ox of ``acc``
    # [.][kernels + 1] -> int32 ``out`` [P][out_channels] (channels past the kernels have no
    # weights: 0, REGISTER_SEMANTICS 2.5) and the last column -> ``sums`` [P]. Unsigned
    # offsets: a signed computed index carries Numba's wraparound branch, which stops LLVM's
    # vectorisation. ``exact``: the sums come from one exact chunk (NUMERICS.md 3.5), so each is
    # an integer of magnitude <= 2**24 - inside int32: without a shift the saturation never
    # applies and the conversion alone is the CORE's output (issue 20: one instruction an
    # element instead of four).
    source, target = acc.reshape(-1), out.reshape(-1)
    columns, channels = np.uint64(acc.shape[1]), np.uint64(out.shape[1])
    count = np.uint64(kernels)
    for p in range(out.shape[0]):
        oy, ox = divmod(p, out_w)
        first = np.uint64(oy * pitch + ox) * columns
        row = np.uint64(p) * channels
        if clip_truncate == 0 and exact:
            for m in range(count):
                target[row + m] = np.int32(source[first + m])
        elif clip_truncate == 0:  # core_output without a shift: the int32 saturation alone
            for m in range(count):
                value = np.float64(source[first + m])
                target[row + m] = np.int32(min(max(value, -2147483648.0), 2147483647.0))
        else:
            for m in range(count):
                target[row + m] = nm.core_output(np.int64(source[first + m]), clip_truncate, mode)
        for m in range(count, channels):
            target[row + m] = 0
        sums[p] = np.int64(source[first + count])


def conv_int8_pixels(feature: np.ndarray, channels: int, real: int, weights: np.ndarray,
                     geometry: ConvGeometry, pad_value: int, clip_truncate: int, round_mode: int,
                     out_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """int8 convolution (one group) of the first ``channels`` channels of ``feature`` (int8
    atoms [C1][H][W][C2]; channels from ``real`` on hold 0, DATAIN_CHANNEL_REAL) with
    ``weights`` int8 [M][channels][KH][KW]: CORE outputs int32 pixel-major [OH*OW][out_channels]
    (kernels past M are 0) and window sums int64 [1][OH][OW]."""
    kernels = weights.shape[0]
    if feature.ndim != 4 or feature.dtype != np.int8 or weights.dtype != np.int8 \
            or weights.ndim != 4 or weights.shape[1] != channels or geometry.groups != 1 \
            or channels > feature.shape[0] * feature.shape[3] or kernels > out_channels:
        raise EmulationError(
            f"pixel-major conv: expected int8 atoms [C1][H][W][C2] holding {channels} channels and "
            f"int8 weights [<= {out_channels}][{channels}][KH][KW] in one group, got {feature.dtype} "
            f"{feature.shape}, {weights.dtype} {weights.shape}, {geometry.groups} groups")
    choose_blas_threads()  # once per process (mac.DEFAULT_BLAS_THREADS)
    operands = pixel_operands(weights, real)
    feature = np.ascontiguousarray(feature)
    out_h, out_w = geometry.out_h, geometry.out_w
    pixels = out_h * out_w
    reduction, columns = operands.matrix.shape
    out = np.empty((pixels, out_channels), np.int32)
    sums = np.empty(pixels, np.int64)
    if operands.taps is not None and geometry.stride_y == geometry.stride_x == 1 \
            and geometry.padded_h * geometry.padded_w * operands.taps.shape[1] <= TAP_OPERAND_ELEMENTS:
        _tap_products(feature, operands, geometry, pad_value, clip_truncate, round_mode, out, sums)
        return out, sums.reshape(1, out_h, out_w)
    block = max(1, min(pixels, BLOCK_ELEMENTS // reduction))
    operand = _scratch("operand", block * reduction, np.float32).reshape(block, reduction)
    single = len(operands.bounds) == 2
    product = _scratch("product", block * columns, np.float32).reshape(block, columns)
    acc = product if single else _scratch("acc", block * columns, np.float64).reshape(block, columns)
    gather = (operands.channels, operands.virtual, float(pad_value), geometry.kernel_h,
              geometry.kernel_w, geometry.stride_y, geometry.stride_x, geometry.dilation_y,
              geometry.dilation_x, geometry.pad_top, geometry.pad_left, out_w)
    height, width = feature.shape[1:3]
    pointwise = geometry.kernel_h == geometry.kernel_w == geometry.stride_y == geometry.stride_x == 1 \
        and geometry.pad_top == geometry.pad_left == 0 and out_w == width and out_h <= height
    for first in range(0, pixels, block):
        count = min(block, pixels - first)
        rows = operand[:count]
        if pointwise:
            _gather_pointwise(feature, operands.channels, operands.virtual, first, rows)
        else:
            _gather(feature, *gather, first, rows)
        if single:
            np.matmul(rows, operands.matrix, out=acc[:count])
        else:
            acc[:count] = 0
            for k0, k1 in zip(operands.bounds, operands.bounds[1:]):
                np.matmul(rows[:, k0:k1], operands.matrix[k0:k1], out=product[:count])
                acc[:count] += product[:count]  # float32 -> float64: exact; chunks add there
        _core_rows(acc[:count], out_w, out_w, kernels, clip_truncate, round_mode,
                   out[first:first + count], sums[first:first + count], single)
    return out, sums.reshape(1, out_h, out_w)


def prepare_conv_int8_pixels(feature_shape: tuple[int, int, int, int], channels: int, real: int,
                             weights: np.ndarray, geometry: ConvGeometry, pad_value: int, clip_truncate: int,
                             round_mode: int, out_channels: int):
    """``conv_int8_pixels`` for int8 atoms of ``feature_shape`` (contiguous) and read-only
    ``weights``, its checks, operands and blocking worked out once: ``run(feature) -> (out,
    sums)``, the same calls on every run (issue 20: a core's task programs, emulator/task_plan.py);
    None where ``conv_int8_pixels`` would refuse them (it then raises its own error)."""
    kernels = weights.shape[0]
    if len(feature_shape) != 4 or weights.dtype != np.int8 or weights.flags.writeable or weights.ndim != 4 \
            or weights.shape[1] != channels or geometry.groups != 1 \
            or channels > feature_shape[0] * feature_shape[3] or kernels > out_channels:
        return None
    choose_blas_threads()  # (process-wide: other BLAS users of an int8 network rely on it too)
    vnni = gemm_conv_int8.prepare(feature_shape, channels, operand_channels(weights, real), weights, geometry,
                                  pad_value, clip_truncate, round_mode, out_channels, _scratch)
    if vnni is not None:  # the exact int32 products on AVX-512 VNNI (NUMERICS.md 29)
        return vnni
    operands = pixel_operands(weights, real)
    out_h, out_w = geometry.out_h, geometry.out_w
    pixels = out_h * out_w
    reduction, columns = operands.matrix.shape
    if operands.taps is not None and geometry.stride_y == geometry.stride_x == 1 \
            and geometry.padded_h * geometry.padded_w * operands.taps.shape[1] <= TAP_OPERAND_ELEMENTS:
        def taps(feature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            out, sums = _results(pixels, out_channels)
            _tap_products(feature, operands, geometry, pad_value, clip_truncate, round_mode, out, sums)
            return out, sums.reshape(1, out_h, out_w)
        return taps
    block = max(1, min(pixels, BLOCK_ELEMENTS // reduction))
    single, matrix, bounds = len(operands.bounds) == 2, operands.matrix, operands.bounds
    gather = (operands.channels, operands.virtual, float(pad_value), geometry.kernel_h,
              geometry.kernel_w, geometry.stride_y, geometry.stride_x, geometry.dilation_y,
              geometry.dilation_x, geometry.pad_top, geometry.pad_left, out_w)
    pointwise = geometry.kernel_h == geometry.kernel_w == geometry.stride_y == geometry.stride_x == 1 \
        and geometry.pad_top == geometry.pad_left == 0 and out_w == feature_shape[2] and out_h <= feature_shape[1]
    blocks = tuple((first, min(block, pixels - first)) for first in range(0, pixels, block))
    # a small layer keeps its own working buffers (the thread's shared ones cost more to look up
    # than such a layer computes); their contents never outlive a run
    small = block * max(reduction, columns) <= OWN_BUFFER_ELEMENTS and pixels * out_channels <= OWN_BUFFER_ELEMENTS
    own = _buffers(block, reduction, columns, single) if small else None
    results = (np.empty((pixels, out_channels), np.int32), np.empty(pixels, np.int64)) if small else None

    def run(feature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, sums = results or _results(pixels, out_channels)
        operand, product, acc = own or _buffers(block, reduction, columns, single, _scratch)
        for first, count in blocks:
            rows = operand[:count]
            if pointwise:
                _gather_pointwise(feature, gather[0], gather[1], first, rows)
            else:
                _gather(feature, *gather, first, rows)
            _products(rows, matrix, bounds, single, product[:count], acc[:count])
            _core_rows(acc[:count], out_w, out_w, kernels, clip_truncate, round_mode,
                       out[first:first + count], sums[first:first + count], single)
        return out, sums.reshape(1, out_h, out_w)

    return run


def _results(pixels: int, out_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """A prepared run's outputs and window sums, in the thread's working buffers: the task's DPU
    consumes them before the next task's CORE runs, and every element is written (``_core_rows``)."""
    return (_scratch("results", pixels * out_channels, np.int32).reshape(pixels, out_channels),
            _scratch("window sums", pixels, np.int64))


def _buffers(block: int, reduction: int, columns: int, single: bool,
             make=lambda name, size, dtype: np.empty(size, dtype)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The operand rows, the product and the accumulator of ``conv_int8_pixels``' blocks."""
    operand = make("operand", block * reduction, np.float32).reshape(block, reduction)
    product = make("product", block * columns, np.float32).reshape(block, columns)
    return operand, product, product if single else make("acc", block * columns, np.float64).reshape(block, columns)


def _products(rows: np.ndarray, matrix: np.ndarray, bounds: tuple[int, ...], single: bool,
              product: np.ndarray, acc: np.ndarray) -> None:
    """The block's sums into ``acc``: one product, or exact chunks added in float64 (as
    ``conv_int8_pixels``)."""
    if single:
        np.matmul(rows, matrix, out=acc)
        return
    acc[:] = 0
    for k0, k1 in zip(bounds, bounds[1:]):
        np.matmul(rows[:, k0:k1], matrix[k0:k1], out=product)
        acc += product


def _tap_products(feature: np.ndarray, operands: PixelOperands, geometry: ConvGeometry,
                  pad_value: int, clip_truncate: int, round_mode: int, out: np.ndarray,
                  sums: np.ndarray) -> None:
    """Stride 1, one exact chunk: the padded input pixel-major [Hp * Wp][C] (gathered as a 1x1
    convolution over the padded size), then one accumulating product per tap
    (``tap_gemm.tap_products_pixels``); exact like the single product (NUMERICS.md 3.5)."""
    padded_h, padded_w = geometry.padded_h, geometry.padded_w
    taps, channels, columns = operands.taps.shape
    padded = _scratch("padded", padded_h * padded_w * channels, np.float32).reshape(-1, channels)
    _gather(feature, operands.channels, operands.virtual, float(pad_value), 1, 1, 1, 1, 1, 1,
            geometry.pad_top, geometry.pad_left, padded_w, 0, padded)
    run = (geometry.out_h - 1) * padded_w + geometry.out_w
    acc = _scratch("product", run * columns, np.float32).reshape(run, columns)
    tap_gemm.tap_products_pixels(padded, operands.taps, geometry.kernel_w, geometry.dilation_y,
                                 geometry.dilation_x, padded_w, acc)
    _core_rows(acc, padded_w, geometry.out_w, columns - 1, clip_truncate, round_mode, out, sums, True)
