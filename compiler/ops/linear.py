"""MatMul (numpy broadcasting semantics) and Gemm (alpha * A' @ B' + beta * C)."""

from __future__ import annotations

from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError

from .base import Canonical, NodeView, TensorInfo, as_float, like, register


def _infer_matmul(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    a, b = inputs[0].shape, inputs[1].shape
    drop_m, drop_n = len(a) == 1, len(b) == 1
    a = (1, *a) if drop_m else a
    b = (*b, 1) if drop_n else b
    if a[-1] != b[-2]:
        raise CompileError(f"MatMul of {list(inputs[0].shape)} and {list(inputs[1].shape)}: inner dims differ")
    try:
        batch = np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        raise CompileError(f"MatMul batch dims of {list(a)} and {list(b)} do not broadcast") from None
    out = (*batch, *(() if drop_m else (a[-2],)), *(() if drop_n else (b[-1],)))
    return [TensorInfo.of(out, inputs[0].dtype)]


@register("MatMul", infer=_infer_matmul)
def matmul(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return like(np.matmul(as_float(x[0]), as_float(x[1])), x[0])


def _canonical_gemm(view: NodeView) -> Canonical:
    attrs = {"alpha": float(view.attr("alpha", 1.0)), "beta": float(view.attr("beta", 1.0)),
             "transA": int(view.attr("transA", 0)), "transB": int(view.attr("transB", 0))}
    return Canonical(attrs, [name for name in view.input_names if name])


def _infer_gemm(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    a, b = inputs[0].shape, inputs[1].shape
    if len(a) != 2 or len(b) != 2:
        raise CompileError(f"Gemm needs 2-D inputs, got {list(a)} and {list(b)}")
    m, k = (a[1], a[0]) if attrs["transA"] else a
    k2, n = (b[1], b[0]) if attrs["transB"] else b
    if k != k2:
        raise CompileError(f"Gemm inner dims differ: {list(a)} transA={attrs['transA']}, {list(b)} transB={attrs['transB']}")
    return [TensorInfo.of((m, n), inputs[0].dtype)]


@register("Gemm", infer=_infer_gemm, canonicalize=_canonical_gemm)
def gemm(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    a, b = as_float(x[0]), as_float(x[1])
    a = a.T if attrs["transA"] else a
    b = b.T if attrs["transB"] else b
    result = attrs["alpha"] * (a @ b)
    if len(x) > 2:
        result = result + attrs["beta"] * as_float(x[2])
    return like(result, x[0])
