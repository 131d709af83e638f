"""A detector's tail - per-head Reshape to [1, C, L], Concat along the L axis, Transpose to the
graph output [1, N, C] - as one NPU FlatConcat and the runtime's readout (LOWERING.md 29).

YOLOX (ddddocr's common_det.onnx) ends in::

    x_i [1,C,H_i,W_i] -Reshape-> [1,C,H_i*W_i] -Concat(axis 2)-> [1,C,N] -Transpose(0,2,1)-> out [1,N,C]

Rewritten as ``FlatConcat(x_0, x_1, ...) -> [1,C,1,N] -Readout(NHWC)-> out``: the FlatConcat is
one DPU copy per head into its columns of a channel-major map (lower/lower_flat_concat.py), the
Readout the runtime's NHWC readout of that map (output_readout.py, LOWERING.md 25). A rank-3
[1,C,L] is stored 1 x C x L (constraints.same_native_bytes), so the per-head Reshapes are real
moves in NC1HWC2; joined with the Concat they are one copy per head.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError

from ..ir import Graph, Node
from ..ops import REGISTRY
from ..ops.base import TensorInfo, register
from .context import PassContext
from .match import add_tensor_like, producer, readers, sole_reader
from .output_readout import NHWC, readout_node

FLAT_CONCAT = "FlatConcat"


def _infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    if not inputs or any(len(x.shape) != 4 or x.shape[0] != 1 or x.shape[1] != inputs[0].shape[1] for x in inputs):
        raise CompileError(f"FlatConcat: inputs {[list(x.shape) for x in inputs]} are not [1, C, H, W] maps of one C")
    columns = sum(x.shape[2] * x.shape[3] for x in inputs)
    return [TensorInfo.of((1, inputs[0].shape[1], 1, columns), inputs[0].dtype)]


def flat_concat(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """Each [1, C, H, W] input flattened to [1, C, 1, H*W], joined along the last axis."""
    return np.concatenate([v.reshape(v.shape[0], v.shape[1], 1, -1) for v in x], axis=3)


if FLAT_CONCAT not in REGISTRY:  # a second import under another name (pytest's importlib mode) finds it
    register(FLAT_CONCAT, infer=_infer)(flat_concat)


def _flattened_head(graph: Graph, name: str) -> str | None:
    """The [1, C, H, W] map a Reshape flattens to ``name`` [1, C, H*W], read only by one node."""
    node = producer(graph, name)
    if node is None or node.op_type != "Reshape" or node.fused or len(readers(graph, name)) != 1:
        return None
    source = graph.tensor(node.inputs[0])
    dims, flat = tuple(source.shape), tuple(graph.tensor(name).shape)
    if source.is_const or len(dims) != 4 or dims[0] != 1 or flat != (1, dims[1], dims[2] * dims[3]):
        return None
    return source.name


def _tail(graph: Graph, node: Node) -> tuple[Node, list[str]] | None:
    """(the Concat, the heads' maps) when ``node`` is the tail's Transpose to a graph output."""
    if node.op_type != "Transpose" or list(node.attrs.get("perm", ())) != [0, 2, 1] or node.fused:
        return None
    output, joined = node.outputs[0], node.inputs[0]
    concat = producer(graph, joined)
    if output not in graph.outputs or concat is None or concat.op_type != "Concat" or concat.fused \
            or joined in graph.outputs or sole_reader(graph, joined) is not node:
        return None
    if len(graph.tensor(joined).shape) != 3 or int(concat.attrs.get("axis", 0)) % 3 != 2:
        return None
    if any(name in graph.outputs for name in concat.inputs):
        return None
    heads = [_flattened_head(graph, name) for name in concat.inputs]
    return None if None in heads else (concat, heads)


def flat_concat_tail(graph: Graph, ctx: PassContext) -> int:
    """Per-head Reshape + Concat(axis 2) + Transpose(0, 2, 1) to a graph output as a FlatConcat and a readout."""
    for node in list(graph.nodes):
        found = _tail(graph, node)
        if found is None:
            continue
        concat, heads = found
        output = node.outputs[0]
        reshapes = [producer(graph, name) for name in concat.inputs]
        first = graph.tensor(heads[0])
        columns = sum(graph.tensor(h).shape[2] * graph.tensor(h).shape[3] for h in heads)
        joined = add_tensor_like(graph, f"{output}_flat", (1, first.shape[1], 1, columns), first.dtype)
        index = graph.nodes.index(concat) - sum(graph.nodes.index(r) < graph.nodes.index(concat) for r in reshapes)
        for done in (node, concat, *reshapes):
            graph.nodes.remove(done)
            if done.outputs[0] != output:
                graph.tensors.pop(done.outputs[0], None)
        for reshape in reshapes:  # the target shapes, when nothing else reads them
            for name in reshape.inputs[1:]:
                if not readers(graph, name) and name not in graph.outputs:
                    graph.tensors.pop(name, None)
        shape = tuple(graph.tensor(output).shape)
        graph.nodes[index:index] = [Node(graph.unique_node_name(f"{concat.name}_flat"), FLAT_CONCAT, heads, [joined], {}),
                                    readout_node(graph.unique_node_name(f"{output}_readout"), joined, output, NHWC, shape)]
        return 1
    return 0


__all__ = ["FLAT_CONCAT", "flat_concat", "flat_concat_tail"]
