"""The compiler's graph IR: tensors, nodes (with fused parts) and the graph that holds them.

The IR is ONNX after import and clean-up: NCHW tensors with static shapes, constants folded
into :class:`Tensor` data, one canonical attribute set per op whatever the ONNX opset (for
example Clip always has ``min``/``max`` attributes, Reshape always carries the resolved output
shape). Each node may carry *fused parts* (:class:`FusedOp`) that are applied in order to the
node's first output after its main op, so a fusion pass turns ``Conv -> Relu -> Add`` into one
``Conv+Relu+Add`` node without changing what the graph computes. Tensors carry an optional
:class:`QuantParams` for the quantization passes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError

from .ir_copy import register

#: Tags in fused layer names that are not simply the snake_case op type (``conv1_fuse_prelu``).
_DEFAULT_TAGS = {"PRelu": "prelu"}

#: In the name of the stand-in the importer gives an optional output a model left out in the
#: middle of a node's outputs (LSTM's Y when only Y_h is wanted): computed, never read.
UNUSED_OUTPUT = ".unused_output"


@register
@dataclass
class QuantParams:
    """Affine quantization of one tensor: ``real = scale * (stored - zero_point)``.

    ``scale``/``zero_point`` are 0-d arrays for per-tensor quantization, or 1-d arrays along
    ``axis`` for per-channel (weights only on this hardware).
    """

    dtype: str
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None = None

    def __post_init__(self) -> None:
        self.scale = np.asarray(self.scale, dtype=np.float32)
        self.zero_point = np.asarray(self.zero_point, dtype=np.int32)
        if self.scale.shape != self.zero_point.shape or self.scale.ndim > 1:
            raise CompileError(
                f"quantization: scale {self.scale.shape} and zero_point {self.zero_point.shape} "
                "must have the same shape, () per-tensor or (C,) per-channel"
            )
        if (self.scale.ndim == 1) != (self.axis is not None):
            raise CompileError("quantization: per-channel parameters need an axis, per-tensor ones none")

    @property
    def per_channel(self) -> bool:
        return self.axis is not None


@register
@dataclass
class Tensor:
    """A value of the graph. ``data`` is set for constants (weights, folded values).

    ``dtype`` is the numpy name of the type the float graph computes ("float32", "int64",
    "bool"); a quantized tensor keeps its float dtype and says how it is stored in ``quant``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray | None = None
    quant: QuantParams | None = None

    def __post_init__(self) -> None:
        self.shape = tuple(int(d) for d in self.shape)
        self.dtype = np.dtype(self.dtype).name

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@register
@dataclass
class FusedOp:
    """An op folded into a node and applied to the node's running result, in order.

    The running result is operand ``carry_index`` of the op; ``inputs`` are its other operands
    (a residual for Add, the slope for PRelu). ``source`` keeps the name of the node it came
    from; ``tag`` overrides the label used in fused layer names (e.g. "bias_add").
    """

    op_type: str
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    carry_index: int = 0
    source: str = ""
    tag: str = ""

    @property
    def label(self) -> str:
        return self.tag or _DEFAULT_TAGS.get(self.op_type) or snake_case(self.op_type)


@register
@dataclass
class Node:
    """One operation: a canonical ONNX op (``op_type``) plus its fused parts."""

    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    fused: list[FusedOp] = field(default_factory=list)
    target: str | None = None  # "NPU" or "CPU" once the partition pass has run

    def __eq__(self, other: object) -> bool:
        """The dataclass comparison (all fields in order), answered by the names first: passes
        remove and find nodes in lists ~160,000 times a compile, against nodes of other names."""
        if other.__class__ is not self.__class__:
            return NotImplemented
        if not (self.name is other.name or self.name == other.name):
            return False
        return ((self.name, self.op_type, self.inputs, self.outputs, self.attrs, self.fused, self.target)
                == (other.name, other.op_type, other.inputs, other.outputs, other.attrs, other.fused, other.target))

    @property
    def display_op(self) -> str:
        """``Conv+Relu+Add`` style name of the main op and its fused parts."""
        return "+".join([self.op_type, *(part.op_type for part in self.fused)])

    @property
    def all_inputs(self) -> list[str]:
        """Inputs of the main op followed by those of the fused parts (graph dependencies)."""
        if not self.fused:  # most nodes; passes ask ~250,000 times a compile (issue 20)
            return list(self.inputs)
        return [*self.inputs, *(name for part in self.fused for name in part.inputs)]

    @property
    def layer_name(self) -> str:
        """The name reports and the per-layer JSON use: the node name plus its fusion suffix."""
        return fused_layer_name(self.name, [part.label for part in self.fused])


def fused_layer_name(base: str, tags: Sequence[str]) -> str:
    """Name of a fused layer in the vendor convention: ``conv1`` + (bias_add, relu) ->
    ``conv1_fuse_bias_add_relu``; no tags leaves the name unchanged."""
    return f"{base}_fuse_{'_'.join(tags)}" if tags else base


def snake_case(op_type: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type).lower()


