"""MatMul of two activations on the NPU (LOWERING.md 37): the graph pass that makes ``ActMatMul``
layers (lower_matmul_act.py: per head and 8-channel surface a 1x1 conv whose weights are the
second operand's bytes, as an earlier task wrote them).

``Y = A B`` with A ``[.., T, K]`` and B ``[.., K, N]`` (one batch axis of H heads at most,
constraints.matmul_form) becomes ``ActMatMul(X, W)`` on the channel-major forms X
``[1, H K, 1, T]`` and W ``[1, H K, 1, N]``, writing ``[1, N, H, T]``. The operands' layout
changes are found, not inserted, where the graph already has them:

- walking back from A (or B) through layout-only ops (Transpose, Reshape, Squeeze, ...) to a
  tensor whose stored elements already are X (W) in order - the channel-major map of a token
  region (LOWERING.md 21), where ``MatMul(q, Transpose(k))`` finds k's map as W: the second
  operand in its native layout;
- else, for a graph input that nothing else reads, the runtime's readin of it permuted
  (``Readin``, LOWERING.md 33.4: the vendor's runtime converts every input's layout too);
- else a Transpose and a Reshape (host steps, or the DPU's H <-> W transpose).

The result is delivered the same ways: to a tensor further on that holds it in order, as the
runtime's readout of a graph output (``Readout``: ``[1, N, H, T]`` is ``[1, H, T, N]`` in NHWC
order), or through a Transpose and a Reshape. A rewrite is kept only where the ActMatMul runs
on the NPU and the graph then has fewer host steps (on a trial copy); otherwise the MatMul stays
a host step and the partition report names the limit (constraints.matmul_activations). In int8
builds the ActMatMul is a float16 island (quant/islands.py ISLAND_ATTR; LOWERING.md 26, 37).
"""

from __future__ import annotations

from copy import deepcopy
from itertools import permutations

import numpy as np

from ..ir import Graph, Node, Tensor
from ..quant.islands import ISLAND_ATTR
from .constraints import matmul_form
from .context import PassContext
from .input_readin import READIN
from .lower_matmul_act import ACT_MATMUL, CHANNEL_ALIGN, CHANNELS, ROWS
from .match import producer, readers
from .output_readout import readout_node
from .partition import decide
from .tokens_as_channels import PARTNERS, TRIAL_PASSES

#: ops that only rearrange elements: the walk looks through them for a tensor already in order
LAYOUT_OPS = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def matmul_activations_on_npu(graph: Graph, ctx: PassContext) -> int:
    """MatMul of two activations as an ActMatMul: run-time-weight convs (LOWERING.md 37)."""
    changed = 0
    for name in [node.name for node in graph.nodes if node.op_type == "MatMul"]:
        node = next((n for n in graph.nodes if n.name == name), None)
        if node is None or node.fused or isinstance(matmul_form(graph, node), str):
            continue
        trial = deepcopy(graph)
        made = _rewrite(trial, trial.node(name), matmul_form(graph, node), ctx)
        if made is None or decide(trial, made, ctx).target != "NPU":
            continue
        if _host_steps(trial, ctx) >= _host_steps(graph, ctx):
            continue
        graph.nodes[:] = trial.nodes
        graph.tensors.clear()
        graph.tensors.update(trial.tensors)
        changed += 1
    return changed


def _host_steps(graph: Graph, ctx: PassContext) -> int:
    live = deepcopy(graph)
    live.remove_dead()
    return sum(decide(live, node, ctx).target != "NPU" for node in live.nodes)


