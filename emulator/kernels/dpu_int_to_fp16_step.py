"""A flying integer DPU task with an fp16 output in one pass (issue 20: the int -> fp16
conversions of int8 builds' float islands, units/dpu_plan_convert.py).

The full unit path (units/dpu.py ``_run_integer``, its ``converting`` branch) reads the MRDMA's
atoms, moves them to a [C][H][W] cube, runs BS -> BN -> EW (``kernels.dpu._stages_int``: int64
blocks, stored as int32), converts the int32 results to fp32 (``dpu_convert._int_to_float``:
OUT_CVT's multiplier, shift and MINUS_EXP, NUMERICS.md 26) and rounds them to fp16.
:func:`int_atoms_to_planes` does the same per element in one pass from the region's atom rows:
each channel's pixels gathered from their lane in the atoms into an int64 block, the same block
functions (``_bs_block``, ``_bn_block``, ``_ew_block``) on it, the int32 store of the stage result
(a wrapping cast, as ``_stages_int``'s int32 output array), then ``_int_to_float`` on the block into
float32 planes - the same functions on the same values in the same order, so the same bits. The
caller rounds the planes into the WDMA's atoms (``fp16_atoms.planes_to_fp16_atoms``: the
rounding of ``fp16.fp32_to_fp16``, NUMERICS.md 33).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels.dpu import BLOCK, _bn_block, _bs_block, _ew_block
from npuemu.emulator.kernels.dpu_convert import _int_to_float


@njit(cache=True)
def int_atoms_to_planes(region, offsets, height, lanes, bs, bs_operands, bn, bn_operands, operand, ew, scale,
                        shift, half_away, factor, lower, out):
    """``region`` the memory region viewed as the input's integer type, ``offsets`` each MRDMA atom
    row's first element (row r: surface r // ``height``, line r % ``height``; lane l of surface s is
    channel s * ``lanes`` + l at element x * ``lanes`` + l); ``out`` float32 [C][H*W]. ``bs`` / ``bn``
    / ``ew``: the stages' settings vectors (kernels.dpu's XP_ / EP_ layouts) or None (bypassed);
    ``bs_operands`` int64 [3][C] (ALU, CPEND, MUL; CPEND must be off: flying tasks have no window
    sums), ``bn_operands`` [2][C], ``operand`` the EW operand [C or 1][H*W]; then
    ``dpu_convert._int_to_float``'s arguments."""
    channels, pixels = out.shape
    if pixels < _FEW_PIXELS:
        _pixel_major(region, offsets, height, lanes, bs, bs_operands, bn, bn_operands, operand, ew, scale, shift,
                     half_away, factor, lower, out)
        return
    width = pixels // height
    scratch = np.empty(BLOCK, np.int64)
    # (no window sums: BS reads zeros, as int_stages' zero row; none made without BS: a 16 KiB fill a call)
    sums = np.zeros(BLOCK if bs is not None else 0, np.int64)
    for c in range(channels):
        base, lane = (c // lanes) * height, c % lanes
        operand_row = operand[c if operand.shape[0] > 1 else 0]
        for start in range(0, pixels, BLOCK):
            stop = min(start + BLOCK, pixels)
            block = scratch[:stop - start]
            y, x = start // width, start % width
            for p in range(block.shape[0]):
                block[p] = region[offsets[base + y] + x * lanes + lane]
                x += 1
                if x == width:
                    x, y = 0, y + 1
            if bs is not None:
                _bs_block(block, sums[:block.shape[0]], bs, bs_operands[0, c], bs_operands[1, c],
                          bs_operands[2, c])
            if bn is not None:
                _bn_block(block, bn, bn_operands[0, c], bn_operands[1, c])
            if ew is not None:
                _ew_block(block, operand_row[start:stop], ew)
            for p in range(block.shape[0]):  # (_stages_int's int32 result array: a wrapping store)
                block[p] = np.int32(block[p])
            _int_to_float(block, scale, shift, half_away, factor, lower, out[c, start:stop])


#: maps of fewer pixels go pixel by pixel across the channels (``_pixel_major``)
_FEW_PIXELS = 16


@njit(cache=True)
def _pixel_major(region, offsets, height, lanes, bs, bs_operands, bn, bn_operands, operand, ew, scale, shift,
                 half_away, factor, lower, out):
    # int_atoms_to_planes a pixel at a time, each block the channels' values at that pixel and the stages'
    # operands the channels' own (one per element: kernels.dpu's ``_at``), the same functions on the same
    # values, so the same bits. Why: channel by channel, a map of 1-5 pixels made four block calls a channel
    # (silero-vad's 128 x 1 conversions: ~4.4 us a call). A surface's lanes are gathered as one run (an integer
    # division an element, for the channel's surface and lane, cost more than the stages: 128 x 1 x 5, 2.4 ->
    # 1.1 us), the block sized to the channels (not BLOCK: a 32 KiB scratch for 128 values)
    channels, pixels = out.shape
    width = pixels // height
    size = min(channels, BLOCK)
    scratch = np.empty(2 * size if ew is not None else size, np.int64)
    floats = np.empty(size, np.float32)
    sums = np.zeros(size if bs is not None else 0, np.int64)
    for c0 in range(0, channels, size):
        c1 = min(c0 + size, channels)
        block, others = scratch[:c1 - c0], scratch[size:size + c1 - c0]
        for p in range(pixels):
            y, x = p // width, p % width
            c = c0
            while c < c1:  # the rest of a surface's lanes, one run
                lane = c % lanes
                count = min(lanes - lane, c1 - c)
                row = region[offsets[(c // lanes) * height + y] + x * lanes + lane:]
                for i in range(count):
                    block[c - c0 + i] = row[i]
                c += count
            if bs is not None:
                _bs_block(block, sums[:block.shape[0]], bs, bs_operands[0, c0:c1], bs_operands[1, c0:c1],
                          bs_operands[2, c0:c1])
            if bn is not None:
                _bn_block(block, bn, bn_operands[0, c0:c1], bn_operands[1, c0:c1])
            if ew is not None:
                for c in range(c0, c1):
                    others[c - c0] = operand[c if operand.shape[0] > 1 else 0, p]
                _ew_block(block, others, ew)
            for i in range(block.shape[0]):  # (_stages_int's int32 result array: a wrapping store)
                block[i] = np.int32(block[i])
            # (into a dense scratch, then the plane column: a strided target slowed the conversion loop)
            _int_to_float(block, scale, shift, half_away, factor, lower, floats[:c1 - c0])
            column = out[c0:c1, p]
            for i in range(c1 - c0):
                column[i] = floats[i]
