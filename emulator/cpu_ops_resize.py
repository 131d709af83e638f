"""Host-side Resize (ONNX Resize-19 semantics; Upsample arrives as Resize with
``nearest_mode`` "simple"): nearest, linear and cubic (with antialias), every coordinate
transformation mode, separable one axis at a time (the ONNX n-linear / n-cubic result).

Parameters (the compiler's canonical attributes): ``mode``, ``coordinate_transformation_mode``,
``nearest_mode``, ``scales`` (per axis, as used to map coordinates), ``sizes`` (the output
shape), ``cubic_coeff_a``, ``exclude_outside``, ``antialias``; tf_crop_and_resize adds ``roi``
(starts then ends, every axis) and ``extrapolation_value`` (outputs mapped outside the input).
Source coordinates are computed in float32 as onnxruntime does, so nearest-neighbour ties
pick the same pixel; the interpolation itself is in float64. Taps outside the input take the
edge value (linear: the coordinate is clamped first), except with ``exclude_outside``, which
drops them and renormalizes the weights.
"""

from __future__ import annotations

import numpy as np

from npuemu.isa.errors import EmulationError

_F = np.float32


def _half_pixel_symmetric(x, in_size: int, out_size: int, scale):
    """half_pixel centred on the implicit ROI, with onnxruntime's mixed precision: the offset in
    float32, ``(x + 0.5) / scale - 0.5`` in float64 (double literals), the sum rounded to float32.
    Pure float32 or pure float64 pick a different nearest pixel on some sizes (tests/emulator)."""
    adjustment = _F(out_size) / (_F(scale) * _F(in_size))
    offset = _F(in_size) / _F(2) * (_F(1) - adjustment)
    return (np.float64(offset) + (x.astype(_F).astype(np.float64) + 0.5) / np.float64(_F(scale)) - 0.5).astype(_F)


#: output index -> input coordinate, per coordinate_transformation_mode (x, in, out, scale: float32);
#: align_corners divides by the output length (out - 1), as onnxruntime does (onnx's reference
#: implementation uses in * scale - 1), and one output pixel maps to 0 there and in pytorch_half_pixel
_TRANSFORMS = {
    "half_pixel": lambda x, n, m, s: (x + _F(0.5)) / s - _F(0.5),
    "pytorch_half_pixel": lambda x, n, m, s: (x + _F(0.5)) / s - _F(0.5) if m > 1 else 0 * x,
    "align_corners": lambda x, n, m, s: x * _F(n - 1) / _F(m - 1) if m > 1 else 0 * x,
    "asymmetric": lambda x, n, m, s: x / s,
    "tf_half_pixel_for_nn": lambda x, n, m, s: (x + _F(0.5)) / s,
    "half_pixel_symmetric": _half_pixel_symmetric,
}


def _crop(params: dict, axis: int, in_size: int, out_size: int) -> np.ndarray:
    """tf_crop_and_resize: outputs spread over the ROI [start, end] (fractions of in - 1)."""
    rank = len(params["sizes"])
    start, end = (float(params["roi"][axis]), float(params["roi"][rank + axis]))
    span = (end - start) * (in_size - 1)
    if out_size == 1:
        return np.array([start * (in_size - 1) + span / 2])
    return start * (in_size - 1) + np.arange(out_size) * span / (out_size - 1)


def _coordinates(mode: str, in_size: int, out_size: int, scale: float) -> np.ndarray:
    if mode not in _TRANSFORMS:
        raise EmulationError(f"CPU step 'Resize': coordinate_transformation_mode {mode!r} is not implemented")
    return _TRANSFORMS[mode](np.arange(out_size, dtype=_F), in_size, out_size, _F(scale))


def _nearest(coordinates: np.ndarray, rounding: str, scale: float) -> np.ndarray:
    floor = np.floor(coordinates)
    if rounding == "round_prefer_floor":
        return np.where(coordinates - floor > 0.5, floor + 1, floor)
    if rounding == "round_prefer_ceil":  # onnxruntime: floor(x + 0.5f), the sum rounded to float32
        return np.floor(coordinates.astype(_F) + _F(0.5))
    if rounding == "floor":
        return floor
    if rounding == "ceil":
        return np.ceil(coordinates)
    if rounding == "simple":  # Upsample / Resize-10: truncate when upsampling, ceil when downsampling
        return np.ceil(coordinates) if scale < 1 else np.trunc(coordinates)
    raise EmulationError(f"CPU step 'Resize': nearest_mode {rounding!r} is not implemented")


