"""A fully connected layer over the rows of an unrolled recurrent layer's output, as NPU convs and
the runtime's readout (LOWERING.md 38.2; issue 19).

ddddocr's CRNN ends in ``Y [T, D, 1, H] -> [T, D*H] -> FullyConnected (8210 classes) -> [T, 1, K]``.
The unrolled LSTM (recurrent_unroll.py) makes Y as the channel Concat of its h's, step-major: row t
of the FC's input is the Concat of step t's h's (both directions side by side, by address), made
from Y's inputs (or, where they do not group by rows, a channel Split of Y). Then:

- K <= the cube's channels: the rows are joined as the pixels of one [1, D*H, 1, T] map (the
  FlatConcat of LOWERING.md 29: one DPU copy per row), the FC is one 1x1 conv over the T pixels
  ([1, K, 1, T]: each weight read once), and the output [T, ..., K] is that map's NHWC readout.
- K wider (8210 > 8192 channels: no map holds it): P = ceil(K / limit) parts of K / P classes,
  each a 1x1 conv over the T pixels ([1, K/P, 1, T]; every weight read once), and row t of part j
  picked as a [1, K/P, 1, 1] map by a depthwise conv with kernel [1, T] and one-hot weights (exact:
  one input times 1); the T*P picks are joined as the pixels t*P + j of one [1, K/P, 1, T*P] map
  (FlatConcat), whose NHWC readout is [T, P, K/P] = the output's order. Where T passes the CNA's
  kernel size (31), per row t and part j a 1x1 conv of row t's [1, D*H, 1, 1] piece instead (every
  row's conv of part j reads one weight constant, stored once: LOWERING.md 30.1), the weights
  streamed once per row.

Taken only where the FC's input is a reshape of a [1, T*C, 1, 1] map a Concat makes (Y) (T >= 2, C on
int8 C2 boundaries), its weights and bias are constants, K splits evenly, and its output reaches a
graph output through reshapes only, each read once; else the FC stays what it was. The arithmetic
is the FC's (a 1x1 conv of the same weights); the joins and the readout move values only.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Tensor
from ..quant.islands import ISLAND_ATTR
from .context import PassContext
from .flat_concat import FLAT_CONCAT
from .focus_as_conv import SELECTION_ATTR
from .match import producer, readers
from .output_readout import NHWC, readout_node
from .recurrent_state_io import drop_unread, map_source, reshape_like

CONV_1X1 = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}


def _output_chain(graph: Graph, name: str) -> list[Node] | None:
    """The reshapes from ``name`` to a graph output, each tensor read once ([] if it is one), else None."""
    chain: list[Node] = []
    while name not in graph.outputs:
        users = readers(graph, name)
        if len(users) != 1 or not reshape_like(graph, users[0]) or len(chain) > 8:
            return None
        chain.append(users[0])
        name = users[0].outputs[0]
    return None if readers(graph, name) else chain


def _form(graph: Graph, node: Node, ctx: PassContext):
    """(map, rows, cols, weight [K, cols], bias [K], output chain, parts) of an FC this pass takes, else None."""
    if node.op_type != "FullyConnected" or node.fused or len(node.inputs) < 2:
        return None
    shape = tuple(graph.tensors[node.inputs[0]].shape)
    axis = int(node.attrs.get("axis", 1))
    rows, cols = int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))
    weight = graph.tensors[node.inputs[1]]
    bias = graph.tensors[node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else None
    if rows < 2 or not weight.is_const or weight.data.ndim != 2 or weight.data.shape[1] != cols \
            or (bias is not None and not bias.is_const) or cols % ctx.platform.c2("int8") \
            or cols > ctx.limits.max_cube_channels:
        return None
    source = map_source(graph, node.inputs[0])
    chain = _output_chain(graph, node.outputs[0])
    made = producer(graph, source) if source is not None else None
    if made is None or made.op_type != "Concat" or chain is None:  # the rows of a joined map (Y)
        return None
    classes = weight.data.shape[0]
    parts = -(-classes // ctx.limits.max_cube_channels)
    if classes % parts or -(-classes // parts) > ctx.limits.max_kernels:
        return None
    data = bias.data.astype(np.float32) if bias is not None else np.zeros(classes, np.float32)
    return source, rows, cols, weight.data.astype(np.float32), data, chain, parts


def fc_rows_as_convs(graph: Graph, ctx: PassContext) -> int:
    """An FC over the T rows of a step-major [1, T*C, 1, 1] map: 1x1 convs, joined and read out."""
    changed = 0
    for node in [node for node in graph.nodes if node.op_type == "FullyConnected"]:
        form = _form(graph, node, ctx)
        if form is None:
            continue
        source, rows, cols, weight, bias, chain, parts = form
        rewrite = _Rewrite(graph, node, source, _island(graph, ctx, source), ctx.limits)
        rewrite.run(rows, cols, weight, bias, chain, parts)
        changed += 1
    return changed


def _island(graph: Graph, ctx: PassContext, source: str) -> bool:
    """int8 builds: whether the rows are an unrolled chain's float16 h's (island layers on int8 C2
    boundaries): then the rows' Concats, the convs and the joins are float16 too (LOWERING.md
    38.2: no conversion of every h to int8 and back, and a float16 output, as the chain's own)."""
    concat = producer(graph, source)
    if ctx.element_bytes == 2:
        return False
    made = [producer(graph, name) for name in concat.inputs]
    c2 = ctx.platform.c2("int8")
    return all(other is not None and other.attrs.get(ISLAND_ATTR) and graph.tensors[name].shape[1] % c2 == 0
               for other, name in zip(made, concat.inputs))


