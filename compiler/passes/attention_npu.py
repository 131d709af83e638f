"""Multi-head attention on the NPU in float16 (LOWERING.md 22.3): the graph pass that makes
``HeadAttention`` layers (lower_attention.py: the two MatMuls of two activations as 1x1 convs
whose weights an earlier task wrote, the Softmax as 22.2's chain).

The graph pass :func:`attention_as_head_convs` finds the attention between channel-major qkv
projection convs (one fused or three) and the convs reading its result (what
``tokens_as_channels`` leaves: Reshape, Transpose, Slice/Squeeze, MatMul, scale, Softmax,
MatMul, Transpose, Reshape on the host), checks numerically that the subgraph is attention
(float evaluation against ``head_attention`` on random inputs), and replaces it: one
projection conv writes the channels in padded heads with the scale folded into q, the
readers' input channels are spread likewise. Two hooks of ``tokens_as_channels`` let the
regions on both sides of an attention body be converted together (``attention_partners``)
and count the attention as NPU work when deciding (this pass in ``TRIAL_PASSES``).
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, replace
from itertools import permutations

import numpy as np

from npuemu.isa.errors import CompileError

from ..float_eval import evaluate
from ..ir import Graph, Node, Tensor
from .context import PassContext
from .lower_attention import HEAD_ATTENTION, SURFACE, head_attention
from .match import bias_parts_only, const, new_constant, producer, readers, scalar
from .partition import decide
from .tokens_as_channels import PARTNERS, TRIAL_PASSES


# ---- the graph pass ----------------------------------------------------------------------------

#: ops of the attention body between the qkv projection and its readers (all host steps today)
BODY_OPS = {"Reshape", "Flatten", "Transpose", "Slice", "Squeeze", "Unsqueeze", "Gather", "Split", "MatMul", "Mul",
            "Div", "Softmax", "Identity"}


@dataclass
class _Attention:
    sources: list[str]  # the projections' outputs: one [1, 3 H d, 1, T] (fused qkv) or q, k, v
    y: str  # the merged heads [1, H d, 1, T]
    body: list[Node]
    projections: list[Node]  # the 1x1 convs writing ``sources``, in the same order
    heads: int
    depth: int
    scale: float
    head_major: bool = False  # fused qkv channels [H, 3, d] instead of [3, H, d]


def attention_as_head_convs(graph: Graph, ctx: PassContext) -> int:
    """Channel-major multi-head attention between 1x1 convs as one HeadAttention (float16 builds;
    in int8 builds a float16 island between DPU DataConverts, quant/islands.py, LOWERING.md 26)."""
    changed = 0
    for softmax in [node for node in graph.nodes if node.op_type == "Softmax"]:
        if not any(node is softmax for node in graph.nodes):
            continue
        found = _find(graph, softmax)
        if found is None or not _settle_layout(graph, found):
            continue
        trial = deepcopy(graph)
        if _rewrite(trial, found, ctx):
            graph.nodes[:] = trial.nodes
            graph.tensors.clear()
            graph.tensors.update(trial.tensors)
            changed += 1
    return changed


def _component(graph: Graph, start: list[str]) -> tuple[list[Node], list[str], list[str]]:
    """(BODY_OPS nodes joined to the tensors ``start`` through their non-constant tensors, the
    tensors they read that none of them writes, the ones they write that others read)."""
    made, read = _links(graph)
    body, inside, frontier, seen = [], set(), list(start), set(start)
    while frontier:
        name = frontier.pop()
        made_by = made.get(name)
        for node in [*read.get(name, ()), *([made_by] if made_by is not None else [])]:
            if node.op_type not in BODY_OPS or id(node) in inside:
                continue
            body.append(node)
            inside.add(id(node))
            for item in [*node.inputs, *node.outputs]:
                if item and item not in seen and const(graph, item) is None:
                    seen.add(item)
                    frontier.append(item)
    produced = {out for node in body for out in node.outputs if out}
    sources = list(dict.fromkeys(name for node in body for name in node.inputs
                                 if name and name not in produced and const(graph, name) is None))
    exits = [name for name in dict.fromkeys(out for node in body for out in node.outputs if out)
             if name in graph.outputs or any(id(node) not in inside for node in read.get(name, ()))]
    return body, sources, exits


def _links(graph: Graph) -> tuple[dict[str, Node], dict[str, list[Node]]]:
    """match.producer and match.readers for every tensor at once (one pass over the nodes)."""
    made: dict[str, Node] = {}
    read: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for out in node.outputs:
            made.setdefault(out, node)
        for name in dict.fromkeys(node.all_inputs):
            read.setdefault(name, []).append(node)
    return made, read


def _find(graph: Graph, softmax: Node) -> _Attention | None:
    """The body around ``softmax``: BODY_OPS nodes from one fused qkv projection conv (or three,
    one per q, k, v, reading the same map) to one tensor y read only as the input of 1x1 convs,
    two MatMuls and one Softmax among them."""
    body, sources, exits = _component(graph, [softmax.inputs[0]])
    ops = [node.op_type for node in body]
    if len(exits) != 1 or len(sources) not in (1, 3) or ops.count("MatMul") != 2 or ops.count("Softmax") != 1:
        return None
    y = exits[0]
    projections = [producer(graph, name) for name in sources]
    inside = {id(node) for node in body}
    if any(conv is None or not _plain_1x1(graph, conv) or not bias_parts_only(conv) or len(conv.outputs) != 1
           or conv.inputs[0] != projections[0].inputs[0] for conv in projections) \
            or any(id(node) not in inside for name in sources for node in readers(graph, name)) \
            or any(name in graph.outputs for name in sources) or y in graph.outputs:
        return None
    if not all(_plain_1x1(graph, node) and node.inputs[0] == y and y not in node.inputs[1:]
               and not any(y in part.inputs for part in node.fused) for node in readers(graph, y)):
        return None
    dims = graph.tensors[softmax.inputs[0]].shape
    if len(dims) != 4 or int(softmax.attrs.get("axis", -1)) % 4 != 3 or softmax.attrs.get("flatten_2d"):
        return None
    scale = _scale(graph, body)
    if scale is None:
        return None
    body.sort(key=lambda node: next(i for i, other in enumerate(graph.nodes) if other is node))
    return _Attention(sources, y, body, projections, int(dims[1]), 0, scale)


def _plain_1x1(graph: Graph, node: Node) -> bool:
    """A 1x1 group-1 Conv with constant weights on a [1, C, 1, T] map."""
    if node.op_type != "Conv" or const(graph, node.inputs[1]) is None or node.attrs.get("group", 1) != 1:
        return False
    dims = graph.tensors[node.inputs[0]].shape
    return tuple(node.attrs.get("kernel_shape", ())) in ((1, 1), [1, 1]) and len(dims) == 4 and dims[2] == 1 \
        and list(node.attrs.get("strides", [1, 1])) == [1, 1] and not any(node.attrs.get("pads", [0] * 4))


def _scale(graph: Graph, body: list[Node]) -> float | None:
    """The product of the body's scalar Mul / Div constants (the scores' 1/sqrt(d))."""
    scale = 1.0
    for node in body:
        if node.op_type not in ("Mul", "Div"):
            continue
        constants = [scalar(const(graph, name)) for name in node.inputs if const(graph, name) is not None]
        divisor_only = node.op_type != "Div" or const(graph, node.inputs[1]) is not None
        if len(constants) != 1 or constants[0] is None or not divisor_only:
            return None
        scale = scale * constants[0] if node.op_type == "Mul" else scale / constants[0]
    return scale


def _settle_layout(graph: Graph, found: _Attention) -> bool:
    """Fill in d and which channels are q, k, v by evaluating the body on random projections and
    comparing with :func:`head_attention` (the body must compute attention, up to float
    rounding): for a fused projection its two usual orders, for three projections which is which."""
    y = graph.tensors[found.y].shape
    shapes = [graph.tensors[name].shape for name in found.sources]
    channels = sum(shape[1] for shape in shapes)
    if any(len(shape) != 4 or shape[2] != 1 or shape[3] != y[3] for shape in shapes) or len(y) != 4 \
            or channels % (3 * found.heads) or y[1] * 3 != channels or len({shape[1] for shape in shapes}) != 1:
        return False
    found.depth = channels // (3 * found.heads)
    body = Graph("attention_body", inputs=list(found.sources), outputs=[found.y])
    for node in found.body:
        for name in [*node.inputs, *node.outputs]:
            if name:
                body.tensors[name] = graph.tensors[name]
    body.nodes = deepcopy(found.body)
    rng = np.random.default_rng(0)
    values = [rng.normal(0, 1, shape).astype(np.float32) for shape in shapes]
    try:
        got = np.asarray(evaluate(body, dict(zip(found.sources, values)))[found.y], np.float64)
    except (CompileError, ValueError, IndexError):
        return False
    fused = len(found.sources) == 1
    for perm, head_major in [((0,), False), ((0,), True)] if fused else [(p, False) for p in permutations(range(3))]:
        found.head_major = head_major
        z = np.concatenate([values[i] for i in perm], axis=1)[:, _qkv_order(found)]
        z = z * np.repeat([found.scale, 1.0, 1.0], found.heads * found.depth)[None, :, None, None]
        want = head_attention({"heads": found.heads, "head_channels": found.depth}, [z.astype(np.float64)])
        if np.allclose(got, want, rtol=1e-4, atol=1e-5):
            found.sources = [found.sources[i] for i in perm]
            found.projections = [found.projections[i] for i in perm]
            return True
    return False


def _qkv_order(found: _Attention) -> np.ndarray:
    """The projections' channel (concatenated in q, k, v order) of canonical channel
    (part, h, e) = (part H + h) d + e."""
    heads, depth = found.heads, found.depth
    part, head, e = np.meshgrid(range(3), range(heads), range(depth), indexing="ij")
    if found.head_major:
        return ((head * 3 + part) * depth + e).reshape(-1)
    return ((part * heads + head) * depth + e).reshape(-1)


def _bias(graph: Graph, conv: Node) -> np.ndarray:
    """A bias-only conv's per-channel bias: its bias input plus its fused constant Adds."""
    channels = const(graph, conv.inputs[1]).shape[0]
    total = np.zeros(channels, np.float64)
    if len(conv.inputs) > 2 and conv.inputs[2]:
        total += np.asarray(const(graph, conv.inputs[2]), np.float64).reshape(-1)
    for part in conv.fused:
        total += np.broadcast_to(np.asarray(const(graph, part.inputs[0]), np.float64).reshape(-1), (channels,))
    return total


