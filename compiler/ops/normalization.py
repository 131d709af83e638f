"""BatchNormalization (inference), LayerNormalization and Softmax."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Canonical, NodeView, TensorInfo, Unsupported, as_float, like, normalize_axis, register, same_as_input


def _canonical_batch_norm(view: NodeView) -> Canonical:
    if int(view.attr("training_mode", 0)) or any(view.output_used(i) for i in range(1, 5)):
        raise Unsupported("BatchNormalization in training mode (running statistics outputs)")
    return Canonical({"epsilon": float(view.attr("epsilon", 1e-5))}, view.input_names[:5])


def _infer_first_only(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [inputs[0]]


@register("BatchNormalization", infer=_infer_first_only, canonicalize=_canonical_batch_norm)
def batch_normalization(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data, scale, bias, mean, var = (as_float(value) for value in x)
    shape = (-1, *[1] * (data.ndim - 2))
    factor = scale.reshape(shape) / np.sqrt(var.reshape(shape) + attrs["epsilon"])
    return like((data - mean.reshape(shape)) * factor + bias.reshape(shape), x[0])


def _canonical_layer_norm(view: NodeView) -> Canonical:
    axis = normalize_axis(int(view.attr("axis", -1)), view.rank(0))
    # the Mean and InvStdDev outputs are made only when something reads them
    statistics = int(view.output_used(1) or view.output_used(2))
    attrs = {"axis": axis, "epsilon": float(view.attr("epsilon", 1e-5)), "statistics_outputs": statistics}
    return Canonical(attrs, [name for name in view.input_names[:3] if name])


def _infer_layer_norm(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    if not attrs["statistics_outputs"]:
        return [inputs[0]]
    x, axis = inputs[0], attrs["axis"]
    stats = TensorInfo.of((*x.shape[:axis], *[1] * (len(x.shape) - axis)), np.float32)
    return [inputs[0], stats, stats]


@register("LayerNormalization", infer=_infer_layer_norm, canonicalize=_canonical_layer_norm)
def layer_normalization(attrs: dict[str, Any], x: list[np.ndarray]) -> list[np.ndarray]:
    data = as_float(x[0])
    axes = tuple(range(attrs["axis"], data.ndim))
    mean = data.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(((data - mean) ** 2).mean(axis=axes, keepdims=True) + attrs["epsilon"])
    result = (data - mean) * inv_std * as_float(x[1])
    if len(x) > 2:
        result = result + as_float(x[2])
    outputs = [like(result, x[0])]
    if attrs["statistics_outputs"]:
        outputs += [mean.astype(np.float32), inv_std.astype(np.float32)]
    return outputs


def _canonical_softmax(view: NodeView) -> Canonical:
    rank = view.rank(0)
    axis = normalize_axis(int(view.attr("axis", 1 if view.opset < 13 else -1)), rank)
    # before opset 13 Softmax flattened the input to 2-D at `axis`; that only differs from the
    # per-axis form when axis is not the last one
    attrs = {"axis": axis, "flatten_2d": int(view.opset < 13 and axis != rank - 1)}
    return Canonical(attrs, [view.input_names[0]])


@register("Softmax", infer=same_as_input, canonicalize=_canonical_softmax)
def softmax(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data = as_float(x[0])
    axis = attrs["axis"]
    work = data.reshape(int(np.prod(data.shape[:axis])), -1) if attrs.get("flatten_2d") else data
    work_axis = 1 if attrs.get("flatten_2d") else axis
    shifted = np.exp(work - work.max(axis=work_axis, keepdims=True))
    result = shifted / shifted.sum(axis=work_axis, keepdims=True)
    return like(result.reshape(data.shape), x[0])
