"""ReduceMean, ReduceMax, ReduceSum (also ReduceMin, ReduceProd for folding) and ArgMax.

Canonical attributes: ``axes`` (sorted, non-negative; an empty list means no reduction, the
``noop_with_empty_axes`` case) and ``keepdims``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Canonical, NodeView, TensorInfo, as_float, int_list, like, normalize_axes, normalize_axis, register

_AXES_AS_INPUT_SINCE = {"ReduceSum": 13}  # the others switched to an axes input at opset 18


def _canonical_reduce(view: NodeView) -> Canonical:
    rank = view.rank(0)
    if view.opset >= _AXES_AS_INPUT_SINCE.get(view.op_type, 18):
        axes = int_list(view.require_const(1, "axes")) if view.has_input(1) else []
    else:
        axes = int_list(view.attr("axes", []))
    if not axes and not int(view.attr("noop_with_empty_axes", 0)):
        axes = list(range(rank))
    attrs = {"axes": normalize_axes(axes, rank), "keepdims": int(view.attr("keepdims", 1))}
    return Canonical(attrs, [view.input_names[0]])


def _reduced_shape(shape: tuple[int, ...], axes: list[int], keepdims: int) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _infer_reduce(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(_reduced_shape(inputs[0].shape, attrs["axes"], attrs["keepdims"]), inputs[0].dtype)]


def _is_noop_reduce(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return not attrs["axes"]


def _reduction(function: Any, accurate: bool):
    def compute(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
        data = as_float(x[0]) if accurate and np.issubdtype(x[0].dtype, np.floating) else x[0]
        return like(function(data, axis=tuple(attrs["axes"]), keepdims=bool(attrs["keepdims"])), x[0])
    return compute


def _extreme(function: Any, lowest: bool):
    """Max/Min with the ONNX value for an empty reduction (-inf / +inf, or the int limits)."""
    def compute(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
        data = x[0]
        if data.dtype == np.bool_:
            initial: Any = not lowest
        elif np.issubdtype(data.dtype, np.integer):
            initial = np.iinfo(data.dtype).min if lowest else np.iinfo(data.dtype).max
        else:
            initial = -np.inf if lowest else np.inf
        return function(data, axis=tuple(attrs["axes"]), keepdims=bool(attrs["keepdims"]), initial=initial)
    return compute


for _op, _compute, _fold_only in [("ReduceMean", _reduction(np.mean, True), False),
                                  ("ReduceSum", _reduction(np.sum, True), False),
                                  ("ReduceMax", _extreme(np.max, True), False),
                                  ("ReduceMin", _extreme(np.min, False), False),
                                  ("ReduceProd", _reduction(np.prod, True), False)]:
    register(_op, infer=_infer_reduce, canonicalize=_canonical_reduce, fold_only=_fold_only,
             is_noop=_is_noop_reduce)(_compute)


def _canonical_argmax(view: NodeView) -> Canonical:
    attrs = {"axis": normalize_axis(int(view.attr("axis", 0)), view.rank(0)), "keepdims": int(view.attr("keepdims", 1)),
             "select_last_index": int(view.attr("select_last_index", 0))}
    return Canonical(attrs, [view.input_names[0]])


def _infer_argmax(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(_reduced_shape(inputs[0].shape, [attrs["axis"]], attrs["keepdims"]), np.int64)]


@register("ArgMax", infer=_infer_argmax, canonicalize=_canonical_argmax)
def argmax(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data, axis = x[0], attrs["axis"]
    if attrs["select_last_index"]:
        index = data.shape[axis] - 1 - np.argmax(np.flip(data, axis=axis), axis=axis)
    else:
        index = np.argmax(data, axis=axis)
    index = index.astype(np.int64)
    return np.expand_dims(index, axis) if attrs["keepdims"] else index
