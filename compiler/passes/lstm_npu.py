"""An LSTM unrolled into NPU layers (LOWERING.md 30, 31; issue 19 item 4).

The vendor runs an LSTM as a task chain per timestep ([V] rknn-fixtures-ops lstm_fp16
librknnc_tables.txt / regcmd.txt: 1x1 gate convs of h(t-1), DPU adds of the input
projection, LUT tasks for sigmoid/tanh, DPU element-wise tasks for the cell update). This pass
writes the same chain with layers the compiler already lowers, for a static sequence length
(the parts every cell shares, X's steps, the initial states, Y and the final states and the
float16 island of int8 builds, are passes/recurrent_unroll.py's):

- X [T, 1, I] is reshaped to one pixel of T*I channels, [1, T*I, 1, 1], and split into the T
  timesteps along the channels (a channel Split: by address on C2 boundaries, else a DPU copy
  or, at -O3, selection convs). A pixel slice of the token layout [1, I, 1, T] would have to
  be a host Slice (no NPU layer reads one pixel of a row by address).
- per timestep and gate g (ONNX order i, o, f, c): ``Conv1x1(x_t; W_g, Wb_g + Rb_g)`` plus
  ``Conv1x1(h(t-1); R_g)`` (the fusion stage makes the Add the second conv's residual), then
  Sigmoid (i, o, f) or Tanh (c) as DPU look-up tables; c(t) = f*c(t-1) + i*g and
  h(t) = o*tanh(c(t)) as DPU element-wise Mul/Add. With h(0) = 0 (c(0) = 0) the first step has
  no recurrent conv (no forget term).
- reverse walks the steps from T-1 down; bidirectional is both chains, each with its own weights.
- Y [T, D, 1, H] is the channel Concat of the h(t), step-major (each step's directions side by
  side), reshaped; Y_h and Y_c are the last h and c of each direction, concatenated, reshaped to
  [D, 1, H].

What it does not take stays the LSTM host step, with :func:`host_reason` in the partition
report (recurrent_constraint.recurrent_unrolled).
"""

from __future__ import annotations

from ..ir import Graph, Node
from .context import PassContext
from .recurrent_unroll import MAX_STEPS, MAX_WEIGHT_BYTES, SLOT_INITIAL_H, Unroll, common_reason, operand, state_reason

DEFAULT_ACTIVATIONS = ["SIGMOID", "TANH", "TANH"]
SLOT_INITIAL_C, SLOT_P = 6, 7
GATES = ("i", "o", "f", "c")  # ONNX's order of W, R and B


def host_reason(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Why this LSTM stays a host step, None when :func:`lstm_as_npu_layers` unrolls it."""
    if node.op_type != "LSTM":
        return None
    reason = common_reason(graph, node, ctx, len(GATES), [DEFAULT_ACTIVATIONS])
    if reason is not None:
        return reason
    if node.attrs.get("input_forget", 0):
        return "input_forget (only the default is unrolled)"
    if operand(graph, node, SLOT_P) is not None:
        return "peepholes P given"
    return (state_reason(graph, node, SLOT_INITIAL_H, "initial_h")
            or state_reason(graph, node, SLOT_INITIAL_C, "initial_c"))


def lstm_as_npu_layers(graph: Graph, ctx: PassContext) -> int:
    """An LSTM as 1x1 convs, look-up tables and element-wise layers per step and direction."""
    changed = 0
    for node in [node for node in graph.nodes if node.op_type == "LSTM"]:
        if host_reason(graph, node, ctx) is None:
            _LstmUnroll(graph, node, ctx, len(GATES)).run(((SLOT_INITIAL_H, "h0"), (SLOT_INITIAL_C, "c0")))
            changed += 1
    return changed


class _LstmUnroll(Unroll):
    """One LSTM's gates and cell update per step (the module docstring)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.bias = self.wb + self.rb  # Wb + Rb, folded into the x conv

    def gate(self, d: int, t: int, k: int, x: str, h: str | None) -> str:
        rows = slice(k * self.hidden, (k + 1) * self.hidden)
        name = f"d{d}_t{t}_{GATES[k]}"
        pre = self.conv(f"{name}_x", f"W{d}_{GATES[k]}", x, self.w[d, rows], self.bias[d, rows])
        if h is not None:  # h(0) = 0: the first step has no recurrent term
            rec = self.conv(f"{name}_h", f"R{d}_{GATES[k]}", h, self.r[d, rows], None)
            pre = self.add(f"{name}_add", "Add", [rec, pre], self.tensor(f"{name}_pre"))
        act = "Tanh" if GATES[k] == "c" else "Sigmoid"
        return self.add(f"{name}_{act.lower()}", act, [pre], self.tensor(f"{name}_gate"))

    def step(self, d: int, t: int, x: str, states: tuple) -> tuple[str, str]:
        h, c = states
        i, o, f, g = (self.gate(d, t, k, x, h) for k in range(4))
        t = f"{d}_{t}"  # the labels below name the direction too
        c_new = self.add(f"t{t}_ig", "Mul", [i, g], self.tensor(f"t{t}_ig"))
        if c is not None:  # c(0) = 0: no forget term at the first step
            fc = self.add(f"t{t}_fc", "Mul", [f, c], self.tensor(f"t{t}_fc"))
            c_new = self.add(f"t{t}_c", "Add", [fc, c_new], self.tensor(f"t{t}_c"))
        tanh_c = self.add(f"t{t}_tanh_c", "Tanh", [c_new], self.tensor(f"t{t}_tanh_c"))
        return self.add(f"t{t}_h", "Mul", [o, tanh_c], self.tensor(f"t{t}_h")), c_new


__all__ = ["MAX_STEPS", "MAX_WEIGHT_BYTES", "host_reason", "lstm_as_npu_layers"]
