"""The int8 DPU's folded chain written straight into the WDMA's atom lines, a surface at a time
(issue 20, NUMERICS.md 50).

``dpu_pixel._folded_rows`` (no EW stage, OUT_CVT's scale >= 0) computes a block of pixel rows into
a tile [pixels][lanes] and ``_store_atoms`` then moves each pixel's 16-byte atoms to their lines:
two passes, the second with a short run per pixel, surface and block (about a third of the
time), and a row loop whose vector body is entered once per pixel with its alias checks (the
narrow layers, 16 or 32 of 64 channels stored, twice the cost per element of the wide ones).
``folded_lines`` walks the output instead: per surface its 16 channels' operands are copied into
16-element rows once, and per line and pixel one 16-lane loop of constant count reads the
pixel's 16 inputs (and window sums) where they are and writes the atom's 16 bytes in place. Each
element is ``_folded_rows``' formula (``_folded_bs`` then ``_folded_out``, the same inline
functions on the same operands); only the order of the elements differs, and no element reads
another's result.

It takes int8 outputs in 16-lane atoms (C2 = 16: 16-byte atoms, the int8 builds' layout) whose
lanes are all channels (the caller's atoms hold none past them), pixel-major int32 data [1][P][C]
(C-contiguous), window sums none, one per pixel ([P], any integer type, already checked against
the chain's bound) or one per pixel and channel (a [P][C] int32 buffer, flat).

``ew_lines`` does the same for chains with the EW stage (residual adds, NUMERICS.md 55): each
element ``_ew_rows``' ``_chain_value``, the ERDMA's int8 operand atoms [S][P][16] read in place
instead of being made pixel-major int32 first.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels.dpu_pixel import _chain_value, _folded_bs, _folded_out, _out_cvt
from npuemu.emulator.kernels.vector_width import wide_vectors

#: lanes of an int8 atom (16 bytes)
LANES = 16


@njit(cache=True)
def takes(settings, out_itemsize, lanes, surfaces):
    """Whether ``folded_lines`` runs this chain (``dpu_pixel.chain_settings``' CH_*): no EW stage,
    OUT_CVT's scale >= 0 (``_folded_rows``' form), int8 elements, 16 lanes to an atom."""
    return settings[dp.CH_EW_ON] == 0 and settings[dp.CH_K] >= 0.0 and out_itemsize == 1 \
        and lanes == LANES * surfaces


@njit(cache=True, inline="always")
def _operand_rows(operands, first, alu, cpend, mul):
    for lane in range(LANES):
        alu[lane], cpend[lane], mul[lane] = operands[0, first + lane], operands[1, first + lane], \
            operands[2, first + lane]


@njit(cache=True, inline="always")
def _channel_lines(flat, sums, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling, even,
                   relu):
    """Window sums per pixel and channel (``sums`` flat [P][C], as ``flat``); ``relu``: literal."""
    lines = offsets.shape[0] // surfaces
    alu, cpend, mul = np.empty(LANES), np.empty(LANES), np.empty(LANES)
    for s in range(surfaces):
        _operand_rows(operands, s * LANES, alu, cpend, mul)
        for y in range(lines):
            into = np.uint64(offsets[s * lines + y] * 8)  # (word offsets; unsigned: no negative-index wrap)
            start = np.uint64((y * width * channels) + s * LANES)
            for x in range(width):
                o, i = into + np.uint64(x * LANES), start + np.uint64(x * channels)
                for lane in range(LANES):
                    u = np.uint64(lane)
                    out[o + u] = _folded_out(_folded_bs(flat[i + u], sums[i + u], cpend[u], alu[u], mul[u], relu), k,
                                             offset, floor, ceiling, even)


@njit(cache=True, inline="always")
def _shared_lines(flat, sums, shared, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling,
                  even, relu):
    """One window sum per pixel (``shared``: ``sums`` [P]) or none; ``relu``: literal."""
    lines = offsets.shape[0] // surfaces
    alu, cpend, mul = np.empty(LANES), np.empty(LANES), np.empty(LANES)
    for s in range(surfaces):
        _operand_rows(operands, s * LANES, alu, cpend, mul)
        for y in range(lines):
            into = np.uint64(offsets[s * lines + y] * 8)
            start = np.uint64((y * width * channels) + s * LANES)
            for x in range(width):
                o, i = into + np.uint64(x * LANES), start + np.uint64(x * channels)
                w = np.float64(sums[y * width + x]) if shared else 0.0
                for lane in range(LANES):
                    u = np.uint64(lane)
                    out[o + u] = _folded_out(_folded_bs(flat[i + u], w, cpend[u], alu[u], mul[u], relu), k, offset,
                                             floor, ceiling, even)


# contract: as dpu_pixel._chain_flat's (every product and sum exact: fused or not, the same numbers).
# Four compiled forms: in one function LLVM vectorises the loop forms badly (NUMERICS.md 40).
@njit(cache=True, fastmath={"contract"})
def _channel_relu(flat, sums, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling, even):
    wide_vectors()
    _channel_lines(flat, sums, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling, even,
                   True)


@njit(cache=True, fastmath={"contract"})
def _channel_plain(flat, sums, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling, even):
    wide_vectors()
    _channel_lines(flat, sums, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling, even,
                   False)


@njit(cache=True, fastmath={"contract"})
def _shared_relu(flat, sums, shared, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling,
                 even):
    wide_vectors()
    _shared_lines(flat, sums, shared, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling,
                  even, True)


@njit(cache=True, fastmath={"contract"})
def _shared_plain(flat, sums, shared, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling,
                  even):
    wide_vectors()
    _shared_lines(flat, sums, shared, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling,
                  even, False)


@njit(cache=True)
def folded_lines(data, sums, sums_layout, operands, chain, surfaces, width, offsets, target):
    """``_rows_pixels_to_atoms``' folded form (``takes``) from ``data`` [1][P][C] (C-contiguous)
    into ``target`` (uint64 words): atom s of pixel (y, x) at word ``offsets[s * H + y] + 2x``, its
    16 lanes channels 16s..16s+15. ``sums``: flat window sums as ``sums_layout`` says
    (SUMS_PIXEL_MAJOR: [P][C] as ``data``; SUMS_SHARED: [P]; SUMS_NONE: not read); ``operands``:
    the chain's float64 BS operands [3][>= 16 * surfaces]; ``chain``: its CH_* settings."""
    even, relu = chain[dp.CH_EVEN] != 0, chain[dp.CH_LOW1] == 0.0
    low1, high1 = chain[dp.CH_LOW1], chain[dp.CH_HIGH1]
    k, offset, low, high = chain[dp.CH_K], chain[dp.CH_OFFSET], chain[dp.CH_LOW], chain[dp.CH_HIGH]
    floor, ceiling = _out_cvt(low1, k, offset, low, high, even), _out_cvt(high1, k, offset, low, high, even)
    channels = data.shape[2]
    flat, out = data.reshape(-1), target.view(np.int8)
    if sums_layout == dp.SUMS_PIXEL_MAJOR:
        if relu:
            _channel_relu(flat, sums, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling,
                          even)
        else:
            _channel_plain(flat, sums, channels, operands, surfaces, width, offsets, out, k, offset, floor, ceiling,
                           even)
    elif relu:
        _shared_relu(flat, sums, sums_layout == dp.SUMS_SHARED, channels, operands, surfaces, width, offsets, out, k,
                     offset, floor, ceiling, even)
    else:
        _shared_plain(flat, sums, sums_layout == dp.SUMS_SHARED, channels, operands, surfaces, width, offsets, out,
                      k, offset, floor, ceiling, even)


