"""A recurrent model's state tensor at the graph's edges: read in and read out as one channel map
(LOWERING.md 38.1; issue 19).

silero-vad keeps its LSTM state in a graph input ``state`` [2, 1, H] and returns ``stateN``
[2, 1, H]: the input's two halves are ``Gather(state, k)`` on axis 0 (h and c), and the output is
``Concat(axis 0)`` of the final h and c, each reshaped from the [1, H, 1, 1] map the unrolled LSTM
makes. As NPU feature maps these are host steps: a rank-3 [2, 1, H] tensor is stored with N = 2
(one image per task chain), and [1, 1, H] is stored 1 x 1 x H, not 1 x H x 1 x 1, so every edge
moves H values between a row and the channels.

The same values stored as one [1, N*R, 1, 1] map (R = the product of the other axes) are the
state in the NPU's own order - the row-major order of [N, ...] is the channel order - so:

- :func:`state_input_as_channels`: a float graph input [N, ...] (N > 1) that only Gathers on axis
  0 with constant indices read, each feeding (through reshapes) only recurrent layers' initial
  states - it runs before the unrolling, which then reads the pieces - becomes the runtime's
  readin (input_readin.py, LOWERING.md 33.4, ``perm`` the identity: only the stored shape
  changes, as the NCHW -> NC1HWC2 conversion every input gets) of [1, N*R, 1, 1], cut by a channel
  Split into the N pieces; each Gather's output is its piece reshaped ([1, R] <-> [1, R, 1, 1]:
  the same bytes, by address).
- :func:`state_output_as_channels`: a graph output made by Concat(axis 0) of tensors each reshaped
  (Reshape / Squeeze / Unsqueeze / Flatten) from a [1, R_i, 1, 1] map becomes the channel Concat
  of those maps, delivered by the runtime's readout (output_readout.py, LOWERING.md 25) with
  ``perm`` the identity and the output's shape.

Only the layout of the edge changes; every value is moved, not computed (bit-exact). In int8
builds the output Concat joins the float16 island of the maps it reads when they are island
tensors on int8 C2 boundaries (LOWERING.md 31.2: a float16 graph output, no conversion).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Tensor
from ..quant.islands import ISLAND_ATTR
from .context import PassContext
from .input_readin import READIN
from .match import producer, readers
from .output_readout import readout_node

RESHAPE_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")
RECURRENT_OPS = ("LSTM", "GRU", "RNN")


def reshape_like(graph: Graph, node: Node | None) -> bool:
    """A Reshape/Squeeze/Unsqueeze/Flatten, or a Transpose that only moves axes of size 1 (the
    values keep their order; the clean-up stage of -O2 makes it a Reshape), not fused."""
    if node is None or node.fused:
        return False
    if node.op_type != "Transpose":
        return node.op_type in RESHAPE_OPS
    dims = graph.tensors[node.inputs[0]].shape
    moved = [axis for axis in node.attrs.get("perm", ()) if dims[axis] != 1]
    return moved == sorted(moved)


def _gather_index(graph: Graph, node: Node, rows: int) -> int | None:
    """The row a Gather on axis 0 with one constant index (scalar or [k]) picks, else None."""
    if node.op_type != "Gather" or node.fused or int(node.attrs.get("axis", 0)) != 0 or len(node.inputs) != 2:
        return None
    index = graph.tensors[node.inputs[1]]
    if not index.is_const or index.data.size != 1:
        return None
    k = int(index.data.ravel()[0])
    return k % rows if -rows <= k < rows else None


def _feeds_recurrent(graph: Graph, name: str) -> bool:
    """Whether ``name`` reaches only recurrent layers (their initial states), through reshapes."""
    users = readers(graph, name)
    if name in graph.outputs or not users:
        return False
    return all(node.op_type in RECURRENT_OPS or (reshape_like(graph, node) and _feeds_recurrent(graph, node.outputs[0]))
               for node in users)


def state_input_as_channels(graph: Graph, ctx: PassContext) -> int:
    """A state graph input [N, ...] read only by row Gathers becomes a readin of one [1, N*R, 1, 1] map."""
    changed = 0
    for name in list(graph.inputs):
        tensor = graph.tensors[name]
        shape, users = tuple(tensor.shape), readers(graph, name)
        if len(shape) < 2 or shape[0] < 2 or np.dtype(tensor.dtype).kind != "f" or name in graph.outputs or not users:
            continue
        picks = [_gather_index(graph, node, shape[0]) for node in users]
        if any(pick is None for pick in picks) or not all(_feeds_recurrent(graph, node.outputs[0]) for node in users):
            continue
        rows, size = shape[0], int(np.prod(shape[1:]))
        stored = graph.unique_tensor_name(f"{name}_channels")
        graph.add_tensor(Tensor(stored, (1, rows * size, 1, 1), tensor.dtype))
        pieces = [graph.unique_tensor_name(f"{name}_row{k}") for k in range(rows)]
        for piece in pieces:
            graph.add_tensor(Tensor(piece, (1, size, 1, 1), tensor.dtype))
        first = graph.nodes.index(users[0])
        new = [Node(graph.unique_node_name(f"{name}_readin"), READIN, [name], [stored],
                    {"perm": list(range(len(shape))), "shape": [1, rows * size, 1, 1]}),
               Node(graph.unique_node_name(f"{name}_rows"), "Split", [stored], pieces,
                    {"axis": 1, "split": [size] * rows})]
        graph.nodes[first:first] = new
        for node, k in zip(users, picks):  # each Gather: its row's piece, reshaped by address
            index = graph.nodes.index(node)
            out = node.outputs[0]
            graph.nodes[index] = Node(node.name, "Reshape", [pieces[k]], [out],
                                      {"shape": list(graph.tensors[out].shape)})
        changed += 1
    return changed


def drop_unread(graph: Graph, nodes: list[Node | None]) -> None:
    """Remove these nodes (and the reshape chains feeding them) where nothing reads their outputs;
    other dead nodes are the clean-up stage's (so no unrelated build changes)."""
    todo = [node for node in nodes if node is not None]
    while todo:
        node = todo.pop()
        if node not in graph.nodes or not reshape_like(graph, node) or any(
                name in graph.outputs or readers(graph, name) for name in node.outputs):
            continue
        graph.nodes.remove(node)
        for name in node.outputs:
            graph.tensors.pop(name, None)
        todo.append(producer(graph, node.inputs[0]))
        todo = [other for other in todo if other is not None]


