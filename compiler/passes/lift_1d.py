"""1-D layers as height-1 2-D layers: Conv, MaxPool/AveragePool and GlobalAveragePool/
GlobalMaxPool on ``[1, C, L]`` tensors (audio front-ends, sequence models) run as their 2-D forms
on ``[1, C, 1, L]``, with the element-wise layers and BatchNormalizations after them.

The CNA and PPU only know 2-D windows, so a 1-D op is the 2-D op with a kernel of height 1:
kernel ``[k] -> [1, k]``, strides ``[s] -> [1, s]``, dilations ``[d] -> [1, d]``, pads
``[b, e] -> [0, b, 0, e]``, weights ``(O, I, k) -> (O, I, 1, k)`` - the same sums in the same
order, so the result is identical. The vendor does the same (rknn-fixtures-ops ``conv1d_int8``:
``unsqueeze_to_4d_conv``, Reshape -> Conv (64,64,1,3) on (1,64,1,400) -> Reshape).

Not op by op but per region: npuemu stores a ``[1, C, L]`` tensor by the runtime's rank padding
(``isa.container_views.tensor_cube``: ``[c, h, w] -> c x h x w``, i.e. one channel, C rows),
which is not the byte layout of ``[1, C, 1, L]`` (C channels, one row), so a Reshape between
them is a host step, not a free alias (the vendor pads at the end instead, ``(1,64,400)`` as
NC1HWC2 ``(1,4,400,1,16)``, which makes its Reshapes free). Hence the pass lifts a whole
connected region - the 1-D layers and the element-wise ops, activations, channel Concats and
BatchNormalizations reading them - to 4-D, with Reshapes only where the region meets the rest
of the graph (graph inputs and outputs, ops with no 4-D form); inside it no tensor is reshaped.

Runs after the subgraph matches (a GELU/SiLU subgraph is one op by then) and the folding stage
(a BatchNormalization after a Conv1d is folded into it on the 3-D graph); a BatchNormalization
lifted with a region becomes the scale+bias depthwise conv of the next stage (fold_bn).

LOWERING.md 32 (silero-vad's STFT): a conv too wide for the CNA also seeds a region when the next
stage rewrites its lifted form into per-frame 1x1 convs (passes/signal_frames.py: a one-channel
signal read from a channel vector); channel Slices, Pow and Sqrt join regions (the channel Slice,
the square and the float16 1/sqrt passes then take their 4-D forms). At -O3,
:func:`elementwise_between_reshapes` drops a Reshape pair around a one-input element-wise op
(``[1, C, 1, 1] -> [1, C, 1] -> Relu -> [1, C, 1, 1]``: two host Reshapes).
"""

from __future__ import annotations

from copy import deepcopy

import numpy as np

from .. import op_table
from ..ir import Graph, Node, Tensor
from .context import PassContext
from .partition import decide
from .match import add_tensor_like, const, new_constant, producer, sole_reader
from .signal_frames import frame_geometry, signal_source

#: ops whose 1-D form needs the lift (spatial windows on [N, C, L]): a region starts at one
WINDOWED = ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")
#: ops whose 4-D form is the same computation with a unit axis inserted before L (per element,
#: or along the channels)
ELEMENTWISE = (*op_table.ops_lowered_as("eltwise"), *op_table.ops_lowered_as("activation"),
               *op_table.ops_lowered_as("lut"), "Div", "PRelu", "Pow", "Sqrt")  # Pow/Sqrt: pow_as_mul, lower_rsqrt
CHANNEL_AXIS_OPS = ("Concat",)
CHANNEL_SLICE = ("Slice",)  # a step-1 Slice of the channels (passes/channel_slice.py once 4-D)
RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def lift_1d_layers(graph: Graph, ctx: PassContext) -> int:
    """1-D Conv/pool/BN layers and the element-wise ops between them lifted to [1, C, 1, L]."""
    seeds = [node for node in graph.nodes if _is_1d_windowed(graph, node) and _npu_when_lifted(graph, node, ctx)]
    if not seeds:
        return 0
    region = _grow(graph, seeds)
    for node in region:
        _lift_attrs(graph, node)
    _lift_tensors(graph, region)
    return len(region)


def _rank3(graph: Graph, name: str) -> bool:
    """A non-constant [1, C, L] feature map."""
    tensor = graph.tensors[name]
    return not tensor.is_const and len(tensor.shape) == 3 and tensor.shape[0] == 1