@njit(cache=True)
def ew_takes(settings, out_itemsize, lanes, surfaces):
    """Whether ``ew_lines`` runs this chain: an EW stage, int8 elements, 16 lanes to an atom
    (NUMERICS.md 55)."""
    return settings[dp.CH_EW_ON] != 0 and out_itemsize == 1 and lanes == LANES * surfaces


@njit(cache=True, inline="always")
def _ew_lines_loop(flat, sums, layout, channels, operands, atoms, chain, surfaces, width, offsets, out, even, relu):
    """``dpu_pixel._ew_rows_loop``'s elements (``_chain_value`` on the same operands) written
    straight into the lines; the EW operand read in place from its atoms (``even``, ``relu``:
    literals)."""
    low1, high1, ew_offset, ew_k = chain[dp.CH_LOW1], chain[dp.CH_HIGH1], chain[dp.CH_EW_OFFSET], chain[dp.CH_EW_K]
    ew_even, ew_add, ew_low, ew_high = chain[dp.CH_EW_EVEN] != 0, chain[dp.CH_EW_ADD], chain[dp.CH_EW_LOW], \
        chain[dp.CH_EW_HIGH]
    k, offset, low, high = chain[dp.CH_K], chain[dp.CH_OFFSET], chain[dp.CH_LOW], chain[dp.CH_HIGH]
    lines = offsets.shape[0] // surfaces
    per_pixel = atoms.shape[1] > 1
    alu, cpend, mul = np.empty(LANES), np.empty(LANES), np.empty(LANES)
    for s in range(surfaces):
        _operand_rows(operands, s * LANES, alu, cpend, mul)
        for y in range(lines):
            into = np.uint64(offsets[s * lines + y] * 8)
            start = np.uint64((y * width * channels) + s * LANES)
            for x in range(width):
                o, i, p = into + np.uint64(x * LANES), start + np.uint64(x * channels), y * width + x
                e = atoms[s, p] if per_pixel else atoms[s, 0]
                if layout == dp.SUMS_PIXEL_MAJOR:
                    for lane in range(LANES):
                        u = np.uint64(lane)
                        out[o + u] = _chain_value(flat[i + u], sums[i + u], cpend[u], alu[u], mul[u],
                                                  np.int32(e[lane]), low1, high1, ew_offset, ew_k, ew_even, ew_add,
                                                  ew_low, ew_high, k, offset, low, high, True, even, relu)
                    continue
                w = np.float64(sums[p]) if layout == dp.SUMS_SHARED else 0.0
                for lane in range(LANES):
                    u = np.uint64(lane)
                    out[o + u] = _chain_value(flat[i + u], w, cpend[u], alu[u], mul[u], np.int32(e[lane]), low1,
                                              high1, ew_offset, ew_k, ew_even, ew_add, ew_low, ew_high, k, offset,
                                              low, high, True, even, relu)


