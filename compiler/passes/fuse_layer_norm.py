"""ReduceMean+Sub+Pow+ReduceMean+Add+Sqrt+Div(+Mul+Add) -> LayerNormalization (the guide's
§8.5.3 subgraph match).

The match, for an input ``x``:

    m = ReduceMean(x, axes A, keepdims)      d = Sub(x, m)
    v = ReduceMean(Pow(d, 2) or Mul(d, d), axes A, keepdims)
    y = Div(d, Sqrt(Add(v, eps)))            [y = Mul(y, gamma)] [y = Add(y, beta)]

``A`` must be the trailing axes ``axis..rank-1`` (what LayerNormalization normalizes), the
same in both means; ``eps`` a scalar constant added to the variance *before* the square
root; ``gamma``/``beta`` constants that vary only over the normalized axes. ``d`` is read by
exactly the square and the division, every other intermediate only by the next node. A
LayerNorm over other axes, with eps after the root, or with a statistic used elsewhere is
not fused. Both forms then take the same road: over the last axis of a [1, T, C] token tensor,
``tokens_as_channels`` makes it the channel normalization of ``layer_norm_npu`` (LOWERING.md 21);
elsewhere it is one host step.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .context import PassContext
from .match import const, only_read_by, other_input, scalar, sole_reader
from .subgraph import only_inside, replace


def _trailing_axis(graph: Graph, mean: Node) -> int | None:
    rank = len(graph.tensors[mean.inputs[0]].shape)
    axes = mean.attrs["axes"]
    if not mean.attrs["keepdims"] or not axes or axes != list(range(axes[0], rank)):
        return None
    return axes[0]


def _square_of(graph: Graph, node: Node, d: str) -> bool:
    if node.op_type == "Mul":
        return node.inputs == [d, d]
    return node.op_type == "Pow" and node.inputs[0] == d and scalar(const(graph, node.inputs[1])) == 2.0


def _affine_constant(graph: Graph, node: Node, y: str, op_type: str, axis: int) -> np.ndarray | None:
    """The gamma (beta) of a Mul (Add) ``y`` by a constant varying only over axes >= ``axis``,
    broadcast to the normalized shape."""
    if node is None or node.op_type != op_type:
        return None
    value = const(graph, other_input(node, y) or "")
    shape = graph.tensors[y].shape
    if value is None or value.ndim > len(shape) or graph.tensors[node.outputs[0]].shape != shape:
        return None
    padded = value.reshape((1,) * (len(shape) - value.ndim) + value.shape)
    if any(size != 1 for size in padded.shape[:axis]):
        return None
    return np.broadcast_to(padded, shape)[(0,) * axis].astype(np.float32)


def _statistics(graph: Graph, mean: Node) -> tuple[list[Node], str, float] | None:
    """The nodes from the first mean to the division, ``d``'s division output and eps."""
    x = mean.inputs[0]
    sub = sole_reader(graph, mean.outputs[0])
    if sub is None or sub.op_type != "Sub" or sub.inputs != [x, mean.outputs[0]]:
        return None
    d = sub.outputs[0]
    square = next((node for node in graph.nodes if node is not sub and d in node.inputs and _square_of(graph, node, d)), None)
    variance = None if square is None else sole_reader(graph, square.outputs[0])
    if variance is None or variance.op_type != "ReduceMean" or variance.attrs != mean.attrs:
        return None
    add = sole_reader(graph, variance.outputs[0])
    eps = None if add is None or add.op_type != "Add" else scalar(const(graph, other_input(add, variance.outputs[0]) or ""))
    root = None if eps is None else sole_reader(graph, add.outputs[0])
    if root is None or root.op_type != "Sqrt" or eps < 0:
        return None
    div = sole_reader(graph, root.outputs[0])
    if div is None or div.op_type != "Div" or div.inputs != [d, root.outputs[0]] or not only_read_by(graph, d, [square, div]):
        return None
    return [mean, sub, square, variance, add, root, div], div.outputs[0], eps


def layer_norm_subgraph(graph: Graph, ctx: PassContext) -> int:
    """ReduceMean+Sub+Pow+ReduceMean+Add+Sqrt+Div(+Mul+Add) becomes LayerNormalization."""
    found = 0
    for mean in [node for node in graph.nodes if node.op_type == "ReduceMean"]:
        axis = None if mean not in graph.nodes else _trailing_axis(graph, mean)
        stats = None if axis is None else _statistics(graph, mean)
        if stats is None:
            continue
        matched, y, eps = stats
        x = mean.inputs[0]
        normalized = graph.tensors[x].shape[axis:]
        scale_node = sole_reader(graph, y)
        gamma = _affine_constant(graph, scale_node, y, "Mul", axis)
        if gamma is not None:
            matched.append(scale_node)
            y = scale_node.outputs[0]
        else:
            gamma = np.ones(normalized, dtype=np.float32)
        shift_node = sole_reader(graph, y)
        beta = _affine_constant(graph, shift_node, y, "Add", axis)
        if beta is not None:
            matched.append(shift_node)
            y = shift_node.outputs[0]
        if not only_inside(graph, matched, y):
            continue
        inputs = [x, graph.add_constant(f"{mean.name}_scale", gamma).name]
        if beta is not None:
            inputs.append(graph.add_constant(f"{mean.name}_bias", beta).name)
        attrs = {"axis": axis, "epsilon": float(eps), "statistics_outputs": 0}
        replace(graph, matched, Node("", "LayerNormalization", inputs, [y], attrs))
        found += 1
    return found

