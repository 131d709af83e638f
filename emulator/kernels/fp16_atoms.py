"""fp32 planes rounded to fp16 and stored into NC1HWC2 atom rows in one pass (issue 20).

The fp16 DPU step of a task program (units/dpu_plan_fp.py) rounds its float32 [C][H][W] results
to fp16 (OUT_CVT, NUMERICS.md 7: ``kernels.dpu.out_cvt_fp16``) and scatters the planes into the
WDMA's atoms (``memory._scatter_planes``): two passes over the cube and an fp16 copy of it.
:func:`planes_to_fp16_atoms` rounds each element as it stores it, with the same per-element
rounding (``fp16.fp32_bits_to_fp16_bits_fast``) and the same stores in the same order, so the
memory afterwards holds the same bytes (tests/emulator/test_fp16_fused_atoms.py,
test_fp16_atom_stores.py); compiled, so that compiled callers (dpu_fp_chain.fp16_step) call it too.

Three loops, one result (NUMERICS.md 33): surfaces whose rows follow each other in the region in runs
of whole rows (``_store_runs``, session 21: a row's lanes no longer end in the loops' scalar tails,
28-wide rows 0.29 -> 0.09 ns an element); other rows of at least ``_WIDE_ROW`` pixels, and the rows of
single-row surfaces, one at a time; narrower rows (the one-pixel rows of an interleaved write) in
blocks of ``_BLOCK`` pixels across rows, which keeps the per-row overhead (~100 ns) off rows of a few
pixels (10 -> 0.6 ns an element on one-pixel rows). All store an atom's C2 = 8 lanes together when C2
is 8 (fp16's) and round with the CPU's own conversion where it has one
(``fp16.fp32_bits_to_fp16_bits_native``). With F16C, the rows and runs of 8 whole lanes go through
``fp16_atoms_ir.planes_to_atoms`` instead (8 pixels transposed in registers, rounded by the same
instruction with the same NaN select: session 21, ppocr_rec's 40-wide rows 0.18 -> 0.08 ns an element).

Every NaN is stored as the canonical fp16 NaN 0x7E00 (``fp16.fp32_bits_to_fp16_bits_canonical``: the
DPU's stores in default-NaN mode, NUMERICS.md section on the DPU's canonical NaN), whatever NaN the
chain made or read from memory: one compare and select per element, in the rounding loop.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels.fp16 import fp32_bits_to_fp16_bits_canonical, native_halves
from npuemu.emulator.kernels.fp16_atoms_ir import planes_to_atoms
from npuemu.emulator.kernels.fp16_small_planes_ir import planes_to_atoms2, planes_to_atoms4, whole_surfaces

#: rows at least this wide go one at a time (measured with F16C: 16-56 wide, 0.47-0.18 ns an element
#: against 0.47-0.49 for the blocked loop; 14 and 7 wide, 0.55 and 0.84 against 0.49 and 0.58)
_WIDE_ROW = 16
#: pixels rounded per block in the blocked loop (its lane-major buffer: 8 KiB at C2 = 8)
_BLOCK = 512
#: pixels a run of back-to-back rows takes at most (whole rows; its lane-major buffer: 16 KiB at C2 = 8)
_RUN = 1024


@njit(cache=True)
def planes_to_fp16_atoms(planes, c2, offsets, data):
    """``planes`` uint32 [C][H][W] (fp32 bits), ``data`` the region as uint16, ``offsets`` each
    atom row's first element: row r is surface r // H, line r % H; lane l of surface s is channel
    s*C2 + l, lanes past C are 0. Rows are stored in order (where two overlap, the later wins).
    Surfaces whose rows follow each other in the region (the first two rows back to back) go in runs
    of rows (``_store_runs``); single-row surfaces a row at a time, as wide rows. Planes of one pixel go flat
    (``store_channels``), whole surfaces of planes of 2 or 4 pixels a surface in registers (``_small_surfaces``,
    F16C; session 22)."""
    height, width = planes.shape[1], planes.shape[2]
    pixels = height * width
    if pixels == 1 and planes.flags.c_contiguous:
        store_channels(planes.reshape(-1), c2, offsets, data)
    elif native_halves() and c2 == 8 and (pixels == 2 or pixels == 4) and planes.flags.c_contiguous \
            and data.strides[0] == 2 and whole_surfaces(offsets, height, 0, 1, planes.shape[0], data.size, pixels):
        _small_surfaces(planes, offsets, height, data, pixels)
    elif height > 1 and offsets.size > 1 and offsets[1] == offsets[0] + width * c2:
        _store_runs(planes, c2, offsets, data)
    elif width >= _WIDE_ROW or height == 1:
        _store_rows(planes, c2, offsets, data)
    else:
        _store_blocks(planes, c2, offsets, data)


@njit(cache=True)
def _small_surfaces(planes, offsets, height, data, pixels):
    # planes of 2 or 4 pixels, surface by surface in registers (fp16_small_planes_ir: 136 x 1 x 4, 0.44 -> ~0.09
    # us a store), surfaces in the rows' order (each one's rows back to back: no overlap inside one)
    if not native_halves():  # (F16C's IR: never compiled for other targets, which have no half conversions)
        return
    for k in range(offsets.size // height):
        source = planes.ctypes.data + k * 8 * pixels * 4
        target = data.ctypes.data + offsets[k * height] * 2
        if pixels == 4:
            planes_to_atoms4(source, 0, target, 0, 1)
        else:
            planes_to_atoms2(source, 0, target, 0, 1)


@njit(cache=True)
def store_channels(bits, c2, offsets, data):
    """``planes_to_fp16_atoms`` of 1x1 planes (H = W = 1), ``bits`` the [C] fp32 bits flat: row r is surface r,
    one atom. Rows back to back in the region go as one loop over their elements, lanes past C stored 0
    (silero-vad's 128-channel LSTM vectors: 16 atoms a loop, not 16 calls and a buffer); the same rounding
    (``fp32_bits_to_fp16_bits_canonical``) in the same order of rows, so the same bytes."""
    channels, r = bits.size, 0
    while r < offsets.size:
        end = r + 1
        while end < offsets.size and offsets[end] == offsets[end - 1] + c2:
            end += 1
        base = r * c2
        target = data[offsets[r]:offsets[r] + (end - r) * c2]
        count = max(0, min(target.size, channels - base))
        source = bits[base:base + count]
        for i in range(count):
            target[i] = fp32_bits_to_fp16_bits_canonical(source[i])
        for i in range(count, target.size):
            target[i] = 0
        r = end


@njit(cache=True, inline="always")
def _transposed(lanes, c2, row, count, pixel_bytes):
    # whether a row of ``count`` atoms goes through fp16_atoms_ir.planes_to_atoms (F16C, 8 whole lanes, dense
    # plane rows, the whole row inside the region): 8 pixels transposed in registers and rounded together, the
    # rounding of the loops below (40-wide rows 0.18 -> 0.08 ns an element, 7-wide 1.8 -> 0.3; session 21)
    return native_halves() and lanes == 8 and c2 == 8 and pixel_bytes == 4 and row.size == count * 8 \
        and row.strides[0] == 2


@njit(cache=True)
def _store_runs(planes, c2, offsets, data):
    # runs of a surface's rows that follow each other in the region (row r + 1 where row r ends; at most
    # _RUN pixels, whole rows) as one row of their pixels: each lane's pixels, contiguous in its plane,
    # rounded in one loop, then stored atom by atom. Why: a row at a time, a 28-wide row's lanes ran
    # 12 of their 28 pixels in the loops' scalar tails (0.29 ns an element; 0.09 in runs). The runs
    # follow the rows' order and hold no overlap (each row starts where the one before ends): the
    # same stores in the same order
    channels, height, width = planes.shape
    flat = planes.reshape(channels, height * width)
    line = width * c2
    most = max(_RUN // width, 1) * width
    rounded = np.empty((c2, most), np.uint16)
    r = 0
    while r < offsets.size:
        end = r + 1
        while end < offsets.size and end % height != 0 and offsets[end] == offsets[end - 1] + line \
                and (end - r) * width < most:
            end += 1
        first, start, count = (r // height) * c2, (r % height) * width, (end - r) * width
        row = data[offsets[r]:offsets[r] + count * c2]
        lanes = min(c2, channels - first)
        if _transposed(lanes, c2, row, count, flat.strides[1]):
            planes_to_atoms(flat.ctypes.data + first * flat.strides[0] + start * 4, flat.strides[0], row.ctypes.data,
                            count)
            r = end
            continue
        if lanes < c2:
            row[:] = 0
        for lane in range(lanes):
            source, target = flat[first + lane, start:start + count], rounded[lane]
            for i in range(count):
                target[i] = fp32_bits_to_fp16_bits_canonical(source[i])
        if lanes == 8 and c2 == 8:  # (a constant count: ~20% faster)
            for x in range(count):
                for lane in range(8):
                    row[x * 8 + lane] = rounded[lane, x]
        else:
            for lane in range(lanes):
                source, target = rounded[lane], row[lane:]
                for x in range(count):
                    target[x * c2] = source[x]
        r = end


@njit(cache=True)
def _store_rows(planes, c2, offsets, data):
    channels, height, width = planes.shape
    line = width * c2
    rounded = np.empty((c2, width), np.uint16)  # one atom row's lanes, rounded (contiguous: vectorised)
    for r in range(offsets.size):
        first, y = (r // height) * c2, r % height
        row = data[offsets[r]:offsets[r] + line]
        lanes = min(c2, channels - first)
        if _transposed(lanes, c2, row, width, planes.strides[2]):
            planes_to_atoms(planes.ctypes.data + first * planes.strides[0] + y * planes.strides[1], planes.strides[0],
                            row.ctypes.data, width)
            continue
        if first + c2 > channels:
            row[:] = 0
        for lane in range(lanes):
            source, target = planes[first + lane, y], rounded[lane]
            for x in range(width):
                target[x] = fp32_bits_to_fp16_bits_canonical(source[x])
        if lanes == 8 and c2 == 8:  # a whole atom at a time (a constant count: ~20% faster)
            for x in range(width):
                for lane in range(8):
                    row[x * 8 + lane] = rounded[lane, x]
            continue
        for lane in range(lanes):
            source, target = rounded[lane], row[lane:]
            for x in range(width):
                target[x * c2] = source[x]


@njit(cache=True)
def _store_blocks(planes, c2, offsets, data):
    # a surface's rows as one run of H*W pixels, _BLOCK at a time: its lanes rounded into a
    # lane-major buffer (lanes past C stay 0), then stored pixel by pixel in row order
    channels, height, width = planes.shape
    flat = planes.reshape(channels, height * width)
    rounded = np.empty((c2, _BLOCK), np.uint16)
    rows = offsets.size
    for s in range(-(-rows // height)):
        first = s * c2
        lanes = max(0, min(c2, channels - first))
        rounded[lanes:] = 0
        end = min(rows - s * height, height) * width
        for p0 in range(0, end, _BLOCK):
            n = min(_BLOCK, end - p0)
            for lane in range(lanes):
                source, target = flat[first + lane, p0:p0 + n], rounded[lane]
                for i in range(n):
                    target[i] = fp32_bits_to_fp16_bits_canonical(source[i])
            y, x, i = p0 // width, p0 % width, 0
            while i < n:
                run = min(width - x, n - i)
                start = offsets[s * height + y] + x * c2
                if c2 == 8:
                    for j in range(run):
                        for lane in range(8):
                            data[start + j * 8 + lane] = rounded[lane, i + j]
                else:
                    for j in range(run):
                        for lane in range(c2):
                            data[start + j * c2 + lane] = rounded[lane, i + j]
                i, x, y = i + run, 0, y + 1