# contract: as dpu_pixel._ew_rows' (every product and sum exact: fused or not, the same numbers)
@njit(cache=True, fastmath={"contract"})
def ew_lines(data, sums, sums_layout, operands, atoms, chain, surfaces, width, offsets, target):
    """``folded_lines`` for a chain with the EW stage (``ew_takes``): each element
    ``_rows_pixels_to_atoms``' ``_ew_rows`` gives it, the EW operand ``atoms`` int8 [S][P or 1][16]
    (the ERDMA's atoms, channel 16s + l at [s][pixel][l]) read where it is, not made pixel-major
    int32 first (NUMERICS.md 55). ``sums``: as ``folded_lines``' (SUMS_NONE: not read)."""
    wide_vectors()
    even, relu = chain[dp.CH_EVEN] != 0, chain[dp.CH_LOW1] == 0.0
    channels = data.shape[2]
    flat, out = data.reshape(-1), target.view(np.int8)
    if even and relu:
        _ew_lines_loop(flat, sums, sums_layout, channels, operands, atoms, chain, surfaces, width, offsets, out,
                       True, True)
    elif even:
        _ew_lines_loop(flat, sums, sums_layout, channels, operands, atoms, chain, surfaces, width, offsets, out,
                       True, False)
    elif relu:
        _ew_lines_loop(flat, sums, sums_layout, channels, operands, atoms, chain, surfaces, width, offsets, out,
                       False, True)
    else:
        _ew_lines_loop(flat, sums, sums_layout, channels, operands, atoms, chain, surfaces, width, offsets, out,
                       False, False)
