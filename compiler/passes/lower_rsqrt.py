"""1/sqrt on the NPU (LOWERING.md 24): the composite op ``Rsqrt`` (a DPU look-up table, its function
in ``compiler/lower/lut_rsqrt.py``) and the pass that puts ``Pow(x, -0.5)``,
``Reciprocal(Sqrt(x))``, float16 ``Sqrt(x)`` and the LayerNorm chain's ``Rsqrt`` (layer_norm_npu.py)
on it.

int8: one ``Rsqrt`` layer (256 input codes, each on a table knot).

float16: 1/sqrt over the positive fp16 values spans 2^-24 .. 65504, 40 octaves, which no linearly
indexed table covers. It is a product of pieces, each one LUT layer accurate over 4 octaves
(lut_rsqrt.py):

    r = top(v) * p_1(v) * ... * p_n(v)
    top(v) = max(v, 2^12) ** -1/2                  Rsqrt(alpha 2^12), table over [0, 2^16]
    p_i(v) = sqrt(h_i / clamp(v, h_i / 16, h_i))   Rsqrt(alpha h_i / 16, beta h_i), h_i = 2^(16 - 4 i)

For v in piece j the pieces above give 4 each (v below them), those below 1: the product
telescopes to v ** -1/2, and every partial product lies between 2^-8 and the result (normal
fp16). Only piece j's factor and its product are rounded: the others are 1 or 4 to within
2^-15 of the table, which the fp16 rounding of the product drops. A piece's table needs its
LUT input factor 16384 / h_i as a normal fp16 (h_i >= 0.5), so the pieces below 2^-4 read
``v * 2^15`` and those below 2^-19 ``v * 2^30``: depthwise 1x1 convs by 2^15 (exact; a value
that overflows to inf is above those pieces' range, where they read their flat end). Pieces
wholly below the floor alpha (the LayerNorm's eps) are left out; the lowest piece's lower clamp
is alpha itself. v = 0 gives 2^12 (every piece at its top). Tasks for n pieces below the top:
2 n + 1 DPU tasks and a conv per scaling used (LayerNorm eps 1e-5: 8 pieces, 18 tasks; the
whole fp16 range: 9 pieces, 21 tasks).

Hybrid int8 builds: the graph pass runs before precisions are chosen, so an int8 build keeps one
Rsqrt layer (attributes cleared: the default floor). Where a quant config or auto-hybrid sets
that layer to float16, build stage 5 (layer_records._expand, as lower_softmax / lower_glu)
makes it the same product of pieces (``expand_rsqrt``; floor 2^-24 there, the whole fp16 range:
21 tasks), the new tensors float16. Its input and output are float16 (the hybrid's DataConverts
are the boundary); a float16 Rsqrt reading a map that is not 4-D with N = 1, or not stored in
float16, becomes a host step (emulator ``Rsqrt``), as Softmax / Glu do at that stage.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ir import Graph, Node, Tensor
from ..lower.lut_rsqrt import FP16_ONE_TABLE_FLOOR, RSQRT_FLOOR, attributes, rsqrt_function
from ..ops import REGISTRY
from ..ops.base import as_float, like, register, same_as_input
from .context import PassContext
from .match import add_tensor_like, const, new_constant, producer, readers, scalar
from .partition import decide
from .softmax_steps import FLOAT16

RSQRT = "Rsqrt"
#: float16: the top piece's floor, the pieces' width (octaves), the lowest piece's floor
TOP_FLOOR = FP16_ONE_TABLE_FLOOR
PIECE_RATIO = 16.0
FP16_FLOOR = 2.0 ** -24  # the smallest fp16 (subnormal): the pieces cover every positive fp16
#: float16: pieces whose top is below this read the input scaled by SCALE (lut_rsqrt.fp16_tables)
SCALED_BELOW = 0.5
SCALE = 2.0 ** 15


def rsqrt(attrs: dict, x: list[np.ndarray]) -> np.ndarray:
    """Float semantics of Rsqrt(alpha, beta) (lut_rsqrt.rsqrt_function)."""
    function = rsqrt_function(attrs.get("alpha"), attrs.get("beta"))
    return like(function(as_float(x[0])), x[0])


def _register_once() -> None:
    if RSQRT not in REGISTRY:
        register(RSQRT, infer=same_as_input)(rsqrt)


_register_once()


def pieces(floor: float) -> list[tuple[float, float]]:
    """(alpha, beta) of the float16 pieces below the top one, for values down to ``floor``."""
    found, top = [], TOP_FLOOR
    while top > floor and top > FP16_FLOOR:
        found.append((max(top / PIECE_RATIO, floor), top))
        top /= PIECE_RATIO
    return found


def scalings(top: float) -> int:
    """How often a piece up to ``top`` scales its input by 2^15 (its table's top must be >= 0.5)."""
    times = 0
    while top * SCALE ** times < SCALED_BELOW:
        times += 1
    return times


def _feature_map(graph: Graph, name: str) -> bool:
    tensor = graph.tensors[name]
    return not tensor.is_const and len(tensor.shape) == 4 and tensor.shape[0] == 1


def _rsqrt_input(graph: Graph, node: Node, half: bool) -> str | None:
    """The x of a 1/sqrt (or, float16, sqrt) this pass replaces, None for other nodes."""
    if node.op_type == "Pow" and len(node.inputs) == 2 and scalar(const(graph, node.inputs[1])) == -0.5:
        return node.inputs[0]
    if node.op_type == "Reciprocal":
        sqrt = producer(graph, node.inputs[0])
        if sqrt is not None and sqrt.op_type == "Sqrt" and len(readers(graph, sqrt.outputs[0])) == 1:
            return sqrt.inputs[0]
    if node.op_type == "Sqrt" and half and not any(r.op_type == "Reciprocal" for r in readers(graph, node.outputs[0])):
        return node.inputs[0]
    return None


def _expandable(node: Node, half: bool) -> bool:
    """A float16 whole 1/sqrt whose floor is below the top piece's: one table cannot hold it."""
    if node.op_type != RSQRT or not half:
        return False
    alpha, beta = attributes(node.attrs.get("alpha"), node.attrs.get("beta"))
    return beta == 0 and alpha < TOP_FLOOR


def rsqrt_on_npu(graph: Graph, ctx: PassContext) -> int:
    """Pow(x, -0.5), Reciprocal(Sqrt(x)) and float16 Sqrt(x) as Rsqrt look-up tables (float16: the
    product of pieces); where one of the new layers would be a host step, nothing changes."""
    half = ctx.element_bytes == 2
    changed = 0
    for node in list(graph.nodes):
        if node not in graph.nodes:
            continue
        x = _rsqrt_input(graph, node, half) if node.op_type != RSQRT else None
        if x is not None and _feature_map(graph, x):
            changed += _replace(graph, node, x, half, ctx)
        elif _expandable(node, half) and _feature_map(graph, node.inputs[0]):
            changed += _replace(graph, node, node.inputs[0], half, ctx)
        elif node.op_type == RSQRT and not half and node.attrs:
            node.attrs = {}  # int8: the default floor (the LayerNorm's eps floor changes no code's value)
            changed += 1
    return changed


def _replace(graph: Graph, node: Node, x: str, half: bool, ctx: PassContext) -> int:
    """Put the new nodes where ``node`` is (and drop a Sqrt only it read), unless the partition
    would run one of them on the host."""
    index = graph.nodes.index(node)
    sqrt_only = node.op_type == "Reciprocal"
    floor = node.attrs.get("alpha") if node.op_type == RSQRT else None
    y = node.outputs[0]
    base = node.name if node.name.endswith("rsqrt") else f"{node.name}_rsqrt"
    new = _sqrt_nodes(graph, x, y, base) if node.op_type == "Sqrt" else _rsqrt_nodes(graph, x, y, base, half, floor)
    graph.nodes[index:index + 1] = new
    if any(decide(graph, n, ctx).target != "NPU" for n in new):
        graph.nodes[index:index + len(new)] = [node]
        graph.remove_dead()
        return 0
    if sqrt_only:
        graph.remove_dead()
    return 1


def _sqrt_nodes(graph: Graph, x: str, y: str, base: str) -> list[Node]:
    """float16 sqrt(x) = x * rsqrt(x) (0 stays 0)."""
    r = add_tensor_like(graph, base, graph.tensors[x].shape, graph.tensors[x].dtype)
    return [*_rsqrt_nodes(graph, x, r, base, True, None),
            Node(graph.unique_node_name(f"{base}_times_input"), "Mul", [x, r], [y], {})]


class _InGraph:
    """Where the graph pass puts the chain's tensors and names: straight into the graph."""

    target = None  # the partition decides

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def tensor(self, name: str) -> Tensor:
        return self.graph.tensors[name]

    def feature(self, base: str, like_tensor: str) -> str:
        tensor = self.graph.tensors[like_tensor]
        return add_tensor_like(self.graph, base, tensor.shape, tensor.dtype)

    def constant(self, base: str, data: np.ndarray) -> str:
        return new_constant(self.graph, base, data)

    def node_name(self, base: str) -> str:
        return self.graph.unique_node_name(base)


class _Collected:
    """Build stage 5 (layer_records._expand): new float16 tensors collected, the graph unchanged
    (the caller adds them to its copy); names unique against the graph and each other."""

    target = "NPU"

    def __init__(self, graph: Graph) -> None:
        self.graph, self.tensors, self.names = graph, [], set()

    def _name(self, base: str) -> str:
        name = base
        index = 0
        while name in self.graph.tensors or name in self.names:
            index += 1
            name = f"{base}_{index}"
        self.names.add(name)
        return name

    def tensor(self, name: str) -> Tensor:
        return next((t for t in self.tensors if t.name == name), None) or self.graph.tensors[name]

    def feature(self, base: str, like_tensor: str) -> str:
        tensor = self.tensor(like_tensor)
        self.tensors.append(Tensor(self._name(base), tuple(tensor.shape), tensor.dtype, quant=FLOAT16))
        return self.tensors[-1].name

    def constant(self, base: str, data: np.ndarray) -> str:
        quant = FLOAT16 if data.ndim == 4 else None  # fp16 weights, a float32 bias (as lower_softmax's)
        data = np.asarray(data, np.float32)
        self.tensors.append(Tensor(self._name(base), tuple(data.shape), "float32", data=data, quant=quant))
        return self.tensors[-1].name

    def node_name(self, base: str) -> str:
        return self._name(base)


def _rsqrt_nodes(graph: Graph, x: str, y: str, base: str, half: bool, floor: float | None,
                 sink=None) -> list[Node]:
    """The Rsqrt layer (int8) or the float16 product of pieces writing ``y``; names from ``base``,
    new tensors through ``sink`` (default: into the graph)."""
    sink = _InGraph(graph) if sink is None else sink
    if not half:
        return [Node(sink.node_name(base), RSQRT, [x], [y], {}, target=sink.target)]
    floor = max(FP16_FLOOR, RSQRT_FLOOR if floor is None else float(floor))
    lower = pieces(floor)
    if not lower:
        return [Node(sink.node_name(base), RSQRT, [x], [y], {"alpha": max(floor, TOP_FLOOR)}, target=sink.target)]
    nodes: list[Node] = []
    sources = [x]  # x, x * 2^15, x * 2^30: what the pieces read (module docstring)
    partial = sink.feature(f"{base}_top", x)
    nodes.append(Node(sink.node_name(f"{base}_top"), RSQRT, [x], [partial], {"alpha": TOP_FLOOR},
                      target=sink.target))
    for number, (alpha, beta) in enumerate(lower, 1):
        times = scalings(beta)
        while len(sources) <= times:
            sources.append(_scaled_input(sink, sources[-1], f"{base}_scale{len(sources)}", nodes))
        source, factor = sources[times], SCALE ** times
        piece = sink.feature(f"{base}_piece{number}", x)
        nodes.append(Node(sink.node_name(f"{base}_piece{number}"), RSQRT, [source], [piece],
                          {"alpha": alpha * factor, "beta": beta * factor}, target=sink.target))
        product = y if number == len(lower) else sink.feature(f"{base}_product{number}", x)
        nodes.append(Node(sink.node_name(f"{base}_product{number}"), "Mul", [partial, piece],
                          [product], {}, target=sink.target))
        partial = product
    return nodes


def _scaled_input(sink, x: str, name: str, nodes: list[Node]) -> str:
    """x * 2^15 by a depthwise 1x1 conv (one output channel per input channel): exact, or inf."""
    channels = sink.tensor(x).shape[1]
    weight = sink.constant(f"{name}_weight", np.full((channels, 1, 1, 1), SCALE))
    bias = sink.constant(f"{name}_bias", np.zeros(channels))
    scaled = sink.feature(name, x)
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": channels}
    nodes.append(Node(sink.node_name(name), "Conv", [x, weight, bias], [scaled], attrs, target=sink.target))
    return scaled


def expand_rsqrt(graph: Graph, node: Node) -> tuple[list[Tensor], list[Node]] | None:
    """Build stage 5 (layer_records._expand, as lower_softmax / lower_glu): (new tensors, nodes)
    of an NPU Rsqrt stored in float16 whose floor one table cannot hold - an int8 build's Rsqrt
    a quant config or auto-hybrid set to float16 (LOWERING.md 24) - as the product of pieces the
    float16 graph pass makes; None for any other node. Input and output in different precisions
    (not a hybrid build's DataConvert boundary) stay one host step."""
    if node.op_type != RSQRT or node.target != "NPU":
        return None
    source, output = graph.tensor(node.inputs[0]), graph.tensor(node.outputs[0])
    if output.quant is None or output.quant.dtype != "float16":
        return None
    if not _expandable(node, True):
        return None
    if source.quant is None or source.quant.dtype != "float16" or not _feature_map(graph, source.name):
        return [], [dataclasses.replace(node, target="CPU")]
    sink = _Collected(graph)
    base = node.name if node.name.endswith("rsqrt") else f"{node.name}_rsqrt"
    nodes = _rsqrt_nodes(graph, source.name, output.name, base, True, node.attrs.get("alpha"), sink)
    return sink.tensors, nodes


__all__ = ["RSQRT", "expand_rsqrt", "pieces", "rsqrt", "rsqrt_on_npu", "scalings"]
