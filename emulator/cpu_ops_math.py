"""Host-side element-wise math, comparison, logic and selection ops (ONNX semantics, numpy
broadcasting = ONNX multidirectional broadcasting). Float inputs arrive as float64, integer
and bool ones in their own type (cpu_ops.run_step); the result is stored in the output
tensor's type."""

from __future__ import annotations

import ml_dtypes  # noqa: F401 - registers bfloat16, int4 and uint4 with numpy
import numpy as np


def _float(value) -> float:
    return float(value)  # params may carry "inf"/"-inf"/"nan" strings (JSON has no non-finite numbers)


def unary(function):
    def run(inputs: list, params: dict) -> list[np.ndarray]:
        return [function(inputs[0])]
    return run


def binary(function):
    def run(inputs: list, params: dict) -> list[np.ndarray]:
        return [function(inputs[0], inputs[1])]
    return run


def variadic(function):
    """Max/Min/Sum of any number of operands."""
    def run(inputs: list, params: dict) -> list[np.ndarray]:
        result = inputs[0]
        for operand in inputs[1:]:
            result = function(result, operand)
        return [result]
    return run


def _reciprocal(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return 1.0 / x


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


def _round(x: np.ndarray) -> np.ndarray:
    return np.round(x)  # ONNX Round: half to even, as numpy


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":  # integer Div truncates toward zero (C semantics)
        quotient = np.abs(a.astype(np.int64)) // np.maximum(np.abs(b.astype(np.int64)), 1)
        return np.where((a < 0) != (b < 0), -quotient, quotient)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(a, b)


def _where(inputs: list, params: dict) -> list[np.ndarray]:
    return [np.where(inputs[0].astype(bool), inputs[1], inputs[2])]


def _cast(inputs: list, params: dict) -> list[np.ndarray]:
    target = np.dtype(str(params["to"]))
    x = inputs[0]
    if target == np.bool_:
        return [x != 0]
    if target.kind in "iu" and x.dtype.kind == "f":  # float -> int: truncate toward zero
        with np.errstate(invalid="ignore"):
            return [np.trunc(x).astype(target)]
    return [x.astype(target)]


def _clip(inputs: list, params: dict) -> list[np.ndarray]:
    x = inputs[0]
    low, high = _float(params.get("min", "-inf")), _float(params.get("max", "inf"))
    bounds = [*inputs[1:], None, None]  # Clip-11+ min/max operands (when not folded into attributes)
    low = low if bounds[0] is None else float(np.asarray(bounds[0]).reshape(-1)[0])
    high = high if bounds[1] is None else float(np.asarray(bounds[1]).reshape(-1)[0])
    return [np.minimum(np.maximum(x, low), high)]


def _leaky_relu(inputs: list, params: dict) -> list[np.ndarray]:
    x = inputs[0]
    return [np.where(x >= 0, x, _float(params.get("alpha", 0.01)) * x)]


def _prelu(inputs: list, params: dict) -> list[np.ndarray]:
    x, slope = inputs[0], inputs[1]
    return [np.where(x >= 0, x, slope * x)]


def _batch_norm(inputs: list, params: dict) -> list[np.ndarray]:
    """Inference BatchNormalization: per channel (axis 1) (x - mean) / sqrt(var + eps) * scale + B."""
    x, scale, bias, mean, variance = inputs[:5]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    epsilon = _float(params.get("epsilon", 1e-5))
    normalized = (x - mean.reshape(shape)) / np.sqrt(variance.reshape(shape) + epsilon)
    return [normalized * scale.reshape(shape) + bias.reshape(shape)]


def _rsqrt(inputs: list, params: dict) -> list[np.ndarray]:
    """The compiler's composite Rsqrt (compiler/lower/lut_rsqrt.py, LOWERING.md 24): beta 0 is
    max(x, alpha) ** -1/2; beta > 0 a piece, sqrt(beta / clamp(x, alpha, beta))."""
    alpha = _float(params.get("alpha", 2.0 ** -100))
    beta = _float(params.get("beta", 0.0))
    if beta > 0:
        return [np.sqrt(beta / np.clip(inputs[0], alpha, beta))]
    return [1.0 / np.sqrt(np.maximum(inputs[0], alpha))]


MATH_OPS = {
    "Abs": unary(np.abs), "Neg": unary(np.negative), "Floor": unary(np.floor), "Ceil": unary(np.ceil),
    "Round": unary(_round), "Reciprocal": unary(_reciprocal), "Log": unary(_log), "Sign": unary(np.sign),
    "Not": unary(np.logical_not),
    "Equal": binary(np.equal), "Less": binary(np.less), "Greater": binary(np.greater),
    "LessOrEqual": binary(np.less_equal), "GreaterOrEqual": binary(np.greater_equal),
    "And": binary(np.logical_and), "Or": binary(np.logical_or), "Xor": binary(np.logical_xor),
    "Where": _where, "Cast": _cast, "Clip": _clip, "LeakyRelu": _leaky_relu, "PRelu": _prelu,
    "Div": binary(_divide), "Max": variadic(np.maximum), "Min": variadic(np.minimum),
    "BatchNormalization": _batch_norm, "Rsqrt": _rsqrt,
}