def map_source(graph: Graph, name: str) -> str | None:
    """The [1, R, 1, 1] map ``name`` is a reshape (through Reshape-like nodes) of, else None."""
    size = int(np.prod(graph.tensors[name].shape))
    seen = name
    for _ in range(8):
        node = producer(graph, seen)
        if not reshape_like(graph, node):
            return None
        seen = node.inputs[0]
        if tuple(graph.tensors[seen].shape) == (1, size, 1, 1):
            return seen
    return None


def _island_concat(graph: Graph, ctx: PassContext, sources: list[str]) -> bool:
    """Whether the channel Concat of ``sources`` is float16 in an int8 build: every source an island
    layer's output, on int8 C2 boundaries, in one cube (recurrent_unroll.Unroll.in_island)."""
    if ctx.element_bytes == 2:
        return False
    c2, total = ctx.platform.c2("int8"), sum(graph.tensors[s].shape[1] for s in sources)
    made = [producer(graph, source) for source in sources]
    return (all(node is not None and node.attrs.get(ISLAND_ATTR) for node in made)
            and all(graph.tensors[s].shape[1] % c2 == 0 for s in sources) and total <= ctx.limits.max_cube_channels)


def state_output_as_channels(graph: Graph, ctx: PassContext) -> int:
    """A graph output Concat(axis 0) of reshaped [1, R, 1, 1] maps becomes their channel Concat, read out."""
    changed = 0
    for node in [node for node in graph.nodes if node.op_type == "Concat" and not node.fused]:
        out = node.outputs[0]
        shape = tuple(graph.tensors[out].shape)
        if out not in graph.outputs or len(shape) < 2 or int(node.attrs.get("axis", 0)) % len(shape) != 0:
            continue
        if any(tuple(graph.tensors[name].shape)[:1] != (1,) for name in node.inputs):
            continue
        sources = [map_source(graph, name) for name in node.inputs]
        if any(source is None for source in sources) or len(sources) < 2:
            continue
        total = sum(graph.tensors[source].shape[1] for source in sources)
        joined = graph.unique_tensor_name(f"{out}_channels")
        graph.add_tensor(Tensor(joined, (1, total, 1, 1), graph.tensors[out].dtype))
        attrs = {"axis": 1} | ({ISLAND_ATTR: 1} if _island_concat(graph, ctx, sources) else {})
        index = graph.nodes.index(node)
        graph.nodes[index:index + 1] = [
            Node(node.name, "Concat", sources, [joined], attrs),
            readout_node(graph.unique_node_name(f"{out}_readout"), joined, out, [0, 1, 2, 3], shape)]
        drop_unread(graph, [producer(graph, name) for name in node.inputs])  # reshapes only it read
        changed += 1
    return changed


__all__ = ["RESHAPE_OPS", "drop_unread", "map_source", "reshape_like", "state_input_as_channels",
           "state_output_as_channels"]
