"""Per-op semantics of the IR: canonical attributes, shape inference and numpy float
computation, one module per op family. Importing the package registers every op."""

from . import (activation, conv, elementwise, layout, linear, normalization, pad, pool, quantize_linear, recurrent,
               reduce, resize, select, tensor_info)
from .base import REGISTRY, Canonical, NodeView, OpDef, TensorInfo, Unsupported, register

__all__ = ["REGISTRY", "Canonical", "NodeView", "OpDef", "TensorInfo", "Unsupported", "get_op", "register",
           "supported_ops"]

_MODULES = (activation, conv, elementwise, layout, linear, normalization, pad, pool, quantize_linear, recurrent, reduce,
            resize, select, tensor_info)


def get_op(op_type: str) -> OpDef:
    """The definition of ``op_type``; KeyError if it has none."""
    return REGISTRY[op_type]


def supported_ops(*, include_fold_only: bool = False) -> list[str]:
    """Op types the IR can hold (and, if asked, those accepted only when they fold)."""
    return sorted(name for name, op in REGISTRY.items() if include_fold_only or not op.fold_only)