def _is_1d_windowed(graph: Graph, node: Node) -> bool:
    if node.op_type not in WINDOWED or not _rank3(graph, node.inputs[0]) or len(node.outputs) != 1:
        return False
    if node.op_type == "Conv":
        parts_const = all(const(graph, name) is not None for part in node.fused for name in part.inputs)
        return const(graph, node.inputs[1]) is not None and parts_const  # weights and bias adds reshaped here
    return not node.attrs.get("indices")  # MaxPool's Indices output counts positions of [N, C, L]


def _npu_when_lifted(graph: Graph, node: Node, ctx: PassContext) -> bool:
    """Whether the partition would run the node's 2-D form on the NPU (a grouped conv that is not
    depthwise, an AveragePool not counting its pads would not): lifting a layer that stays a host
    step would only add two host Reshapes. GlobalAveragePool is lifted at level 3, where it becomes
    depthwise convs (rewrites, any plane)."""
    if node.op_type == "GlobalAveragePool" and ctx.level >= 3:
        return True
    trial = Graph(graph.name, {name: graph.tensors[name] for name in [*node.all_inputs, *node.outputs]})
    for name in [*node.inputs[:1], *node.outputs]:
        shape = graph.tensors[name].shape
        trial.tensors[name] = Tensor(name, (shape[0], shape[1], 1, shape[2]), graph.tensors[name].dtype)
    copy = Node(node.name, node.op_type, list(node.inputs), list(node.outputs), deepcopy(node.attrs),
                deepcopy(node.fused))
    _lift_attrs(trial, copy)
    trial.nodes = [copy]
    if decide(trial, copy, ctx).target == "NPU":
        return True
    # a wide conv over a one-channel signal read from a channel vector: per-frame 1x1 convs (signal_frames)
    return frame_geometry(trial, copy, ctx) is not None and signal_source(graph, node.inputs[0]) is not None


def _liftable(graph: Graph, node: Node) -> bool:
    """An element-wise op, channel Concat or BatchNormalization (the scale+bias depthwise conv
    once lifted, fold_bn) whose feature maps are all [1, C, L] of one shape (no broadcasting
    between feature maps) and whose constants broadcast into them. A BatchNormalization on its own
    is not a region: as a host step it costs less than the two host Reshapes around it."""
    if node.op_type == "BatchNormalization":
        return _rank3(graph, node.inputs[0]) and all(const(graph, name) is not None for name in node.inputs[1:5])
    if node.op_type not in ELEMENTWISE + CHANNEL_AXIS_OPS + CHANNEL_SLICE or node.fused or len(node.outputs) != 1:
        return False
    maps = [name for name in node.inputs if const(graph, name) is None]
    if not maps or not all(_rank3(graph, name) for name in [*maps, node.outputs[0]]):
        return False
    if node.op_type in CHANNEL_AXIS_OPS:
        return node.attrs.get("axis") in (1, -2)
    if node.op_type in CHANNEL_SLICE:  # axis 1 of [1, C, L] is axis 1 of [1, C, 1, L]: attributes unchanged
        return list(node.attrs["axes"]) == [1] and list(node.attrs["steps"]) == [1]
    out_shape = graph.tensors[node.outputs[0]].shape
    return all(graph.tensors[name].shape == out_shape for name in maps) \
        and all(const(graph, name).ndim <= 3 for name in node.inputs if name not in maps)


def _grow(graph: Graph, seeds: list[Node]) -> list[Node]:
    """The seeds plus, to a fixpoint, every liftable reader of a region tensor (in graph order)."""
    chosen = {id(node) for node in seeds}
    changed = True
    while changed:
        changed = False
        produced = {name for node in graph.nodes if id(node) in chosen for name in node.outputs}
        for node in graph.nodes:
            if id(node) not in chosen and any(name in produced for name in node.inputs) and _liftable(graph, node):
                chosen.add(id(node))
                changed = True
    return [node for node in graph.nodes if id(node) in chosen]


def _unit_height(value: np.ndarray) -> np.ndarray:
    """A constant that broadcasts against [N, C, L] made to broadcast the same way against
    [N, C, 1, L]: rank-padded to 3 (numpy broadcasting), then a unit axis before the last."""
    if value.ndim == 0:
        return value
    padded = value.reshape((1,) * (3 - value.ndim) + value.shape)
    return padded.reshape(*padded.shape[:2], 1, padded.shape[2])


