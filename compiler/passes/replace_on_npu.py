"""Replacing a node by layers only when the partition puts them on the NPU: the loop the rewrite
passes of LOWERING.md 32 share (gather_index, reduce_mean_npu, pad_channels)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..ir import Graph, Node
from .context import PassContext
from .partition import decide


def replace_each(graph: Graph, ctx: PassContext, op_type: str, replacement: Callable[[Node], list[Node] | None],
                 exempt: Sequence[str] = ()) -> int:
    """Each ``op_type`` node for which ``replacement`` gives nodes is replaced by them when the
    partition puts every new node but those of the ``exempt`` op types on the NPU; otherwise it
    stays as it is (remove_dead drops the new tensors). The number of nodes replaced."""
    rewritten = 0
    for node in [node for node in graph.nodes if node.op_type == op_type]:
        nodes = replacement(node)
        if nodes is None or any(decide(graph, new, ctx).target != "NPU" for new in nodes if new.op_type not in exempt):
            continue
        index = graph.nodes.index(node)
        graph.nodes[index:index + 1] = nodes
        rewritten += 1
    return rewritten
