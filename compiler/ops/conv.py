"""Conv and ConvTranspose over any number of spatial axes (NCHW for the 2-D case).

Canonical attributes: ``kernel_shape``, ``strides``, ``dilations``, ``group`` and explicit
``pads`` ([begins..., ends...], resolved from ``auto_pad``); ConvTranspose adds
``output_padding`` (its ``output_shape`` attribute is resolved into pads).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .base import Canonical, NodeView, SpatialParams, TensorInfo, as_float, int_list, like, register, resolve_pads


def spatial_params(view: NodeView, kernel_default: list[int]) -> SpatialParams:
    kernel = int_list(view.attr("kernel_shape", kernel_default))
    rank = len(kernel)
    params = SpatialParams(kernel, int_list(view.attr("strides", [1] * rank)),
                           int_list(view.attr("dilations", [1] * rank)))
    for name, values in (("kernel_shape", params.kernel), ("strides", params.strides), ("dilations", params.dilations)):
        if len(values) != rank or min(values, default=1) < 1:  # a 0 stride divides by zero later
            raise view.fail(f"attribute {name} {list(values)}: expected {rank} value(s), each >= 1")
    return params


def check_pads(view: NodeView, pads: list[int], rank: int) -> list[int]:
    """Explicit pads: 2 x rank values, none negative (ONNX allows no cropping through pads)."""
    if len(pads) != 2 * rank or min(pads, default=0) < 0:
        raise view.fail(f"attribute pads {list(pads)}: expected {2 * rank} values, each >= 0")
    return pads


def check_output_sizes(view: NodeView, sizes: list[int], in_sizes, what: str) -> None:
    """Every output dimension is at least 1: a window larger than its padded input is refused here,
    by node and attribute, not later as a negative tensor shape."""
    if min(sizes, default=1) < 1:
        raise view.fail(f"{what} does not fit the input's spatial size {list(in_sizes)}: the output would be "
                        f"{list(sizes)}")


def window_extent(kernel: int, dilation: int) -> int:
    return (kernel - 1) * dilation + 1


def conv_out_size(size: int, kernel: int, stride: int, dilation: int, pad_total: int) -> int:
    return (size + pad_total - window_extent(kernel, dilation)) // stride + 1


def windows(padded: np.ndarray, kernel: list[int], strides: list[int], dilations: list[int]) -> np.ndarray:
    """View (N, C, *out, *kernel) of the sliding windows of an already padded (N, C, *spatial)."""
    axes = tuple(range(2, 2 + len(kernel)))
    extents = [window_extent(k, d) for k, d in zip(kernel, dilations)]
    view = sliding_window_view(padded, extents, axis=axes)
    picks = (slice(None), slice(None), *(slice(None, None, s) for s in strides), *(slice(None, None, d) for d in dilations))
    return view[picks]


# ---- Conv ----------------------------------------------------------------------------------

def _canonical_conv(view: NodeView) -> Canonical:
    x, w = view.info(0), view.info(1)
    params = spatial_params(view, list(w.shape[2:]))
    group = int(view.attr("group", 1))
    if group < 1 or len(x.shape) != len(w.shape) or x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise view.fail(f"input {list(x.shape)}, weight {list(w.shape)} and group {group} do not fit")
    if min(w.shape, default=0) < 1:
        raise view.fail(f"weight {list(w.shape)}: every dimension (output channels included) must be >= 1")
    rank = len(params.kernel)
    pads = check_pads(view, resolve_pads(view.attr("auto_pad", "NOTSET"), x.shape[2:], params, view.attr("pads")), rank)
    attrs = {"kernel_shape": params.kernel, "strides": params.strides, "pads": pads,
             "dilations": params.dilations, "group": group}
    sizes = [conv_out_size(x.shape[2 + i], params.kernel[i], params.strides[i], params.dilations[i],
                           pads[i] + pads[i + rank]) for i in range(min(rank, len(x.shape) - 2))]
    check_output_sizes(view, sizes, x.shape[2:], f"kernel_shape {params.kernel} (dilations {params.dilations}, "
                       f"pads {pads})")
    return Canonical(attrs, [name for name in view.input_names if name])


def _infer_conv(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    x, w = inputs[0], inputs[1]
    rank = len(attrs["kernel_shape"])
    pads = attrs["pads"]
    out = [conv_out_size(x.shape[2 + i], attrs["kernel_shape"][i], attrs["strides"][i], attrs["dilations"][i],
                         pads[i] + pads[i + rank]) for i in range(rank)]
    return [TensorInfo.of((x.shape[0], w.shape[0], *out), x.dtype)]


@register("Conv", infer=_infer_conv, canonicalize=_canonical_conv)
def conv(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """float64 sums (every float32 product is exact in float64), cast to the input's dtype.

    Calibration evaluates every conv of every sample, so each path below is the arithmetic of
    the plain formulation (einsum over gathered windows, one matmul for 1x1, a multiply-add per
    tap for depthwise) with its copies cut: the same BLAS products on the same operands in the
    same layouts, so the values are the same bits (tests/compiler/test_conv_float_paths.py)."""
    weight = np.ascontiguousarray(x[1], dtype=np.float64)
    kernel, rank, group = attrs["kernel_shape"], len(attrs["kernel_shape"]), attrs["group"]
    channels, pads = x[0].shape[1], attrs["pads"]
    bias = np.asarray(x[2], dtype=np.float64).reshape(-1) if len(x) > 2 else None
    if group == channels == weight.shape[0]:
        return _finish(_depthwise(_padded(x[0], pads, rank, np.float64), weight, attrs), bias, x[0])
    if group == 1 and all(k == 1 for k in kernel):
        data = _padded(x[0], pads, rank, np.float64)
        picked = data[(slice(None), slice(None), *(slice(None, None, s) for s in attrs["strides"]))]
        batch = data.shape[0]
        result = np.matmul(weight.reshape(weight.shape[0], channels), picked.reshape(batch, channels, -1))
        return _finish(result.reshape(batch, -1, *picked.shape[2:]), bias, x[0])
    strides, dilations = attrs["strides"], attrs["dilations"]
    sizes = [conv_out_size(n, k, s, d, pads[i] + pads[i + rank])
             for i, (n, k, s, d) in enumerate(zip(x[0].shape[2:], kernel, strides, dilations))]
    # einsum drops size-1 axes (one column or one output channel: a vector product; an output
    # axis of 1 changes its plan too), so not here
    if group == 1 and channels > 1 and weight.shape[0] > 1 and np.prod(kernel) > 1 and min(sizes) > 1:
        columns, out_sizes = _im2col(_padded(x[0], pads, rank, _exact(x[0])), kernel, strides, dilations)
        # einsum's own plan for this case (numpy 2.x bmm_einsum): (O, C * taps) @ (C * taps, N * out)
        result = np.matmul(weight.reshape(weight.shape[0], -1), columns)
        return _finish(result.reshape(weight.shape[0], x[0].shape[0], *out_sizes).swapaxes(0, 1), bias, x[0])
    padded = _padded(x[0], pads, rank, np.float64)
    batch = padded.shape[0]
    cols = windows(padded, kernel, attrs["strides"], attrs["dilations"])
    out_sizes = cols.shape[2:2 + rank]
    cols = cols.reshape(batch, group, channels // group, *out_sizes, -1)
    outputs = weight.shape[0]
    weight = weight.reshape(group, outputs // group, channels // group, -1)
    result = np.einsum("ngc...k,gock->ngo...", cols, weight, optimize=True)
    return _finish(result.reshape(batch, outputs, *out_sizes), bias, x[0])


def _exact(data: np.ndarray):
    """The dtype to gather ``data`` in: its own when its products with float64 weights (and its
    float64 cast) are exact, else float64, as before."""
    dtype = np.asarray(data).dtype
    return dtype if dtype.kind == "f" and dtype.itemsize <= 4 else np.float64


def _padded(data: np.ndarray, pads: list[int], rank: int, dtype) -> np.ndarray:
    """``data`` as ``dtype`` with its zero pads, in one copy (none when it already is)."""
    data = np.asarray(data)
    if not any(pads):
        return np.asarray(data, dtype=dtype)
    shape = (*data.shape[:2], *(n + pads[i] + pads[i + rank] for i, n in enumerate(data.shape[2:])))
    padded = np.zeros(shape, dtype=dtype)
    padded[(slice(None), slice(None), *(slice(pads[i], pads[i] + n) for i, n in enumerate(data.shape[2:])))] = data
    return padded


def _im2col(padded: np.ndarray, kernel: list[int], strides: list[int], dilations: list[int]):
    """The gathered windows as float64 (C * taps, N * out positions), C-ordered: the operand
    einsum copies ``windows(...)`` into for this product, made with one strided copy per tap
    (numpy's copy of the window view runs its inner loop over the few kernel taps)."""
    batch, channels = padded.shape[:2]
    sizes = [(padded.shape[2 + i] - window_extent(k, d)) // s + 1
             for i, (k, s, d) in enumerate(zip(kernel, strides, dilations))]
    columns = np.empty((channels, *kernel, batch, *sizes), dtype=np.float64)
    source = padded.swapaxes(0, 1)  # (C, N, *spatial)
    for tap in np.ndindex(*kernel):
        columns[(slice(None), *tap)] = source[(slice(None), slice(None), *(slice(t * d, t * d + s * (n - 1) + 1, s)
                                               for t, d, s, n in zip(tap, dilations, strides, sizes)))]
    return columns.reshape(channels * int(np.prod(kernel)), -1), sizes


def _finish(result: np.ndarray, bias: np.ndarray | None, reference: np.ndarray) -> np.ndarray:
    """(N, O, *sizes) float64 sums in any layout: the bias added in float64 and the sum cast to
    ``reference``'s dtype in one pass, into a C-ordered array (later reductions sum in memory
    order, so the layout matters too)."""
    out = np.empty(result.shape, dtype=reference.dtype)
    if bias is None:
        np.copyto(out, result, casting="unsafe")
    else:
        np.add(result, bias.reshape(-1, *[1] * (result.ndim - 2)), out=out, casting="unsafe")
    return out


def _depthwise(padded: np.ndarray, weight: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """One channel per group: a float64 multiply-add per kernel tap from a zero start (0 + -0 is
    +0), tap after tap, over blocks of channels small enough to stay in cache. With unit strides
    each tap is one run over the flattened padded plane (each output row then spans the padded
    width; the extra columns are dropped at the end) instead of a loop over short rows."""
    kernel, strides, dilations = attrs["kernel_shape"], attrs["strides"], attrs["dilations"]
    batch, channels, *spatial = padded.shape
    sizes = [(n - window_extent(k, d)) // s + 1 for n, k, s, d in zip(spatial, kernel, strides, dilations)]
    if all(s == 1 for s in strides):
        pitch = [int(np.prod(spatial[i + 1:])) for i in range(len(spatial))]  # elements per step of each axis
        length = sum((n - 1) * p for n, p in zip(sizes, pitch)) + 1  # the last output position + 1
        source = np.ascontiguousarray(padded).reshape(batch, channels, -1)
        starts = [sum(t * d * p for t, d, p in zip(tap, dilations, pitch)) for tap in np.ndindex(*kernel)]
        if length <= _CHANNELS_LAST_RATIO * channels:  # many channels over a short plane
            result = _tap_sums_channels_last(source, weight, starts, length, sizes[0] * pitch[0]).transpose(0, 2, 1)
        else:
            result = np.zeros((batch, channels, sizes[0] * pitch[0]))
            _tap_sums(source, weight, [(slice(start, start + length),) for start in starts], result[..., :length])
        planes = result.reshape(batch, channels, sizes[0], *spatial[1:])
        return planes[(Ellipsis, *(slice(n) for n in sizes[1:]))]
    taps = [tuple(slice(t * d, t * d + s * (n - 1) + 1, s) for t, d, s, n in zip(tap, dilations, strides, sizes))
            for tap in np.ndindex(*kernel)]
    result = np.zeros((batch, channels, *sizes))
    _tap_sums(padded, weight, taps, result)
    return result


def _tap_sums(source: np.ndarray, weight: np.ndarray, taps: list[tuple], result: np.ndarray) -> None:
    """``result[:, c] += source[:, c][tap] * weight[c, tap]`` for each tap in order, channel block
    by channel block (products in float64: exact for float32 and float16 sources)."""
    batch, channels = result.shape[:2]
    scales = weight.reshape(channels, -1)
    step = max(1, _BLOCK // max(1, result[0, 0].size * batch))
    scratch = np.empty((batch, min(step, channels), *result.shape[2:]))
    ones = [1] * (result.ndim - 2)
    for start in range(0, channels, step):
        block = slice(start, min(start + step, channels))
        out, product = result[:, block], scratch[:, :block.stop - block.start]
        for index, tap in enumerate(taps):
            np.multiply(source[(slice(None), block, *tap)], scales[block, index].reshape(-1, *ones), out=product)
            out += product


#: float64 elements of one depthwise channel block (result and scratch stay in L2)
_BLOCK = 16384


def _tap_sums_channels_last(source: np.ndarray, weight: np.ndarray, starts: list[int], length: int,
                            total: int) -> np.ndarray:
    """``_tap_sums`` over the flattened planes (N, C, L) with the channels as the inner axis:
    (N, total, C) sums, the first ``length`` positions computed. The same products added in the
    same tap order from the same zero start, so the same bits; numpy's inner loops then run
    over the channels instead of over short planes, 1.3-2x faster where the plane is short
    (MobileNetV2's 14x14 and 7x7 stages, PP-OCRv4 rec's 5x5 convs on 12x80), slower on large
    planes with few channels, which keep the other path (``_CHANNELS_LAST_RATIO``)."""
    batch, channels = source.shape[:2]
    src = np.ascontiguousarray(source.transpose(0, 2, 1))
    scales = np.ascontiguousarray(weight.reshape(channels, -1).T)  # (taps, C), taps row-major
    result = np.zeros((batch, total, channels))
    rows = max(1, _BLOCK * 2 // (channels * batch))  # positions per block: result and scratch in L2
    scratch = np.empty((batch, min(rows, length), channels))
    for begin in range(0, length, rows):
        end = min(begin + rows, length)
        out, product = result[:, begin:end], scratch[:, :end - begin]
        for index, start in enumerate(starts):
            np.multiply(src[:, start + begin:start + end], scales[index], out=product)
            out += product
    return result


#: flattened plane length per channel up to which the channels-last tap sums run (measured on
#: the depthwise convs of MobileNetV2 and PP-OCRv4 rec: faster up to ~15, slower from ~22)
_CHANNELS_LAST_RATIO = 16


# ---- ConvTranspose -------------------------------------------------------------------------

def _transpose_pads(view: NodeView, params: SpatialParams, in_sizes: tuple[int, ...], output_padding: list[int]) -> list[int]:
    rank = len(in_sizes)
    auto_pad = view.attr("auto_pad", "NOTSET")
    output_shape = view.attr("output_shape")
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [size * stride for size, stride in zip(in_sizes, params.strides)]
    if output_shape is None:
        return resolve_pads(auto_pad if auto_pad == "VALID" else "NOTSET", in_sizes, params, view.attr("pads"))
    output_shape = int_list(output_shape)[-rank:]
    begins, ends = [], []
    for i in range(rank):
        full = params.strides[i] * (in_sizes[i] - 1) + output_padding[i] + window_extent(params.kernel[i], params.dilations[i])
        total = full - output_shape[i]
        if total < 0 and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = 0  # onnxruntime and ONNX shape inference keep the full output then
        if total < 0:  # a larger output than the input reaches: zeros (plus bias) at the end
            begins.append(0)
            ends.append(total)
            continue
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def _canonical_conv_transpose(view: NodeView) -> Canonical:
    x, w = view.info(0), view.info(1)
    params = spatial_params(view, list(w.shape[2:]))
    group = int(view.attr("group", 1))
    if len(x.shape) != len(w.shape) or x.shape[1] != w.shape[0] or w.shape[0] % group:
        raise view.fail(f"input {list(x.shape)}, weight {list(w.shape)} and group {group} do not fit")
    rank = len(params.kernel)
    if view.attr("pads") is not None:  # computed pads may crop (output_shape), given ones may not
        check_pads(view, int_list(view.attr("pads")), rank)
    output_padding = int_list(view.attr("output_padding", [0] * rank))
    pads = _transpose_pads(view, params, x.shape[2:], output_padding)
    attrs = {"kernel_shape": params.kernel, "strides": params.strides, "pads": pads, "dilations": params.dilations,
             "group": group, "output_padding": output_padding}
    return Canonical(attrs, [name for name in view.input_names if name])


def _full_sizes(attrs: dict[str, Any], in_sizes: tuple[int, ...]) -> list[int]:
    """Output sizes before pads are cropped (output_padding included)."""
    return [attrs["strides"][i] * (size - 1) + window_extent(attrs["kernel_shape"][i], attrs["dilations"][i])
            + attrs["output_padding"][i] for i, size in enumerate(in_sizes)]


def _infer_conv_transpose(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    x, w = inputs[0], inputs[1]
    rank = len(attrs["kernel_shape"])
    pads = attrs["pads"]
    out = [full - pads[i] - pads[i + rank] for i, full in enumerate(_full_sizes(attrs, x.shape[2:]))]
    return [TensorInfo.of((x.shape[0], w.shape[1] * attrs["group"], *out), x.dtype)]


@register("ConvTranspose", infer=_infer_conv_transpose, canonicalize=_canonical_conv_transpose)
def conv_transpose(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data, weight = as_float(x[0]), as_float(x[1])
    kernel, rank, group = attrs["kernel_shape"], len(attrs["kernel_shape"]), attrs["group"]
    batch, channels, *in_sizes = data.shape
    full = _full_sizes(attrs, tuple(in_sizes))
    out_per_group = weight.shape[1]
    result = np.zeros((batch, group, out_per_group, *full))
    grouped = data.reshape(batch, group, channels // group, *in_sizes)
    weight = weight.reshape(group, channels // group, out_per_group, *kernel)
    # scatter: each kernel tap adds the input, scaled, at a strided offset of the output
    for tap in np.ndindex(*kernel):
        contribution = np.einsum("ngc...,gco->ngo...", grouped, weight[(slice(None),) * 3 + tap], optimize=True)
        target = tuple(slice(t * d, t * d + s * (size - 1) + 1, s)
                       for t, d, s, size in zip(tap, attrs["dilations"], attrs["strides"], in_sizes))
        result[(slice(None),) * 3 + target] += contribution
    pads = attrs["pads"]
    result = result.reshape(batch, -1, *full)
    if min(pads) < 0:  # negative end pads extend the output with zeros
        result = np.pad(result, [(0, 0), (0, 0), *((0, max(0, -pad)) for pad in pads[rank:])])
    crop = tuple(slice(pads[i], full[i] - pads[i + rank]) for i in range(rank))
    result = result[(slice(None), slice(None), *crop)]
    if len(x) > 2:
        result = result + as_float(x[2]).reshape(-1, *[1] * rank)
    return like(result, x[0])
