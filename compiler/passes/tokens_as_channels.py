"""Token regions as channel-major maps: the per-token layers of a transformer on ``[1, T, C]``
tensors (T tokens of C features) rewritten to ``[1, C, 1, T]`` - C channels, T pixels - where
the NPU has them (LOWERING.md section 21):

- a FullyConnected over the T rows (MatMul/Gemm against constant weights) is a 1x1 Conv over
  T pixels - the vendor's "1x1 conv between Transposes" (rknn-fixtures-ops matmul_rows_fp16:
  Conv (1,120,1,40) -> (1,360,1,40));
- LayerNormalization over the last axis is the channel normalization of ``layer_norm_npu``;
- element-wise ops (residual Adds, per-feature constants) and LUT activations act per element.

Like ``lift_1d`` (which lifts ``[1, C, L]`` with the channels first), the pass converts whole
connected regions: npuemu stores a ``[1, T, C]`` tensor as one channel of T rows
(``isa.container_views.tensor_cube``), so every change between the two forms is a host step.
Inside a region no tensor changes form; at its edges one Transpose and one Reshape convert,
composed with the model's own conversions where there are some (a ``Transpose(Squeeze(z))`` of
a ``[1, C, 1, T]`` map is read as z, an output turned back by ``Reshape [1, 1, T, C]`` +
``Transpose [0, 3, 1, 2]`` is written directly, a Transpose before or a Reshape + Transpose
after the region becomes one Transpose, a ``[1, T, C]`` graph output is the runtime's readout of
the map - a ``Readout`` node, LOWERING.md 25). A region whose edges would cost more host steps than
its layers save is left as it was. Ops the region does not know stay outside, so that other
passes' channel-major forms can join later: add their entry to :data:`REGION_OPS`.
"""

from __future__ import annotations

from collections.abc import Callable
from copy import deepcopy

import numpy as np

from .. import op_table
from ..ir import FusedOp, Graph, Node, Tensor
from . import layer_norm_npu
from .context import PassContext
from .match import add_tensor_like, const, new_constant, per_channel, producer, readers
from .output_readout import NHWC, readout_node
from .partition import decide

#: op types whose per-token form is the same op on [1, C, 1, T] with its constants transposed
ELEMENTWISE = (*op_table.ops_lowered_as("eltwise"), *op_table.ops_lowered_as("activation"),
               *op_table.ops_lowered_as("lut"), "Div")
#: the ones whose constant operands broadcast against the map
BINARY = (*op_table.ops_lowered_as("eltwise"), "Div")


def _token(graph: Graph, name: str) -> bool:
    """A non-constant [1, T, C] tensor."""
    tensor = graph.tensors[name]
    return not tensor.is_const and len(tensor.shape) == 3 and tensor.shape[0] == 1


def _maps(graph: Graph, node: Node) -> list[str]:
    return [name for name in node.inputs if const(graph, name) is None]


# ---- which nodes a region takes -------------------------------------------------------------

def _fc_ok(graph: Graph, node: Node, ctx: PassContext) -> bool:
    """A FullyConnected over the rows of a [1, T, ...] input (flattened from axis 2) with
    constant weights and constant per-unit fused parts, whose 1x1 conv the partition runs."""
    shape = graph.tensors[node.inputs[0]].shape
    if node.attrs.get("axis") != 2 or len(shape) < 3 or shape[0] != 1 or shape[1] == 1 \
            or not _token(graph, node.outputs[0]):  # one row is already a conv (fully_connected_as_conv)
        return False
    if const(graph, node.inputs[1]) is None or any(const(graph, name) is None for name in node.inputs[2:]):
        return False
    if any(name is not None and const(graph, name) is None for part in node.fused for name in part.inputs):
        return False
    trial = Graph(graph.name, {name: graph.tensors[name] for name in node.all_inputs})
    out = graph.tensors[node.outputs[0]].shape
    trial.tensors[node.inputs[0]] = Tensor(node.inputs[0], (1, int(np.prod(shape[2:])), 1, shape[1]), "float32")
    trial.tensors[node.outputs[0]] = Tensor(node.outputs[0], (1, out[2], 1, out[1]), "float32")
    copy = Node(node.name, node.op_type, list(node.inputs), list(node.outputs), deepcopy(node.attrs), deepcopy(node.fused))
    _convert_fc(trial, copy)
    if copy.op_type != "Conv":
        return False
    trial.nodes = [copy]
    return decide(trial, copy, ctx).target == "NPU"


