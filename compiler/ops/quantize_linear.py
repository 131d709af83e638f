"""QuantizeLinear and DequantizeLinear: the QDQ nodes of a pre-quantized model (onnxruntime's
``quantize_static`` QDQ output, PyTorch QAT exports; guide 6.4).

They never reach the NPU as themselves: a DequantizeLinear of a constant (a weight or bias)
folds at import like any all-constant node, and ``passes/fold_qdq.py`` turns every
QuantizeLinear -> DequantizeLinear pair on an activation into that tensor's int8 parameters.
The numpy semantics here are ONNX's (round half to even, saturate), what folding and the
float evaluation of a left-over pair compute. Scale and zero point must be constants: the
parameters of a pre-quantized model are fixed, and only fixed ones can become annotations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Canonical, NodeView, TensorInfo, Unsupported, normalize_axis, register
from .tensor_info import numpy_dtype

_INTEGER_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
                   "int32": (-2 ** 31, 2 ** 31 - 1)}


def _canonical(view: NodeView) -> Canonical:
    if view.attr("block_size", 0):
        raise Unsupported("blocked quantization (block_size)")
    for index, what in ((1, "scale"), (2, "zero point")):
        if view.has_input(index) and view.const(index) is None:
            raise Unsupported(f"a {what} computed at run time (a pre-quantized model's parameters are constants)")
    per_axis = np.asarray(view.const(1)).size > 1  # ONNX ignores axis for per-tensor parameters
    axis = normalize_axis(int(view.attr("axis", 1)), view.rank(0)) if per_axis else 0
    inputs = [name for name in view.input_names if name]
    attrs: dict[str, Any] = {"axis": axis}
    if view.op_type == "QuantizeLinear":
        zero = view.const(2) if view.has_input(2) else None
        declared = int(view.attr("output_dtype", 0) or 0)  # opset 21; else the zero point's type
        out_dtype = numpy_dtype(declared) if declared else zero.dtype.name if zero is not None else "uint8"
        if out_dtype not in _INTEGER_RANGES:
            raise Unsupported(f"quantization to {out_dtype}")
        attrs["to"] = out_dtype
    return Canonical(attrs, inputs)


def _broadcast(value: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A per-axis (1-D) parameter shaped to broadcast along ``axis``; scalars as they are."""
    value = np.asarray(value)
    if value.ndim == 0 or value.size == 1 and rank == 0:
        return value.reshape(())
    shape = [1] * rank
    shape[axis] = value.size
    return value.reshape(shape)


def _infer_quantize(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(inputs[0].shape, attrs["to"])]


def _infer_dequantize(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(inputs[0].shape, inputs[1].dtype)]


@register("QuantizeLinear", infer=_infer_quantize, canonicalize=_canonical)
def quantize_linear(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    rank = x[0].ndim
    scale = _broadcast(x[1], attrs["axis"], rank).astype(np.float64)
    zero = _broadcast(x[2], attrs["axis"], rank).astype(np.float64) if len(x) > 2 else 0.0
    low, high = _INTEGER_RANGES[attrs["to"]]
    values = np.rint(np.asarray(x[0], np.float64) / scale) + zero  # rint: half to even, as ONNX
    return np.clip(values, low, high).astype(attrs["to"])


@register("DequantizeLinear", infer=_infer_dequantize, canonicalize=_canonical)
def dequantize_linear(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    rank = x[0].ndim
    scale = _broadcast(x[1], attrs["axis"], rank)
    zero = _broadcast(x[2], attrs["axis"], rank).astype(np.int64) if len(x) > 2 else 0
    # float32 product of the integer difference and the scale, as onnxruntime computes it
    return ((np.asarray(x[0], np.int64) - zero).astype(np.float32) * scale.astype(np.float32)).astype(x[1].dtype)
