"""A simple RNN unrolled into NPU layers (LOWERING.md 31.4; issue 19 item 4).

Per step and direction h' = f(Conv1x1(x_t; W, Wb + Rb) + Conv1x1(h; R)) with f Tanh or Sigmoid
(a DPU look-up table) or Relu (the DPU's BS stage), fused into the recurrent conv with the Add
as its residual; the first step has no recurrent conv when h(0) = 0. The rest (X's steps, the
initial state, Y and Y_h, int8 builds' float16 island) is passes/recurrent_unroll.py's.
"""

from __future__ import annotations

from ..ir import Graph, Node
from .context import PassContext
from .recurrent_unroll import SLOT_INITIAL_H, Unroll, common_reason, state_reason

#: the functions unrolled, one per direction, both directions the same
FUNCTIONS = {"TANH": "Tanh", "RELU": "Relu", "SIGMOID": "Sigmoid"}


def host_reason(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Why this RNN stays a host step, None when :func:`rnn_as_npu_layers` unrolls it."""
    if node.op_type != "RNN":
        return None
    reason = common_reason(graph, node, ctx, 1, [[name] for name in FUNCTIONS])
    return reason or state_reason(graph, node, SLOT_INITIAL_H, "initial_h")


def rnn_as_npu_layers(graph: Graph, ctx: PassContext) -> int:
    """An RNN as 1x1 convs and an activation per step and direction."""
    changed = 0
    for node in [node for node in graph.nodes if node.op_type == "RNN"]:
        if host_reason(graph, node, ctx) is None:
            _RnnUnroll(graph, node, ctx, 1).run(((SLOT_INITIAL_H, "h0"),))
            changed += 1
    return changed


class _RnnUnroll(Unroll):
    def step(self, d: int, t: int, x: str, states: tuple) -> tuple[str]:
        (h,) = states
        name = f"d{d}_t{t}"
        pre = self.conv(f"{name}_x", f"W{d}", x, self.w[d], self.wb[d] + self.rb[d])
        if h is not None:
            rec = self.conv(f"{name}_h", f"R{d}", h, self.r[d], None)
            pre = self.add(f"{name}_add", "Add", [rec, pre], self.tensor(f"{name}_pre"))
        function = FUNCTIONS[self.node.attrs["activations"][d]]
        return (self.add(f"{name}_{function.lower()}", function, [pre], self.tensor(f"{name}_h")),)


__all__ = ["rnn_as_npu_layers", "host_reason"]