def _lift_attrs(graph: Graph, node: Node) -> None:
    """The node's attributes and constant operands for its 4-D form (in place)."""
    attrs = node.attrs
    if "kernel_shape" in attrs:  # Conv, MaxPool, AveragePool: the window gets height 1
        attrs["kernel_shape"] = [1, *attrs["kernel_shape"]]
        attrs["strides"] = [1, *attrs["strides"]]
        attrs["dilations"] = [1, *attrs["dilations"]]
        begin, end = attrs["pads"]
        attrs["pads"] = [0, begin, 0, end]
    if node.op_type == "Conv":
        weight = const(graph, node.inputs[1])
        node.inputs[1] = new_constant(graph, f"{node.name}_weight_2d", weight[:, :, None, :], weight.dtype.name)
        for part in node.fused:  # bias_add parts folded on the 3-D graph: [C, 1] -> [1, C, 1, 1]
            part.inputs = [_lifted_constant(graph, name) for name in part.inputs]
    elif node.op_type in CHANNEL_AXIS_OPS:
        attrs["axis"] = 1
    elif node.op_type in ELEMENTWISE:
        node.inputs = [name if const(graph, name) is None else _lifted_constant(graph, name) for name in node.inputs]


def _lifted_constant(graph: Graph, name: str) -> str:
    """A new constant of ``name``'s value for the 4-D form (a scalar stays as it is)."""
    value = const(graph, name)
    if value.ndim == 0:
        return name
    return new_constant(graph, f"{name}_2d", _unit_height(value), value.dtype.name)


def _lift_tensors(graph: Graph, region: list[Node]) -> None:
    """Every [1, C, L] tensor the region produces or reads as [1, C, 1, L]: in place where only
    the region sees it, else through a Reshape at the region's edge."""
    members = {id(node) for node in region}
    for name in list(graph.tensors):
        tensor = graph.tensors[name]
        if not _rank3(graph, name):
            continue
        readers = [node for node in graph.nodes if name in node.all_inputs]
        inside = [node for node in readers if id(node) in members]
        source = producer(graph, name)
        made_inside = source is not None and id(source) in members
        if not made_inside and not inside:
            continue
        lifted = (1, tensor.shape[1], 1, tensor.shape[2])
        if made_inside and len(inside) == len(readers) and name not in graph.outputs:
            tensor.shape = lifted
            continue
        twin = add_tensor_like(graph, f"{name}_2d", lifted, tensor.dtype)
        for node in inside:
            node.inputs = [twin if item == name else item for item in node.inputs]
        if made_inside:  # the region writes the 4-D twin, a Reshape gives the outside its [1, C, L]
            source.outputs = [twin if item == name else item for item in source.outputs]
            _insert_reshape(graph, graph.nodes.index(source) + 1, twin, name, tensor.shape)
        else:  # read from outside: reshaped just before the region's first reader
            _insert_reshape(graph, min(graph.nodes.index(node) for node in inside), name, twin, lifted)


def _insert_reshape(graph: Graph, index: int, source: str, target: str, shape: tuple[int, ...]) -> None:
    graph.nodes.insert(index, Node(graph.unique_node_name(f"{target}_reshape"), "Reshape", [source], [target],
                                   {"shape": list(shape)}))


def elementwise_between_reshapes(graph: Graph, ctx: PassContext) -> int:
    """Reshape -> one-input element-wise op -> the inverse Reshape becomes the op on the first input."""
    changed = 0
    for node in list(graph.nodes):
        maps = [name for name in node.inputs if const(graph, name) is None]
        if node.op_type not in ELEMENTWISE or node.fused or len(maps) != 1 or len(node.outputs) != 1 \
                or any(const(graph, name).size != 1 for name in node.inputs if name not in maps):
            continue
        first, second = producer(graph, maps[0]), sole_reader(graph, node.outputs[0])
        if first is None or second is None or sole_reader(graph, maps[0]) is not node \
                or first.op_type not in RESHAPES or second.op_type not in RESHAPES or first.fused or second.fused \
                or graph.tensors[first.inputs[0]].shape != graph.tensors[second.outputs[0]].shape:
            continue
        node.inputs = [first.inputs[0] if name == maps[0] else name for name in node.inputs]
        for done in (first, second):
            graph.nodes.remove(done)
        graph.tensors.pop(maps[0])
        graph.tensors.pop(node.outputs[0])
        node.outputs = list(second.outputs)
        changed += 1
    return changed


__all__ = ["elementwise_between_reshapes", "lift_1d_layers"]
