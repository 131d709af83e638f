"""float16 islands of int8 builds (LOWERING.md 26, QUANTIZATION.md 13).

Some NPU lowerings exist in float16 only: Softmax over channels (LOWERING.md 22.2, 25) and the
multi-head attention (22.3). The vendor keeps Softmax in float16 inside its int8 builds too
(rknn-fixtures-ops softmax_last_int8: every tensor FLOAT16). An int8 build therefore makes such
an NPU layer a float16 layer by default: quantize_graph then stores its output in float16 and
inserts a DataConvert at each int8 edge, which the DPU runs (LOWERING.md 26). A layer the
partition sends to the host keeps the build's dtype; a dtype given explicitly (a quant config,
auto-hybrid) wins. A graph pass may mark the nodes it makes as island layers (``ISLAND_ATTR``:
float16 whatever their op and unit).
"""

from __future__ import annotations

from ..ir import Node

FLOAT16 = "float16"
#: ops whose NPU lowering computes in float16 whatever the build's precision
FLOAT16_ISLAND_OPS = ("Softmax", "HeadAttention")
#: a node attribute: the layer belongs to a float16 island a graph pass made (e.g. an unrolled
#: LSTM, GRU or RNN, passes/recurrent_unroll.py, LOWERING.md 31.2), on the NPU or the host
ISLAND_ATTR = "float16_island"


def island_dtype(node: Node) -> str | None:
    """"float16" for an NPU layer that exists in float16 only or a marked island layer, else None
    (the build's default)."""
    if node.attrs.get(ISLAND_ATTR):
        return FLOAT16
    return FLOAT16 if node.target == "NPU" and node.op_type in FLOAT16_ISLAND_OPS else None


__all__ = ["FLOAT16_ISLAND_OPS", "ISLAND_ATTR", "island_dtype"]
