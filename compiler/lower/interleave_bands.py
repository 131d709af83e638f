"""Row bands of an interleaved (phase) conv short enough for the vendor's WDMA split.

The interleaved write's WDMA sizes are W lines of H x the cube's channels (REGISTER_SEMANTICS.md 52,
53 [V]: the vendor's rk3588 / rk3576 phase convs), so CHANNEL_WDMA (13 bits) caps a task's rows at
``deconv_phases.interleave_rows(channels)``. The CBUF plan (tiling.py) cuts rows for the CBUF only;
here any band taller than the cap is cut again into as even bands as can be, each reading the input
rows its outputs need (tiling.split_rows' rule), the first keeping the pad top (LOWERING.md 54).
"""

from __future__ import annotations

import dataclasses

from .. import deconv_phases
from .tiling import CbufPlan, CbufRequest, RowTile, rows_read


def cap_rows(plan: CbufPlan, request: CbufRequest, allocated: int) -> CbufPlan:
    """``plan`` with every row band of more than ``interleave_rows(allocated)`` output rows cut."""
    limit = deconv_phases.interleave_rows(allocated)
    if all(tile.out_rows <= limit for tile in plan.row_tiles):
        return plan
    tiles: list[RowTile] = []
    for tile in plan.row_tiles:
        count = -(-tile.out_rows // limit)
        bounds = [tile.out_start + tile.out_rows * i // count for i in range(count + 1)]
        tiles += [_band(request, start, end - start) for start, end in zip(bounds, bounds[1:])]
    return dataclasses.replace(plan, row_tiles=tuple(tiles))


def _band(request: CbufRequest, out_start: int, out_rows: int) -> RowTile:
    """Output rows [out_start, + out_rows) and the input rows they read (tiling.rows_read)."""
    pad = request.pad_top if out_start == 0 else 0
    in_start = max(0, out_start * request.stride_y - request.pad_top)
    return RowTile(in_start, rows_read(request, in_start, out_rows, pad), out_start, out_rows, pad)