class _Rewrite:
    def __init__(self, graph: Graph, node: Node, source: str, island: bool, limits) -> None:
        self.graph, self.node, self.source, self.nodes = graph, node, source, []
        self.dtype, self.island = graph.tensors[source].dtype, island
        self.max_kernel, self.max_channels, self.onehots = limits.max_kernel, limits.max_cube_channels, {}

    def tensor(self, label: str, shape: tuple[int, ...]) -> str:
        name = self.graph.unique_tensor_name(f"{self.node.name}_{label}")
        self.graph.add_tensor(Tensor(name, shape, self.dtype))
        return name

    def add(self, label: str, op: str, inputs: list[str], outputs: list[str], attrs: dict) -> str:
        if self.island:
            attrs = dict(attrs, **{ISLAND_ATTR: 1})
        self.nodes.append(Node(self.graph.unique_node_name(f"{self.node.name}_{label}"), op, inputs, outputs, attrs))
        return outputs[0]

    def conv(self, label: str, x: str, weight: str, bias: str, classes: int, width: int) -> str:
        return self.add(label, "Conv", [x, weight, bias], [self.tensor(label, (1, classes, 1, width))], dict(CONV_1X1))

    def rows(self, rows: int, cols: int) -> list[str]:
        """Each row as a [1, cols, 1, 1] map: the Concat of the inputs of Y's Concat that make it
        (each step's directions side by side, by address; one input is the row itself), else a
        channel Split of Y (on C2 boundaries: views)."""
        concat, groups, group, total = producer(self.graph, self.source), [], [], 0
        for name in concat.inputs:
            group, total = group + [name], total + self.graph.tensors[name].shape[1]
            if total == cols:
                groups, group, total = groups + [group], [], 0
        if len(groups) == rows and not group:
            return [names[0] if len(names) == 1 else
                    self.add(f"row{t}", "Concat", names, [self.tensor(f"row{t}", (1, cols, 1, 1))], {"axis": 1})
                    for t, names in enumerate(groups)]
        pieces = [self.tensor(f"row{t}", (1, cols, 1, 1)) for t in range(rows)]
        if self.island and self.graph.tensors[self.source].shape[1] <= self.max_channels:
            concat.attrs[ISLAND_ATTR] = 1  # Y float16 too: its h's are not converted to int8 and back
        self.add("rows", "Split", [self.source], pieces, {"axis": 1, "split": [cols] * rows})
        return pieces

    def pick(self, label: str, x: str, t: int, rows: int, size: int) -> str:
        """Pixel t of the [1, size, 1, rows] map ``x`` as a [1, size, 1, 1] map: a depthwise conv with
        kernel [1, rows] whose weights are 1 at tap t, 0 elsewhere (one constant per t)."""
        if t not in self.onehots:
            onehot = np.zeros((size, 1, 1, rows), np.float32)
            onehot[:, 0, 0, t] = 1.0
            self.onehots[t] = self.graph.add_constant(f"{self.node.name}_pick{t}", onehot).name
        attrs = dict(CONV_1X1, kernel_shape=[1, rows], group=size, **{SELECTION_ATTR: 1})
        return self.add(label, "Conv", [x, self.onehots[t]], [self.tensor(label, (1, size, 1, 1))], attrs)

    def run(self, rows: int, cols: int, weight: np.ndarray, bias: np.ndarray, chain: list[Node], parts: int) -> None:
        graph, node = self.graph, self.node
        pieces = self.rows(rows, cols)
        size = weight.shape[0] // parts
        weights = [graph.add_constant(f"{node.name}_w{j}", weight[j * size:(j + 1) * size, :, None, None]).name
                   for j in range(parts)]
        biases = [graph.add_constant(f"{node.name}_b{j}", bias[j * size:(j + 1) * size]).name for j in range(parts)]
        if parts == 1 or rows <= self.max_kernel:  # the rows as the pixels of one map, a conv per part over them
            joined = self.add("pixels", FLAT_CONCAT, pieces, [self.tensor("pixels", (1, cols, 1, rows))], {})
            outs = [self.conv(f"conv{j}" if parts > 1 else "conv", joined, weights[j], biases[j], size, rows)
                    for j in range(parts)]
        if parts == 1:
            result = outs[0]
        else:  # pixel t*P + j of the joined map: row t of part j
            if rows <= self.max_kernel:  # picked from part j's map by a one-hot depthwise conv (exact)
                outs = [self.pick(f"t{t}_p{j}", outs[j], t, rows, size) for t in range(rows) for j in range(parts)]
            else:  # per row and part a conv of the row's piece (the weights read once per row)
                outs = [self.conv(f"t{t}_p{j}", pieces[t], weights[j], biases[j], size, 1)
                        for t in range(rows) for j in range(parts)]
            result = self.add("joined", FLAT_CONCAT, outs, [self.tensor("joined", (1, size, 1, rows * parts))], {})
        final = chain[-1].outputs[0] if chain else node.outputs[0]
        self.nodes.append(readout_node(graph.unique_node_name(f"{final}_readout"), result, final, NHWC,
                                       tuple(graph.tensors[final].shape)))
        if self.island:
            self.nodes[-1].attrs[ISLAND_ATTR] = 1
        index = graph.nodes.index(node)
        graph.nodes[index:index + 1] = self.nodes
        for other in chain:
            graph.nodes.remove(other)
        for name in [node.outputs[0], *(other.outputs[0] for other in chain)]:
            if name != final:
                graph.tensors.pop(name, None)
        drop_unread(graph, [producer(graph, node.inputs[0])])
        joined = producer(graph, self.source)
        if self.source not in graph.outputs and not readers(graph, self.source):  # Y, when only rows were read
            graph.nodes.remove(joined)
            graph.tensors.pop(self.source, None)


__all__ = ["fc_rows_as_convs"]
