"""The compiler's two roundings, defined once (QUANTIZATION.md "Rounding"; NUMERICS.md 9).

- ``round_half_away``: values the compiler computes once (weights, int32 bias, int16
  operands, zero points, LUT entries, register factors) and C's ``round()`` where ONNX asks
  for it (Resize's nearest modes, keep-aspect-ratio sizes);
- ``round_half_even``: what the NPU's OUT_CVT does with CVT_ROUND = 0 (numpy's rint).

A leaf module, so the operator library and the quantizer both import it without importing
each other.
"""

from __future__ import annotations

import numpy as np


def round_half_away(values: np.ndarray | float, out: np.ndarray | None = None) -> np.ndarray:
    """Nearest integer, ties away from zero, in float64. Exact for |x| < 2^52 except at
    x = +-(0.5 - 2^-54), where |x| + 0.5 rounds up to 1 (a float32 input is always exact).
    ``out``: a float64 array of ``values``' shape to compute in (it may be ``values``)."""
    array = np.asarray(values, dtype=np.float64)
    if out is None:
        return np.sign(array) * np.floor(np.abs(array) + 0.5)
    sign = np.sign(array)  # the same operations in place: no temporaries for large weights
    np.abs(array, out=out)
    out += 0.5
    np.floor(out, out=out)
    out *= sign
    return out


def round_half_even(values: np.ndarray | float, out: np.ndarray | None = None) -> np.ndarray:
    """Nearest integer, ties to even (numpy's rint), in float64 (in ``out`` as round_half_away)."""
    return np.rint(np.asarray(values, dtype=np.float64), out=out)
