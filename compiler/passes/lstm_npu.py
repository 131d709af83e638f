"""An LSTM unrolled into NPU layers in float16 builds (LOWERING.md 30, issue 19 item 4).

The vendor runs an LSTM as a task chain per timestep ([V] rknn-fixtures-ops lstm_fp16
librknnc_tables.txt / regcmd.txt: 1x1 gate convs of h(t-1), DPU adds of the input
projection, LUT tasks for sigmoid/tanh, DPU element-wise tasks for the cell update). This pass
writes the same chain with layers the compiler already lowers, for a static sequence length:

- X [T, 1, I] is reshaped to one pixel of T*I channels, [1, T*I, 1, 1], and split into the T
  timesteps along the channels (a channel Split: by address on C2 boundaries, else a DPU copy
  or, at -O3, selection convs). A pixel slice of the token layout [1, I, 1, T] would have to
  be a host Slice (no NPU layer reads one pixel of a row by address).
- per timestep and gate g (ONNX order i, o, f, c): ``Conv1x1(x_t; W_g, Wb_g + Rb_g)`` plus
  ``Conv1x1(h(t-1); R_g)`` (the fusion stage makes the Add the second conv's residual), then
  Sigmoid (i, o, f) or Tanh (c) as DPU look-up tables; c(t) = f*c(t-1) + i*g and
  h(t) = o*tanh(c(t)) as DPU element-wise Mul/Add. With h(0) = c(0) = 0 the first step has no
  recurrent conv and no forget term.
- reverse walks the steps from T-1 down; bidirectional is both chains, each with its own weights.
- Y [T, D, 1, H] is the channel Concat of the h(t), step-major (each step's directions side by
  side), reshaped; Y_h and Y_c are the last h and c of each direction, concatenated, reshaped to
  [D, 1, H].

What it does not take stays the LSTM host step, with :func:`host_reason` in the partition
report (constraints.lstm_unrolled).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Tensor
from .context import PassContext

#: the longest sequence unrolled ([C]: every step is ~20 layers; the issue asks for small T)
MAX_STEPS = 64
#: [C] at most this many bytes of float16 W and R are unrolled. Every step's gate convs read one
#: constant per gate, which the build stores once (compiler/shared_weights.py, LOWERING.md 30.1),
#: so this counts one copy, not T (ddddocr's bidirectional 512-wide LSTM stores 8 MiB)
MAX_WEIGHT_BYTES = 32 << 20
DEFAULT_ACTIVATIONS = ["SIGMOID", "TANH", "TANH"]
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
SLOT_B, SLOT_SEQUENCE_LENS, SLOT_INITIAL_H, SLOT_INITIAL_C, SLOT_P = 3, 4, 5, 6, 7
GATES = ("i", "o", "f", "c")  # ONNX's order of W, R and B


def _operand(graph: Graph, node: Node, slot: int) -> Tensor | None:
    slots = node.attrs.get("input_slots", [])
    return graph.tensor(node.inputs[slots.index(slot)]) if slot in slots else None


def _zero_or_absent(tensor: Tensor | None) -> bool:
    return tensor is None or (tensor.is_const and not np.any(tensor.data))


def _form_reason(graph: Graph, node: Node) -> str | None:
    """The first attribute or operand this slice does not unroll, None when all fit."""
    attrs = node.attrs
    if attrs.get("layout", 0) != 0 or attrs.get("clip") is not None or attrs.get("input_forget", 0):
        return "layout 1, clip or input_forget (only the defaults are unrolled)"
    if list(attrs.get("activations", [])) != DEFAULT_ACTIVATIONS * DIRECTIONS[attrs.get("direction")]:
        return f"activations {attrs.get('activations')} (only Sigmoid/Tanh/Tanh are unrolled)"
    if _operand(graph, node, SLOT_SEQUENCE_LENS) is not None or _operand(graph, node, SLOT_P) is not None:
        return "sequence_lens or peepholes P given"
    for slot, what in ((SLOT_INITIAL_H, "initial_h"), (SLOT_INITIAL_C, "initial_c")):
        if not _zero_or_absent(_operand(graph, node, slot)):
            return f"{what} is not a constant zero (a state input or non-zero start)"
    return None


def host_reason(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Why this LSTM stays a host step, None when :func:`lstm_as_npu_layers` unrolls it."""
    if node.op_type != "LSTM":
        return None
    if ctx.element_bytes != 2:
        return "not a float16 build (--fp16): int8 and hybrid builds keep the LSTM step on the host"
    if any(not graph.tensor(name).is_const for name in node.inputs[1:]):
        return "W, R and B must be constants"
    x_shape = graph.tensor(node.inputs[0]).shape
    if len(x_shape) != 3 or x_shape[1] != 1:
        return f"X has shape {list(x_shape)} (batch 1 [T, 1, I] only)"
    if not 1 <= x_shape[0] <= MAX_STEPS:
        return f"sequence length {x_shape[0]} (at most {MAX_STEPS} steps are unrolled)"
    hidden, directions = int(node.attrs["hidden_size"]), DIRECTIONS.get(node.attrs.get("direction"), 1)
    weight_bytes = 2 * directions * 4 * hidden * (x_shape[2] + hidden)  # stored once for all steps
    if weight_bytes > MAX_WEIGHT_BYTES:
        return (f"W and R would store {weight_bytes / (1 << 20):.1f} MiB of float16 weights "
                f"(at most {MAX_WEIGHT_BYTES >> 20} MiB; every step shares one copy)")
    return _form_reason(graph, node)


