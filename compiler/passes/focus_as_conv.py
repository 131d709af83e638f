"""The YOLOv5/YOLOX **Focus** block as one convolution (a vendor rewrite).

Focus takes the four stride-2 phases of a feature map ``x[1, C, H, W]`` and concatenates them
along the channels: ``Concat(x[..., r0::2, c0::2], x[..., r1::2, c1::2], ...)`` with the four
(row, column) phases in some order (YOLOX: (0,0), (1,0), (0,1), (1,1)). In ONNX each phase is
one Slice with axes (2, 3), or two chained single-axis Slices. As it stands the Slices have no
NPU lowering, so the block runs on the host.

The vendor replaces the whole block by ONE 2x2 stride-2 convolution from C to 4C channels
(``fuse_ops: fuse_focus_slice`` in fixture rknn-fixtures-ops/focus_slice_int8 python_passes:
Slices + Concat removed, ``Concat_26_2conv`` added; its layer table shows
``Conv (1,3,128,128),(12,3,2,2),(12) -> (1,12,64,64)`` [V]). Its weights select: output channel
``p*C + k`` (concat position p, phase (r, c)) is ``x[k, 2i + r, 2j + c]``, i.e. weight 1 at
``[p*C + k, k, r, c]`` and 0 elsewhere, no bias.

The conv outputs only input values, so in int8 its output keeps the input's scale and zero
point (the vendor's ``concat_out25`` has the input's 0.00392156 / -128 [V]) and the int8 result
is exact. The node carries ``SELECTION_ATTR`` so quantization (quant/sharing.py) puts its input
and output in one sharing group, as for the value-preserving ops.

The match is exact: one source tensor; every phase a step-2 slice of H and W with start 0 or 1
covering the axis to its end (each phase has size H/2, W/2: H and W even); other axes
untouched (absent, or start 0 step 1 to the end); the four phases distinct; intermediate
tensors read only inside the block (an exporter may share ``x[..., ::2, :]`` between two
phases); a channel (axis 1) Concat of exactly those four tensors. Anything else is left alone.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .context import PassContext
from .match import new_constant, only_read_by, producer, sole_reader

#: Attribute of a conv that only copies input values (quantization shares its input's parameters).
SELECTION_ATTR = "selection"

_PHASES = {(0, 0), (0, 1), (1, 0), (1, 1)}


def _axis_phase(start: int, end: int, step: int, size: int) -> int | None:
    """0 or 1 when ``start:end:step`` on an axis of ``size`` is every second element from that
    start to the end, else None."""
    if step != 2 or start not in (0, 1) or size % 2:
        return None
    return start if list(range(start, end, step)) == list(range(start, size, 2)) else None


def _slice_phases(graph: Graph, node: Node, phases: dict[int, int]) -> bool:
    """Add the (axis -> phase) picks of one Slice node to ``phases``; False if it is not a pure
    stride-2 pick of H and/or W (or picks an axis twice)."""
    if node.op_type != "Slice" or node.fused or len(node.outputs) != 1:
        return False
    shape = graph.tensors[node.inputs[0]].shape
    if len(shape) != 4:
        return False
    attrs = node.attrs
    for start, end, axis, step in zip(attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]):
        if axis not in (2, 3) and (int(start), int(step)) == (0, 1) and int(end) >= shape[axis]:
            continue  # an exporter's whole-axis entry (x[:, :, ::2]): no pick
        phase = _axis_phase(int(start), int(end), int(step), shape[axis])
        if axis not in (2, 3) or axis in phases or phase is None:
            return False
        phases[axis] = phase
    return bool(phases)


def _phase_chain(graph: Graph, tensor: str) -> tuple[str, tuple[int, int], list[Node]] | None:
    """(source, (row phase, column phase), slice nodes) of a Concat input made by one or two
    Slices, else None."""
    phases: dict[int, int] = {}
    chain: list[Node] = []
    current = tensor
    while len(phases) < 2:
        node = producer(graph, current)
        if node is None or not _slice_phases(graph, node, phases):
            return None
        chain.append(node)
        current = node.inputs[0]
    return current, (phases[2], phases[3]), chain


def _focus_match(graph: Graph, concat: Node) -> tuple[str, list[tuple[int, int]], list[Node]] | None:
    """(source, phase per concat input, nodes to remove) of a Focus Concat, else None."""
    if concat.op_type != "Concat" or concat.fused or len(concat.inputs) != 4 or len(concat.outputs) != 1:
        return None
    if int(concat.attrs.get("axis", 1)) % 4 != 1 or len(set(concat.inputs)) != 4:
        return None
    chains = [_phase_chain(graph, name) for name in concat.inputs]
    if any(chain is None for chain in chains):
        return None
    sources = {chain[0] for chain in chains}
    phases = [chain[1] for chain in chains]
    if len(sources) != 1 or set(phases) != _PHASES:
        return None
    if np.dtype(graph.tensors[next(iter(sources))].dtype).kind != "f":
        return None
    if any(sole_reader(graph, name) is not concat for name in concat.inputs):
        return None
    removed = list({id(node): node for chain in chains for node in chain[2]}.values())  # a shared H slice once
    inner = {name for node in removed for name in node.outputs} - set(concat.inputs)
    if any(name in graph.outputs or not only_read_by(graph, name, [node for node in removed if name in node.inputs])
           for name in inner):
        return None  # an intermediate slice is read outside the block too: keep the block
    return sources.pop(), phases, removed


def selection_weights(channels: int, phases: list[tuple[int, int]]) -> np.ndarray:
    """The [4C, C, 2, 2] 0/1 weights: output channel p*C + k reads input channel k at (r, c)."""
    weights = np.zeros((len(phases) * channels, channels, 2, 2), np.float32)
    for position, (row, col) in enumerate(phases):
        for channel in range(channels):
            weights[position * channels + channel, channel, row, col] = 1.0
    return weights


def focus_as_conv(graph: Graph, ctx: PassContext) -> int:
    """The YOLOX/YOLOv5 Focus block (four stride-2 Slices + Concat) becomes one 2x2 stride-2 selection Conv."""
    rewritten = 0
    for concat in [node for node in graph.nodes if node.op_type == "Concat"]:
        match = _focus_match(graph, concat)
        if match is None:
            continue
        source, phases, removed = match
        channels = graph.tensors[source].shape[1]
        weight = new_constant(graph, f"{concat.name}_2conv_weight", selection_weights(channels, phases))
        attrs = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
                 SELECTION_ATTR: 1}
        conv = Node(graph.unique_node_name(f"{concat.name}_2conv"), "Conv", [source, weight], list(concat.outputs),
                    attrs)
        graph.nodes[graph.nodes.index(concat)] = conv
        for node in removed:
            graph.nodes.remove(node)
            for name in node.outputs:
                if name not in graph.outputs:
                    graph.tensors.pop(name, None)
        rewritten += 1
    return rewritten


__all__ = ["SELECTION_ATTR", "focus_as_conv", "selection_weights"]
