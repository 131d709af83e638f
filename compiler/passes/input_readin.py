"""Graph inputs the runtime permutes as it stores them: the input side of the output readout
(LOWERING.md 33.4, isa/CONTAINER.md 3.3 ``readin``).

The runtime already converts every input from the caller's NCHW to the NPU's NC1HWC2 when it
stores it (``Runtime.set_input``), on the host and outside the layer count, as the vendor's
runtime does (rknn_inputs_set converts the caller's NCHW or NHWC buffer - ``rknn_input.fmt`` - to
the NPU layout on the CPU unless ``pass_through``; docs/hardware.md 2). A ``Readin`` node asks for
one more fixed permutation there: its input, a graph input of the caller's shape, is transposed
by ``perm`` and reshaped to ``shape`` (the stored tensor). A token region's channel-major
``[1, C, 1, T]`` map fed from the model's ``[1, T, C]`` input (tokens_as_channels' entry edge:
Transpose putting the tokens last, then a Reshape) is such a readin: the NHWC order of the map,
the other order the vendor's runtime takes.

:func:`readin_token_inputs` replaces exactly that edge - a graph input ``[1, T, *rest]`` read
only by a Transpose moving axis 1 last, whose output only a Reshape to ``[1, prod(rest), 1, T]``
reads - by one Readin node. Other inputs are left as they were (so files without a readin stay
byte-identical). In the graph the node is a layer like any other (the float evaluator runs it;
the partition places it by the op table's ``readin`` group); the build strips it
(:func:`strip_readins`: the graph input takes the map's shape and quantization under its own name)
and the output_readout annotation records the permutation in the input's tensor record.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError

from ..ir import Graph, Node, Tensor
from ..ops import REGISTRY
from ..ops.base import TensorInfo, register
from .constraints import Constraint
from .context import PassContext
from .match import readers

READIN = "Readin"


def permute_infer(op: str):
    """Shape inference of a Readin or Readout: the input transposed by ``perm``, then ``shape``."""
    def infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
        perm, shape = list(attrs["perm"]), [int(d) for d in attrs["shape"]]
        if sorted(perm) != list(range(len(inputs[0].shape))) or int(np.prod(shape)) != int(np.prod(inputs[0].shape)):
            raise CompileError(f"{op}: perm {perm} and shape {shape} do not fit input {list(inputs[0].shape)}")
        return [TensorInfo.of(shape, inputs[0].dtype)]
    return infer


def permuted(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """The array transposed by ``perm`` and reshaped to ``shape`` (Readin and Readout)."""
    return np.ascontiguousarray(np.transpose(x[0], attrs["perm"])).reshape(attrs["shape"])


def readin(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """The caller's array transposed by ``perm`` and reshaped to the stored ``shape``."""
    return permuted(attrs, x)


if READIN not in REGISTRY:  # a second import under another name (pytest's importlib mode) finds it
    register(READIN, infer=permute_infer(READIN))(readin)


@Constraint
def graph_input(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """A Readin reads a graph input, which the runtime permutes as it stores it (LOWERING.md 33.4)."""
    return None if node.inputs[0] in graph.inputs else f"{node.inputs[0]!r} is not a graph input"


def _token_edge(graph: Graph, name: str) -> tuple[Node, Node] | None:
    """(Transpose, Reshape) of graph input ``name`` [1, T, *rest] -> [1, prod(rest), 1, T], else None."""
    shape = graph.tensors[name].shape
    users = readers(graph, name)
    if len(shape) < 3 or shape[0] != 1 or name in graph.outputs or len(users) != 1:
        return None
    transpose = users[0]
    tokens_last = [0, *range(2, len(shape)), 1]
    if transpose.op_type != "Transpose" or transpose.fused or list(transpose.attrs.get("perm", ())) != tokens_last:
        return None
    moved = transpose.outputs[0]
    after = readers(graph, moved)
    if moved in graph.outputs or len(after) != 1 or after[0].op_type != "Reshape" or after[0].fused:
        return None
    target = (1, int(np.prod(shape[2:])), 1, shape[1])
    return (transpose, after[0]) if tuple(graph.tensors[after[0].outputs[0]].shape) == target else None


def readin_token_inputs(graph: Graph, ctx: PassContext) -> int:
    """A [1, T, C] graph input's Transpose + Reshape to channel-major becomes the runtime's readin."""
    changed = 0
    for name in list(graph.inputs):
        edge = _token_edge(graph, name)
        if edge is None or np.dtype(graph.tensors[name].dtype).kind != "f":
            continue
        transpose, reshape = edge
        out = reshape.outputs[0]
        node = Node(graph.unique_node_name(f"{name}_readin"), READIN, [name], [out],
                    {"perm": list(transpose.attrs["perm"]), "shape": list(graph.tensors[out].shape)})
        graph.nodes[graph.nodes.index(transpose)] = node
        graph.nodes.remove(reshape)
        graph.tensors.pop(transpose.outputs[0], None)
        changed += 1
    return changed


def strip_readins(graph: Graph) -> tuple[Graph, dict[str, dict[str, list[int]]]]:
    """``graph`` without its Readin nodes (a copy if it has any): each graph input takes its
    readin's output (shape, type, quantization) under the input's name, so the layers read the
    stored map; and the permutation records by input name (``perm``, and ``shape``: the caller's)."""
    found = [node for node in graph.nodes if node.op_type == READIN]
    if not found:
        return graph, {}
    graph = copy.deepcopy(graph)
    records = {}
    for node in [node for node in graph.nodes if node.op_type == READIN]:
        source, stored = node.inputs[0], node.outputs[0]
        others = [other for other in graph.nodes if source in other.all_inputs and other is not node]
        if source not in graph.inputs or stored in graph.outputs or source in graph.outputs or others:
            raise CompileError(f"Readin {node.name}: only a graph input that nothing else reads is read in")
        given = list(graph.tensors[source].shape)
        graph.nodes.remove(node)
        made = graph.tensors.pop(stored)
        graph.tensors[source] = Tensor(source, made.shape, made.dtype, quant=made.quant)
        graph.replace_uses(stored, source)
        records[source] = {"perm": list(node.attrs["perm"]), "shape": given}
    return graph, records


__all__ = ["READIN", "graph_input", "readin", "readin_token_inputs", "strip_readins"]
