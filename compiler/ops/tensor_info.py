"""Ops about a tensor's shape and type, and inference no-ops: Shape, Size, Cast,
ConstantOfShape, Range, Expand, Tile, Identity, Dropout.

Shape and Size fold as soon as the input shape is known (always, once dynamic dims are
fixed); ConstantOfShape and Range must fold to constants; Tile and Expand (canonical attribute
``shape``, the broadcast output shape) may stay; Identity and Dropout are removed by the
import clean-up.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .base import Canonical, NodeView, TensorInfo, Unsupported, int_list, register, same_as_input


def _canonical_shape(view: NodeView) -> Canonical:
    rank = view.rank(0)
    start, end = int(view.attr("start", 0)), int(view.attr("end", rank))
    # Python slicing clamps exactly as ONNX Shape-15 does; normalize for a readable IR
    start, end, _ = slice(start, end).indices(rank)
    return Canonical({"start": start, "end": max(start, end)}, [view.input_names[0]])


def _infer_shape(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of((attrs["end"] - attrs["start"],), np.int64)]


@register("Shape", infer=_infer_shape, canonicalize=_canonical_shape, fold_only=True, folds_from_shape=True)
def shape(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.array(x[0].shape[attrs["start"]:attrs["end"]], dtype=np.int64)


@register("Size", infer=lambda attrs, inputs: [TensorInfo.of((), np.int64)], fold_only=True, folds_from_shape=True)
def size(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.array(x[0].size, dtype=np.int64)


_NUMPY_TYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64",
                # ml_dtypes' types (onnx maps BFLOAT16/INT4/UINT4 to them): host tensors only, one
                # element per 2/1/1 bytes, never quantized (their numpy kind is not "f")
                "bfloat16", "int4", "uint4"}


def numpy_dtype(onnx_type: int) -> str:
    """numpy name of an ONNX element type; the float8/float4/int2 families and strings are
    not supported (no NPU precision and no runtime tensor type)."""
    try:
        name = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type)).name
    except (KeyError, TypeError, ValueError):
        name = ""
    if name not in _NUMPY_TYPES:
        raise Unsupported(f"element type {onnx.TensorProto.DataType.Name(onnx_type)}")
    return name


def _canonical_cast(view: NodeView) -> Canonical:
    return Canonical({"to": numpy_dtype(int(view.attr("to")))}, [view.input_names[0]])


def _infer_cast(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(inputs[0].shape, attrs["to"])]


def _same_type(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return inputs[0].dtype == outputs[0].dtype


@register("Cast", infer=_infer_cast, canonicalize=_canonical_cast, is_noop=_same_type)
def cast(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return x[0].astype(attrs["to"])


def _canonical_constant_of_shape(view: NodeView) -> Canonical:
    value = view.attr("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    attrs = {"shape": int_list(view.require_const(0, "shape")), "value": fill[0].item(), "dtype": fill.dtype.name}
    return Canonical(attrs, [])


@register("ConstantOfShape", infer=lambda attrs, inputs: [TensorInfo.of(attrs["shape"], attrs["dtype"])],
          canonicalize=_canonical_constant_of_shape, fold_only=True)
def constant_of_shape(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.full(attrs["shape"], attrs["value"], dtype=attrs["dtype"])


def _canonical_range(view: NodeView) -> Canonical:
    start, limit, delta = (view.require_const(i, name) for i, name in enumerate(("start", "limit", "delta")))
    count = max(int(np.ceil((limit - start) / delta)), 0)
    return Canonical({"start": start.item(), "delta": delta.item(), "count": count, "dtype": start.dtype.name}, [])


@register("Range", infer=lambda attrs, inputs: [TensorInfo.of((attrs["count"],), attrs["dtype"])],
          canonicalize=_canonical_range, fold_only=True)
def range_(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    dtype = np.dtype(attrs["dtype"])
    return (dtype.type(attrs["start"]) + np.arange(attrs["count"], dtype=dtype) * dtype.type(attrs["delta"])).astype(dtype)


def _canonical_expand(view: NodeView) -> Canonical:
    target = int_list(view.require_const(1, "shape"))
    return Canonical({"shape": list(np.broadcast_shapes(view.info(0).shape, tuple(target)))}, [view.input_names[0]])


def _same_shape(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return inputs[0].shape == outputs[0].shape


@register("Expand", infer=lambda attrs, inputs: [TensorInfo.of(attrs["shape"], inputs[0].dtype)],
          canonicalize=_canonical_expand, is_noop=_same_shape)
def expand(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.broadcast_to(x[0], attrs["shape"]).copy()


def _canonical_tile(view: NodeView) -> Canonical:
    return Canonical({"repeats": int_list(view.require_const(1, "repeats"))}, [view.input_names[0]])


@register("Tile", infer=lambda attrs, inputs: [TensorInfo.of(
    [d * r for d, r in zip(inputs[0].shape, attrs["repeats"])], inputs[0].dtype)],
    canonicalize=_canonical_tile)
def tile(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.tile(x[0], attrs["repeats"])


def _always(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return True


def _canonical_dropout(view: NodeView) -> Canonical:
    """Inference Dropout: the input, and (attribute ``mask``) an all-true mask when it is used."""
    training = view.const(2) if view.opset >= 12 and view.has_input(2) else np.array(False)
    if training is None or bool(training.reshape(())):
        raise Unsupported("Dropout in training mode (or not constant inference mode)")
    return Canonical({"mask": int(view.output_used(1))}, [view.input_names[0]])


def _infer_dropout(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [inputs[0]] + ([TensorInfo.of(inputs[0].shape, np.bool_)] if attrs.get("mask") else [])


def _dropout(attrs: dict[str, Any], x: list[np.ndarray]) -> list[np.ndarray]:
    return [x[0]] + ([np.ones(x[0].shape, np.bool_)] if attrs.get("mask") else [])


@register("Identity", infer=same_as_input, is_noop=_always)
def identity(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return x[0]


register("Dropout", infer=_infer_dropout, canonicalize=_canonical_dropout, is_noop=_always)(_dropout)