def _rewrite(graph: Graph, node: Node, form: tuple[int, int, int, int], ctx: PassContext) -> Node | None:
    heads, tokens, depth, columns = form
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    feature = _index(graph, a).reshape(heads, tokens, depth).transpose(0, 2, 1).reshape(1, heads * depth, 1, tokens)
    weights = _index(graph, b).reshape(1, heads * depth, 1, columns)
    x = _source(graph, a, feature, node)
    w = _source(graph, b, weights, node)
    # for each element of the output, its flat index in Y: "rows" out[0, n, h, t] = Y[h, t, n];
    # "channels" (heads merged on the channels, where a later tensor holds them so) out[0, h N + n, 0, t]
    result = _index(graph, y).reshape(heads, tokens, columns)
    layout, placed = ROWS, result.transpose(2, 0, 1)[None]
    merged = result.transpose(0, 2, 1).reshape(1, heads * columns, 1, tokens)
    if heads > 1 and columns % CHANNEL_ALIGN == 0 and _downstream(graph, y, merged) is not None:
        layout, placed = CHANNELS, merged
    out = graph.add_tensor(Tensor(graph.unique_tensor_name(f"{y}_columns"), placed.shape, "float32")).name
    made = Node(graph.unique_node_name(f"{node.name}_act"), ACT_MATMUL, [x, w], [out],
                {"heads": heads, "layout": layout})
    if ctx.element_bytes == 1:
        made.attrs[ISLAND_ATTR] = True  # computed in float16 between DataConverts (LOWERING.md 37)
    graph.nodes[graph.nodes.index(node)] = made
    _deliver(graph, made, y, placed)
    graph.remove_dead()
    return made


def _index(graph: Graph, name: str) -> np.ndarray:
    shape = graph.tensors[name].shape
    return np.arange(int(np.prod(shape))).reshape(shape)


