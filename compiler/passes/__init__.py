"""Graph passes: folding, hardware fusion, clean-up, vendor rewrites and the NPU/CPU partition.

    from npuemu.compiler.passes import PassContext, optimize
    ctx = PassContext.for_chip("rk3588", level=3)
    log, split = optimize(graph, ctx)        # passes in place, then the partition

``pipeline.py`` lists the stages per optimization level; ``partition.py`` the NPU ops and
their constraints (``constraints.py``); ``compiler/SUPPORT.md`` is generated from both
(``python -m npuemu.compiler.passes.support_doc``). Ops only passes create (FullyConnected,
Silu, Glu) are registered by ``composite_ops`` when this package is imported.
"""

from __future__ import annotations

from collections import Counter

from ..ir import Graph
from . import composite_ops
from .context import PassContext
from .partition import CPU, NPU, Decision, Partition, partition
from .pipeline import DEFAULT_LEVEL, LEVELS, STAGES, PassLog, run_passes


def optimize(graph: Graph, ctx: PassContext, *, check_every_pass: bool = False) -> tuple[PassLog, Partition]:
    """Run the passes of ``ctx.level`` on ``graph`` (in place), then partition it."""
    log = run_passes(graph, ctx, check_every_pass=check_every_pass)
    return log, partition(graph, ctx)


def fused_layer_counts(graph: Graph) -> Counter[str]:
    """How many layers carry fused parts, by ``display_op`` (``Conv+Relu``...)."""
    return Counter(node.display_op for node in graph.nodes if node.fused)


__all__ = ["CPU", "DEFAULT_LEVEL", "LEVELS", "NPU", "STAGES", "Decision", "PassContext", "PassLog", "Partition",
           "composite_ops", "fused_layer_counts", "optimize", "partition", "run_passes"]