@register
@dataclass
class Graph:
    """A whole model: tensors by name, nodes in execution (topological) order, graph I/O."""

    name: str
    tensors: dict[str, Tensor] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    opset: int = 0
    source: str = ""

    # ---- look-ups -------------------------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise CompileError(f"{self._where()}: no tensor named '{name}'") from None

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise CompileError(f"{self._where()}: no node named '{name}'")

    def constants(self) -> list[Tensor]:
        return [tensor for tensor in self.tensors.values() if tensor.is_const]

    def producers(self) -> dict[str, Node]:
        return {name: node for node in self.nodes for name in node.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.all_inputs):
                users.setdefault(name, []).append(node)
        return users

    # ---- edits ----------------------------------------------------------------------------
    def add_tensor(self, tensor: Tensor) -> Tensor:
        if tensor.name in self.tensors:
            raise CompileError(f"{self._where()}: tensor '{tensor.name}' already exists")
        self.tensors[tensor.name] = tensor
        return tensor

    def add_constant(self, name: str, data: np.ndarray) -> Tensor:
        data = np.asarray(data)
        return self.add_tensor(Tensor(self.unique_tensor_name(name), data.shape, data.dtype.name, data))

    def unique_tensor_name(self, base: str) -> str:
        return _unique(base, self.tensors)

    def unique_node_name(self, base: str) -> str:
        return _unique(base, {node.name for node in self.nodes})

    def rename_tensor(self, old: str, new: str) -> None:
        """Give tensor ``old`` the name ``new`` everywhere (producer, users, graph I/O)."""
        if new in self.tensors:
            raise CompileError(f"{self._where()}: cannot rename '{old}' to existing tensor '{new}'")
        tensor = self.tensors.pop(old)
        tensor.name = new
        self.tensors[new] = tensor
        self.replace_uses(old, new)
        for node in self.nodes:
            node.outputs = [new if name == old else name for name in node.outputs]
        self.inputs = [new if name == old else name for name in self.inputs]
        self.outputs = [new if name == old else name for name in self.outputs]

    def replace_uses(self, old: str, new: str) -> None:
        """Make every node (and fused part) that reads ``old`` read ``new`` instead."""
        for node in self.nodes:
            node.inputs = [new if name == old else name for name in node.inputs]
            for part in node.fused:
                part.inputs = [new if name == old else name for name in part.inputs]

    def bypass(self, node: Node) -> bool:
        """Remove a node whose first output equals its first input (Identity-like).

        Returns False, leaving the graph as it is, when that would merge a graph input or
        output with another graph input or output.
        """
        source, target = node.inputs[0], node.outputs[0]
        if target in self.outputs:
            producer = self.producers().get(source)
            if producer is None or source in self.outputs or source in self.inputs:
                return False
            self.nodes.remove(node)
            del self.tensors[target]
            self.rename_tensor(source, target)
            return True
        self.nodes.remove(node)
        self.replace_uses(target, source)
        for name in node.outputs:
            self.tensors.pop(name, None)
        return True

    def remove_dead(self) -> int:
        """Drop nodes none of whose outputs are used, then unreferenced tensors; returns the
        number of nodes removed."""
        removed = 0
        while True:
            used = set(self.outputs)
            for node in self.nodes:
                used.update(node.all_inputs)
            dead = [node for node in self.nodes if not used.intersection(node.outputs)]
            if not dead:
                break
            for node in dead:
                self.nodes.remove(node)
            removed += len(dead)
        referenced = set(self.inputs) | set(self.outputs)
        for node in self.nodes:
            referenced.update(node.all_inputs)
            referenced.update(node.outputs)
        for name in [name for name in self.tensors if name not in referenced]:
            del self.tensors[name]
        return removed

    # ---- health check ---------------------------------------------------------------------
    def check(self) -> None:
        """Raise CompileError unless the graph is well formed: unique names, every tensor
        defined once before it is used, graph outputs defined."""
        defined = {name for name, tensor in self.tensors.items() if tensor.is_const}
        for name in self.inputs:
            if name not in self.tensors or self.tensors[name].is_const:
                raise CompileError(f"{self._where()}: graph input '{name}' is not a non-constant tensor")
            defined.add(name)
        names: set[str] = set()
        for node in self.nodes:
            if node.name in names:
                raise CompileError(f"{self._where()}: node name '{node.name}' is not unique")
            names.add(node.name)
            for name in node.all_inputs:
                if name not in defined:
                    raise CompileError(f"{self._where()}: node '{node.name}' reads '{name}' before it is defined")
            for name in node.outputs:
                if name in defined or name not in self.tensors:
                    raise CompileError(f"{self._where()}: node '{node.name}' output '{name}' is defined twice or unknown")
                defined.add(name)
        for name in self.outputs:
            if name not in defined:
                raise CompileError(f"{self._where()}: graph output '{name}' is never defined")

    def _where(self) -> str:
        return f"graph '{self.name}'" + (f" ({self.source})" if self.source else "")


def _unique(base: str, taken: Iterable[str]) -> str:
    taken = set(taken)
    if base not in taken:
        return base
    index = 1
    while f"{base}_{index}" in taken:
        index += 1
    return f"{base}_{index}"
