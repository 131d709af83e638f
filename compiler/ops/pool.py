"""MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.

Canonical attributes of the windowed pools: ``kernel_shape``, ``strides``, ``dilations``,
explicit ``pads``, ``ceil_mode``; AveragePool adds ``count_include_pad``; a MaxPool whose
Indices output is used adds ``indices`` and ``storage_order``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Canonical, NodeView, TensorInfo, as_float, like, register, resolve_pads
from .conv import check_output_sizes, check_pads, spatial_params, window_extent, windows


def pool_out_size(size: int, kernel: int, stride: int, dilation: int, begin: int, end: int, ceil_mode: bool) -> int:
    span = size + begin + end - window_extent(kernel, dilation)
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    # ceil mode: the last window must start inside the input or its leading pad
    if ceil_mode and (out - 1) * stride >= size + begin:
        out -= 1
    return out


def _out_sizes(attrs: dict[str, Any], in_sizes: tuple[int, ...]) -> list[int]:
    rank = len(in_sizes)
    pads = attrs["pads"]
    return [pool_out_size(in_sizes[i], attrs["kernel_shape"][i], attrs["strides"][i], attrs["dilations"][i],
                          pads[i], pads[rank + i], bool(attrs["ceil_mode"])) for i in range(rank)]


def _canonical_pool(view: NodeView) -> Canonical:
    if view.attr("kernel_shape") is None:
        raise view.fail("attribute kernel_shape is required")
    params = spatial_params(view, [])
    x = view.info(0)
    if len(params.kernel) != len(x.shape) - 2:
        raise view.fail(f"attribute kernel_shape {params.kernel} has {len(params.kernel)} value(s); the input "
                        f"{list(x.shape)} has {len(x.shape) - 2} spatial axes")
    pads = resolve_pads(view.attr("auto_pad", "NOTSET"), x.shape[2:], params, view.attr("pads"))
    pads = check_pads(view, pads, len(params.kernel))
    attrs: dict[str, Any] = {"kernel_shape": params.kernel, "strides": params.strides, "pads": pads,
                             "dilations": params.dilations, "ceil_mode": int(view.attr("ceil_mode", 0))}
    check_output_sizes(view, _out_sizes(attrs, x.shape[2:]), x.shape[2:],
                       f"kernel_shape {params.kernel} (dilations {params.dilations}, pads {pads})")
    if view.op_type == "AveragePool":
        attrs["count_include_pad"] = int(view.attr("count_include_pad", 0))
    if view.op_type == "MaxPool" and view.output_used(1):  # the Indices output: flat input positions
        attrs |= {"indices": 1, "storage_order": int(view.attr("storage_order", 0))}
    return Canonical(attrs, [view.input_names[0]])


def _infer_pool(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    x = inputs[0]
    shape = (*x.shape[:2], *_out_sizes(attrs, x.shape[2:]))
    return [TensorInfo.of(shape, x.dtype)] + ([TensorInfo.of(shape, np.int64)] if attrs.get("indices") else [])


def _pooling_windows(data: np.ndarray, attrs: dict[str, Any], fill: float, extra_fill: float | None = None) -> np.ndarray:
    """Windows (N, C, *out, *kernel) of ``data`` padded with ``fill``; the trailing cells that
    ceil mode reads beyond the explicit pads hold ``extra_fill`` (default ``fill``)."""
    rank = len(attrs["kernel_shape"])
    in_sizes = data.shape[2:]
    outs = _out_sizes(attrs, in_sizes)
    pads = attrs["pads"]
    extras = []
    for i in range(rank):
        needed = (outs[i] - 1) * attrs["strides"][i] + window_extent(attrs["kernel_shape"][i], attrs["dilations"][i])
        extras.append(max(0, needed - (in_sizes[i] + pads[i] + pads[rank + i])))
    padded = np.pad(data, [(0, 0), (0, 0), *zip(pads[:rank], pads[rank:])], constant_values=fill)
    padded = np.pad(padded, [(0, 0), (0, 0), *((0, extra) for extra in extras)],
                    constant_values=fill if extra_fill is None else extra_fill)
    cols = windows(padded, attrs["kernel_shape"], attrs["strides"], attrs["dilations"])
    return cols[(slice(None), slice(None), *(slice(0, out) for out in outs))]


@register("MaxPool", infer=_infer_pool, canonicalize=_canonical_pool)
def max_pool(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data = x[0]
    lowest = np.iinfo(data.dtype).min if np.issubdtype(data.dtype, np.integer) else -np.inf
    cols = _pooling_windows(data, attrs, lowest)
    rank = len(attrs["kernel_shape"])
    if not attrs.get("indices"):
        return _window_max(cols, rank)
    # Indices: the flat position (N, C, then the spatial axes row-major, or column-major with
    # storage_order 1) of each window's first maximum
    n, c, *spatial = data.shape
    order = "F" if attrs.get("storage_order") else "C"
    plane = np.arange(int(np.prod(spatial)), dtype=np.int64).reshape(spatial, order=order)
    positions = (np.arange(n * c, dtype=np.int64).reshape(n, c, *[1] * rank) * plane.size + plane)
    flat_cols = cols.reshape(*cols.shape[:-rank], -1)
    picked = flat_cols.argmax(axis=-1)[..., None]
    index_cols = _pooling_windows(positions, attrs, -1).reshape(flat_cols.shape)
    return [cols.max(axis=tuple(range(-rank, 0))), np.take_along_axis(index_cols, picked, axis=-1)[..., 0]]


def _window_max(cols: np.ndarray, rank: int) -> np.ndarray:
    """``cols.max`` over the trailing ``rank`` window axes, one np.maximum per kernel tap over
    the whole output (a reduction over a window view walks each short window on its own: 13-23
    ms a call on ResNet-50's and YOLOX's pools). The taps in row-major order with the running
    maximum first, as the reduction compares them (a tie goes to the later tap): the same element
    wins every tie, so -0.0 / +0.0 and NaNs come out as before (tests/compiler/test_float_fast_paths.py)."""
    taps = list(np.ndindex(*cols.shape[-rank:]))
    result = np.array(cols[(Ellipsis, *taps[0])])
    for tap in taps[1:]:
        np.maximum(result, cols[(Ellipsis, *tap)], out=result)
    return result


@register("AveragePool", infer=_infer_pool, canonicalize=_canonical_pool)
def average_pool(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data = as_float(x[0])
    rank = len(attrs["kernel_shape"])
    axes = tuple(range(-rank, 0))
    sums = _pooling_windows(data, attrs, 0.0).sum(axis=axes)
    # divisor: the window's cells on the input (with count_include_pad also those on the
    # explicit pads), never the cells ceil mode reads beyond the pads
    mask = np.ones((1, 1, *data.shape[2:]))
    counts = _pooling_windows(mask, attrs, float(attrs["count_include_pad"]), 0.0).sum(axis=axes)
    return like(sums / counts, x[0])


def _infer_global(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    x = inputs[0]
    return [TensorInfo.of((*x.shape[:2], *[1] * (len(x.shape) - 2)), x.dtype)]


@register("GlobalAveragePool", infer=_infer_global)
def global_average_pool(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    axes = tuple(range(2, x[0].ndim))
    return like(as_float(x[0]).mean(axis=axes, keepdims=True), x[0])


@register("GlobalMaxPool", infer=_infer_global)
def global_max_pool(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return x[0].max(axis=tuple(range(2, x[0].ndim)), keepdims=True)