def _kernel(mode: str, distance: np.ndarray, a: float) -> np.ndarray:
    """Interpolation weight at ``distance`` (input pixels): the tent for linear, Keys' cubic
    convolution kernel with coefficient ``a`` for cubic."""
    d = np.abs(distance)
    if mode == "linear":
        return np.clip(1.0 - d, 0.0, 1.0)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _taps(params: dict, in_size: int, out_size: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each (out_size, taps): the input pixels each output reads.

    Linear/cubic: with ``base = ceil(x) - 1`` and ``t = x - base`` in (0, 1], taps ``base + i``
    for i in [start, 1 - start] weigh ``kernel((i - t) * s)``, normalized: s = 1 and start 0
    (linear) or -1 (cubic); with ``antialias`` when downsampling, s = scale and the kernel's
    support widens to 1/s (start = floor(-1/s) + 1, or floor(-2/s) + 1 for cubic)."""
    mode = str(params.get("mode", "nearest"))
    coordinates = params["_coordinates"]
    if mode == "nearest":
        index = _nearest(coordinates, str(params.get("nearest_mode", "round_prefer_floor")), scale)
        return np.clip(index, 0, in_size - 1).astype(np.int64)[:, None], np.ones((out_size, 1))
    if mode not in ("linear", "cubic"):
        raise EmulationError(f"CPU step 'Resize': mode {mode!r} is not implemented")
    x = coordinates.astype(np.float64)
    if mode == "linear":
        x = np.clip(x, 0, in_size - 1)  # outside: the edge pixel (what edge padding gives)
    s = min(scale, 1.0) if int(params.get("antialias", 0)) else 1.0
    reach = 1.0 if mode == "linear" else 2.0
    start = int(np.floor(-reach / s)) + 1
    offsets = np.arange(start, 2 - start)
    base = np.ceil(x) - 1
    index = base.astype(np.int64)[:, None] + offsets[None, :]
    weights = _kernel(mode, (offsets[None, :] - (x - base)[:, None]) * s, float(params.get("cubic_coeff_a", -0.75)))
    if int(params.get("exclude_outside", 0)):
        weights = np.where((index >= 0) & (index < in_size), weights, 0.0)
    weights = weights / weights.sum(axis=1, keepdims=True)
    return np.clip(index, 0, in_size - 1), weights


def resize(inputs: list, params: dict) -> list[np.ndarray]:
    data = inputs[0]
    if not params.get("sizes") and not params.get("scales"):
        raise EmulationError("CPU step 'Resize': neither scales nor sizes in params")
    sizes = [int(v) for v in params.get("sizes") or
             [np.floor(size * np.float32(scale)) for size, scale in zip(data.shape, params["scales"])]]
    scales = [float(v) for v in params.get("scales") or [out / size for out, size in zip(sizes, data.shape)]]
    if len(sizes) != data.ndim or len(scales) != data.ndim:
        raise EmulationError(f"CPU step 'Resize': {len(sizes)} sizes / {len(scales)} scales for a rank-{data.ndim} input")
    transform = str(params.get("coordinate_transformation_mode", "half_pixel"))
    crop = transform == "tf_crop_and_resize"
    if list(data.shape) == sizes and not crop:
        return [data]  # the shape does not change: a copy, whatever the scales (as onnxruntime)
    result = data
    for axis, (out_size, scale) in enumerate(zip(sizes, scales)):
        if out_size == result.shape[axis] and scale == 1.0 and not crop:
            continue
        in_size = result.shape[axis]
        coordinates = _crop(params, axis, in_size, out_size).astype(_F) if crop else \
            _coordinates(transform, in_size, out_size, scale)
        index, weights = _taps(params | {"_coordinates": coordinates}, in_size, out_size, scale)
        gathered = np.take(result, index.reshape(-1), axis=axis)
        shape = list(result.shape)
        shape[axis:axis + 1] = [out_size, index.shape[1]]
        gathered = gathered.reshape(shape)
        view = [1] * gathered.ndim
        view[axis:axis + 2] = list(weights.shape)
        result = (gathered * weights.reshape(view)).sum(axis=axis + 1)
        if crop:  # outside the input: the extrapolation value
            outside = (coordinates < 0) | (coordinates > in_size - 1)
            result = np.where(outside.reshape([-1 if a == axis else 1 for a in range(result.ndim)]),
                              float(params.get("extrapolation_value", 0.0)), result)
    return [result]
