"""Activations: Relu, Clip, LeakyRelu, PRelu, Sigmoid, Tanh, Elu, HardSigmoid, HardSwish,
Softplus, Gelu. Each is also what a fused activation part of a Conv/MatMul node computes."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Canonical, NodeView, TensorInfo, as_float, like, register, same_as_input
from .elementwise import erf_array

_FLOAT32_MAX = float(np.finfo(np.float32).max)


@register("Relu", infer=same_as_input)
def relu(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.maximum(x[0], np.zeros((), x[0].dtype))


def _clip_bound(view: NodeView, index: int, name: str, default: float) -> float:
    if view.opset < 11:  # Clip-6 has attributes, Clip-11 and later take inputs
        return float(view.attr(name, default))
    if not view.has_input(index):
        return default
    return float(view.require_const(index, name).reshape(()))


def _canonical_clip(view: NodeView) -> Canonical:
    low = _clip_bound(view, 1, "min", -_FLOAT32_MAX if view.opset < 11 else -np.inf)
    high = _clip_bound(view, 2, "max", _FLOAT32_MAX if view.opset < 11 else np.inf)
    return Canonical({"min": low, "max": high}, [view.input_names[0]])


@register("Clip", infer=same_as_input, canonicalize=_canonical_clip)
def clip(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    low, high = attrs["min"], attrs["max"]
    if np.issubdtype(x[0].dtype, np.integer):
        info = np.iinfo(x[0].dtype)
        low, high = max(low, info.min), min(high, info.max)
    # ONNX: min then max, so max wins when min > max (the second in the first's buffer)
    result = np.maximum(x[0], x[0].dtype.type(low))
    return np.minimum(result, x[0].dtype.type(high), out=result)


def _with_defaults(**defaults: Any):
    def canonicalize(view: NodeView) -> Canonical:
        attrs = {key: type(value)(view.attr(key, value)) for key, value in defaults.items()}
        return Canonical(attrs, [name for name in view.input_names if name])
    return canonicalize


@register("LeakyRelu", infer=same_as_input, canonicalize=_with_defaults(alpha=0.01))
def leaky_relu(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.where(x[0] < 0, x[0] * x[0].dtype.type(attrs["alpha"]), x[0])


def _prelu_infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [inputs[0]]  # slope broadcasts unidirectionally to X


@register("PRelu", infer=_prelu_infer)
def prelu(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data, slope = x
    return np.where(data < 0, data * slope.astype(data.dtype), data)


@register("Sigmoid", infer=same_as_input)
def sigmoid(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    value = as_float(x[0])
    # two branches so exp never overflows: 1 / (1 + exp(-|v|)) where v >= 0, else 1 minus that;
    # the same operations in one buffer (calibration runs every activation of every sample)
    result = np.abs(value)
    np.negative(result, out=result)
    np.exp(result, out=result)
    np.add(result, 1.0, out=result)
    np.divide(1.0, result, out=result)
    np.subtract(1.0, result, out=result, where=~(value >= 0))
    return like(result, x[0])


@register("Tanh", infer=same_as_input)
def tanh(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return like(np.tanh(as_float(x[0])), x[0])


@register("Elu", infer=same_as_input, canonicalize=_with_defaults(alpha=1.0))
def elu(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    value = as_float(x[0])
    return like(np.where(value < 0, attrs["alpha"] * np.expm1(np.minimum(value, 0)), value), x[0])


@register("HardSigmoid", infer=same_as_input, canonicalize=_with_defaults(alpha=0.2, beta=0.5))
def hard_sigmoid(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return like(np.clip(attrs["alpha"] * as_float(x[0]) + attrs["beta"], 0.0, 1.0), x[0])


@register("HardSwish", infer=same_as_input)
def hard_swish(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    value = as_float(x[0])
    gate = np.divide(value, 6.0)  # value * clip(value / 6 + 0.5, 0, 1), in one buffer
    np.add(gate, 0.5, out=gate)
    np.clip(gate, 0.0, 1.0, out=gate)
    np.multiply(gate, value, out=gate)
    return like(gate, x[0])


@register("Softplus", infer=same_as_input)
def softplus(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return like(np.logaddexp(0.0, as_float(x[0])), x[0])


@register("Gelu", infer=same_as_input, canonicalize=_with_defaults(approximate="none"))
def gelu(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    value = as_float(x[0])
    if attrs["approximate"] == "tanh":
        inner = np.sqrt(2.0 / np.pi) * (value + 0.044715 * value**3)
        return like(0.5 * value * (1.0 + np.tanh(inner)), x[0])
    return like(0.5 * value * (1.0 + as_float(erf_array(value / np.sqrt(2.0)))), x[0])
