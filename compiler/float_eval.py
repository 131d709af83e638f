"""Run an IR graph in numpy: the float reference of the compiler.

Each node runs its main op with the op's numpy semantics (``ops/``), then its fused parts in
order on the running result, so a fused ``Conv+Relu+Add`` node computes exactly what the
unfused nodes did. A ``tensor_hook`` sees every tensor value (constants once, node outputs as
they are made) and may replace it: the quantization passes plug fake-quantization in there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError, InputError, NpuemuError

from .ir import Graph, Node, Tensor
from .ops import OpDef, get_op

log = logging.getLogger(__name__)

#: ``hook(tensor, value) -> value`` applied to each constant and each node output.
TensorHook = Callable[[Tensor, np.ndarray], np.ndarray]


def evaluate(graph: Graph, inputs: Mapping[str, Any], *, return_all: bool = False,
             tensor_hook: TensorHook | None = None, ops: Mapping[str, OpDef] | None = None) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` on ``inputs`` (by graph input name) and return its outputs by name,
    or, with ``return_all``, the graph inputs and every node output as well. ``ops`` replaces
    the registry's op of those types (calibration's compiled kernels, bit-equal to the registry's)."""
    values = _checked_inputs(graph, inputs)
    if tensor_hook is not None:
        values = {name: tensor_hook(graph.tensors[name], value) for name, value in values.items()}
    constants = _ConstantCache(graph, tensor_hook)
    uses = None if return_all else _use_counts(graph)

    def fetch(name: str) -> np.ndarray:
        return values[name] if name in values else constants[name]

    for node in graph.nodes:
        try:
            results = run_node(node, fetch, ops)
        except NpuemuError:
            raise
        except Exception as error:  # e.g. an out-of-range Gather index in the data
            raise InputError(f"node '{node.name}' ({node.display_op}): {type(error).__name__}: {error}") from error
        for name, value in zip(node.outputs, results):
            tensor = graph.tensors[name]
            if value.shape != tensor.shape:
                raise CompileError(f"node '{node.name}' ({node.display_op}) made output '{name}' of shape "
                                   f"{list(value.shape)}, the graph says {list(tensor.shape)}")
            value = value.astype(tensor.dtype, copy=False)
            values[name] = tensor_hook(tensor, value) if tensor_hook is not None else value
        if uses is not None:
            _release(node, uses, values)
    if return_all:
        return values | {name: constants[name] for name in graph.outputs if name not in values}
    return {name: values[name] if name in values else constants[name] for name in graph.outputs}


def run_node(node: Node, fetch: Callable[[str], np.ndarray],
             ops: Mapping[str, OpDef] | None = None) -> list[np.ndarray]:
    """Outputs of one node: the main op, then each fused part on output 0, in order."""
    results = _op(node.op_type, ops).run(node.attrs, [fetch(name) for name in node.inputs])
    for part in node.fused:
        operands = [fetch(name) for name in part.inputs]
        operands.insert(part.carry_index, results[0])
        results[0] = _op(part.op_type, ops).run(part.attrs, operands)[0]
    return results


def _op(op_type: str, ops: Mapping[str, OpDef] | None) -> OpDef:
    return ops[op_type] if ops and op_type in ops else get_op(op_type)


def _checked_inputs(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    missing = [name for name in graph.inputs if name not in inputs]
    unknown = [name for name in inputs if name not in graph.inputs]
    if missing or unknown:
        raise InputError(f"graph '{graph.name}' expects inputs {graph.inputs}; missing {missing}, unknown {unknown}")
    values = {}
    for name in graph.inputs:
        tensor, value = graph.tensors[name], np.asarray(inputs[name])
        if value.shape != tensor.shape:
            raise InputError(f"input '{name}' has shape {list(value.shape)}, the graph expects {list(tensor.shape)}")
        if not np.can_cast(value.dtype, tensor.dtype, casting="same_kind"):
            raise InputError(f"input '{name}' has dtype {value.dtype}, the graph expects {tensor.dtype}")
        values[name] = value.astype(tensor.dtype, copy=False)
    return values


class _ConstantCache:
    """Constant values, passed through the hook once, on first use."""

    def __init__(self, graph: Graph, hook: TensorHook | None):
        self.graph, self.hook, self.cache = graph, hook, {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.cache:
            tensor = self.graph.tensors[name]
            if tensor.data is None:
                raise CompileError(f"tensor '{name}' is read before it is computed")
            self.cache[name] = self.hook(tensor, tensor.data) if self.hook is not None else tensor.data
        return self.cache[name]


def _use_counts(graph: Graph) -> dict[str, int]:
    """How many reads each value still has to serve; graph outputs count one extra read so
    they are never released."""
    counts = dict.fromkeys(graph.outputs, 1)
    for node in graph.nodes:
        for name in node.all_inputs:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _release(node: Node, uses: dict[str, int], values: dict[str, np.ndarray]) -> None:
    """Forget values no later node reads, to bound memory on large models."""
    for name in node.all_inputs:
        uses[name] -= 1
        if uses[name] == 0:
            values.pop(name, None)
