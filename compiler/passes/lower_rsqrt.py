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
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from ..lower.lut_rsqrt import FP16_ONE_TABLE_FLOOR, RSQRT_FLOOR, attributes, rsqrt_function
from ..ops import REGISTRY
from ..ops.base import as_float, like, register, same_as_input
from .context import PassContext
from .match import add_tensor_like, const, new_constant, producer, readers, scalar
from .partition import decide

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


def _rsqrt_nodes(graph: Graph, x: str, y: str, base: str, half: bool, floor: float | None) -> list[Node]:
    """The Rsqrt layer (int8) or the float16 product of pieces writing ``y``; names from ``base``."""
    if not half:
        return [Node(graph.unique_node_name(base), RSQRT, [x], [y], {})]
    floor = max(FP16_FLOOR, RSQRT_FLOOR if floor is None else float(floor))
    shape, dtype = graph.tensors[x].shape, graph.tensors[x].dtype
    lower = pieces(floor)
    if not lower:
        return [Node(graph.unique_node_name(base), RSQRT, [x], [y], {"alpha": max(floor, TOP_FLOOR)})]
    nodes: list[Node] = []
    sources = [x]  # x, x * 2^15, x * 2^30: what the pieces read (module docstring)
    partial = add_tensor_like(graph, f"{base}_top", shape, dtype)
    nodes.append(Node(graph.unique_node_name(f"{base}_top"), RSQRT, [x], [partial], {"alpha": TOP_FLOOR}))
    for number, (alpha, beta) in enumerate(lower, 1):
        times = scalings(beta)
        while len(sources) <= times:
            sources.append(_scaled_input(graph, sources[-1], f"{base}_scale{len(sources)}", nodes))
        source, factor = sources[times], SCALE ** times
        piece = add_tensor_like(graph, f"{base}_piece{number}", shape, dtype)
        nodes.append(Node(graph.unique_node_name(f"{base}_piece{number}"), RSQRT, [source], [piece],
                          {"alpha": alpha * factor, "beta": beta * factor}))
        product = y if number == len(lower) else add_tensor_like(graph, f"{base}_product{number}", shape, dtype)
        nodes.append(Node(graph.unique_node_name(f"{base}_product{number}"), "Mul", [partial, piece],
                          [product], {}))
        partial = product
    return nodes


def _scaled_input(graph: Graph, x: str, name: str, nodes: list[Node]) -> str:
    """x * 2^15 by a depthwise 1x1 conv (one output channel per input channel): exact, or inf."""
    shape, dtype = graph.tensors[x].shape, graph.tensors[x].dtype
    channels = shape[1]
    weight = new_constant(graph, f"{name}_weight", np.full((channels, 1, 1, 1), SCALE))
    bias = new_constant(graph, f"{name}_bias", np.zeros(channels))
    scaled = add_tensor_like(graph, name, shape, dtype)
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": channels}
    nodes.append(Node(graph.unique_node_name(name), "Conv", [x, weight, bias], [scaled], attrs))
    return scaled


__all__ = ["RSQRT", "pieces", "rsqrt", "rsqrt_on_npu", "scalings"]