def _moved(node: Node, source: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A layout op applied to an array (of the source's flat indices)."""
    if node.op_type == "Transpose":
        return np.transpose(source, node.attrs["perm"]).reshape(shape)
    return source.reshape(shape)


def _perm(shape: tuple[int, ...], wanted: np.ndarray) -> list[int] | None:
    """A perm p with transpose(arange(shape), p) in raster order = ``wanted`` (flat), else None."""
    base = np.arange(int(np.prod(shape))).reshape(shape)
    return next((list(p) for p in permutations(range(len(shape)))
                 if np.array_equal(np.transpose(base, p).reshape(-1), wanted.reshape(-1))), None)


def _in_order(graph: Graph, name: str, index: np.ndarray) -> bool:
    return tuple(graph.tensors[name].shape) == index.shape and np.array_equal(index.reshape(-1), np.arange(index.size))


def _source(graph: Graph, name: str, index: np.ndarray, reader: Node) -> str:
    """A tensor whose elements are ``name``'s at ``index`` in raster order: found back through
    layout ops, a graph input's readin, or a new Transpose + Reshape inserted before ``reader``."""
    current, mapping, alone = name, index, True
    while not _in_order(graph, current, mapping):
        made = producer(graph, current)
        if made is None or made.op_type not in LAYOUT_OPS or made.fused or current in graph.outputs:
            break
        alone = alone and len(readers(graph, current)) == 1
        source = made.inputs[0]
        mapping = _moved(made, _index(graph, source), graph.tensors[current].shape).reshape(-1)[mapping]
        current = source
    if _in_order(graph, current, mapping):
        return current
    alone = alone and len(readers(graph, current)) == 1
    perm = _perm(graph.tensors[current].shape, mapping)
    if current in graph.inputs and alone and perm is not None and current not in graph.outputs:
        stored = graph.add_tensor(Tensor(graph.unique_tensor_name(f"{current}_stored"), mapping.shape, "float32")).name
        graph.nodes.insert(0, Node(graph.unique_node_name(f"{current}_readin"), READIN, [current], [stored],
                                   {"perm": perm, "shape": list(mapping.shape)}))
        return stored
    return _converted(graph, name, index, graph.nodes.index(reader))


def _converted(graph: Graph, name: str, index: np.ndarray, position: int) -> str:
    """``name`` transposed and reshaped by new nodes before ``graph.nodes[position]``."""
    shape = tuple(graph.tensors[name].shape)
    perm = _perm(shape, index)
    nodes, current = [], name
    if perm != list(range(len(shape))):
        moved = graph.add_tensor(Tensor(graph.unique_tensor_name(f"{name}_moved"),
                                        tuple(shape[p] for p in perm), "float32")).name
        nodes.append(Node(graph.unique_node_name(f"{name}_transpose"), "Transpose", [current], [moved], {"perm": perm}))
        current = moved
    if tuple(graph.tensors[current].shape) != index.shape:
        shaped = graph.add_tensor(Tensor(graph.unique_tensor_name(f"{name}_shaped"), index.shape, "float32")).name
        nodes.append(Node(graph.unique_node_name(f"{name}_reshape"), "Reshape", [current], [shaped],
                          {"shape": list(index.shape)}))
        current = shaped
    graph.nodes[position:position] = nodes
    return current


def _inverse(placed: np.ndarray) -> np.ndarray:
    inverse = np.empty(placed.size, np.int64)
    inverse[placed.reshape(-1)] = np.arange(placed.size)  # y's element j is the output's inverse[j]
    return inverse


def _downstream(graph: Graph, y: str, placed: np.ndarray) -> str | None:
    """A tensor after ``y`` (through layout ops, each read only by the next) holding the output
    (element i = y's flat element ``placed[i]``) in raster order, else None."""
    current, mapping = y, _inverse(placed)
    while current not in graph.outputs and len(readers(graph, current)) == 1:
        after = readers(graph, current)[0]
        if after.op_type not in LAYOUT_OPS or after.fused:
            return None
        current, mapping = after.outputs[0], _moved(after, mapping.reshape(graph.tensors[current].shape),
                                                    graph.tensors[after.outputs[0]].shape).reshape(-1)
        if tuple(graph.tensors[current].shape) == placed.shape and np.array_equal(mapping, np.arange(placed.size)):
            return current
    return None


def _deliver(graph: Graph, made: Node, y: str, placed: np.ndarray) -> None:
    """Make ``y`` (the MatMul's output) from ``made``'s output, whose element i is y's flat
    element ``placed[i]``: a tensor further on that holds it in order takes made's output,
    a graph output nothing reads is the runtime's readout, else Transpose + Reshape."""
    out, inverse = made.outputs[0], _inverse(placed)
    target = _downstream(graph, y, placed)
    if target is not None:
        graph.nodes.remove(producer(graph, target))
        made.outputs = [target]
        graph.tensors.pop(out)
        return
    position = graph.nodes.index(made) + 1
    perm = _perm(placed.shape, inverse)
    if y in graph.outputs and not readers(graph, y) and perm is not None:
        graph.nodes.insert(position, readout_node(graph.unique_node_name(f"{y}_readout"), out, y, perm,
                                                  graph.tensors[y].shape))
        return
    converted = _converted(graph, out, inverse.reshape(graph.tensors[y].shape), position)
    if y in graph.outputs:  # the last new node writes the graph output under its name
        producer(graph, converted).outputs = [y]
        graph.tensors.pop(converted)
    else:
        graph.replace_uses(y, converted)


# ---- token regions (LOWERING.md 21): the FCs on both sides of a MatMul of two activations -------

def matmul_partners(graph: Graph, seed: Node, ctx: PassContext) -> list[Node]:
    """The FullyConnected nodes writing the operands or reading the result (through layout ops) of
    a MatMul of two activations that ``seed``'s inputs or outputs reach through layout ops: the
    regions on both sides only pay off together, once the MatMul runs here (q k^T between the q
    and k projections)."""
    found = [node for name in seed.inputs if name for node in _layout_walk(graph, name, False)] + \
        [node for name in seed.outputs for node in _layout_walk(graph, name, True)]
    partners = []
    for matmul in found:
        if matmul.op_type != "MatMul" or isinstance(matmul_form(graph, matmul), str):
            continue
        ends = [node for name in matmul.inputs[:2] for node in _layout_walk(graph, name, False)] + \
            _layout_walk(graph, matmul.outputs[0], True)
        partners += [node for node in ends if node.op_type == "FullyConnected" and node is not seed
                     and not any(node is other for other in partners)]
    return partners


def _layout_walk(graph: Graph, name: str, forward: bool) -> list[Node]:
    """The first non-layout nodes reading (``forward``) or writing ``name`` through layout ops."""
    ends, frontier, seen = [], [name], {name}
    while frontier:
        current = frontier.pop()
        nodes = readers(graph, current) if forward else [n for n in [producer(graph, current)] if n is not None]
        for node in nodes:
            if node.op_type not in LAYOUT_OPS or node.fused:
                ends.append(node)
                continue
            for item in (node.outputs if forward else node.inputs[:1]):
                if item not in seen:
                    seen.add(item)
                    frontier.append(item)
    return ends


if matmul_partners not in PARTNERS:
    PARTNERS.append(matmul_partners)
if matmul_activations_on_npu not in TRIAL_PASSES:  # a region pays off where its MatMul then runs here
    TRIAL_PASSES.append(matmul_activations_on_npu)

__all__ = ["LAYOUT_OPS", "matmul_activations_on_npu", "matmul_partners"]