def _layer_norm_ok(graph: Graph, node: Node, ctx: PassContext) -> bool:
    """LayerNormalization over the last axis of [1, T, C], with its normalized output only."""
    shape = graph.tensors[node.inputs[0]].shape
    return _token(graph, node.inputs[0]) and node.attrs.get("axis") in (-1, len(shape) - 1) \
        and len([name for name in node.outputs if name]) == 1 and const(graph, node.inputs[1]) is not None \
        and all(const(graph, name) is not None for name in node.inputs[2:] if name)


def _softmax_ok(graph: Graph, node: Node, ctx: PassContext) -> bool:
    """Softmax over the features of [1, T, C] (its last axis): channel-major, the channel Softmax
    the partition runs on the NPU (float16 builds, LOWERING.md 22.2 and 25)."""
    source, output = node.inputs[0], node.outputs[0]
    if node.fused or not (_token(graph, source) and _token(graph, output)) or node.attrs.get("flatten_2d"):
        return False
    if int(node.attrs.get("axis", -1)) % 3 != 2:
        return False
    shape = _channel_major(graph.tensors[source].shape)
    trial = Graph(graph.name, {name: Tensor(name, shape, graph.tensors[name].dtype) for name in (source, output)})
    copy = Node(node.name, node.op_type, [source], [output], {**node.attrs, "axis": 1})
    trial.nodes = [copy]
    return decide(trial, copy, ctx).target == "NPU"


def _convert_softmax(graph: Graph, node: Node) -> None:
    node.attrs = {**node.attrs, "axis": 1}


def _elementwise_ok(graph: Graph, node: Node, ctx: PassContext) -> bool:
    """One op per element: all maps [1, T, C] of one shape, constants broadcasting into it."""
    if node.op_type not in ELEMENTWISE or node.fused or len(node.outputs) != 1:
        return False
    maps = _maps(graph, node)
    out = graph.tensors[node.outputs[0]].shape
    if not maps or not all(_token(graph, name) and graph.tensors[name].shape == out for name in [*maps, node.outputs[0]]):
        return False
    return all(const(graph, name).ndim <= 3 for name in node.inputs if name not in maps)


#: op type -> (may it join a region, convert it in place). The hook for other per-token ops
#: (Softmax over the features, ...): add an entry; a node whose op is not here stays outside.
REGION_OPS: dict[str, tuple[Callable[[Graph, Node, PassContext], bool], Callable[[Graph, Node], None]]] = {}
#: passes run on a region's trial copy before its host work is counted, so that what they make
#: of the converted region counts (attention_npu adds its HeadAttention rewrite)
TRIAL_PASSES: list[Callable[[Graph, PassContext], int]] = []
#: functions naming nodes a seed's region is first tried together with (attention_npu: the FC at
#: the other end of an attention body, which only the two together let run on the NPU)
PARTNERS: list[Callable[[Graph, Node, PassContext], list[Node]]] = []


def tokens_as_channels(graph: Graph, ctx: PassContext) -> int:
    """Per-token layers of [1, T, C] transformer regions rewritten channel-major on [1, C, 1, T]."""
    changed = 0
    claimed: set[str] = set()
    seeds = [node for node in graph.nodes if node.op_type in SEEDS and REGION_OPS[node.op_type][0](graph, node, ctx)]
    for seed in seeds:
        if seed.name in claimed:
            continue
        joint = _with_partners(graph, seed, claimed, ctx)
        for group in (joint, [seed]) if len(joint) > 1 else ([seed],):
            names = {node.name for node in _grow(graph, group, ctx)}
            if _worth_converting(graph, names, ctx):
                changed += _convert(graph, names)
                break
        claimed |= names
    return changed


