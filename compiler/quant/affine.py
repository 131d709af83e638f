"""Affine (asymmetric linear) quantization arithmetic: parameters from a range, quantize,
dequantize, and the storage roundings the NPU applies.

``real = scale * (q - zero_point)`` with ``q`` in ``[qmin, qmax]`` (hardware.md 5, SDK guide
6.1.2). The range always contains 0, so 0 is stored exactly as ``q = zero_point``; that is
what lets the NPU pad with the zero point and what makes ReLU free (saturation at
``zero_point = -128`` after a range starting at 0).

Rounding, stated once for the compiler (QUANTIZATION.md "Rounding"; the functions live in
``compiler/rounding.py`` and are re-exported here):

- **values the NPU produces** (requantized activations) round half to even: the OUT_CVT
  converter with CVT_ROUND = 0, the mode the emulator uses by default (NUMERICS.md 1, 4.5);
- **values the compiler computes once** (weights, int32 bias, int16 operands, zero points)
  round half away from zero, as ``quant_regs`` does for the BS operands (NUMERICS.md 9).

Scales are stored as float32 (``QuantParams``), so every parameter computed here is derived
from the float32 scale: the zero point, and the bias scale ``s_in * s_w`` in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rounding import round_half_away, round_half_even

INT8 = (-128, 127)
INT16 = (-32768, 32767)
INT32 = (-(1 << 31), (1 << 31) - 1)

#: Integer range of each quantized storage type.
QRANGES = {"int8": INT8, "int16": INT16, "int32": INT32}

#: The range given to an all-zero tensor (any positive scale represents it exactly; this one
#: keeps requantization factors near 1 instead of overflowing them).
DEGENERATE_RANGE = (0.0, 1.0)


@dataclass(frozen=True)
class Range:
    """A clipping range in real units; ``lo <= 0 <= hi`` once normalized."""

    lo: float
    hi: float

    def including_zero(self) -> "Range":
        return Range(min(float(self.lo), 0.0), max(float(self.hi), 0.0))

    def union(self, other: "Range") -> "Range":
        return Range(min(self.lo, other.lo), max(self.hi, other.hi))


def affine_params(lo: float, hi: float, qrange: tuple[int, int] = INT8) -> tuple[np.float32, int]:
    """(scale, zero_point) for the clipping range [lo, hi] (extended to contain 0).

    ``s = (hi - lo) / (qmax - qmin)`` rounded to float32, then
    ``z = qmin - round_half_away(lo / s)`` clamped to [qmin, qmax] (guide formula 6-5). The
    range actually represented is ``[s (qmin - z), s (qmax - z)]``: it differs from [lo, hi]
    by less than s/2 at each end, so that 0 falls on a level.
    """
    scales, zero_points = affine_params_array(np.asarray([lo]), np.asarray([hi]), qrange)
    return scales[0], int(zero_points[0])


def affine_params_array(lo: np.ndarray, hi: np.ndarray,
                        qrange: tuple[int, int] = INT8) -> tuple[np.ndarray, np.ndarray]:
    """Vectorized :func:`affine_params` (per-channel weights): float32 scales, int32 zero points."""
    qmin, qmax = qrange
    lo = np.minimum(np.asarray(lo, dtype=np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, dtype=np.float64), 0.0)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError("quantization range must be finite")
    degenerate = (hi - lo) <= np.finfo(np.float32).tiny * (qmax - qmin)
    lo = np.where(degenerate, DEGENERATE_RANGE[0], lo)
    hi = np.where(degenerate, DEGENERATE_RANGE[1], hi)
    scale = ((hi - lo) / (qmax - qmin)).astype(np.float32)
    zero_point = qmin - round_half_away(lo / scale.astype(np.float64))
    return scale, np.clip(zero_point, qmin, qmax).astype(np.int32)


def symmetric_scale(max_abs: float, qrange: tuple[int, int] = INT16) -> np.float32:
    """Scale of a symmetric (zero point 0) quantization covering [-max_abs, max_abs]."""
    max_abs = float(max_abs)
    if not np.isfinite(max_abs):
        raise ValueError("quantization range must be finite")
    if max_abs <= 0:
        return np.float32(1.0)
    return np.float32(max_abs / qrange[1])


def _broadcast(params: np.ndarray, ndim: int, axis: int | None) -> np.ndarray:
    params = np.asarray(params, dtype=np.float64)
    if axis is None or params.ndim == 0:
        return params
    shape = [1] * ndim
    shape[axis] = params.size
    return params.reshape(shape)


#: value types ``quantize`` divides as they are: numpy converts them to float64 exactly
_EXACT_IN_FLOAT64 = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def quantize(values: np.ndarray, scale: np.ndarray | float, zero_point: np.ndarray | int,
             qrange: tuple[int, int] = INT8, axis: int | None = None, *, half_even: bool = True) -> np.ndarray:
    """Stored integers ``clamp(round(x / s) + z, qmin, qmax)`` as int64 (per-channel along
    ``axis`` when the parameters are 1-d)."""
    if not (isinstance(values, np.ndarray) and values.dtype in _EXACT_IN_FLOAT64):
        values = np.asarray(values, dtype=np.float64)
    scale = _broadcast(scale, values.ndim, axis)
    zero_point = _broadcast(zero_point, values.ndim, axis)
    scaled = np.asarray(values / scale)  # float64 (a float32 weight converts exactly)
    # Rounded in place: ResNet-50's 25M weights took 0.4 s of CPU through the temporaries,
    # 0.13 s so (issue 20; test_affine checks it equal).
    (round_half_even if half_even else round_half_away)(scaled, out=scaled)
    if np.broadcast_shapes(scaled.shape, zero_point.shape) != scaled.shape:  # only in place below
        return np.clip(scaled + zero_point, qrange[0], qrange[1]).astype(np.int64)
    scaled += zero_point
    np.clip(scaled, qrange[0], qrange[1], out=scaled)
    return scaled.astype(np.int64)


def dequantize(stored: np.ndarray, scale: np.ndarray | float, zero_point: np.ndarray | int,
               axis: int | None = None) -> np.ndarray:
    """Real values ``s * (q - z)`` (float64)."""
    stored = np.asarray(stored, dtype=np.float64)
    return _broadcast(scale, stored.ndim, axis) * (stored - _broadcast(zero_point, stored.ndim, axis))


def fake_quantize(values: np.ndarray, scale: np.ndarray | float, zero_point: np.ndarray | int,
                  qrange: tuple[int, int] = INT8, axis: int | None = None, *, half_even: bool = True) -> np.ndarray:
    """``dequantize(quantize(x))`` in float64: what the value is after being stored."""
    return dequantize(quantize(values, scale, zero_point, qrange, axis, half_even=half_even), scale, zero_point, axis)


def round_to_float16(values: np.ndarray) -> np.ndarray:
    """fp16 storage of a value the NPU computed in fp32: round to fp32, then to fp16 with
    round-to-nearest-even (NUMERICS.md 4.6, 7; overflow gives infinity); returned as float32."""
    with np.errstate(over="ignore"):
        return np.asarray(values).astype(np.float32).astype(np.float16).astype(np.float32)
