"""Resize (nearest, linear and cubic, with antialias; every ONNX coordinate mode) and the
legacy Upsample, which becomes a Resize.

Canonical attributes: ``mode`` ("nearest", "linear" or "cubic"), ``coordinate_transformation_mode``,
``nearest_mode`` (the ONNX ones plus "simple", the rule of Upsample and Resize-10: truncate
when upsampling, ceil when downsampling), ``scales`` (per axis, as used to map coordinates)
and ``sizes`` (the output shape); linear and cubic add ``cubic_coeff_a``, ``exclude_outside``
and ``antialias``; tf_crop_and_resize adds ``roi`` (starts then ends, every axis) and
``extrapolation_value``. Coordinates are computed in float32, as onnxruntime does,
so that nearest-neighbour ties pick the same pixel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..rounding import round_half_away  # C's round(): ties away from zero
from .base import Canonical, NodeView, TensorInfo, Unsupported, int_list, normalize_axis, register

_COORDINATE_MODES = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
                     "half_pixel_symmetric", "tf_crop_and_resize"}
_NEAREST_MODES = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"}
_F = np.float32


def _mode(view: NodeView) -> str:
    mode = view.attr("mode", "nearest")
    mode = "linear" if mode == "bilinear" else mode  # Upsample-7 spelling
    if mode not in ("nearest", "linear", "cubic"):
        raise Unsupported(f"{view.op_type} mode '{mode}'")
    return mode


def _output_from_sizes(view: NodeView, in_shape: tuple[int, ...], sizes: list[int], axes: list[int]) -> tuple[list[float], list[int]]:
    out = list(in_shape)
    ratios = {axis: float(_F(size) / _F(in_shape[axis])) for axis, size in zip(axes, sizes)}
    policy = view.attr("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch":
        for axis, size in zip(axes, sizes):
            out[axis] = size
    elif policy in ("not_larger", "not_smaller"):
        common = (min if policy == "not_larger" else max)(ratios.values())
        ratios = dict.fromkeys(axes, common)
        for axis in axes:
            out[axis] = int(round_half_away(np.asarray(_F(common) * _F(in_shape[axis]))))
    else:
        raise view.fail(f"keep_aspect_ratio_policy '{policy}' is not stretch, not_larger or not_smaller")
    scales = [float(_F(out[axis]) / _F(in_shape[axis])) if policy == "stretch" and axis in ratios
              else float(_F(ratios.get(axis, 1.0))) for axis in range(len(in_shape))]
    return scales, out


def _output_from_scales(in_shape: tuple[int, ...], given: list[float], axes: list[int]) -> tuple[list[float], list[int]]:
    scales = [1.0] * len(in_shape)
    for axis, scale in zip(axes, given):
        scales[axis] = float(_F(scale))
    out = [int(_F(scale) * _F(size)) for scale, size in zip(scales, in_shape)]
    return scales, out


def _canonical_resize(view: NodeView) -> Canonical:
    in_shape = view.info(0).shape
    rank = len(in_shape)
    mode = _mode(view)
    legacy = view.op_type == "Upsample" or view.opset < 11
    if legacy:
        coordinate, nearest = "asymmetric", "simple"
        scales_given = view.attr("scales") if view.op_type == "Upsample" and view.opset < 9 else view.require_const(1, "scales")
        scales, out = _output_from_scales(in_shape, [float(s) for s in np.asarray(scales_given).reshape(-1)], list(range(rank)))
    else:
        coordinate = view.attr("coordinate_transformation_mode", "half_pixel")
        nearest = view.attr("nearest_mode", "round_prefer_floor")
        if coordinate not in _COORDINATE_MODES:
            raise Unsupported(f"Resize coordinate_transformation_mode '{coordinate}'")
        if nearest not in _NEAREST_MODES:
            raise view.fail(f"nearest_mode '{nearest}' is not one of {sorted(_NEAREST_MODES)}")
        # scales/sizes follow the order of `axes`, which need not be sorted
        axes = [normalize_axis(axis, rank) for axis in int_list(view.attr("axes", range(rank)))]
        sizes = view.const(3) if view.has_input(3) else None
        given = view.const(2) if view.has_input(2) else None
        if sizes is not None and sizes.size:
            scales, out = _output_from_sizes(view, in_shape, int_list(sizes), axes)
        elif given is not None and given.size:
            scales, out = _output_from_scales(in_shape, [float(s) for s in given.reshape(-1)], axes)
        else:
            raise view.fail("needs constant scales or sizes once input shapes are fixed")
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinate, "nearest_mode": nearest,
             "scales": scales, "sizes": out}
    if coordinate == "tf_crop_and_resize":  # the crop box per axis (fractions of in - 1) and the fill outside
        roi = view.require_const(1, "roi").astype(np.float64).reshape(-1)
        starts, ends = [0.0] * rank, [1.0] * rank
        for i, axis in enumerate(axes):
            starts[axis], ends[axis] = float(roi[i]), float(roi[len(axes) + i])
        attrs |= {"roi": starts + ends, "extrapolation_value": float(view.attr("extrapolation_value", 0.0))}
    if mode != "nearest":  # the kernel's options (Resize-11+; defaults for the legacy forms)
        attrs |= {"cubic_coeff_a": float(view.attr("cubic_coeff_a", -0.75)),
                  "exclude_outside": int(view.attr("exclude_outside", 0)),
                  "antialias": int(view.attr("antialias", 0))}
    return Canonical(attrs, [view.input_names[0]], op_type="Resize")


def _infer_resize(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(attrs["sizes"], inputs[0].dtype)]


def _unchanged(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return inputs[0].shape == outputs[0].shape


def source_coordinates(mode: str, in_size: int, out_size: int, scale: float) -> np.ndarray:
    """Input coordinate of every output index along one axis (float32, unclamped)."""
    x = np.arange(out_size, dtype=_F)
    scale, half = _F(scale), _F(0.5)
    if mode == "asymmetric":
        return x / scale
    if mode == "align_corners":
        return x * _F(in_size - 1) / _F(out_size - 1) if out_size > 1 else np.zeros_like(x)
    if mode == "pytorch_half_pixel":
        return (x + half) / scale - half if out_size > 1 else np.zeros_like(x)
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / scale
    if mode == "half_pixel_symmetric":
        adjustment = _F(out_size) / (scale * _F(in_size))
        offset = _F(in_size) / _F(2) * (_F(1) - adjustment)
        # onnxruntime evaluates this one in double (its 0.5 literals are doubles), then rounds
        return (float(offset) + (x.astype(np.float64) + 0.5) / float(scale) - 0.5).astype(_F)
    return (x + half) / scale - half  # half_pixel


def nearest_indices(coordinates: np.ndarray, mode: str, in_size: int, scale: float) -> np.ndarray:
    if mode == "round_prefer_floor":
        halfway = coordinates == np.trunc(coordinates) + _F(0.5)
        index = np.where(halfway, np.floor(coordinates), round_half_away(coordinates))
    elif mode == "round_prefer_ceil":
        index = round_half_away(coordinates)
    elif mode == "floor":
        index = np.floor(coordinates)
    elif mode == "ceil":
        index = np.ceil(coordinates)
    else:  # simple
        index = np.ceil(coordinates) if scale < 1 else np.trunc(coordinates)
    return np.clip(index, 0, in_size - 1).astype(np.int64)


def _crop_coordinates(attrs: dict[str, Any], axis: int, in_size: int, out_size: int) -> np.ndarray:
    """tf_crop_and_resize: the output spans the ROI [start, end] (fractions of in - 1)."""
    rank = len(attrs["sizes"])
    start, end = attrs["roi"][axis], attrs["roi"][rank + axis]
    if out_size == 1:
        return np.full(1, (end - start) * (in_size - 1) / 2 + start * (in_size - 1))
    return start * (in_size - 1) + np.arange(out_size) * (end - start) * (in_size - 1) / (out_size - 1)


def _resize_axis(data: np.ndarray, axis: int, attrs: dict[str, Any]) -> np.ndarray:
    in_size, out_size, scale = data.shape[axis], attrs["sizes"][axis], attrs["scales"][axis]
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        coordinates = _crop_coordinates(attrs, axis, in_size, out_size)
        outside = (coordinates < 0) | (coordinates > in_size - 1)
        inner = dict(attrs, coordinate_transformation_mode="asymmetric")  # any: the coordinates are given
        result = _interpolate_axis(data, axis, coordinates.astype(_F), inner)
        shape = [1] * data.ndim
        shape[axis] = out_size
        return np.where(outside.reshape(shape), attrs["extrapolation_value"], result)
    coordinates = source_coordinates(attrs["coordinate_transformation_mode"], in_size, out_size, scale)
    return _interpolate_axis(data, axis, coordinates, attrs)


def _interpolate_axis(data: np.ndarray, axis: int, coordinates: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    in_size, out_size, scale = data.shape[axis], attrs["sizes"][axis], attrs["scales"][axis]
    if attrs["mode"] == "nearest":
        return np.take(data, nearest_indices(coordinates, attrs["nearest_mode"], in_size, scale), axis=axis)
    if attrs["mode"] == "cubic" or attrs.get("antialias") or attrs.get("exclude_outside"):
        return _filter_axis(data, axis, coordinates.astype(np.float64), attrs)
    coordinates = np.clip(coordinates, 0, in_size - 1).astype(np.float64)
    low = np.floor(coordinates).astype(np.int64)
    high = np.minimum(low + 1, in_size - 1)
    shape = [1] * data.ndim
    shape[axis] = out_size
    weight = (coordinates - low).reshape(shape)
    return np.take(data, low, axis=axis) * (1.0 - weight) + np.take(data, high, axis=axis) * weight


def _filter_coefficients(attrs: dict[str, Any], ratio: float, scale: float) -> np.ndarray:
    """ONNX Resize's coefficients for the neighbours ``floor(x) + i`` (i from ``1 - n/2``),
    ratio in (0, 1]; antialias (downsampling) stretches the kernel by 1/scale."""
    a = attrs.get("cubic_coeff_a", -0.75)
    cubic = attrs["mode"] == "cubic"
    stretch = min(scale, 1.0) if attrs.get("antialias") else 1.0
    first = int(np.floor((-2.0 if cubic else -1.0) / stretch)) + 1
    coefficients = []
    for i in range(first, 2 - first):
        d = abs((i - ratio) * stretch)
        if not cubic:
            coefficients.append(max(0.0, 1.0 - d))
        elif d <= 1:
            coefficients.append((a + 2) * d ** 3 - (a + 3) * d ** 2 + 1)
        else:
            coefficients.append(a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a if d < 2 else 0.0)
    return np.asarray(coefficients)


def _filter_axis(data: np.ndarray, axis: int, coordinates: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """Cubic, or linear with antialias / exclude_outside, along one axis: per output index, the
    coefficient-weighted neighbours (edge pixels repeat outside the input)."""
    in_size, scale = data.shape[axis], attrs["scales"][axis]
    moved = np.moveaxis(data.astype(np.float64), axis, 0)
    if attrs["mode"] == "linear":
        coordinates = np.clip(coordinates, 0, in_size - 1)
    rows = []
    for x in coordinates:
        left = int(np.ceil(x)) - 1  # ratio in (0, 1]: an integer x takes the pixel on its left as base
        coefficients = _filter_coefficients(attrs, x - left, scale)
        first = left + 1 - len(coefficients) // 2
        neighbours = np.arange(first, first + len(coefficients))
        if attrs.get("exclude_outside"):
            coefficients = np.where((neighbours >= 0) & (neighbours < in_size), coefficients, 0.0)
        coefficients = coefficients / coefficients.sum()
        rows.append(np.tensordot(coefficients, moved[np.clip(neighbours, 0, in_size - 1)], axes=1))
    return np.moveaxis(np.stack(rows), 0, axis)


@register("Resize", "Upsample", infer=_infer_resize, canonicalize=_canonical_resize, is_noop=_unchanged)
def resize(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    crop = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    if list(x[0].shape) == attrs["sizes"] and not crop:
        return x[0]  # onnxruntime copies when the shape does not change, whatever the scales
    # separable: one axis at a time gives the ONNX n-linear / nearest result
    data = x[0] if attrs["mode"] == "nearest" else x[0].astype(np.float64)
    for axis in range(data.ndim):
        if attrs["sizes"][axis] != data.shape[axis] or attrs["scales"][axis] != 1.0 or crop:
            data = _resize_axis(data, axis, attrs)
    return data.astype(x[0].dtype, copy=False)


#: the unpooling kernel fields are 3 bits wide (DPU_RDMA SRC_DMA_CFG KERNEL_WIDTH/HEIGHT hold factor - 1)
MAX_REPLICATION = 8


def replication_factors(attrs: dict[str, Any], in_shape: tuple[int, ...]) -> tuple[tuple[int, int] | None, str]:
    """((fy, fx), "") when this Resize of an [N, C, H, W] tensor is nearest-neighbour upsampling
    by whole factors in which every output pixel (y, x) copies input pixel (y // fy, x // fx) -
    what the DPU's unpooling mode computes (LOWERING.md 19); else (None, why not).

    Decided on the index map itself (``source_coordinates`` + ``nearest_indices``, the same
    float32 arithmetic as onnxruntime), so every coordinate / nearest mode that reduces to this
    gather qualifies: asymmetric + floor, half_pixel + round_prefer_floor/ceil for any factor,
    asymmetric + round_prefer_floor for factor 2, tf_half_pixel_for_nn + floor, Upsample's simple."""
    if attrs["mode"] != "nearest":
        return None, f"mode {attrs['mode']} (only nearest is a DPU unpooling; linear: passes/resize_bilinear.py)"
    sizes = list(attrs["sizes"])
    if len(in_shape) != 4 or sizes[:2] != list(in_shape[:2]):
        return None, f"resizes axes other than H and W ({list(in_shape)} -> {sizes})"
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        return None, "coordinate_transformation_mode tf_crop_and_resize"
    factors = []
    for axis in (2, 3):
        size, out = in_shape[axis], sizes[axis]
        if out % size or not 1 <= out // size <= MAX_REPLICATION:
            return None, f"output {out} is not 1..{MAX_REPLICATION} x input {size} along axis {axis}"
        coordinates = source_coordinates(attrs["coordinate_transformation_mode"], size, out, attrs["scales"][axis])
        index = nearest_indices(coordinates, attrs["nearest_mode"], size, attrs["scales"][axis])
        if not np.array_equal(index, np.arange(out) // (out // size)):
            return None, (f"{attrs['coordinate_transformation_mode']} / {attrs['nearest_mode']} does not copy "
                          f"input pixel o // {out // size} to output o along axis {axis}")
        factors.append(out // size)
    return (factors[0], factors[1]), ""
