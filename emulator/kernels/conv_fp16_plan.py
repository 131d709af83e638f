"""An fp16 CORE task's convolution worked out once: the prepared form of ``mac.fetch_padded_input``
followed by ``mac.conv2d_fp16`` (issue 20: a core's task programs, emulator/task_plan.py).

``prepare_conv2d_fp16`` does the checks, the float32 weights, the method (direct loop or products),
the packed weights and the gemm layout (``mac.gemm_layout``: tap offsets, buffers) once per (read-only)
weights; each run then only fetches the atoms into padded planes and runs the same kernel calls - every
sum +0 then its products in (c, ky, kx) order whatever the path (NUMERICS.md 3.3, 47) - so the bits are
``conv2d_fp16``'s. In the steady runs of a small model the checks and memo look-ups of the plain
calls cost about as much as a small layer's work (5-10 us a task).

The padded planes, the im2col columns and the result live in arrays a small task keeps from run to
run, or else the thread's working buffers (``conv_pixels.working_buffer``): the task's DPU consumes
the result before the next task's CORE runs (task_plan: an fp16 CORE feeds only its own task's fp16
DPU step), and a fresh multi-MiB array each run costs its page faults (MobileNetV2 fp16: ~1 ms a run).
Kernels past the weights' count (up to the task's output channels) are rows of zeros, as
``units/cna_core._pad_channels`` gives them. Depthwise convolutions (one kernel a channel, 8-lane
atoms) read the atoms themselves (``depthwise_fp16``, NUMERICS.md 36), and so do 1x1 convolutions of
a few kernels at stride 1 without padding (``pointwise_fp16``, NUMERICS.md 42).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from npuemu.emulator.kernels import depthwise_fp16, depthwise_fp16_rows, fetch_fp16, mac, pointwise_fp16
from npuemu.emulator.kernels.conv_pixels import working_buffer
from npuemu.emulator.kernels.fp16 import widening_table


def prepare_conv2d_fp16(feature_shape: tuple[int, int, int, int], channels: int, weights: np.ndarray,
                        geometry: mac.ConvGeometry, pad_value: float,
                        out_channels: int) -> Callable[[np.ndarray], np.ndarray] | None:
    """``run(feature) -> float32 [out_channels][OH][OW]`` for float16 atoms ``[C1][H][W][C2]`` of
    ``feature_shape`` and read-only float16 ``weights``: the values of ``fetch_padded_input`` then
    ``conv2d_fp16`` (zero rows for kernels past the weights). None where those calls would refuse
    the operands (they then raise their own error) or for writeable weights (which may change)."""
    if weights.dtype != np.float16 or weights.flags.writeable or weights.ndim != 4 or len(feature_shape) != 4 \
            or not 0 < channels <= feature_shape[0] * feature_shape[3] or weights.shape[0] > out_channels:
        return None
    planes_shape = (channels, geometry.padded_h, geometry.padded_w)
    if not mac.operands_fit(planes_shape, weights, geometry):
        return None
    kernels, out_shape = weights.shape[0], (out_channels, geometry.out_h, geometry.out_w)
    matrices = mac._widened(weights, geometry.groups)
    if feature_shape[3] == depthwise_fp16.LANES and weights.shape[1] == 1 and geometry.groups == kernels:
        fetch, convolve = None, _depthwise(matrices.reshape(weights.shape), geometry, pad_value, feature_shape)
    elif mac._use_direct(weights, geometry, "auto") and pointwise_fp16.takes(feature_shape, channels, weights.shape,
                                                                               geometry):
        fetch, convolve = None, _pointwise(matrices.reshape(kernels, -1), channels, geometry)
    elif mac._use_direct(weights, geometry, "auto"):
        fetch, direct = _fetcher(feature_shape, channels, geometry, pad_value), matrices.reshape(weights.shape)
        arguments = (geometry.groups, geometry.stride_y, geometry.stride_x, geometry.dilation_y, geometry.dilation_x)

        def convolve(padded: np.ndarray, acc: np.ndarray) -> None:
            mac._conv_direct_float(padded, direct, *arguments, acc.reshape(kernels, geometry.out_h, geometry.out_w))
    else:
        # a group's lanes past ``channels`` fetched too where the atoms hold them: whole atoms widen in
        # registers (fetch_fp16), a few lanes by the table loop (~2x slower for 3 of 8, the image input)
        fetched = min(-(-channels // depthwise_fp16.LANES) * depthwise_fp16.LANES, feature_shape[0] * feature_shape[3]) \
            if feature_shape[3] == depthwise_fp16.LANES else channels
        fetch, products = _fetcher(feature_shape, fetched, geometry, pad_value), _gemm(matrices, geometry, planes_shape)

        def convolve(padded: np.ndarray, acc: np.ndarray) -> None:
            products(padded[:channels], acc)  # (the first planes: C-contiguous)
    result = _scratch((("fp16 conv result", out_shape, np.float32),))

    def run(feature: np.ndarray) -> np.ndarray:
        out = result()[0]
        acc = out.reshape(out_channels, -1)
        if feature.shape != feature_shape or feature.dtype != np.float16 or not feature.flags.c_contiguous:
            padded = mac.fetch_padded_input(feature, channels, geometry, pad_value)  # (its checks and errors)
            acc[:kernels] = mac.conv2d_fp16(padded, weights, geometry).reshape(kernels, -1)
        else:  # (the depthwise kernel reads the atoms themselves)
            convolve(feature if fetch is None else fetch(feature), acc[:kernels])
        if kernels < out_channels:
            acc[kernels:] = 0
        return out

    return run


def _depthwise(matrices: np.ndarray, geometry: mac.ConvGeometry, pad_value: float, feature_shape: tuple):
    """``convolve(feature, acc)``: ``depthwise_fp16.depthwise_fp16_atoms`` of the atoms into ``acc``
    [K][OH * OW], its lane weights made once (NUMERICS.md 36); ``depthwise_fp16_rows`` (the same bits)
    where the CPU widens halves itself (NUMERICS.md 49)."""
    if depthwise_fp16_rows.available():
        return _depthwise_rows(matrices, geometry, pad_value, feature_shape)
    tiles = depthwise_fp16.lane_tiles(matrices, geometry)
    phase_rows, pitch, length = depthwise_fp16.phase_layout(geometry)
    lanes = depthwise_fp16.LANES
    sizes = (geometry.stride_y * geometry.stride_x * phase_rows * pitch * lanes, pitch * 2, length * lanes)
    buffers = _scratch((("fp16 depthwise phases", (sizes[0],), np.float32),
                        ("fp16 depthwise pixels", (pitch, 2), np.uint64),
                        ("fp16 depthwise line", (sizes[2],), np.float32)))

    def convolve(feature: np.ndarray, acc: np.ndarray) -> None:
        phases, gathered, line = buffers()
        depthwise_fp16.depthwise_fp16_atoms(feature.view(np.uint16), tiles, geometry, pad_value,
                                            acc.reshape(acc.shape[0], geometry.out_h, geometry.out_w), phases,
                                            gathered, line)

    return convolve


def _depthwise_rows(matrices: np.ndarray, geometry: mac.ConvGeometry, pad_value: float, feature_shape: tuple):
    """``convolve(feature, acc)``: ``depthwise_fp16_rows.depthwise_fp16_rows`` of the atoms into ``acc``
    (C-contiguous: the plan's result rows), prepared once."""
    weights = depthwise_fp16_rows.lane_weights(matrices)
    sizes = depthwise_fp16_rows.scratch_sizes(geometry)
    kernel = depthwise_fp16_rows.prepare(geometry, pad_value, feature_shape[1], feature_shape[2])
    buffers = _scratch((("fp16 depthwise rows", (sizes[0],), np.float32),
                        ("fp16 depthwise row", (sizes[1],), np.float32)))
    shape = (geometry.out_h, geometry.out_w)

    def convolve(feature: np.ndarray, acc: np.ndarray) -> None:
        rows, line = buffers()
        kernel(feature.view(np.uint16), weights, acc.reshape((acc.shape[0],) + shape), rows, line)

    return convolve


def _pointwise(matrices: np.ndarray, channels: int, geometry: mac.ConvGeometry):
    """``convolve(feature, acc)``: ``pointwise_fp16.pointwise_fp16_atoms`` of the atoms into ``acc``
    [K][OH * OW] (the direct loop's order, no fetch into planes)."""
    def convolve(feature: np.ndarray, acc: np.ndarray) -> None:
        pointwise_fp16.pointwise_fp16_atoms(feature.view(np.uint16), matrices, channels,
                                            acc.reshape(acc.shape[0], geometry.out_h, geometry.out_w))

    return convolve


def _fetcher(feature_shape: tuple, channels: int, geometry: mac.ConvGeometry, pad_value: float):
    """``fetch(feature) -> padded``: ``mac.fetch_padded_input`` of C-contiguous float16 atoms of
    ``feature_shape``, into the thread's working buffer (every element written: the border and
    the reach past the input get the pad value, ``mac._pad_border``); whole atoms transposed in
    registers (``fetch_fp16``, the same bits)."""
    shape = (channels, geometry.padded_h, geometry.padded_w)
    table = widening_table()
    top, left, pad_bits = geometry.pad_top, geometry.pad_left, np.float32(pad_value).view(np.uint32)
    planes = _scratch((("fp16 conv planes", shape, np.float32),))

    def fetch(feature: np.ndarray) -> np.ndarray:
        padded = planes()[0]
        fetch_fp16.fetch_padded_half(feature.view(np.uint16), channels, top, left, pad_bits, padded.view(np.uint32),
                                     table)
        return padded

    return fetch


def _gemm(matrices: np.ndarray, geometry: mac.ConvGeometry, planes_shape: tuple):
    """``convolve(padded, acc)``: ``mac.gemm_products`` into ``acc`` [kernels][OH * OW], the packed
    weights and the layout (tap offsets, buffer shapes) worked out once (``mac.gemm_layout``)."""
    layout = mac.gemm_layout(matrices, geometry, planes_shape)
    packed = mac._PACKED(matrices, layout.narrow)
    named = (("fp16 conv columns", layout.columns), ("fp16 conv wide results", layout.wide),
             ("fp16 conv phases", None if layout.phases is None else (layout.phases,)))
    kept = tuple(shape is not None for _, shape in named)
    buffers = _scratch(tuple((name, shape, np.float32) for name, shape in named if shape is not None))

    def convolve(padded: np.ndarray, acc: np.ndarray) -> None:
        held = iter(buffers())
        columns, wide, phases = (next(held) if keep else None for keep in kept)
        mac.gemm_products(padded, geometry, packed, layout, acc, columns, wide, phases)

    return convolve


#: a task whose working arrays take at most this many bytes keeps arrays of its own from run to run
#: (no look-up of the thread's buffers: ~1 us each; ppocr_cls' tasks are mostly this small)
_OWN_BYTES = 1 << 16


def _scratch(specs: tuple[tuple[str, tuple, type], ...]):
    """``get() -> arrays`` of ``specs`` (name, shape, dtype): the plan's own arrays for a small task,
    otherwise the thread's working buffers of those names (``conv_pixels.working_buffer``) each run.
    Either way their contents never outlive a run (the module docstring)."""
    sizes = [int(np.prod(shape)) for _, shape, _ in specs]
    if sum(size * np.dtype(dtype).itemsize for size, (_, _, dtype) in zip(sizes, specs)) <= _OWN_BYTES:
        own = tuple(np.empty(shape, dtype) for _, shape, dtype in specs)
        return lambda: own

    def get() -> tuple[np.ndarray, ...]:
        return tuple(working_buffer(name, size, dtype).reshape(shape)
                     for size, (name, shape, dtype) in zip(sizes, specs))

    return get
