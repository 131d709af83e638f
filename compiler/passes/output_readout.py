"""Graph outputs the runtime permutes as it reads them (LOWERING.md 25, isa/CONTAINER.md 3.3
``readout``).

The runtime already converts every output from the NPU's NC1HWC2 to NCHW when it reads it, on
the host and outside the layer count, as the vendor's runtime does (rknn_outputs_get converts
NC1HWC2 to NCHW or NHWC as the caller asks; docs/hardware.md 2: "reference conversion code
NC1HWC2 -> NCHW and -> NHWC"). A ``Readout`` node asks for one more fixed permutation there: its
output, a graph output, is its input transposed by ``perm`` and reshaped to ``shape``. A token
region's channel-major ``[1, C, 1, T]`` map delivered as the model's ``[1, T, C]`` is the NHWC
readout (``perm`` [0, 2, 3, 1]) of that map, reshaped.

In the graph the node is a layer like any other (the float evaluator runs it; the partition
places it by the op table's ``view`` group, constraints.same_native_bytes naming the rule); the
build strips it (:func:`strip_readouts`: the map it reads becomes the graph output under the
output's name) and records the permutation in the output's tensor record (:func:`annotate`).
The input side, ``Readin`` (input_readin.py, LOWERING.md 33.4), is stripped and recorded here too.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from npuemu.isa.container import ModelFile
from npuemu.isa.errors import CompileError

from ..ir import Graph, Node, Tensor
from ..ops import REGISTRY
from ..ops.base import register
from .input_readin import permute_infer, permuted, strip_readins

READOUT = "Readout"
#: NCHW -> NHWC: what the vendor's runtime offers besides NCHW
NHWC = [0, 2, 3, 1]


def readout(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return permuted(attrs, x)


if READOUT not in REGISTRY:  # a second import under another name (pytest's importlib mode) finds it
    register(READOUT, infer=permute_infer(READOUT))(readout)


def readout_node(name: str, source: str, output: str, perm: list[int], shape: tuple[int, ...]) -> Node:
    return Node(name, READOUT, [source], [output], {"perm": list(perm), "shape": [int(d) for d in shape]})


def strip_readouts(graph: Graph) -> tuple[Graph, dict[str, dict[str, dict[str, list[int]]]]]:
    """``graph`` without its Readout and Readin nodes (a copy if it has any): each Readout's input
    renamed to its output, so the layer before writes the graph output in its stored form, each
    Readin's graph input given its stored form (input_readin.strip_readins); and the records by
    tensor name: ``{"readout": ...}`` or ``{"readin": ...}``."""
    graph, readins = strip_readins(graph)
    records: dict[str, dict[str, dict[str, list[int]]]] = {name: {"readin": record} for name, record in readins.items()}
    found = [node for node in graph.nodes if node.op_type == READOUT]
    if not found:
        return graph, records
    graph = copy.deepcopy(graph)
    for node in [node for node in graph.nodes if node.op_type == READOUT]:
        source, output = node.inputs[0], node.outputs[0]
        readers = [other for other in graph.nodes if source in other.all_inputs and other is not node]
        if output not in graph.outputs or source in graph.outputs or source in graph.inputs or readers:
            raise CompileError(f"Readout {node.name}: only a graph output whose input nothing else reads is read out")
        graph.nodes.remove(node)
        stored = graph.tensors.pop(source)
        del graph.tensors[output]
        graph.tensors[output] = Tensor(output, stored.shape, stored.dtype, quant=stored.quant)
        for other in graph.nodes:
            other.outputs = [output if name == source else name for name in other.outputs]
        records[output] = {"readout": {"perm": list(node.attrs["perm"]), "shape": list(node.attrs["shape"])}}
    return graph, records


def annotate(model: ModelFile, records: dict[str, dict[str, dict[str, list[int]]]]) -> ModelFile:
    """``model`` with each output's ``readout`` and each input's ``readin`` record (isa/CONTAINER.md 3.3)."""
    if not records:
        return model
    trailer = dict(model.trailer)  # only the changed tensor records are new (a deep copy took 0.1-0.25 s)
    if "tensors" in trailer:
        trailer["tensors"] = [{**tensor, **records[tensor["name"]]} if tensor["name"] in records else tensor
                              for tensor in trailer["tensors"]]
    return ModelFile(model.sections, trailer)


__all__ = ["NHWC", "READOUT", "annotate", "readout", "readout_node", "strip_readouts"]