def _with_partners(graph: Graph, seed: Node, claimed: set[str], ctx: PassContext) -> list[Node]:
    """``seed`` and, to a fixpoint, the PARTNERS of every node of the region they grow."""
    group = [seed]
    while True:
        region = _grow(graph, group, ctx)
        extra = [node for find in PARTNERS for member in region for node in find(graph, member, ctx)
                 if node.name not in claimed and node not in region and node not in group and _joins(graph, node, ctx)]
        if not extra:
            return group
        group += [node for index, node in enumerate(extra) if node not in extra[:index]]


def _worth_converting(graph: Graph, names: set[str], ctx: PassContext) -> bool:
    """False if the region's edges would cost more host steps or host time than its layers
    save (counted on a trial copy, after the TRIAL_PASSES)."""
    trial = deepcopy(graph)
    _convert(trial, names)
    for follow_up in TRIAL_PASSES:
        follow_up(trial, ctx)
    after, before = _host_work(trial, ctx), _host_work(graph, ctx)
    return not (after[0] > before[0] or after[1] > before[1])


def _convert(graph: Graph, names: set[str]) -> int:
    """Convert the region of the nodes named ``names``; returns the number of changes."""
    members = {id(node) for node in graph.nodes if node.name in names}
    boundary = _convert_tensors(graph, members)
    for node in [node for node in graph.nodes if id(node) in members]:
        REGION_OPS[node.op_type][1](graph, node)
    return len(members) + boundary


def _host_work(graph: Graph, ctx: PassContext) -> tuple[int, float]:
    """How many layers the partition would run on the host (dead ones left out), and their time
    by the runtime's host-step model (emulator/timing/host_model.cpu_step_us: the platform's
    fixed cost per step plus a cost per input element). A lone FC on [1, T, C] graph I/O (two
    entry steps for one) is cheaper as it was; PP-OCRv4 rec's 6625-class head with its Softmax
    reaching the graph output (a Readout, no step) is not."""
    live = deepcopy(graph)
    live.remove_dead()
    host = [node for node in live.nodes if decide(live, node, ctx).target != "NPU"]
    elements = sum(int(np.prod(live.tensors[name].shape)) for node in host for name in node.all_inputs
                   if name and not live.tensors[name].is_const)
    launch = ctx.platform.launch
    return len(host), len(host) * launch.cpu_op_overhead_us + elements * launch.cpu_op_us_per_element


def _joins(graph: Graph, node: Node, ctx: PassContext) -> bool:
    entry = REGION_OPS.get(node.op_type)
    return entry is not None and entry[0](graph, node, ctx)


def _grow(graph: Graph, seeds: list[Node], ctx: PassContext) -> list[Node]:
    """The seeds plus, to a fixpoint, every joinable node reading a region output or writing
    a region input (in graph order)."""
    chosen = {id(node) for node in seeds}
    changed = True
    while changed:
        changed = False
        inside = [node for node in graph.nodes if id(node) in chosen]
        produced = {name for node in inside for name in node.outputs}
        consumed = {name for node in inside for name in node.all_inputs}
        for node in graph.nodes:
            touches = any(name in produced for name in node.inputs) or any(name in consumed for name in node.outputs)
            if id(node) not in chosen and touches and _joins(graph, node, ctx):
                chosen.add(id(node))
                changed = True
    return [node for node in graph.nodes if id(node) in chosen]


# ---- tensors: in place inside, converted at the edges ----------------------------------------

