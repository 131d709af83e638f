"""The op registry and what an op definition holds.

Every supported ONNX op has an :class:`OpDef` with three small functions:

- ``canonicalize(view)``: read the ONNX node (attributes, constant inputs, input shapes) and
  return the IR form: one attribute set whatever the opset, and the inputs that stay
  tensors. Inputs that only configure the op (Clip min/max, Reshape shape, Slice starts,
  Resize scales...) become attributes. Unsupported variants raise :class:`Unsupported`.
- ``infer(attrs, inputs)``: output shapes and dtypes from input shapes and dtypes.
- ``compute(attrs, arrays)``: the float semantics in numpy (float32 results, float64
  accumulation where it matters). Used for constant folding and by the float evaluator.

``fold_only`` ops (Shape, Range, Equal...) may appear in a model only where they fold to
constants once the input shapes are fixed; any left over is reported as unsupported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of a value, known during import before its data is."""

    shape: tuple[int, ...]
    dtype: str

    @staticmethod
    def of(shape: Sequence[int], dtype: Any) -> "TensorInfo":
        return TensorInfo(tuple(int(d) for d in shape), np.dtype(dtype).name)


class Unsupported(Exception):
    """Raised by a canonicalizer when this node's variant of the op is not supported."""


@dataclass
class Canonical:
    """The IR form of one ONNX node: attributes, tensor inputs, and a new op type if the
    op maps onto another one (Upsample -> Resize)."""

    attrs: dict[str, Any]
    inputs: list[str]
    op_type: str | None = None


class NodeView:
    """What a canonicalizer may look at: the ONNX node, the model's opset, the values of
    constant inputs and the shapes of all inputs."""

    def __init__(self, node: Any, name: str, opset: int, attrs: dict[str, Any],
                 constants: dict[str, np.ndarray], infos: dict[str, TensorInfo], used_outputs: set[str]):
        self.node = node
        self.name = name
        self.opset = opset
        self.attrs = attrs
        self._constants = constants
        self._infos = infos
        self._used_outputs = used_outputs

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def input_names(self) -> list[str]:
        return list(self.node.input)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def has_input(self, index: int) -> bool:
        return index < len(self.node.input) and self.node.input[index] != ""

    def const(self, index: int) -> np.ndarray | None:
        """Value of input ``index`` if it is a constant, else None (also when absent)."""
        return self._constants.get(self.node.input[index]) if self.has_input(index) else None

    def require_const(self, index: int, what: str) -> np.ndarray:
        value = self.const(index)
        if value is None:
            raise CompileError(f"input {index} ('{what}', tensor '{self.node.input[index]}') must be "
                               "constant once input shapes are fixed")
        return value

    def info(self, index: int) -> TensorInfo:
        return self._infos[self.node.input[index]]

    def rank(self, index: int = 0) -> int:
        return len(self.info(index).shape)

    def output_used(self, index: int) -> bool:
        return index < len(self.node.output) and self.node.output[index] in self._used_outputs

    def fail(self, message: str) -> CompileError:
        """The error to raise for a malformed node (the importer adds the node's name)."""
        return CompileError(message)


Compute = Callable[[dict[str, Any], list[np.ndarray]], Any]
Infer = Callable[[dict[str, Any], list[TensorInfo]], list[TensorInfo]]
Canonicalize = Callable[[NodeView], Canonical]
NoopTest = Callable[[dict[str, Any], list[TensorInfo], list[TensorInfo]], bool]


def keep_all(view: NodeView) -> Canonical:
    """Default canonicalizer: all ONNX attributes, all non-empty inputs."""
    return Canonical(dict(view.attrs), [name for name in view.input_names if name])


@dataclass(frozen=True)
class OpDef:
    op_type: str
    compute: Compute
    infer: Infer
    canonicalize: Canonicalize = keep_all
    fold_only: bool = False
    #: Shape-only ops (Shape, Size) fold as soon as their input's shape is known.
    folds_from_shape: bool = False
    #: Returns True when the node (with these attrs and shapes) passes its input through.
    is_noop: NoopTest | None = None

    def run(self, attrs: dict[str, Any], arrays: list[np.ndarray]) -> list[np.ndarray]:
        result = self.compute(attrs, arrays)
        if isinstance(result, (list, tuple)):
            return [np.asarray(value) for value in result]
        return [np.asarray(result)]


REGISTRY: dict[str, OpDef] = {}


def register(*op_types: str, infer: Infer, canonicalize: Canonicalize = keep_all, fold_only: bool = False,
             folds_from_shape: bool = False, is_noop: NoopTest | None = None) -> Callable[[Compute], Compute]:
    """Decorator: register ``compute`` as the semantics of each of ``op_types``."""

    def decorate(compute: Compute) -> Compute:
        for op_type in op_types:
            if op_type in REGISTRY:
                raise RuntimeError(f"op {op_type} registered twice")
            REGISTRY[op_type] = OpDef(op_type, compute, infer, canonicalize, fold_only, folds_from_shape, is_noop)
        return compute

    return decorate


# ---- small helpers shared by op modules ----------------------------------------------------

def same_as_input(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    """Infer rule of unary elementwise ops."""
    return [inputs[0]]


def broadcast_infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    """Infer rule of multidirectional broadcasting ops; dtype of the first input."""
    try:
        shape = np.broadcast_shapes(*(info.shape for info in inputs))
    except ValueError:
        raise CompileError(f"shapes {[list(info.shape) for info in inputs]} do not broadcast") from None
    return [TensorInfo.of(shape, inputs[0].dtype)]


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise CompileError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(axes: Sequence[int], rank: int) -> list[int]:
    return sorted(normalize_axis(int(axis), rank) for axis in axes)


def as_float(value: np.ndarray) -> np.ndarray:
    """float64 copy for accurate accumulation."""
    return np.asarray(value, dtype=np.float64)


def like(result: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Cast ``result`` back to the dtype of ``reference`` (float64 math -> float32 tensor)."""
    return np.asarray(result).astype(reference.dtype, copy=False)


def int_list(values: Any) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


@dataclass
class SpatialParams:
    """Kernel, strides, dilations and explicit pads of a conv/pool over its spatial axes."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list[int] = field(default_factory=list)  # begins then ends, as ONNX


def resolve_pads(auto_pad: str, in_sizes: Sequence[int], params: SpatialParams, pads: Sequence[int] | None) -> list[int]:
    """Explicit ``[begin..., end...]`` pads from ONNX ``auto_pad`` / ``pads``."""
    rank = len(in_sizes)
    if auto_pad in ("", "NOTSET"):
        return int_list(pads) if pads is not None and len(pads) else [0] * (2 * rank)
    if auto_pad == "VALID":
        return [0] * (2 * rank)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise CompileError(f"auto_pad '{auto_pad}' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    begins, ends = [], []
    for size, kernel, stride, dilation in zip(in_sizes, params.kernel, params.strides, params.dilations):
        out = -(-size // stride)
        total = max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def decode_attr_value(value: Any) -> Any:
    """ONNX attribute value -> plain Python: bytes -> str; floats (stored as float32) -> the
    shortest decimal that is the same float32, so 1e-5 reads 1e-05, not 9.99999974e-06."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, float):
        return float(str(np.float32(value)))
    if isinstance(value, list):
        return [decode_attr_value(item) for item in value]
    return value
