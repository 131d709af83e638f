"""fp32 planes rounded to fp16 and stored into NC1HWC2 atom rows in one pass (issue 20).

The fp16 DPU step of a task program (units/dpu_plan_fp.py) rounds its float32 [C][H][W] results
to fp16 (OUT_CVT, NUMERICS.md 7: ``kernels.dpu.out_cvt_fp16``) and scatters the planes into the
WDMA's atoms (``memory._scatter_planes``): two passes over the cube and an fp16 copy of it.
:func:`planes_to_fp16_atoms` rounds each element as it stores it, with the same per-element
rounding (``fp16.fp32_bits_to_fp16_bits_fast``) and the same stores in the same order, so the
memory afterwards holds the same bytes (tests/emulator/test_fp16_fused_atoms.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels.fp16 import fp32_bits_to_fp16_bits_fast


@njit(cache=True)
def planes_to_fp16_atoms(planes, c2, offsets, data):
    """``planes`` uint32 [C][H][W] (fp32 bits), ``data`` the region as uint16, ``offsets`` each
    atom row's first element: row r is surface r // H, line r % H; lane l of surface s is channel
    s*C2 + l, lanes past C are 0. Rows are stored in order (where two overlap, the later wins)."""
    channels, height, width = planes.shape
    line = width * c2
    rounded = np.empty((c2, width), np.uint16)  # one atom row's lanes, rounded (contiguous: vectorised)
    for r in range(offsets.size):
        first, y = (r // height) * c2, r % height
        row = data[offsets[r]:offsets[r] + line]
        if first + c2 > channels:
            row[:] = 0
        lanes = min(c2, channels - first)
        for lane in range(lanes):
            source, target = planes[first + lane, y], rounded[lane]
            for x in range(width):
                target[x] = fp32_bits_to_fp16_bits_fast(source[x])
        for lane in range(lanes):  # (lane by lane: ~10% faster than pixel by pixel)
            source, target = rounded[lane], row[lane:]
            for x in range(width):
                target[x * c2] = source[x]