def _channel_major(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    return (1, int(np.prod(shape[2:])), 1, shape[1])


def _convert_tensors(graph: Graph, members: set[int]) -> int:
    """Every token tensor the region reads or writes made [1, C, 1, T]; returns the number of
    boundary nodes added."""
    added = 0
    region_inputs = {name for node in graph.nodes if id(node) in members for name in node.all_inputs}
    made = {name: node for node in graph.nodes if id(node) in members for name in node.outputs}
    # fixed before any edit: an exit may make the region write a graph output already channel-major
    names = [name for name in graph.tensors if not graph.tensors[name].is_const and (name in made or name in region_inputs)]
    for name in names:
        source = made.get(name)
        made_inside = source is not None
        inside = [node for node in readers(graph, name) if id(node) in members]
        outside = [node for node in readers(graph, name) if id(node) not in members]
        if made_inside and not outside and name not in graph.outputs:
            graph.tensors[name].shape = _channel_major(graph.tensors[name].shape)
            continue
        if made_inside:
            added += _exit(graph, source, name, outside)
        else:
            added += _entry(graph, name, inside)
    return added


def _replace_in(nodes: list[Node], old: str, new: str) -> None:
    for node in nodes:
        node.inputs = [new if item == old else item for item in node.inputs]
        for part in node.fused:
            part.inputs = [new if item == old else item for item in part.inputs]


def _entry(graph: Graph, name: str, inside: list[Node]) -> int:
    """The region's readers of outside tensor ``name`` ([1, T, *rest]) read its [1, C, 1, T]
    form: the map the model squeezed and transposed it from if there is one, else one Transpose
    to [1, *rest, T] (composed with the Transpose that made ``name``, if one did) and a Reshape."""
    shape = graph.tensors[name].shape
    target = _channel_major(shape)
    origin = _transposed_from(graph, name, target)
    if origin is not None:
        _replace_in(inside, name, origin)
        return 0
    source = _regrouped_from(graph, name)  # a Reshape of the features only is left out
    rest = graph.tensors[source].shape[2:]
    tokens_last = [0, *range(2, 2 + len(rest)), 1]
    perm = tokens_last
    made_by = producer(graph, source)
    if made_by is not None and made_by.op_type == "Transpose":  # one Transpose instead of two
        source, perm = made_by.inputs[0], [made_by.attrs["perm"][axis] for axis in tokens_last]
    index = min(graph.nodes.index(node) for node in inside)
    dtype = graph.tensors[name].dtype
    moved = add_tensor_like(graph, f"{name}_tokens_last", (1, *rest, shape[1]), dtype)
    twin = add_tensor_like(graph, f"{name}_channels", target, dtype)
    graph.nodes[index:index] = [
        Node(graph.unique_node_name(f"{name}_tokens_last"), "Transpose", [source], [moved], {"perm": perm}),
        Node(graph.unique_node_name(f"{name}_to_channels"), "Reshape", [moved], [twin], {"shape": list(target)}),
    ]
    _replace_in(inside, name, twin)
    return 2


def _regrouped_from(graph: Graph, name: str) -> str:
    """The input of the Reshape/Flatten that made ``name`` if it only regroups the features
    ([1, T, H, D] -> [1, T, H*D], attention's head merge), else ``name``."""
    made_by = producer(graph, name)
    if made_by is None or made_by.op_type not in ("Reshape", "Flatten"):
        return name
    before, after = graph.tensors[made_by.inputs[0]].shape, graph.tensors[name].shape
    same = len(before) >= 3 and before[:2] == after[:2] and int(np.prod(before[2:])) == int(np.prod(after[2:]))
    return made_by.inputs[0] if same and not graph.tensors[made_by.inputs[0]].is_const else name


def _transposed_from(graph: Graph, name: str, target: tuple[int, ...]) -> str | None:
    """z if ``name`` = Transpose(Squeeze/Reshape(z), perm [0, 2, 1]) with z of shape ``target``."""
    transpose = producer(graph, name)
    if transpose is None or transpose.op_type != "Transpose" or transpose.attrs.get("perm") != [0, 2, 1]:
        return None
    squeeze = producer(graph, transpose.inputs[0])
    if squeeze is None or squeeze.op_type not in ("Squeeze", "Reshape"):
        return None
    origin = squeeze.inputs[0]
    return origin if graph.tensors[origin].shape == target and not graph.tensors[origin].is_const else None


def _exit(graph: Graph, source: Node, name: str, outside: list[Node]) -> int:
    """The region writes ``name``'s [1, C, 1, T] twin. Outside readers that turn it back into
    [1, C, 1, T] read the twin; a Reshape splitting C (and a Transpose after it) becomes a
    Reshape of the twin and one Transpose; the others read ``name`` through a Reshape +
    Transpose after the producer."""
    tensor = graph.tensors[name]
    target = _channel_major(tensor.shape)
    twin = add_tensor_like(graph, f"{name}_channels", target, tensor.dtype)
    source.outputs = [twin if item == name else item for item in source.outputs]
    rest = []
    for node in outside:
        back = _back_to_channels(graph, node, target)
        if back is not None:
            for done in [node, *readers(graph, node.outputs[0])]:  # the model's Reshape + Transpose, now dead
                graph.nodes.remove(done)
                if done.outputs[0] != back:
                    graph.tensors.pop(done.outputs[0], None)
            if back in graph.outputs:  # the region writes the graph output itself
                graph.replace_uses(twin, back)
                source.outputs = [back if item == twin else item for item in source.outputs]
                del graph.tensors[twin]
                twin = back
            else:
                graph.replace_uses(back, twin)
                del graph.tensors[back]
        elif not _split_channels(graph, node, twin, tensor.shape):
            rest.append(node)
    outside_ids = {id(node) for node in outside}
    _replace_in([node for node in readers(graph, name) if id(node) not in outside_ids], name, twin)
    if not rest and name not in graph.outputs:
        del graph.tensors[name]
        return 0
    if not rest and not readers(graph, twin):  # a graph output: the runtime's readout turns it (LOWERING.md 25)
        graph.nodes.insert(graph.nodes.index(source) + 1,
                           readout_node(graph.unique_node_name(f"{name}_readout"), twin, name, NHWC, tensor.shape))
        return 0
    flat = add_tensor_like(graph, f"{name}_flat", (1, target[1], tensor.shape[1]), tensor.dtype)
    index = graph.nodes.index(source) + 1
    graph.nodes[index:index] = [
        Node(graph.unique_node_name(f"{name}_flat"), "Reshape", [twin], [flat], {"shape": [1, target[1], tensor.shape[1]]}),
        Node(graph.unique_node_name(f"{name}_to_tokens"), "Transpose", [flat], [name], {"perm": [0, 2, 1]}),
    ]
    return 2


def _split_channels(graph: Graph, node: Node, twin: str, shape: tuple[int, ...]) -> bool:
    """Rewrite a Reshape of the [1, T, C] tensor to [1, T, *parts] (prod parts = C), and the sole
    Transpose reading it if there is one, as a Reshape of ``twin`` to [1, *parts, T] and one
    Transpose with the composed permutation. False if ``node`` is no such Reshape."""
    if node.op_type != "Reshape" or node.inputs[0] == twin:
        return False
    out = graph.tensors[node.outputs[0]].shape
    if len(out) < 3 or out[:2] != shape[:2] or int(np.prod(out[2:])) != shape[2]:
        return False
    parts = out[2:]
    tokens_second = [0, len(parts) + 1, *range(1, len(parts) + 1)]  # [1, *parts, T] -> [1, T, *parts]
    after = readers(graph, node.outputs[0])
    transpose = after[0] if len(after) == 1 and after[0].op_type == "Transpose" \
        and node.outputs[0] not in graph.outputs else None
    split = add_tensor_like(graph, f"{node.outputs[0]}_tokens_last", (1, *parts, shape[1]), graph.tensors[twin].dtype)
    node.inputs, node.attrs = [twin], {"shape": [1, *parts, shape[1]]}
    old = node.outputs[0]
    node.outputs = [split]
    if transpose is not None:
        transpose.inputs = [split]
        transpose.attrs = {"perm": [tokens_second[axis] for axis in transpose.attrs["perm"]]}
        graph.tensors.pop(old, None)
    else:
        graph.nodes.insert(graph.nodes.index(node) + 1, Node(graph.unique_node_name(f"{old}_to_tokens"), "Transpose",
                                                             [split], [old], {"perm": tokens_second}))
    return True


def _back_to_channels(graph: Graph, node: Node, target: tuple[int, ...]) -> str | None:
    """The output of ``node`` = Reshape [1, 1, T, C] and its sole Transpose [0, 3, 1, 2], if
    that output has ``target`` shape."""
    if node.op_type != "Reshape":
        return None
    after = readers(graph, node.outputs[0])
    if len(after) != 1 or after[0].op_type != "Transpose" or after[0].attrs.get("perm") != [0, 3, 1, 2]:
        return None
    out = after[0].outputs[0]
    return out if graph.tensors[out].shape == target else None


# ---- nodes -----------------------------------------------------------------------------------

def _channel_constant(graph: Graph, name: str) -> str:
    """A constant broadcasting against [1, T, C] made to broadcast the same way against
    [1, C, 1, T] (a scalar stays as it is)."""
    value = const(graph, name)
    if value.ndim == 0:
        return name
    padded = value.reshape((1,) * (3 - value.ndim) + value.shape)
    moved = padded.transpose(0, 2, 1)[:, :, None, :]
    return new_constant(graph, f"{name}_channels", moved, value.dtype.name)


def _convert_elementwise(graph: Graph, node: Node) -> None:
    if node.op_type not in BINARY:  # Clip's bounds and the like are scalars
        return
    node.inputs = [item if const(graph, item) is None else _channel_constant(graph, item) for item in node.inputs]


def _convert_fc(graph: Graph, node: Node) -> None:
    """FullyConnected -> 1x1 Conv over the T pixels (in place); left as it is if a fused part
    does not vary per unit."""
    weight = const(graph, node.inputs[1])
    out_shape = (1, 1, weight.shape[0])  # a fused constant must vary only over the units
    parts = []
    for part in node.fused:
        if not part.inputs:
            parts.append(FusedOp(part.op_type, dict(part.attrs), [], part.carry_index, part.source, part.tag))
            continue
        vector = per_channel(const(graph, part.inputs[0]), out_shape, len(out_shape) - 1)
        if vector is None:
            return
        vec = new_constant(graph, f"{node.name}_{part.tag or part.op_type.lower()}", vector.reshape(-1, 1, 1))
        parts.append(FusedOp(part.op_type, dict(part.attrs), [vec], part.carry_index, part.source, part.tag))
    kernel = new_constant(graph, f"{node.name}_weight_1x1", weight.reshape(weight.shape[0], -1, 1, 1))
    node.op_type, node.fused = "Conv", parts
    node.inputs = [node.inputs[0], kernel, *node.inputs[2:]]
    node.attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}


