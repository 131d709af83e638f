"""A GRU unrolled into NPU layers (LOWERING.md 31.3; issue 19 item 4).

The vendor builds an ONNX GRU as one exGRU layer and keeps it float16 even in int8 builds
([V] rknn-fixtures-ops gru_int8 librknnc_tables.txt). This pass writes the recurrence with the
layers the LSTM's chain uses (passes/recurrent_unroll.py holds X's steps, the initial state, Y
and Y_h, and the float16 island of int8 builds). Per step and direction, gates in ONNX order
z, r, h:

- z = Sigmoid(Conv1x1(x_t; Wz, Wbz + Rbz) + Conv1x1(h; Rz)), r likewise;
- linear_before_reset 0: n = Tanh(Conv1x1(x_t; Wh, Wbh + Rbh) + Conv1x1(r*h; Rh));
  linear_before_reset 1: n = Tanh(Conv1x1(x_t; Wh, Wbh) + r*Conv1x1(h; Rh, Rbh));
- h' = (1 - z)*n + z*h, written n + z*(h - n): Sub, Mul, Add (DPU element-wise).

linear_before_reset 0 folds Rbh into the x conv's bias. With h(0) = 0 the first step has no
recurrent conv: n's recurrent term is r*Rbh for linear_before_reset 1 (a 1x1 depthwise conv of
r), none for 0 (where r is not made), and h' = n - z*n.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .context import PassContext
from .recurrent_unroll import SLOT_INITIAL_H, Unroll, common_reason, state_reason

DEFAULT_ACTIVATIONS = ["SIGMOID", "TANH"]
GATES = ("z", "r", "h")  # ONNX's order of W, R and B


def host_reason(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Why this GRU stays a host step, None when :func:`gru_as_npu_layers` unrolls it."""
    if node.op_type != "GRU":
        return None
    reason = common_reason(graph, node, ctx, len(GATES), [DEFAULT_ACTIVATIONS])
    return reason or state_reason(graph, node, SLOT_INITIAL_H, "initial_h")


def gru_as_npu_layers(graph: Graph, ctx: PassContext) -> int:
    """A GRU as 1x1 convs, look-up tables and element-wise layers per step and direction."""
    changed = 0
    for node in [node for node in graph.nodes if node.op_type == "GRU"]:
        if host_reason(graph, node, ctx) is None:
            _GruUnroll(graph, node, ctx, len(GATES)).run(((SLOT_INITIAL_H, "h0"),))
            changed += 1
    return changed


class _GruUnroll(Unroll):
    """One GRU's gates and update per step (the module docstring)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.before_reset = bool(self.node.attrs.get("linear_before_reset", 0))

    def rows(self, k: int) -> slice:
        return slice(k * self.hidden, (k + 1) * self.hidden)

    def gate(self, name: str, d: int, k: int, x: str, h: str | None) -> str:
        """Sigmoid(W x + Wb + Rb + R h) for z (k 0) and r (k 1)."""
        rows = self.rows(k)
        pre = self.conv(f"{name}_x", f"W{d}_{GATES[k]}", x, self.w[d, rows], self.wb[d, rows] + self.rb[d, rows])
        if h is not None:
            rec = self.conv(f"{name}_h", f"R{d}_{GATES[k]}", h, self.r[d, rows], None)
            pre = self.add(f"{name}_add", "Add", [rec, pre], self.tensor(f"{name}_pre"))
        return self.add(f"{name}_sigmoid", "Sigmoid", [pre], self.tensor(f"{name}_gate"))

    def candidate(self, name: str, d: int, x: str, h: str | None, r: str | None) -> str:
        """n = Tanh(W x + Wb + (Rh (r h) + Rb  |  r (Rh h + Rb)))."""
        rows, key = self.rows(2), f"{d}_h"
        rb = self.rb[d, rows]
        # linear_before_reset 0: Rb is outside r's product, so it joins the x conv's bias
        pre = self.conv(f"{name}_x", f"W{key}", x, self.w[d, rows], self.wb[d, rows] + (0 if self.before_reset else rb))
        term = None
        if not self.before_reset and h is not None:
            reset = self.add(f"{name}_rh", "Mul", [r, h], self.tensor(f"{name}_rh"))
            term = self.conv(f"{name}_h", f"R{key}", reset, self.r[d, rows], None)
        elif self.before_reset and h is not None:
            rec = self.conv(f"{name}_h", f"R{key}", h, self.r[d, rows], rb)
            term = self.add(f"{name}_r_rec", "Mul", [r, rec], self.tensor(f"{name}_r_rec"))
        elif self.before_reset and np.any(rb):
            term = self.scale(f"{name}_r_rb", f"Rb{key}", r, rb)  # r * Rb: h(0) = 0
        if term is not None:
            pre = self.add(f"{name}_add", "Add", [term, pre], self.tensor(f"{name}_pre"))
        return self.add(f"{name}_tanh", "Tanh", [pre], self.tensor(f"{name}_cand"))

    def step(self, d: int, t: int, x: str, states: tuple) -> tuple[str]:
        (h,) = states
        name = f"d{d}_t{t}"
        z = self.gate(f"{name}_z", d, 0, x, h)
        needs_r = h is not None or (self.before_reset and np.any(self.rb[d, self.rows(2)]))
        r = self.gate(f"{name}_r", d, 1, x, h) if needs_r else None
        n = self.candidate(f"{name}_n", d, x, h, r)
        if h is None:  # h' = n - z n
            zn = self.add(f"{name}_zn", "Mul", [z, n], self.tensor(f"{name}_zn"))
            return (self.add(f"{name}_h", "Sub", [n, zn], self.tensor(f"{name}_h")),)
        diff = self.add(f"{name}_diff", "Sub", [h, n], self.tensor(f"{name}_diff"))
        zd = self.add(f"{name}_zd", "Mul", [z, diff], self.tensor(f"{name}_zd"))
        return (self.add(f"{name}_h", "Add", [n, zd], self.tensor(f"{name}_h")),)


__all__ = ["gru_as_npu_layers", "host_reason"]
