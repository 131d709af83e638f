"""Tensors that must share one int8 scale and zero point.

- **Value-preserving ops** (max pooling, reshapes, transposes, slices, splits, gathers, pads,
  nearest/linear resize, ...) output only values of their input, or convex combinations of
  them, so the output keeps the input's parameters and the NPU copies or pools bytes without
  requantizing. Average pooling is one of them: the PPU does not requantize
  (``lower.layers.PoolLayer`` takes one ``quant``; vendor rep08/avgpool cases keep the input's
  scale). GlobalAveragePool is not: the vendor lowers it to depthwise convolutions with their
  own output scale (vendor-corpus README 3.3: gap cases shrink the scale ~100x), and sharing
  would waste most of the output's levels.
- **Concat** is unified where that is cheap: an input joins the output's group (and the
  concatenation is only a matter of addresses: each input written into its slice of the output
  buffer, no task - compiler/LOWERING.md 10.1) when its own range is at least
  1/``CONCAT_MAX_GROWTH`` of the group's, i.e. unifying coarsens its scale by at most that
  factor. A narrower input keeps its own parameters and is
  requantized into the output buffer by a DPU pass, as the vendor does (vendor-corpus
  ``tensors.csv``, concat_002: the output's scale differs from both inputs'). Unifying a
  narrow input would coarsen it for every other reader too (through the value-preserving
  chain that feeds it: a Resize before a Concat shares its input's parameters), which costs
  more than the extra rounding of one requantization. The group's range is the union of its
  members' ranges (for concat_003 the vendor's output scale is exactly the union's).

Groups are found with union-find over tensor names; only int8 nodes without fused parts
join their tensors (a fused op changes values; a float16 node's output is not int8). The
representative ("anchor") of a group is its non-constant member that appears first in the
graph (graph inputs, then node outputs in order), which is where quant-config writes the
group's range.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..ir import Graph, Node
from .affine import Range

#: A Concat input joins the unified group when that coarsens its scale by at most this factor.
CONCAT_MAX_GROWTH = 1.5

#: Ops whose output holds only (combinations within the range of) their first input's values.
VALUE_PRESERVING = frozenset({
    "MaxPool", "GlobalMaxPool", "AveragePool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
    "Identity", "Dropout", "Slice", "Split", "Gather", "Pad", "Expand", "Tile", "ReduceMax", "ReduceMin",
    "Resize", "Upsample", "DepthToSpace", "SpaceToDepth",
    "Readin",  # the runtime's permutation of a graph input (passes/input_readin.py): its stored form, one quantization
})


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        self.parent.setdefault(name, name)
        root = name
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[name] != root:  # path compression
            self.parent[name], name = root, self.parent[name]
        return root

    def union(self, a: str, b: str) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a != root_b:
            self.parent[root_b] = root_a


def _is_float(graph: Graph, name: str) -> bool:
    return np.dtype(graph.tensors[name].dtype).kind == "f"


def joins_tensors(node: Node) -> bool:
    """True when the node's float inputs and outputs must share their quantization."""
    if node.fused:
        return False
    if node.op_type in ("Conv", "ConvTranspose") and node.attrs.get("selection"):
        return True  # a 0/1 selection conv (passes/focus_as_conv.py, depth_to_space.py): input values only
    return node.op_type == "Concat" or node.op_type in VALUE_PRESERVING


def placement_members(node: Node) -> list[str]:
    """A placement conv of a Concat (passes/concat_as_convs.py): [its output, the partial
    concatenation its residual add reads] (they share parameters, so the adds pass stored values
    through), [its output] for the first of the chain; [] for any other node."""
    if node.op_type != "Conv" or not node.attrs.get("placement"):
        return []
    if not node.fused:
        return [node.outputs[0]]
    part = node.fused[0]
    single_add = len(node.fused) == 1 and part.op_type == "Add" and len(part.inputs) == 1
    return [node.outputs[0], part.inputs[0]] if single_add else []


def sharing_groups(graph: Graph, layer_dtypes: Mapping[str, str],
                   ranges: Mapping[str, Range] | None = None) -> dict[str, str]:
    """Tensor name -> anchor name, for every tensor in a group of two or more.

    ``ranges`` (per tensor, where known) decide which Concat inputs are unified; without
    them every Concat input is.
    """
    union = _UnionFind()
    concats = []
    for node in graph.nodes:
        chain = placement_members(node) if layer_dtypes.get(node.name) == "int8" else []
        if chain:  # a Concat input placed by a conv: unified with the output as a Concat's would be
            union.union(chain[0], chain[-1])
            concats.append(node)
        if layer_dtypes.get(node.name) != "int8" or not joins_tensors(node):
            continue
        if node.op_type == "Concat":
            concats.append(node)
            continue
        members = node.inputs[:1] if node.inputs and _is_float(graph, node.inputs[0]) else []
        members += [name for name in node.outputs if _is_float(graph, name)]
        for other in members[1:]:
            union.union(members[0], other)
    for node in concats:
        output = node.outputs[0]
        sources = node.inputs[:1] if node.op_type == "Conv" else node.inputs  # a placement conv: its input
        inputs = [name for name in sources if _is_float(graph, name)]
        widths = {name: _group_width(graph, union, name, ranges) for name in [*inputs, output]}
        total = _group_range(graph, union, [*inputs, output], ranges)
        for name in inputs:
            if ranges is None or total is None or widths[name] is None \
                    or widths[name] * CONCAT_MAX_GROWTH >= total.hi - total.lo:
                union.union(output, name)
    order = {name: index for index, name in enumerate(_appearance_order(graph))}
    groups: dict[str, list[str]] = {}
    for name in union.parent:
        groups.setdefault(union.find(name), []).append(name)
    anchors = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        candidates = [name for name in members if not graph.tensors[name].is_const] or members
        anchor = min(candidates, key=lambda name: order.get(name, len(order)))
        anchors.update(dict.fromkeys(members, anchor))
    return anchors


def _members(union: _UnionFind, name: str) -> list[str]:
    root = union.find(name)
    return [member for member in list(union.parent) if union.find(member) == root]


def _tensor_range(graph: Graph, name: str, ranges: Mapping[str, Range]) -> Range | None:
    if name in ranges:
        return ranges[name]
    tensor = graph.tensors[name]
    if tensor.is_const and tensor.size:
        data = np.asarray(tensor.data, dtype=np.float64)
        return Range(float(data.min()), float(data.max()))
    return None


def _group_range(graph: Graph, union: _UnionFind, names: list[str], ranges: Mapping[str, Range] | None) -> Range | None:
    if ranges is None:
        return None
    known = [value for name in names for member in _members(union, name)
             if (value := _tensor_range(graph, member, ranges)) is not None]
    if not known:
        return None
    total = known[0]
    for value in known[1:]:
        total = total.union(value)
    return total.including_zero()


def _group_width(graph: Graph, union: _UnionFind, name: str, ranges: Mapping[str, Range] | None) -> float | None:
    value = _group_range(graph, union, [name], ranges)
    return None if value is None else value.hi - value.lo


def _appearance_order(graph: Graph) -> list[str]:
    names = list(graph.inputs)
    for node in graph.nodes:
        names += [name for name in node.all_inputs if graph.tensors[name].is_const]
        names += node.outputs
    return list(dict.fromkeys(names))