def _convert_layer_norm(graph: Graph, node: Node) -> None:
    """LayerNormalization -> the channel normalization layers of ``layer_norm_npu``."""
    gamma = const(graph, node.inputs[1]).reshape(-1)
    beta = const(graph, node.inputs[2]).reshape(-1) if len(node.inputs) > 2 and node.inputs[2] else None
    channels = graph.tensors[node.inputs[0]].shape[1]
    gamma = np.broadcast_to(gamma, (channels,))
    beta = None if beta is None else np.broadcast_to(beta, (channels,))
    index = graph.nodes.index(node)
    graph.nodes.remove(node)
    layer_norm_npu.channel_layer_norm(graph, index, node.inputs[0], node.outputs[0], gamma, beta,
                                      float(node.attrs.get("epsilon", 1e-5)), node.name)


REGION_OPS.update({op: (_elementwise_ok, _convert_elementwise) for op in ELEMENTWISE})
#: ops a region can start from (an element-wise op alone would only gain edges)
SEEDS = ("FullyConnected", "LayerNormalization")
REGION_OPS["FullyConnected"] = (_fc_ok, _convert_fc)
REGION_OPS["LayerNormalization"] = (_layer_norm_ok, _convert_layer_norm)
REGION_OPS["Softmax"] = (_softmax_ok, _convert_softmax)

__all__ = ["tokens_as_channels", "REGION_OPS", "SEEDS", "ELEMENTWISE", "PARTNERS", "TRIAL_PASSES"]
