"""The partition rule of the recurrent ops: each runs on the NPU only as the layers its pass
unrolls it into (passes/lstm_npu.py, gru_npu.py, recurrent_rnn.py; LOWERING.md 30, 31)."""

from __future__ import annotations

from ..ir import Graph, Node
from . import gru_npu, lstm_npu, recurrent_rnn
from .constraints import Constraint
from .context import PassContext

_HOST_REASONS = {"LSTM": lstm_npu.host_reason, "GRU": gru_npu.host_reason, "RNN": recurrent_rnn.host_reason}


@Constraint
def recurrent_unrolled(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """An LSTM, GRU or RNN runs on the NPU only as the layers its pass unrolls it into (float16; in
    int8 builds a float16 island between DPU DataConverts; any direction, batch 1, at most 64 steps
    and 32 MiB of W and R (stored once), default activations (RNN: Tanh, Relu or Sigmoid), no clip,
    peepholes, input_forget or sequence_lens; initial states absent, constant or [D, 1, H] maps;
    below -O3 steps on C2 boundaries; LOWERING.md 30, 31); one left as itself is a host step."""
    reason = _HOST_REASONS[node.op_type](graph, node, ctx)
    return reason or "not unrolled: the recurrent passes run from optimization level 1"


__all__ = ["recurrent_unrolled"]
