"""Ops that only graph passes create: FullyConnected, Silu, Glu.

They are registered in the op registry (``compiler/ops``) like every other op, so the float
evaluator, the IR text and the per-layer JSON handle them, but ONNX import never produces
them: they are the targets of fusions (``MatMul+Add`` / ``Reshape+Gemm`` -> FullyConnected,
``x*Sigmoid(x)`` -> Silu, ``Split+Sigmoid+Mul`` -> Glu). Importing this module registers them;
every pass module that builds such a node imports it.

- ``FullyConnected(X, W[, B])``, attribute ``axis``: X flattened at ``axis`` to rows of
  K = prod(X.shape[axis:]) features, ``W`` is [N, K] (output units first, as a conv's OI
  weight), ``B`` is [N]. Output shape ``X.shape[:axis] + (N,)``.
- ``Silu(X)``: ``x * sigmoid(x)`` (the vendor's "Silu"/"Swish" activation).
- ``Glu(X)``, attribute ``axis``: X cut into halves ``a, b`` along ``axis``; ``a * sigmoid(b)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError

from ..ops import REGISTRY
from ..ops.activation import sigmoid
from ..ops.base import TensorInfo, as_float, like, register, same_as_input

FULLY_CONNECTED, SILU, GLU = "FullyConnected", "Silu", "Glu"


def _rows_and_features(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    return int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))


def _infer_fully_connected(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    x, w = inputs[0], inputs[1]
    axis = attrs["axis"]
    if not 1 <= axis <= len(x.shape) or len(w.shape) != 2:
        raise CompileError(f"FullyConnected: axis {axis} of input {list(x.shape)} and weight {list(w.shape)} do not fit")
    if _rows_and_features(x.shape, axis)[1] != w.shape[1]:
        raise CompileError(f"FullyConnected: input {list(x.shape)} at axis {axis} has not {w.shape[1]} features")
    if len(inputs) > 2 and inputs[2].shape != (w.shape[0],):
        raise CompileError(f"FullyConnected: bias {list(inputs[2].shape)} is not [{w.shape[0]}]")
    return [TensorInfo.of((*x.shape[:axis], w.shape[0]), x.dtype)]


def fully_connected(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data, weight = as_float(x[0]), as_float(x[1])
    axis = attrs["axis"]
    rows, features = _rows_and_features(data.shape, axis)
    result = data.reshape(rows, features) @ weight.T
    if len(x) > 2:
        result = result + as_float(x[2])
    return like(result.reshape(*data.shape[:axis], weight.shape[0]), x[0])


def silu(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    value = as_float(x[0])
    return like(value * as_float(sigmoid({}, [value])), x[0])


def _infer_glu(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    shape, axis = list(inputs[0].shape), attrs["axis"]
    if not 0 <= axis < len(shape) or shape[axis] % 2:
        raise CompileError(f"Glu: axis {axis} of {shape} cannot be cut into two equal halves")
    shape[axis] //= 2
    return [TensorInfo.of(shape, inputs[0].dtype)]


def glu(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    value, gate = np.split(as_float(x[0]), 2, axis=attrs["axis"])
    return like(value * as_float(sigmoid({}, [gate])), x[0])


def _register_once() -> None:
    """Register the three ops (a second import of this module, e.g. under another name by
    pytest's importlib mode, finds them registered and leaves them)."""
    if FULLY_CONNECTED in REGISTRY:
        return
    register(FULLY_CONNECTED, infer=_infer_fully_connected)(fully_connected)
    register(SILU, infer=same_as_input)(silu)
    register(GLU, infer=_infer_glu)(glu)


_register_once()
