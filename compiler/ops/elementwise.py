"""Broadcasting arithmetic and unary math: Add, Sub, Mul, Div, Pow, Sqrt, Exp, Erf, and the
comparison, logic and selection ops (folded at import when constant, else CPU steps)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .base import TensorInfo, as_float, broadcast_infer, like, register, same_as_input

_erf = np.frompyfunc(math.erf, 1, 1)  # numpy has no erf; math.erf is correctly rounded in float64


def _is_int(array: np.ndarray) -> bool:
    return np.issubdtype(array.dtype, np.integer)


@register("Add", infer=broadcast_infer)
def add(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return x[0] + x[1]


@register("Sub", infer=broadcast_infer)
def sub(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return x[0] - x[1]


@register("Mul", infer=broadcast_infer)
def mul(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return x[0] * x[1]


@register("Div", infer=broadcast_infer)
def div(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    a, b = x
    if _is_int(a):  # ONNX integer division truncates toward zero, numpy's // floors
        return (np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))).astype(a.dtype)
    return a / b


@register("Pow", infer=broadcast_infer)
def power(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    base, exponent = x
    if _is_int(base):
        return np.power(base, exponent.astype(base.dtype))
    return like(np.power(as_float(base), as_float(exponent)), base)


@register("Sqrt", infer=same_as_input)
def sqrt(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.sqrt(x[0])


@register("Exp", infer=same_as_input)
def exp(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return like(np.exp(as_float(x[0])), x[0])


@register("Erf", infer=same_as_input)
def erf(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return erf_array(x[0])


def erf_array(x: np.ndarray) -> np.ndarray:
    return like(_erf(as_float(x)).astype(np.float64), x)


# ---- unary math, comparison, logic, Min/Max, Where: folded when constant, else host steps (emulator/cpu_ops_math.py) -------------------

def _bool_infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(broadcast_infer(attrs, inputs)[0].shape, np.bool_)]


_UNARY = {"Neg": np.negative, "Abs": np.abs, "Floor": np.floor, "Ceil": np.ceil, "Not": np.logical_not,
          "Reciprocal": np.reciprocal, "Log": np.log, "Round": np.round, "Sign": np.sign}
_COMPARE = {"Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
            "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}


def _register_unary(op_type: str, function: Any) -> None:
    register(op_type, infer=same_as_input)(lambda attrs, x: function(x[0]))


def _register_compare(op_type: str, function: Any) -> None:
    register(op_type, infer=_bool_infer)(lambda attrs, x: function(x[0], x[1]))


for _name, _function in _UNARY.items():
    _register_unary(_name, _function)
for _name, _function in _COMPARE.items():
    _register_compare(_name, _function)


def _register_variadic(op_type: str, function: Any) -> None:
    register(op_type, infer=broadcast_infer)(lambda attrs, x: function.reduce(np.broadcast_arrays(*x)))


_register_variadic("Min", np.minimum)
_register_variadic("Max", np.maximum)


def _where_infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(broadcast_infer(attrs, inputs)[0].shape, inputs[1].dtype)]


@register("Where", infer=_where_infer)
def where(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.where(x[0], x[1], x[2])