def lstm_as_npu_layers(graph: Graph, ctx: PassContext) -> int:
    """A float16 LSTM as 1x1 convs, look-up tables and element-wise layers per step and direction."""
    changed = 0
    for node in [node for node in graph.nodes if node.op_type == "LSTM"]:
        if host_reason(graph, node, ctx) is None:
            _Unroll(graph, node).run()
            changed += 1
    return changed


class _Unroll:
    """The new tensors and nodes of one LSTM, inserted where the LSTM was."""

    def __init__(self, graph: Graph, node: Node) -> None:
        self.graph, self.node, self.nodes = graph, node, []
        self.constants: dict[str, str] = {}
        self.steps, _, self.inputs = graph.tensor(node.inputs[0]).shape
        self.hidden = int(node.attrs["hidden_size"])
        self.dtype = graph.tensor(node.inputs[0]).dtype
        direction = node.attrs["direction"]
        self.reverse = [False, True] if direction == "bidirectional" else [direction == "reverse"]
        self.w = graph.tensor(node.inputs[1]).data.astype(np.float32)  # [D, 4H, I]
        self.r = graph.tensor(node.inputs[2]).data.astype(np.float32)  # [D, 4H, H]
        b = _operand(graph, node, SLOT_B)
        both = np.zeros((len(self.reverse), 8 * self.hidden), np.float32) if b is None else b.data.astype(np.float32)
        self.bias = both[:, :4 * self.hidden] + both[:, 4 * self.hidden:]  # Wb + Rb, folded into the x conv

    def tensor(self, label: str, shape: tuple[int, ...], name: str | None = None) -> str:
        name = name or self.graph.unique_tensor_name(f"{self.node.name}_{label}")
        if name not in self.graph.tensors:
            self.graph.add_tensor(Tensor(name, shape, self.dtype))
        return name

    def add(self, label: str, op: str, inputs: list[str], output: str, attrs: dict | None = None) -> str:
        name = self.graph.unique_node_name(f"{self.node.name}_{label}")
        self.nodes.append(Node(name, op, inputs, [output], dict(attrs or {})))
        return output

    def constant(self, key: str, data: np.ndarray) -> str:
        """One constant tensor per gate weight, read by that gate's conv at every step."""
        if key not in self.constants:
            self.constants[key] = self.graph.add_constant(f"{self.node.name}_{key}", data).name
        return self.constants[key]

    def conv(self, label: str, key: str, x: str, weight: np.ndarray, bias: np.ndarray | None) -> str:
        inputs = [x, self.constant(f"{key}_w", weight[:, :, None, None])]
        if bias is not None:
            inputs.append(self.constant(f"{key}_b", bias))
        attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
        return self.add(label, "Conv", inputs, self.tensor(label, (1, weight.shape[0], 1, 1)), attrs)

    def run(self) -> None:
        steps, size, hidden = self.steps, self.inputs, self.hidden
        flat = self.add("x_flat", "Reshape", [self.node.inputs[0]], self.tensor("x_flat", (1, steps * size, 1, 1)),
                        {"shape": [1, steps * size, 1, 1]})
        xs = [self.tensor(f"x{t}", (1, size, 1, 1)) for t in range(steps)]
        if steps > 1:
            self.nodes.append(Node(self.graph.unique_node_name(f"{self.node.name}_x_split"), "Split", [flat], xs,
                                   {"axis": 1, "split": [size] * steps}))
        else:
            xs = [flat]
        hs: list[list[str]] = []
        finals: list[tuple[str, str]] = []
        for d, reverse in enumerate(self.reverse):  # the reverse direction walks the steps backwards
            h = c = None
            hs.append([""] * steps)
            for t in (reversed(range(steps)) if reverse else range(steps)):
                h, c = self.step(d, t, xs[t], h, c)
                hs[d][t] = h
            finals.append((h, c))
        self.outputs(hs, finals)
        index = self.graph.nodes.index(self.node)
        self.graph.nodes[index:index + 1] = self.nodes

    def gate(self, d: int, t: int, k: int, x: str, h: str | None) -> str:
        rows = slice(k * self.hidden, (k + 1) * self.hidden)
        name = f"d{d}_t{t}_{GATES[k]}"
        pre = self.conv(f"{name}_x", f"W{d}_{GATES[k]}", x, self.w[d, rows], self.bias[d, rows])
        if h is not None:  # h(0) = 0: the first step has no recurrent term
            rec = self.conv(f"{name}_h", f"R{d}_{GATES[k]}", h, self.r[d, rows], None)
            pre = self.add(f"{name}_add", "Add", [rec, pre], self.tensor(f"{name}_pre", (1, self.hidden, 1, 1)))
        act = "Tanh" if GATES[k] == "c" else "Sigmoid"
        return self.add(f"{name}_{act.lower()}", act, [pre], self.tensor(f"{name}_gate", (1, self.hidden, 1, 1)))

    def step(self, d: int, t: int, x: str, h: str | None, c: str | None) -> tuple[str, str]:
        shape = (1, self.hidden, 1, 1)
        i, o, f, g = (self.gate(d, t, k, x, h) for k in range(4))
        t = f"{d}_{t}"  # the labels below name the direction too
        c_new = self.add(f"t{t}_ig", "Mul", [i, g], self.tensor(f"t{t}_ig", shape))
        if c is not None:  # c(0) = 0: no forget term at the first step
            fc = self.add(f"t{t}_fc", "Mul", [f, c], self.tensor(f"t{t}_fc", shape))
            c_new = self.add(f"t{t}_c", "Add", [fc, c_new], self.tensor(f"t{t}_c", shape))
        tanh_c = self.add(f"t{t}_tanh_c", "Tanh", [c_new], self.tensor(f"t{t}_tanh_c", shape))
        return self.add(f"t{t}_h", "Mul", [o, tanh_c], self.tensor(f"t{t}_h", shape)), c_new

    def outputs(self, hs: list[list[str]], finals: list[tuple[str, str]]) -> None:
        """Y [T, D, 1, H] from the h(t) ordered step-major (a channel Concat), Y_h / Y_c [D, 1, H]."""
        used = set(self.graph.outputs) | set(self.graph.consumers())
        outs = [name if name in used else "" for name in self.node.outputs] + [""] * 3
        y, y_h, y_c = outs[:3]  # an output nothing reads (the importer's stand-in for "") costs no layer
        parts = {y: [h for t in range(self.steps) for h in (hs[d][t] for d in range(len(hs)))],
                 y_h: [h for h, _ in finals], y_c: [c for _, c in finals]}
        for name, values in parts.items():
            if not name:
                continue
            joined = values[0]
            if len(values) > 1:
                joined = self.add(f"{name}_concat", "Concat", values,
                                  self.tensor(f"{name}_concat", (1, len(values) * self.hidden, 1, 1)), {"axis": 1})
            self.add(f"{name}_reshape", "Reshape", [joined], name, {"shape": list(self.graph.tensor(name).shape)})

__all__ = ["MAX_STEPS", "MAX_WEIGHT_BYTES", "host_reason", "lstm_as_npu_layers"]
