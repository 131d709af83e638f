"""Splitting one convolution across NPU cores (issue 5's `--core-mask`).

The vendor's multi-core streams (RKNN chains 1-5) are not documented well enough to copy
(vendor-corpus README 4.4: per-core PPU merge tasks and amount-word bits 31:16 whose meaning is
unknown), so the split is our own, in the spirit of the guide's per-core workload table: a
convolution's tasks - its CBUF row tiles (and depthwise channel groups), re-cut into at least one
row block per core when the CBUF plan made fewer - are dealt to the cores in contiguous blocks
of output rows. Each core has its own CBUF, so the first task on every core loads the weights
(WEIGHT_REUSE 0) and, for a LUT activation, uploads the LUT into that core's LUT RAM. The cores
write disjoint rows of the same output tensor; the next layer starts when all have finished
(the build's schedule groups, isa/CONTAINER.md 3.5).

A layer stays on one core when it has fewer than ``MIN_ROWS_PER_CORE`` output rows per core
(splitting it would cost more in per-task overhead and halo rows than it saves) or when its
weights stream through the CBUF (an FC-like layer: every core would re-read all weights).
"""

from __future__ import annotations

import dataclasses

from .tiling import CbufPlan, CbufRequest, TaskTile, split_rows

MIN_ROWS_PER_CORE = 4


def deal_to_cores(plan: CbufPlan, request: CbufRequest, cores: int) -> tuple[tuple[TaskTile, ...], tuple[int, ...]]:
    """(the tasks, the core index of each) for ``cores`` cores; all on core 0 if not split."""
    tiles = plan.tasks
    if cores <= 1 or plan.weights_streamed or request.out_height < MIN_ROWS_PER_CORE * cores:
        return tiles, (0,) * len(tiles)
    row_tiles = plan.row_tiles
    if len(row_tiles) < cores:
        out_rows = -(-request.out_height // cores)
        max_rows = (out_rows - 1) * request.stride_y + max(request.kernel_h, request.stride_y)
        row_tiles = split_rows(request, max_rows)
        plan = dataclasses.replace(plan, row_tiles=row_tiles)
        tiles = plan.tasks
    used = min(cores, len(row_tiles))
    # whole row blocks per core: block b goes to core b * used // blocks
    core_of_row = [index * used // len(row_tiles) for index in range(len(row_tiles))]
    groups = len(plan.channel_groups)
    assignment = tuple(core_of_row[i // groups] for i in range(len(tiles)))
    dealt = []
    for index, (tile, core) in enumerate(zip(tiles, assignment)):
        first_on_core = index == 0 or assignment[index - 1] != core
        dealt.append(dataclasses.replace(tile, weight_reuse=False) if first_on_core else tile)
    return tuple(dealt), assignment
