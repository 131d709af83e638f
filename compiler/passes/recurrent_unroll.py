"""What the recurrent passes share: their limits and the unrolling (LOWERING.md 30, 31; issue 19 item 4).

``lstm_npu``, ``gru_npu`` and ``recurrent_rnn`` write an ONNX LSTM, GRU or RNN as per-step NPU
layers the compiler already lowers (1x1 convs, DPU look-up tables, DPU element-wise layers,
channel Split/Concat). :class:`Unroll` holds the parts that do not depend on the cell:

- X [T, 1, I] reshaped to one pixel of T*I channels and split into the T steps' [1, I, 1, 1];
  or, where X is a map [1, C, H, T] transposed into the time-major form (a CRNN), each input
  projection as one conv over the map's T columns and each step's term picked from it
  (:meth:`Unroll.x_columns`, LOWERING.md 38.3);
- the initial states: absent or constant zero (no layer; the cell skips the recurrent terms of
  its first step), a feature map [D, 1, H] (a graph input or a layer's output: a Reshape to
  [1, D*H, 1, 1], split per direction), or a non-zero constant (a 1x1 conv with zero weights
  and the state as its bias, reading x_0: the NPU has no constant feature maps);
- Y [T, D, 1, H] as the step-major channel Concat of every step's h, and the final states, each
  reshaped to the ONNX shape.

**int8 and hybrid builds** (LOWERING.md 31.2): the chain is a float16 island. Every layer of the
cell carries :data:`ISLAND_ATTR`, which ``quant/islands.py`` reads, so quantize_graph stores its
tensors in float16 and inserts DPU DataConverts where it meets int8 tensors. Where X or a state
is cut into pieces, the pieces are float16 when the map fits one cube: a Split on int8 C2
boundaries, else 1x1 selection convs this pass makes (the -O3 rewrite of a Split off int8 C2
boundaries makes convs that would not carry the mark); a wider map is an int8 host Split and
each piece is converted. The Reshapes at the edges stay in the build's type, except where they
read a graph input only this node reads or write a graph output: those are float16 too (no
conversion). Y and the final states are float16 where they are graph outputs (the vendor's int8
exGRU build outputs float16 too) and their Concat is on int8 C2 boundaries; where layers read
them, the Concats stay int8 when the NPU runs them (a DataConvert runs on its reader's unit and
the output Reshapes are host steps), so each h is converted by a DPU task; a final state of one
direction (no Concat) is converted before its host Reshape.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Tensor
from ..quant.islands import ISLAND_ATTR
from .context import PassContext
from .focus_as_conv import SELECTION_ATTR
from .match import producer, readers
from .split_as_convs import channel_selection_weights

#: the longest sequence unrolled ([C]: every step is ~10-20 layers; the issue asks for small T)
MAX_STEPS = 64
#: [C] at most this many bytes of float16 W and R are unrolled. Every step's gate convs read one
#: constant per gate, which the build stores once (compiler/shared_weights.py, LOWERING.md 30.1),
#: so this counts one copy, not T (ddddocr's bidirectional 512-wide LSTM stores 8 MiB)
MAX_WEIGHT_BYTES = 32 << 20
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
SLOT_B, SLOT_SEQUENCE_LENS, SLOT_INITIAL_H = 3, 4, 5
CONV_1X1 = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}


def operand(graph: Graph, node: Node, slot: int) -> Tensor | None:
    """The tensor at ONNX input position ``slot``, None when the model left it out."""
    slots = node.attrs.get("input_slots", [])
    return graph.tensor(node.inputs[slots.index(slot)]) if slot in slots else None


def zero_or_absent(tensor: Tensor | None) -> bool:
    return tensor is None or (tensor.is_const and not np.any(tensor.data))


def state_reason(graph: Graph, node: Node, slot: int, what: str) -> str | None:
    """Why an initial state cannot be read, None when it can: absent, any constant, or a float
    tensor [D, 1, H] (a graph input or any layer's output)."""
    tensor = operand(graph, node, slot)
    if tensor is None or tensor.is_const:
        return None
    want = (DIRECTIONS[node.attrs["direction"]], 1, int(node.attrs["hidden_size"]))
    if tensor.shape != want or tensor.dtype != "float32":
        shown = ", ".join(map(str, want))
        return f"{what} is a {tensor.dtype} tensor {list(tensor.shape)} (a float [{shown}] state only)"
    return None


def common_reason(graph: Graph, node: Node, ctx: PassContext, gates: int, defaults: list[list[str]]) -> str | None:
    """The limits every unrolled cell shares; ``gates`` per direction, ``defaults``: the activation
    lists (one direction's) the cell unrolls."""
    if ctx.element_bytes not in (1, 2):
        return f"{ctx.element_bytes}-byte elements"
    if any(operand(graph, node, slot) is not None and not operand(graph, node, slot).is_const for slot in (1, 2, 3)):
        return "W, R and B must be constants"
    x_shape = graph.tensor(node.inputs[0]).shape
    if len(x_shape) != 3 or x_shape[1] != 1:
        return f"X has shape {list(x_shape)} (batch 1 [T, 1, I] only)"
    if not 1 <= x_shape[0] <= MAX_STEPS:
        return f"sequence length {x_shape[0]} (at most {MAX_STEPS} steps are unrolled)"
    hidden, directions = int(node.attrs["hidden_size"]), DIRECTIONS.get(node.attrs.get("direction"), 1)
    weight_bytes = 2 * directions * gates * hidden * (x_shape[2] + hidden)  # stored once for all steps
    if weight_bytes > MAX_WEIGHT_BYTES:
        return (f"W and R would store {weight_bytes / (1 << 20):.1f} MiB of float16 weights "
                f"(at most {MAX_WEIGHT_BYTES >> 20} MiB; every step shares one copy)")
    if node.attrs.get("layout", 0) != 0:
        return "layout 1 (batch-major; only layout 0 is unrolled)"
    if node.attrs.get("clip") is not None:
        return f"clip {node.attrs['clip']:g} (clipped gate inputs are not unrolled)"
    activations = list(node.attrs.get("activations", []))
    if not any(activations == list(one) * directions for one in defaults):
        shown = " or ".join("/".join(one).title() for one in defaults)
        return f"activations {activations} (only {shown} are unrolled)"
    if operand(graph, node, SLOT_SEQUENCE_LENS) is not None:
        return "sequence_lens given"
    return _split_reason(ctx, x_shape[0], x_shape[2], hidden, directions)


def _split_reason(ctx: PassContext, steps: int, size: int, hidden: int, directions: int) -> str | None:
    """Below -O3 no pass turns a channel Split off C2 boundaries into selection convs, and the
    build lowers only those on boundaries: X's steps (I) and a bidirectional state's halves (H)."""
    c2 = ctx.platform.c2("fp16" if ctx.element_bytes == 2 else "int8")
    if ctx.level >= 3 or (steps == 1 or size % c2 == 0) and (directions == 1 or hidden % c2 == 0):
        return None
    return f"input size {size} / hidden size {hidden} off the {c2}-channel C2 boundaries below -O3"


RESHAPES = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")
#: Transpose of a map [1, C, H, W] into the time-major [W, 1, C, H] (a CRNN's columns as steps)
COLUMNS_PERM = [3, 0, 1, 2]


def transposed_columns(graph: Graph, x: str) -> str | None:
    """The map [1, C, H, T] that X [T, 1, C*H] is, through reshapes, the Transpose(perm [3, 0, 1, 2])
    of (X's feature c*H + h of step t is the map's (c, h, t)), else None."""
    steps, _, size = graph.tensor(x).shape
    node = producer(graph, x)
    while node is not None and node.op_type in RESHAPES and not node.fused:
        node = producer(graph, node.inputs[0])
    if node is None or node.op_type != "Transpose" or node.fused or list(node.attrs.get("perm", ())) != COLUMNS_PERM:
        return None
    source = graph.tensor(node.inputs[0])
    dims = tuple(source.shape)
    if source.is_const or len(dims) != 4 or dims[0] != 1 or dims[3] != steps or dims[1] * dims[2] != size:
        return None
    return source.name


def drop_unread_chain(graph: Graph, name: str) -> None:
    """Remove the reshapes and Transpose that made ``name`` back to the first tensor still read."""
    while name not in graph.outputs and not readers(graph, name):
        node = producer(graph, name)
        if node is None or node.op_type not in (*RESHAPES, "Transpose") or node.fused:
            return
        graph.nodes.remove(node)
        graph.tensors.pop(name, None)
        name = node.inputs[0]


class Unroll:
    """The new tensors and nodes of one recurrent node, inserted where it was. A cell subclass
    writes :meth:`step`: (direction, t, x_t, states) -> the new states, h first."""

    def __init__(self, graph: Graph, node: Node, ctx: PassContext, gates: int) -> None:
        self.graph, self.node, self.nodes = graph, node, []
        self.constants: dict[str, str] = {}
        self.steps, _, self.inputs = graph.tensor(node.inputs[0]).shape
        self.hidden = int(node.attrs["hidden_size"])
        self.dtype = graph.tensor(node.inputs[0]).dtype
        direction = node.attrs["direction"]
        self.reverse = [False, True] if direction == "bidirectional" else [direction == "reverse"]
        self.w = graph.tensor(node.inputs[1]).data.astype(np.float32)  # [D, G*H, I]
        self.r = graph.tensor(node.inputs[2]).data.astype(np.float32)  # [D, G*H, H]
        b = operand(graph, node, SLOT_B)
        size = gates * self.hidden
        both = np.zeros((len(self.reverse), 2 * size), np.float32) if b is None else b.data.astype(np.float32)
        self.wb, self.rb = both[:, :size], both[:, size:]
        # int8 / hybrid builds: a float16 island (module docstring); float16 builds: no mark
        self.island = ctx.element_bytes != 2
        self.c2, self.max_channels = ctx.platform.c2("int8"), ctx.limits.max_cube_channels
        self.max_kernel = ctx.limits.max_kernel
        self.columns: dict[str, tuple[int, int]] = {}  # the map X is transposed from -> (C, H)
        self.column_map, self.column_steps, self.projections = "", {}, {}  # x_columns, conv
        self.picked: dict[str, tuple[str, int, bool]] = {}  # a picked projection -> (key, step, biased)

    # ---- building blocks ----------------------------------------------------------------------
    def tensor(self, label: str, shape: tuple[int, ...] | None = None, name: str | None = None) -> str:
        name = name or self.graph.unique_tensor_name(f"{self.node.name}_{label}")
        if name not in self.graph.tensors:
            self.graph.add_tensor(Tensor(name, shape or (1, self.hidden, 1, 1), self.dtype))
        return name

    def add(self, label: str, op: str, inputs: list[str], output: str | list[str], attrs: dict | None = None,
            island: bool = True) -> str:
        attrs = dict(attrs or {})
        if island and self.island:
            attrs[ISLAND_ATTR] = 1
        outputs = output if isinstance(output, list) else [output]
        self.nodes.append(Node(self.graph.unique_node_name(f"{self.node.name}_{label}"), op, inputs, outputs, attrs))
        return outputs[0]

    def constant(self, key: str, data: np.ndarray) -> str:
        """One constant tensor per key (a gate's weight), read by that gate's conv at every step."""
        if key not in self.constants:
            self.constants[key] = self.graph.add_constant(f"{self.node.name}_{key}", data).name
        return self.constants[key]

    def conv(self, label: str, key: str, x: str, weight: np.ndarray, bias: np.ndarray | None) -> str:
        """A 1x1 conv of the [1, C, 1, 1] map ``x`` with ``weight`` [H', C]. Of step t of a map X was
        transposed from (:meth:`x_columns`): pixel t of the conv over all steps (:meth:`projection`),
        picked; of the map's only column [1, C, H, 1], a conv with kernel [H, 1]."""
        if x in self.column_steps:
            picked = self.pick(label, self.projection(key, weight, bias), self.column_steps[x])
            self.picked[picked] = (key, self.column_steps[x], bias is not None)
            return picked
        attrs, kernel = CONV_1X1, weight[:, :, None, None]
        if x in self.columns:
            channels, height = self.columns[x]
            attrs, kernel = dict(CONV_1X1, kernel_shape=[height, 1]), weight.reshape(-1, channels, height, 1)
        inputs = [x, self.constant(f"{key}_w", kernel)]
        if bias is not None:
            inputs.append(self.constant(f"{key}_b", bias))
        return self.add(label, "Conv", inputs, self.tensor(label, (1, weight.shape[0], 1, 1)), attrs)

    def projection(self, key: str, weight: np.ndarray, bias: np.ndarray | None) -> str:
        """The input projection of every step at once, made once per ``key``: a conv with kernel [H, 1]
        of the map [1, C, H, T] X was transposed from, ``weight`` [H', C*H] read as [H', C, H, 1]
        (X's feature c*H + h of step t is the map's (c, h, t)) -> [1, H', 1, T] (the vendor's
        all-steps projection, LOWERING.md 31.2 [V]; each weight read once, not once per step)."""
        if key not in self.projections:
            source, (channels, height) = self.column_map, self.columns[self.column_map]
            inputs = [source, self.constant(f"{key}_w", weight.reshape(-1, channels, height, 1))]
            if bias is not None:
                inputs.append(self.constant(f"{key}_b", bias))
            shape = (1, weight.shape[0], 1, self.steps)
            self.projections[key] = self.add(f"{key}_all_steps", "Conv", inputs, self.tensor(f"{key}_all_steps", shape),
                                             dict(CONV_1X1, kernel_shape=[height, 1]))
        return self.projections[key]

    def pick(self, label: str, source: str, t: int) -> str:
        """Pixel t of the [1, C, 1, T] map ``source`` as a [1, C, 1, 1] map: a depthwise conv with
        kernel [1, T] whose weights are 1 at tap t, 0 elsewhere (exact: one product by 1.0)."""
        channels = self.graph.tensor(source).shape[1]
        onehot = np.zeros((channels, 1, 1, self.steps), np.float32)
        onehot[:, 0, 0, t] = 1.0
        attrs = dict(CONV_1X1, kernel_shape=[1, self.steps], group=channels, **{SELECTION_ATTR: 1})
        return self.add(label, "Conv", [source, self.constant(f"pick{t}_{channels}", onehot)],
                        self.tensor(label, (1, channels, 1, 1)), attrs)

    def scale(self, label: str, key: str, x: str, vector: np.ndarray) -> str:
        """x times a constant per-channel vector: a 1x1 depthwise conv (made here, so it carries the
        island mark; the scale+bias stage would make the same layer from a Mul)."""
        weight = self.constant(f"{key}_w", vector.astype(np.float32)[:, None, None, None])
        return self.add(label, "Conv", [x, weight], self.tensor(label), dict(CONV_1X1, group=self.hidden))

    def in_island(self, part: int, total: int) -> bool:
        """A Split/Concat of ``part``-channel pieces into/of ``total`` channels stays by address in
        both precisions (int8 C2 boundaries, one cube), so it can be float16 in an int8 build."""
        return part % self.c2 == 0 and total <= self.max_channels

    def pieces_in_island(self, total: int) -> bool:
        """Whether :meth:`pieces` of a ``total``-channel map are float16 in an int8 build."""
        return self.island and total <= self.max_channels

    def pieces(self, label: str, source: str, parts: int, size: int) -> list[str]:
        """``source`` cut into ``parts`` maps of ``size`` channels: a channel Split, except in an
        int8 build off int8 C2 boundaries, where the -O3 rewrite would make unmarked int8 selection
        convs of a float16 Split: there this makes the 1x1 selection convs itself, in the island
        (0/1 weights: exact in float16)."""
        total = parts * size
        if not self.pieces_in_island(total) or self.in_island(size, total):
            names = [self.tensor(f"{label}{index}", (1, size, 1, 1)) for index in range(parts)]
            self.add(f"{label}_split", "Split", [source], names, {"axis": 1, "split": [size] * parts},
                     island=self.in_island(size, total))
            return names
        attrs = dict(CONV_1X1, **{SELECTION_ATTR: 1})
        return [self.add(f"{label}{index}_select", "Conv",
                         [source, self.constant(f"{label}{index}_select", channel_selection_weights(total, index * size, size))],
                         self.tensor(f"{label}{index}", (1, size, 1, 1)), attrs) for index in range(parts)]

    def own_input(self, name: str) -> bool:
        """A graph input only this node reads: stored float16 in int8 builds (quantize_graph types a
        graph input by its readers), so the island needs no conversion there, as the vendor's
        int8 exGRU build reads a float16 input ([V] rknn-fixtures-ops gru_int8 InputOperator)."""
        return name in self.graph.inputs and [node.name for node in self.graph.consumers().get(name, [])] == [
            self.node.name]

    # ---- the chain ----------------------------------------------------------------------------
    def x_steps(self) -> list[str]:
        columns = self.x_columns()
        if columns is not None:
            return columns
        steps, size = self.steps, self.inputs
        flat = self.add("x_flat", "Reshape", [self.node.inputs[0]], self.tensor("x_flat", (1, steps * size, 1, 1)),
                        {"shape": [1, steps * size, 1, 1]},
                        island=self.own_input(self.node.inputs[0]) and self.pieces_in_island(steps * size))
        return [flat] if steps == 1 else self.pieces("x", flat, steps, size)

    def x_columns(self) -> list[str] | None:
        """X [T, 1, C*H] made from a map [1, C, H, T] by Transpose(perm [3, 0, 1, 2]) and reshapes
        (a CRNN's feature map into its LSTM, LOWERING.md 38.3): no Transpose or flattening; each
        input projection is one conv over the map's T columns and each step picks its pixel
        (:meth:`conv`). The steps are names :meth:`conv` knows, not tensors. None where X is not made
        so, or T or H pass the CNA's kernel size."""
        source = transposed_columns(self.graph, self.node.inputs[0])
        if source is None:
            return None
        _, channels, height, width = self.graph.tensor(source).shape
        if max(width, height) > self.max_kernel:
            return None
        self.columns[source], self.column_map = (channels, height), source
        if width == 1:
            return [source]
        self.column_steps = {f"{source}@step{t}": t for t in range(width)}
        return list(self.column_steps)

    def alone_from_columns(self) -> None:
        """A picked projection with no recurrent term to add (the first step's, h(0) = 0) feeds its
        activation directly: there it is the step's own conv of column t of the map (the column a
        one-hot depthwise conv picks, the gate conv with kernel [H, 1]), whose activation runs on
        the conv's output before it is rounded to float16, as the flattened route does (38.3)."""
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                users.setdefault(name, []).append(node)
        columns: dict[int, str] = {}
        for index, node in enumerate(self.nodes):
            if node.outputs[0] not in self.picked or any(user.op_type in ("Add", "Sub")
                                                         for user in users.get(node.outputs[0], [])):
                continue
            key, t, biased = self.picked[node.outputs[0]]
            if t not in columns:
                columns[t] = self.pick(f"x{t}_column", self.column_map, t)
            channels, height = self.columns[self.column_map]
            self.graph.tensors[columns[t]].shape = (1, channels, height, 1)
            inputs = [columns[t], self.constants[f"{key}_w"]] + ([self.constants[f"{key}_b"]] if biased else [])
            island = {ISLAND_ATTR: 1} if node.attrs.get(ISLAND_ATTR) else {}
            attrs = dict(CONV_1X1, kernel_shape=[height, 1], **island)
            self.nodes[index] = Node(node.name, "Conv", inputs, node.outputs, attrs)
        self.nodes.sort(key=lambda node: 0 if node.outputs[0] in columns.values() else 1)  # columns first

    def initial(self, slot: int, label: str, x: str) -> list[str | None]:
        """Each direction's initial state as a [1, H, 1, 1] map, None where it is zero."""
        tensor, count = operand(self.graph, self.node, slot), len(self.reverse)
        if zero_or_absent(tensor):
            return [None] * count
        if tensor.is_const:  # a map of the constant: zero weights, the state as bias
            data = tensor.data.astype(np.float32).reshape(count, self.hidden)
            zeros = np.zeros((self.hidden, self.inputs), np.float32)
            return [self.conv(f"{label}{d}", f"{label}{d}", x, zeros, data[d]) for d in range(count)]
        shape = [1, count * self.hidden, 1, 1]
        flat = self.add(f"{label}_flat", "Reshape", [tensor.name], self.tensor(f"{label}_flat", tuple(shape)),
                        {"shape": shape}, island=self.own_input(tensor.name) and self.pieces_in_island(shape[1]))
        return [flat] if count == 1 else self.pieces(label, flat, count, self.hidden)

    def run(self, initial_slots: tuple[tuple[int, str], ...]) -> None:
        xs = self.x_steps()
        hs: list[list[str]] = []
        finals: list[tuple[str, ...]] = []
        starts = [self.initial(slot, label, xs[0]) for slot, label in initial_slots]
        for d, reverse in enumerate(self.reverse):  # the reverse direction walks the steps backwards
            states = tuple(start[d] for start in starts)
            hs.append([""] * self.steps)
            for t in (reversed(range(self.steps)) if reverse else range(self.steps)):
                states = self.step(d, t, xs[t], states)
                hs[d][t] = states[0]
            finals.append(states)
        self.outputs(hs, finals)
        if self.column_steps:
            self.alone_from_columns()
        index = self.graph.nodes.index(self.node)
        self.graph.nodes[index:index + 1] = self.nodes
        if self.columns:  # the Transpose and reshapes that made X, when nothing else reads them
            drop_unread_chain(self.graph, self.node.inputs[0])

    def step(self, d: int, t: int, x: str, states: tuple) -> tuple[str, ...]:
        raise NotImplementedError

    def outputs(self, hs: list[list[str]], finals: list[tuple[str, ...]]) -> None:
        """Y [T, D, 1, H] from the h(t) ordered step-major (a channel Concat); each final state
        [D, 1, H] from the directions' last ones."""
        used = set(self.graph.outputs) | set(self.graph.consumers())
        # an output nothing reads (the importer's stand-in for "") costs no layer
        names = [name if name in used else "" for name in self.node.outputs]
        parts = [[h for t in range(self.steps) for h in (hs[d][t] for d in range(len(hs)))]]
        parts += [[final[k] for final in finals] for k in range(len(finals[0]))]
        for name, values in zip(names, parts):
            if not name:
                continue
            # int8 builds: a graph output stays float16 (no conversion, as the vendor's exGRU output);
            # otherwise a Concat the NPU runs is int8 (each h converted by a DPU task, where a
            # conversion feeding the host Reshape would be a host step) and a wider one, a host
            # step either way, joins in float16 (one conversion instead of T*D host ones)
            # (a float16 Concat off int8 C2 boundaries would become unmarked int8 placement convs at -O3)
            output, total = name in self.graph.outputs, len(values) * self.hidden
            joined, island = values[0], name in self.graph.outputs
            if len(values) > 1:
                island = output and self.in_island(self.hidden, total) or total > self.max_channels
                joined = self.add(f"{name}_concat", "Concat", values, self.tensor(f"{name}_concat", (1, total, 1, 1)),
                                  {"axis": 1}, island=island)
            self.add(f"{name}_reshape", "Reshape", [joined], name, {"shape": list(self.graph.tensor(name).shape)},
                     island=output and island)


__all__ = ["COLUMNS_PERM", "CONV_1X1", "DIRECTIONS", "MAX_STEPS", "MAX_WEIGHT_BYTES", "SLOT_B", "SLOT_INITIAL_H",
           "SLOT_SEQUENCE_LENS", "Unroll", "common_reason", "drop_unread_chain", "operand", "state_reason",
           "transposed_columns", "zero_or_absent"]