def _padded(depth: int) -> int:
    return -(-depth // SURFACE) * SURFACE


def _rewrite(graph: Graph, found: _Attention, ctx: PassContext) -> bool:
    """One projection conv with its channels in padded heads (q scaled), HeadAttention, readers'
    channels likewise; False (graph half-edited: the caller's trial copy) where the partition
    would not run it."""
    found = replace(found, projections=[graph.node(n.name) for n in found.projections],
                    body=[graph.node(n.name) for n in found.body])
    heads, depth, width = found.heads, found.depth, _padded(found.depth)
    tokens = graph.tensors[found.y].shape[3]
    # canonical (part, h, e) -> padded channel (part H + h) P + e; the padding channels stay 0
    part, head, e = np.meshgrid(range(3), range(heads), range(depth), indexing="ij")
    placed, order = ((part * heads + head) * width + e).reshape(-1), _qkv_order(found)
    factor = np.repeat([found.scale, 1.0, 1.0], heads * depth)
    weights = np.concatenate([const(graph, conv.inputs[1]) for conv in found.projections])
    bias = np.concatenate([_bias(graph, conv) for conv in found.projections])
    wide_weights = np.zeros((3 * heads * width, *weights.shape[1:]), np.float32)
    wide_weights[placed] = weights[order] * factor[:, None, None, None]
    wide_bias = np.zeros(3 * heads * width, np.float32)
    wide_bias[placed] = bias[order] * factor
    conv = found.projections[0]
    z = graph.add_tensor(Tensor(graph.unique_tensor_name(f"{found.sources[0]}_heads"),
                                (1, 3 * heads * width, 1, tokens), "float32")).name
    y = graph.add_tensor(Tensor(graph.unique_tensor_name(f"{found.y}_heads"), (1, heads * width, 1, tokens),
                                "float32")).name
    conv.inputs = [conv.inputs[0], new_constant(graph, f"{conv.name}_heads_weight", wide_weights),
                   new_constant(graph, f"{conv.name}_heads_bias", wide_bias)]
    conv.fused, conv.outputs = [], [z]
    merged = (np.arange(heads)[:, None] * width + np.arange(depth)[None, :]).reshape(-1)
    for reader in readers(graph, found.y):
        weights = const(graph, reader.inputs[1])
        wide = np.zeros((weights.shape[0], heads * width, 1, 1), np.float32)
        wide[:, merged] = weights
        reader.inputs = [y, new_constant(graph, f"{reader.name}_heads_weight", wide), *reader.inputs[2:]]
    node = Node(graph.unique_node_name(f"{found.sources[0]}_attention"), HEAD_ATTENTION, [z], [y],
                {"heads": heads, "head_channels": width})
    gone = {id(n) for n in [*found.body, *found.projections[1:]]}
    index = next(i for i, n in enumerate(graph.nodes) if n is conv) + 1
    graph.nodes[:] = [n for n in graph.nodes[:index] if id(n) not in gone] + [node] + \
        [n for n in graph.nodes[index:] if id(n) not in gone]
    for name in {out for n in found.body for out in n.outputs} | set(found.sources):
        graph.tensors.pop(name, None)
    graph.remove_dead()
    return decide(graph, node, ctx).target == "NPU"


def attention_partners(graph: Graph, seed: Node, ctx: PassContext) -> list[Node]:
    """The FullyConnected nodes at the other ends of an attention body (BODY_OPS nodes joined
    through their tensors, two MatMuls and a Softmax among them) that ``seed`` touches (int8 builds
    too: the attention is a float16 island there, LOWERING.md 26)."""
    if seed.op_type != "FullyConnected":
        return []
    body, sources, exits = _component(graph, [seed.outputs[0], seed.inputs[0]])
    ops = [node.op_type for node in body]
    if ops.count("MatMul") != 2 or ops.count("Softmax") != 1:
        return []
    inside = {id(node) for node in body}
    ends = [producer(graph, name) for name in sources] + [node for name in exits for node in readers(graph, name)
                                                          if id(node) not in inside]
    return [node for node in _unique(ends) if node.op_type == "FullyConnected" and node is not seed]


def _unique(nodes: list) -> list[Node]:
    kept: list[Node] = []
    for node in nodes:
        if node is not None and not any(node is other for other in kept):
            kept.append(node)
    return kept


if attention_partners not in PARTNERS:
    PARTNERS.append(attention_partners)
if attention_as_head_convs not in TRIAL_PASSES:  # a region is worth converting if its attention then runs here
    TRIAL_PASSES.append(attention_as_head_convs)

__all__ = ["BODY_OPS", "attention_as_head_convs", "attention_partners"]
