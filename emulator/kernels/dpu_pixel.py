"""The integer DPU stages pixel-major, written straight into NC1HWC2 atoms (the WDMA's job).

``stages_to_atoms`` runs BS -> BN -> EW -> OUT_CVT (each optional; the LUT is not here, see
``units/dpu.py``) on blocks of pixels with the channels contiguous - the order of the atoms
the WDMA writes - and stores each pixel's C2-lane atoms as whole words at the row offsets the
caller validated (``TaskDma.claim_rows``). The stages are the per-element functions of
``kernels.dpu.int_stages`` (``numerics``, NUMERICS.md 4 and 4.8), or, for the common
configurations, the float64 chain that gives the same numbers (``chain_settings``, 4.9).

Inputs are "channel blocks" ``[S][P][L]``: channel ``c`` of pixel ``p`` is ``[c // L, p, c % L]``.
A pixel-major cube ``[P][C]`` is ``[1][P][C]``; NC1HWC2 atoms read by a DMA are
``[S][H*W][C2]`` as they are; a ``[C][H][W]`` cube is ``[C][H*W][1]``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.conv_pixels import working_buffer
from npuemu.emulator.kernels.dpu import (
    _OPERAND_MATRICES, _OUTPUT_RANGES, CP_HIGH, CP_LOW, CP_MODE, CP_OFFSET, CP_SCALE, CP_SHIFT, EwConfig,
    OutCvtConfig, XStageConfig, _bn_block, _bs_block, _cvt_params, _ew_block, _ew_params, _out_cvt_flat,
    _x_params,
)
from npuemu.emulator.memo import Memo
from npuemu.isa.errors import EmulationError

#: Elements (pixels x channels) per block: a block (16 KiB of int64 or float64) and the tiled
#: per-channel operands stay in L1 between stages.
BLOCK_ELEMENTS = 2048

# How the window sums are laid out (``sums`` is flat): one per pixel ([P], G = 1), pixel-major
# [P][G] (the depthwise path's buffer), or group-major [G][P]
SUMS_NONE, SUMS_SHARED, SUMS_PIXEL_MAJOR, SUMS_GROUP_MAJOR = range(4)
#: Pixels per block at least, where a block gathers channel-major data (planes, group-major
#: sums): one short run per channel and block costs more than the gather itself below this.
GATHER_PIXELS = 8


@njit(cache=True)
def _load_block(data, first, pixels, channels, block):
    """Pixels ``first..first+pixels`` of the channel-block cube ``data`` [S][P][L] into
    ``block`` [pixels][channels] (the first ``channels`` channels)."""
    surfaces, lanes = data.shape[0], data.shape[2]
    if surfaces == 1 and lanes == channels:  # pixel-major [1][P][C]: one contiguous run
        source = data.reshape(-1)[first * channels:(first + pixels) * channels]
        for i in range(pixels * channels):
            block[i] = source[i]
    elif lanes == 1:  # [C][P][1] planes: one run per channel
        flat = data.reshape(-1)
        total = data.shape[1]
        for c in range(channels):
            source = flat[c * total + first:c * total + first + pixels]
            for b in range(pixels):
                block[b * channels + c] = source[b]
    else:  # NC1HWC2 atoms [S][P][C2]: one run of C2 lanes per pixel and surface
        for s in range(min(surfaces, -(-channels // lanes))):
            source = data[s].reshape(-1)[first * lanes:(first + pixels) * lanes]
            used = min(lanes, channels - s * lanes)
            if used == 16:  # a whole 16-lane run: a fixed count LLVM turns into vector moves
                for b in range(pixels):
                    for lane in range(16):
                        block[b * channels + s * 16 + lane] = source[b * lanes + lane]
            else:
                for b in range(pixels):
                    for lane in range(used):
                        block[b * channels + s * lanes + lane] = source[b * lanes + lane]


@njit(cache=True)
def _load_window(sums, layout, groups, kernels_per_group, first, pixels, channels, window):
    """The window sums of pixels ``first..first+pixels`` in block order ([pixel][channel]) for
    the first ``channels`` channels; ``sums`` holds ``groups`` of them per pixel."""
    if layout == SUMS_SHARED:
        source = sums[first:first + pixels]
        for b in range(pixels):
            value = source[b]
            for c in range(channels):
                window[b * channels + c] = value
    elif layout == SUMS_GROUP_MAJOR:
        total = sums.shape[0] // groups
        for c in range(channels):
            g = c // kernels_per_group
            source = sums[g * total + first:g * total + first + pixels]
            for b in range(pixels):
                window[b * channels + c] = source[b]
    else:
        source = sums[first * groups:(first + pixels) * groups]
        if kernels_per_group == 1 and channels == groups:  # one contiguous run
            for i in range(pixels * channels):
                window[i] = source[i]
        elif kernels_per_group == 1:  # the first channels of each pixel's row
            for b in range(pixels):
                for c in range(channels):
                    window[b * channels + c] = source[b * groups + c]
        else:
            for b in range(pixels):
                for c in range(channels):
                    window[b * channels + c] = source[b * groups + c // kernels_per_group]


@njit(cache=True)
def _tile(values, repeats, out):
    """``values`` [C] repeated ``repeats`` times into ``out`` (per-channel operands of a block)."""
    channels = values.shape[0]
    for b in range(repeats):
        for c in range(channels):
            out[b * channels + c] = values[c]


@njit(cache=True)
def _stages_to_atoms(data, sums, sums_layout, kernels_per_group, stages, bs, bs_operands, bn,
                     bn_operands, operand, ew, cvt, channels, surfaces, width, tile, offsets, target):
    """BS -> BN -> EW -> OUT_CVT (int64, the ``numerics`` functions) on the channel-block cube
    ``data`` [S][P][L] (int32), each pixel stored as ``surfaces`` atoms of ``target`` (uint64
    words): atom s of pixel (y, x) at word ``offsets[s * H + y] + x * atom_words``.

    ``stages`` [3]: BS, BN, EW on (1) or bypassed (0); settings vectors as ``kernels.dpu``
    (XP_/EP_/CP_; OUT_CVT always, the identity when off): one compiled variant per output type
    whatever the stages. ``sums``: flat window sums laid out as ``sums_layout`` says (channel c
    uses group c // kernels_per_group); ``operand``: the raw EW operand as a channel-block cube
    [S][P or 1][L]; per-channel operands int64 [3][C] (BS: ALU, CPEND, MUL) and [2][C] (BN:
    ALU, MUL). ``tile``: zeros of the output type, [pixels per block][surfaces * C2] (its lanes
    past the channels stay 0: the WDMA writes them as 0). Channels past the atoms are not
    computed.

    Per block of pixels, the stages run flat over [pixel][channel] (the per-channel operands
    tiled alike), OUT_CVT writes the block's atoms into ``tile`` and each atom leaves as whole
    words (``_store_atoms``)."""
    per_block, lanes_out = tile.shape
    computed = min(channels, lanes_out)
    block, window, other = _scratch(per_block * computed, np.int64)
    alu, cpend, mul = _tiled(bs_operands, computed, per_block, np.int64)
    bn_alu, bn_mul, _ = _tiled(bn_operands, computed, per_block, np.int64)
    scale, shift, offset = cvt[CP_SCALE], cvt[CP_SHIFT], cvt[CP_OFFSET]
    mode, low, high = cvt[CP_MODE], cvt[CP_LOW], cvt[CP_HIGH]
    flat_tile = tile.reshape(-1)
    for first in range(0, data.shape[1], per_block):
        count = min(per_block, data.shape[1] - first)
        n = count * computed
        _load_inputs(data, sums, sums_layout, kernels_per_group, channels, operand, stages[2] != 0,
                     first, count, computed, block, window, other)
        if stages[0] != 0:
            _bs_block(block[:n], window[:n], bs, alu[:n], cpend[:n], mul[:n])
        if stages[1] != 0:
            _bn_block(block[:n], bn, bn_alu[:n], bn_mul[:n])
        if stages[2] != 0:
            _ew_block(block[:n], other[:n], ew)
        if lanes_out == computed:  # the atoms hold exactly the channels: one flat loop
            _out_cvt_flat(block[:n], flat_tile[:n], scale, shift, offset, mode, low, high)
        else:
            for b in range(count):
                _out_cvt_flat(block[b * computed:(b + 1) * computed], tile[b, :computed], scale,
                              shift, offset, mode, low, high)
        _store_atoms(tile, first, count, width, surfaces, offsets, target)


@njit(cache=True)
def _chain_to_atoms(data, sums, sums_layout, kernels_per_group, operands, operand, chain, channels,
                    surfaces, width, tile, offsets, target):
    """``_stages_to_atoms`` with the float64 chain (``chain_settings``, NUMERICS.md 4.9) in
    place of the int64 stages; ``operands``: float64 [3][C] BS ALU and CPEND times MUL *
    2**-shift, and MUL * 2**-shift (``_build_chain_operands``)."""
    per_block, lanes_out = tile.shape
    computed = min(channels, lanes_out)
    block, window, other = _scratch(per_block * computed, np.float64)
    alu, cpend, mul = _tiled(operands, computed, per_block, np.float64)
    ew_on = chain[CH_EW_ON] != 0
    flat_tile = tile.reshape(-1)
    for first in range(0, data.shape[1], per_block):
        count = min(per_block, data.shape[1] - first)
        n = count * computed
        _load_inputs(data, sums, sums_layout, kernels_per_group, channels, operand, ew_on, first,
                     count, computed, block, window, other)
        if lanes_out == computed:
            _chain_flat(block[:n], window[:n], cpend[:n], alu[:n], mul[:n], other[:n], chain,
                        flat_tile[:n])
        else:
            for b in range(count):
                row = slice(b * computed, (b + 1) * computed)
                _chain_flat(block[row], window[row], cpend[row], alu[row], mul[row], other[row],
                            chain, tile[b, :computed])
        _store_atoms(tile, first, count, width, surfaces, offsets, target)


@njit(cache=True)
def _scratch(size, dtype):
    return np.zeros(size, dtype), np.zeros(size, dtype), np.zeros(size, dtype)


@njit(cache=True)
def _tiled(operands, computed, per_block, dtype):
    """Per-channel operand rows tiled over a block (up to three; zeros past the given rows):
    the stage loops read them contiguously. (A given row with at least ``computed`` channels is
    written whole, so it starts empty: no zeroing pass, issue 20.)"""
    given = min(3, operands.shape[0]) if operands.shape[1] >= computed else 0
    size = per_block * computed
    rows = (np.empty(size, dtype) if given > 0 else np.zeros(size, dtype),
            np.empty(size, dtype) if given > 1 else np.zeros(size, dtype),
            np.empty(size, dtype) if given > 2 else np.zeros(size, dtype))
    for r in range(min(3, operands.shape[0])):
        _tile(operands[r, :computed], per_block, rows[r])
    return rows


@njit(cache=True)
def _load_inputs(data, sums, sums_layout, kernels_per_group, channels, operand, ew_on, first, count,
                 computed, block, window, other):
    """One block's main input, window sums and EW operand (a per-tensor or per-channel operand
    is tiled over the whole block at the first one)."""
    _load_block(data, first, count, computed, block)
    if sums_layout != SUMS_NONE:
        _load_window(sums, sums_layout, channels // kernels_per_group, kernels_per_group, first, count,
                     computed, window)
    if not ew_on:
        return
    if operand.shape[1] > 1:
        _load_block(operand, first, count, computed, other)
    elif first == 0:
        _load_block(operand, 0, 1, computed, other)
        for i in range(computed, other.shape[0]):
            other[i] = other[i - computed]


@njit(cache=True)
def _store_atoms(tile, first, count, width, surfaces, offsets, target):
    """The block's atoms from ``tile`` [pixel][surfaces * C2] into the target words: per line
    run and surface, the atoms are consecutive words there."""
    words = tile.reshape(-1).view(np.uint64)
    row_words = words.shape[0] // tile.shape[0]
    atom_words = row_words // surfaces
    height = offsets.shape[0] // surfaces
    b = 0
    while b < count:
        y, x = (first + b) // width, (first + b) % width
        run = min(width - x, count - b)
        for s in range(surfaces):
            line = target[offsets[s * height + y] + x * atom_words:]
            source = words[b * row_words + s * atom_words:]
            if atom_words == 2:  # 16-byte atoms
                for j in range(run):
                    line[2 * j] = source[j * row_words]
                    line[2 * j + 1] = source[j * row_words + 1]
            else:
                for j in range(run):
                    for w in range(atom_words):
                        line[j * atom_words + w] = source[j * row_words + w]
        b += run


# ---------------------------------------------------------------------------------------------
# The float64 chain (NUMERICS.md 4.9): the common configurations in exact float64 arithmetic
# ---------------------------------------------------------------------------------------------
(CH_LOW1, CH_HIGH1, CH_EW_ON, CH_EW_OFFSET, CH_EW_K, CH_EW_EVEN, CH_EW_ADD, CH_EW_LOW, CH_EW_HIGH, CH_K,
 CH_EVEN, CH_OFFSET, CH_LOW, CH_HIGH, CH_COUNT) = range(15)

#: Bound on every integer the chain forms (NUMERICS.md 4.9): below it, sums and products are
#: exact float64s, and so is k / 2**s +- 0.5 for s <= CHAIN_MAX_SHIFT.
CHAIN_BOUND = 1 << 52
CHAIN_MAX_SHIFT = 52


@njit(cache=True, inline="always")
def _round_half_away(y):
    # y = k / 2**s exactly with |k| < 2**52, s <= 52: y +- 0.5 = (k +- 2**(s-1)) / 2**s is exact
    # (numerator below 2**53), and truncating it rounds the ties away from zero
    return np.trunc(y + np.copysign(0.5, y))


@njit(cache=True, inline="always")
def _bs_sum(d, w, cpend, alu, scaled_mul):
    # BS: (data + CPEND * window + ALU) * MUL * 2**-shift as data * (MUL * 2**-shift) + (window
    # * CPEND' + ALU') with CPEND', ALU' the operands already times MUL * 2**-shift
    # (_build_chain_operands: 0, 0, 1 where a part is off). Exact: every product and partial sum
    # is an integer times 2**-shift of magnitude below CHAIN_BOUND (NUMERICS.md 4.9's bound
    # |data| + |CPEND * window| + |ALU| <= (CHAIN_BOUND - 1) // |MUL| bounds each term and each
    # sum of terms), so this is the value the int64 stages shift, whatever the association.
    return d * scaled_mul + (w * cpend + alu)


@njit(cache=True, inline="always")
def _out_cvt(v, k, offset, low, high, even):
    # OUT_CVT: v * scale * 2**-shift rounded, plus the offset, saturated
    y = v * k
    r = np.rint(y) if even else _round_half_away(y)
    return min(max(r + offset, low), high)


@njit(cache=True, inline="always")
def _chain_value(d, w, cpend, alu, scaled_mul, e, low1, high1, ew_offset, ew_k, ew_even, ew_add,
                 ew_low, ew_high, k, offset, low, high, ew_on, even, relu):
    # BS's sum and its rounding, then BS's and BN's saturation / ReLU / RELUX as one clamp
    # [low1, high1]; the EW stage; OUT_CVT
    y = _bs_sum(d, w, cpend, alu, scaled_mul)
    if relu:  # low1 == 0 <= high1: y < 0 ends at 0 both ways; y >= 0 rounds half away as trunc(y + 0.5)
        v = min(np.trunc(max(y, 0.0) + 0.5), high1)
    else:
        v = min(max(_round_half_away(y), low1), high1)
    if ew_on:
        x = (e + ew_offset) * ew_k
        x = np.rint(x) if ew_even else _round_half_away(x)
        x = min(max(x, -2147483648.0), 2147483647.0)
        v = min(max(v + ew_add * x, ew_low), ew_high)
    return _out_cvt(v, k, offset, low, high, even)


@njit(cache=True, inline="always")
def _chain_loop(block, window, cpend, alu, scaled_mul, operand, chain, out, ew_on, even, relu):
    """One of ``_chain_flat``'s loop copies (``ew_on``, ``even``, ``relu``: literals)."""
    low1, high1, ew_offset, ew_k = chain[CH_LOW1], chain[CH_HIGH1], chain[CH_EW_OFFSET], chain[CH_EW_K]
    ew_even, ew_add, ew_low, ew_high = chain[CH_EW_EVEN] != 0, chain[CH_EW_ADD], chain[CH_EW_LOW], \
        chain[CH_EW_HIGH]
    k, offset, low, high = chain[CH_K], chain[CH_OFFSET], chain[CH_LOW], chain[CH_HIGH]
    for i in range(block.shape[0]):
        out[i] = _chain_value(block[i], window[i], cpend[i], alu[i], scaled_mul[i], operand[i], low1, high1,
                              ew_offset, ew_k, ew_even, ew_add, ew_low, ew_high, k, offset, low, high, ew_on,
                              even, relu)


@njit(cache=True, inline="always")
def _folded_loop(block, window, cpend, alu, scaled_mul, chain, out, even):
    """``_chain_loop`` without the EW stage and with OUT_CVT's scale >= 0, BS's clamp folded into
    OUT_CVT's: OUT_CVT (``_out_cvt``, float operations included) is non-decreasing in v, and for
    a non-decreasing f, f(min(max(t, L), H)) = min(max(f(t), f(L)), f(H)); with f's own clamp
    [low, high] holding [f(L), f(H)] that is min(max(g(t), f(L)), f(H)), g its unclamped part.
    Where t lies in [L, H] g runs on the very value the unfolded form gives f; elsewhere the
    answer is f(L) or f(H) as the unfolded form's - whether t * k is exact there or not."""
    low1, high1 = chain[CH_LOW1], chain[CH_HIGH1]
    k, offset, low, high = chain[CH_K], chain[CH_OFFSET], chain[CH_LOW], chain[CH_HIGH]
    floor, ceiling = _out_cvt(low1, k, offset, low, high, even), _out_cvt(high1, k, offset, low, high, even)
    for i in range(block.shape[0]):
        y = _round_half_away(_bs_sum(block[i], window[i], cpend[i], alu[i], scaled_mul[i])) * k
        r = np.rint(y) if even else _round_half_away(y)
        out[i] = min(max(r + offset, floor), ceiling)


# contract: a * b + c may become one fused multiply-add; every product and sum here is exact,
# so the fused and the separate forms give the same numbers
@njit(cache=True, fastmath={"contract"})
def _chain_flat(block, window, cpend, alu, scaled_mul, operand, chain, out):
    """BS -> BN -> EW -> OUT_CVT of ``chain_settings`` in float64 (``cpend``, ``alu``: the
    operands times ``scaled_mul``, ``_build_chain_operands``; ``operand`` read only with EW on).
    The settings are read into locals (loads from an array the loop might write would stop the
    vectorisation), and the EW stage, OUT_CVT's rounding mode and whether BS's clamp starts at 0
    (a ReLU: one operation fewer, ``_chain_value``) are decided outside the loops; without EW
    and with OUT_CVT's scale >= 0 BS's clamp is folded into OUT_CVT's (``_folded_loop``: two
    operations fewer). Ten loop copies."""
    ew_on, even, relu = chain[CH_EW_ON] != 0, chain[CH_EVEN] != 0, chain[CH_LOW1] == 0.0
    if not ew_on and chain[CH_K] >= 0.0:
        if even:
            _folded_loop(block, window, cpend, alu, scaled_mul, chain, out, True)
        else:
            _folded_loop(block, window, cpend, alu, scaled_mul, chain, out, False)
    elif relu:
        if ew_on and even:
            _chain_loop(block, window, cpend, alu, scaled_mul, operand, chain, out, True, True, True)
        elif ew_on:
            _chain_loop(block, window, cpend, alu, scaled_mul, operand, chain, out, True, False, True)
        elif even:
            _chain_loop(block, window, cpend, alu, scaled_mul, operand, chain, out, False, True, True)
        else:
            _chain_loop(block, window, cpend, alu, scaled_mul, operand, chain, out, False, False, True)
    elif ew_on and even:
        _chain_loop(block, window, cpend, alu, scaled_mul, operand, chain, out, True, True, False)
    elif ew_on:
        _chain_loop(block, window, cpend, alu, scaled_mul, operand, chain, out, True, False, False)
    elif even:
        _chain_loop(block, window, cpend, alu, scaled_mul, operand, chain, out, False, True, False)
    else:
        _chain_loop(block, window, cpend, alu, scaled_mul, operand, chain, out, False, False, False)


@njit(cache=True)
def _first_lanes(rows, first, count, lanes, out):
    """The first ``lanes`` channels of pixels ``first..first+count`` of ``rows`` [P][C] into
    ``out`` [count * lanes]: 2-D indexing with both indices from ``range`` keeps them provably
    non-negative (a computed flat index carries Numba's wraparound branch, which stops the
    vectorisation: 1 ns an element)."""
    block = out[:count * lanes].reshape(count, lanes)
    for b in range(count):
        for c in range(lanes):
            block[b, c] = rows[first + b, c]


@njit(cache=True)
def _chain_pixels_to_atoms(data, sums, sums_layout, operands, operand, chain, surfaces, width, tile,
                           offsets, target):
    """``_chain_to_atoms`` for pixel-major ``data`` [1][P][C] with window sums none, one per pixel
    (SUMS_SHARED) or one per pixel and channel ([P][C], SUMS_PIXEL_MAJOR), an EW operand
    [1][P or 1][C], and atoms that hold no lane past the channels (``tile`` [pixels per block]
    [L], L <= C): ``_chain_flat`` runs once per block on the inputs where they are - a block of
    pixels is one run of each - and writes the tile (NUMERICS.md 4.10). Only where the atoms
    take fewer channels than there are are the first L of each pixel's gathered; shared window
    sums and a per-channel or per-tensor operand are tiled. ``_rows_pixels_to_atoms`` mostly runs
    instead (see below): pixel by pixel, nothing gathered or tiled (issue 20)."""
    per_block, lanes = tile.shape
    pixels, channels = data.shape[1], data.shape[2]
    size = per_block * lanes
    gather = lanes < channels
    # pixel by pixel unless the chain has no EW stage and a negative OUT_CVT scale, or the window
    # sums are per channel and every channel is stored (one flat run each already: no faster)
    if (chain[CH_EW_ON] != 0 or chain[CH_K] >= 0.0) and (gather or sums_layout != SUMS_PIXEL_MAJOR):
        _rows_pixels_to_atoms(data[0], sums.reshape(-1, channels if sums_layout == SUMS_PIXEL_MAJOR else 1),
                              sums_layout, operands, operand[0], chain, surfaces, width, tile, offsets, target)
        return
    alu, cpend, mul = _tiled(operands, lanes, per_block, np.float64)
    flat_data = data.reshape(-1)
    rows = np.empty(size if gather else 1, np.int32)  # (each block's run written before it is read)
    per_channel = sums_layout == SUMS_PIXEL_MAJOR
    sum_rows = sums.reshape(-1, channels) if per_channel else sums.reshape(1, -1)
    window = np.zeros(size if not per_channel or gather else 1, sums.dtype)  # 0 without CPEND
    ew_on, per_pixel = chain[CH_EW_ON] != 0, operand.shape[1] > 1
    other = np.empty(size if ew_on and (gather or not per_pixel) else 1, np.int32)  # (as rows)
    if ew_on and not per_pixel:
        _tile(operand[0, 0, :lanes], per_block, other)
    flat_tile = tile.reshape(-1)
    for first in range(0, pixels, per_block):
        count = min(per_block, pixels - first)
        n = count * lanes
        if gather:
            _first_lanes(data[0], first, count, lanes, rows)
            d = rows[:n]
        else:
            d = flat_data[first * lanes:first * lanes + n]
        if per_channel and not gather:
            w = sums[first * lanes:first * lanes + n]
        else:
            if per_channel:
                _first_lanes(sum_rows, first, count, lanes, window)
            elif sums_layout == SUMS_SHARED:
                _load_window(sums, SUMS_SHARED, 1, lanes, first, count, lanes, window)
            w = window[:n]
        if not ew_on:
            e = d  # not read
        elif per_pixel and not gather:
            e = operand.reshape(-1)[first * lanes:first * lanes + n]
        else:
            if per_pixel:
                _first_lanes(operand[0], first, count, lanes, other)
            e = other[:n]
        _chain_flat(d, w, cpend[:n], alu[:n], mul[:n], e, chain, flat_tile[:n])
        _store_atoms(tile, first, count, width, surfaces, offsets, target)


@njit(cache=True, inline="always")
def _folded_out(v, k, offset, floor, ceiling, even):
    # _folded_loop's OUT_CVT of a BS value already rounded
    y = v * k
    r = np.rint(y) if even else _round_half_away(y)
    return min(max(r + offset, floor), ceiling)


# contract: as _chain_flat's (every product and sum exact: fused or not, the same numbers)
@njit(cache=True, fastmath={"contract"})
def _folded_rows(rows, window, sums_layout, first, operands, chain, out, even):
    """``_folded_loop`` pixel by pixel (issue 20): pixels ``first..`` of ``rows`` [P][>= L] (its
    first L channels: no gathered copy) into ``out`` [count][L], the per-channel operands read
    from ``operands`` [3][>= L] as they are (no tiling) and the window sums from ``window``:
    [P][1] for SUMS_SHARED (one value per pixel: no tiled copy, no conversion per element),
    [P][>= L] for SUMS_PIXEL_MAJOR, not read for SUMS_NONE. With BS's clamp starting at 0 (a
    ReLU), its rounding is ``_chain_value``'s ``trunc(max(y, 0) + 0.5)``: below 0 it gives 0
    where the half-away rounding gives round(y) <= 0, and OUT_CVT (non-decreasing, clamped from
    below at f(low1) = f(0)) maps both to that floor. Each value is ``_folded_loop``'s formula
    otherwise. The four loop forms (window sums per channel or not, ReLU or not) are four
    compiled functions (``_folded_*``): in one function together LLVM vectorised none of them
    well (0.78 ns an element against 0.21, issue 20 session 16)."""
    low1, high1 = chain[CH_LOW1], chain[CH_HIGH1]
    k, offset, low, high = chain[CH_K], chain[CH_OFFSET], chain[CH_LOW], chain[CH_HIGH]
    floor, ceiling = _out_cvt(low1, k, offset, low, high, even), _out_cvt(high1, k, offset, low, high, even)
    alu, cpend, mul = operands[0], operands[1], operands[2]
    relu = low1 == 0.0
    if sums_layout == SUMS_PIXEL_MAJOR:
        if relu:
            _folded_channel_relu(rows, window, first, alu, cpend, mul, k, offset, floor, ceiling, out, even)
        else:
            _folded_channel_plain(rows, window, first, alu, cpend, mul, k, offset, floor, ceiling, out, even)
    elif relu:
        _folded_shared_relu(rows, window, sums_layout == SUMS_SHARED, first, alu, cpend, mul, k, offset, floor,
                            ceiling, out, even)
    else:
        _folded_shared_plain(rows, window, sums_layout == SUMS_SHARED, first, alu, cpend, mul, k, offset, floor,
                             ceiling, out, even)


@njit(cache=True, inline="always")
def _folded_bs(d, w, cpend, alu, mul, relu):
    # BS's value rounded: with a ReLU clamp trunc(max(y, 0) + 0.5) (see _folded_rows), else half away
    y = _bs_sum(d, w, cpend, alu, mul)
    return np.trunc(max(y, 0.0) + 0.5) if relu else _round_half_away(y)


@njit(cache=True, inline="always")
def _folded_shared_loop(rows, window, shared, first, alu, cpend, mul, k, offset, floor, ceiling, out, even, relu):
    """``_folded_rows``' loop with one window sum per pixel (``shared``) or none (``relu``: literal)."""
    lanes = out.shape[1]
    for b in range(out.shape[0]):
        d, o = rows[first + b], out[b]
        w = np.float64(window[first + b, 0]) if shared else 0.0
        for c in range(lanes):
            o[c] = _folded_out(_folded_bs(d[c], w, cpend[c], alu[c], mul[c], relu), k, offset, floor, ceiling, even)


@njit(cache=True, inline="always")
def _folded_channel_loop(rows, window, first, alu, cpend, mul, k, offset, floor, ceiling, out, even, relu):
    """``_folded_rows``' loop with window sums per pixel and channel (``relu``: literal)."""
    lanes = out.shape[1]
    for b in range(out.shape[0]):
        d, sums, o = rows[first + b], window[first + b], out[b]
        for c in range(lanes):
            o[c] = _folded_out(_folded_bs(d[c], sums[c], cpend[c], alu[c], mul[c], relu), k, offset, floor, ceiling,
                               even)


@njit(cache=True, fastmath={"contract"})
def _folded_shared_plain(rows, window, shared, first, alu, cpend, mul, k, offset, floor, ceiling, out, even):
    _folded_shared_loop(rows, window, shared, first, alu, cpend, mul, k, offset, floor, ceiling, out, even, False)


@njit(cache=True, fastmath={"contract"})
def _folded_shared_relu(rows, window, shared, first, alu, cpend, mul, k, offset, floor, ceiling, out, even):
    _folded_shared_loop(rows, window, shared, first, alu, cpend, mul, k, offset, floor, ceiling, out, even, True)


@njit(cache=True, fastmath={"contract"})
def _folded_channel_plain(rows, window, first, alu, cpend, mul, k, offset, floor, ceiling, out, even):
    _folded_channel_loop(rows, window, first, alu, cpend, mul, k, offset, floor, ceiling, out, even, False)


@njit(cache=True, fastmath={"contract"})
def _folded_channel_relu(rows, window, first, alu, cpend, mul, k, offset, floor, ceiling, out, even):
    _folded_channel_loop(rows, window, first, alu, cpend, mul, k, offset, floor, ceiling, out, even, True)


@njit(cache=True, inline="always")
def _ew_rows_loop(rows, window, sums_layout, first, operands, operand, chain, out, even, relu):
    """``_chain_loop`` with the EW stage (``_chain_value``, ``even`` and ``relu`` literals) pixel by
    pixel, the inputs read as ``_folded_rows`` reads them; ``operand`` [P or 1][>= L]."""
    low1, high1, ew_offset, ew_k = chain[CH_LOW1], chain[CH_HIGH1], chain[CH_EW_OFFSET], chain[CH_EW_K]
    ew_even, ew_add, ew_low, ew_high = chain[CH_EW_EVEN] != 0, chain[CH_EW_ADD], chain[CH_EW_LOW], \
        chain[CH_EW_HIGH]
    k, offset, low, high = chain[CH_K], chain[CH_OFFSET], chain[CH_LOW], chain[CH_HIGH]
    alu, cpend, mul = operands[0], operands[1], operands[2]
    lanes, per_pixel = out.shape[1], operand.shape[0] > 1
    for b in range(out.shape[0]):
        d, o = rows[first + b], out[b]
        e = operand[first + b] if per_pixel else operand[0]
        if sums_layout == SUMS_PIXEL_MAJOR:
            sums = window[first + b]
            for c in range(lanes):
                o[c] = _chain_value(d[c], sums[c], cpend[c], alu[c], mul[c], e[c], low1, high1, ew_offset, ew_k,
                                    ew_even, ew_add, ew_low, ew_high, k, offset, low, high, True, even, relu)
            continue
        w = np.float64(window[first + b, 0]) if sums_layout == SUMS_SHARED else 0.0
        for c in range(lanes):
            o[c] = _chain_value(d[c], w, cpend[c], alu[c], mul[c], e[c], low1, high1, ew_offset, ew_k, ew_even,
                                ew_add, ew_low, ew_high, k, offset, low, high, True, even, relu)


# contract: as _chain_flat's
@njit(cache=True, fastmath={"contract"})
def _ew_rows(rows, window, sums_layout, first, operands, operand, chain, out):
    """``_ew_rows_loop``'s four copies (OUT_CVT's rounding, BS's clamp from 0 or not)."""
    even, relu = chain[CH_EVEN] != 0, chain[CH_LOW1] == 0.0
    if even and relu:
        _ew_rows_loop(rows, window, sums_layout, first, operands, operand, chain, out, True, True)
    elif even:
        _ew_rows_loop(rows, window, sums_layout, first, operands, operand, chain, out, True, False)
    elif relu:
        _ew_rows_loop(rows, window, sums_layout, first, operands, operand, chain, out, False, True)
    else:
        _ew_rows_loop(rows, window, sums_layout, first, operands, operand, chain, out, False, False)


@njit(cache=True)
def _rows_pixels_to_atoms(rows, window, sums_layout, operands, operand, chain, surfaces, width, tile, offsets,
                          target):
    """``_chain_pixels_to_atoms`` pixel by pixel, nothing gathered or tiled (issue 20): without the
    EW stage and with OUT_CVT's scale >= 0 ``_folded_rows``, otherwise ``_ew_rows`` (the EW
    operand ``operand`` [P or 1][C]); ``window``: the window sums as they take them."""
    per_block = tile.shape[0]
    folded, even = chain[CH_EW_ON] == 0 and chain[CH_K] >= 0.0, chain[CH_EVEN] != 0
    for first in range(0, rows.shape[0], per_block):
        count = min(per_block, rows.shape[0] - first)
        if folded and even:
            _folded_rows(rows, window, sums_layout, first, operands, chain, tile[:count], True)
        elif folded:
            _folded_rows(rows, window, sums_layout, first, operands, chain, tile[:count], False)
        else:
            _ew_rows(rows, window, sums_layout, first, operands, operand, chain, tile[:count])
        _store_atoms(tile, first, count, width, surfaces, offsets, target)


def _channel_blocks(cube: np.ndarray, channels: int, pixels: int, name: str) -> np.ndarray:
    if cube.ndim != 3 or cube.shape[1] != pixels or cube.shape[0] * cube.shape[2] < channels \
            or (cube.shape[0] - 1) * cube.shape[2] >= channels:
        raise EmulationError(f"{name}: a channel-block cube [S][{pixels}][L] holding {channels} "
                             f"channels was expected, got shape {cube.shape}")
    return cube


def stages_to_atoms(data: np.ndarray, channels: int, width: int, target: np.ndarray,
                    offsets: np.ndarray, out_dtype: np.dtype, c2: int, surfaces: int, *,
                    bs: XStageConfig | None = None, bs_alu=None, bs_mul=None, bs_cpend=None,
                    window_sum: np.ndarray | None = None, bn: XStageConfig | None = None,
                    bn_alu=None, bn_mul=None, ew: EwConfig | None = None,
                    ew_operand: np.ndarray | None = None, cvt: OutCvtConfig | None = None) -> None:
    """``kernels.dpu.int_stages`` on the channel-block cube ``data`` [S][H*W][L] (see the module
    docstring), its result in ``out_dtype`` (int8/int16/int32 with OUT_CVT, int32 without)
    stored as NC1HWC2 atoms of ``c2`` lanes, whole 8-byte words each, into ``target`` (uint64
    words): atom s of pixel (y, x) at word ``offsets[s * H + y] + x * atom_words``, for the
    first ``surfaces`` surfaces; lanes past ``channels`` are stored as 0. The caller has
    bounds-checked every row.

    ``window_sum``: [G][H][W] or [G][H*W], any strides (a pixel-major buffer is read as it
    is); ``ew_operand``: a channel-block cube with H*W pixels, or [1][1][1] / [1][1][C]
    broadcast over the pixels. (``plan_stages`` then ``planned_to_atoms``: a caller running
    the same settings again keeps the plan.)"""
    if ew is not None and ew_operand is None:
        raise EmulationError("the EW stage needs an operand")
    plan = plan_stages(channels, out_dtype, data.dtype, None if ew is None else np.asarray(ew_operand).dtype,
                       bs=bs, bs_alu=bs_alu, bs_mul=bs_mul, bs_cpend=bs_cpend, bn=bn, bn_alu=bn_alu,
                       bn_mul=bn_mul, ew=ew, cvt=cvt)
    planned_to_atoms(plan, data, width, target, offsets, c2, surfaces, window_sum, ew_operand)


@dataclasses.dataclass(frozen=True, eq=False)
class StagePlan:
    """What ``stages_to_atoms`` works out from the stage settings, the per-channel operands and
    the element types alone (``plan_stages``): the same for every run of a task."""

    channels: int
    out_dtype: np.dtype
    data_dtype: np.dtype
    operand_dtype: np.dtype | None  # the EW operand's (None: no EW stage)
    bs: XStageConfig | None
    bn: XStageConfig | None
    ew: EwConfig | None
    cvt: OutCvtConfig | None
    bs_operands: np.ndarray  # int64 [3][C] (kernels.dpu._OPERAND_MATRICES)
    bn_operands: np.ndarray  # int64 [2][C]
    floats: np.ndarray  # the chain's float64 BS operands [3][C] (_build_chain_operands)
    chain: tuple[np.ndarray, int] | None  # chain_settings: CH_* and the largest |window sum|


def plan_stages(channels: int, out_dtype: np.dtype, data_dtype: np.dtype, operand_dtype: np.dtype | None, *,
                bs: XStageConfig | None = None, bs_alu=None, bs_mul=None, bs_cpend=None,
                bn: XStageConfig | None = None, bn_alu=None, bn_mul=None, ew: EwConfig | None = None,
                cvt: OutCvtConfig | None = None) -> StagePlan:
    """The settings part of ``stages_to_atoms`` (``operand_dtype``: the EW operand's, None
    without the EW stage)."""
    out_dtype = np.dtype(out_dtype)
    if cvt is None and out_dtype != np.int32 or out_dtype not in _OUTPUT_RANGES:
        raise EmulationError(f"the DPU stores int8, int16 or int32 elements (int32 without OUT_CVT), "
                             f"not {out_dtype}")
    bs_operands = _OPERAND_MATRICES.get(channels, () if bs is None else (
        (bs_alu, "BS ALU operand"), (bs_cpend, "CPEND operand"), (bs_mul, "BS MUL operand")), 3)
    bn_operands = _OPERAND_MATRICES.get(channels, () if bn is None else (
        (bn_alu, "BN ALU operand"), (bn_mul, "BN MUL operand")), 2)
    floats, tops = _chain_operands(bs_operands, bs)
    operand_dtype = None if ew is None else np.dtype(operand_dtype)
    chain = chain_settings(bs, bn, ew, cvt, out_dtype, tops, np.dtype(data_dtype),
                           operand_dtype if ew is not None else np.dtype(np.int32))
    return StagePlan(channels, out_dtype, np.dtype(data_dtype), operand_dtype, bs, bn, ew, cvt, bs_operands,
                     bn_operands, floats, chain)


def planned_to_atoms(plan: StagePlan, data: np.ndarray, width: int, target: np.ndarray, offsets: np.ndarray,
                     c2: int, surfaces: int, window_sum: np.ndarray | None = None,
                     ew_operand: np.ndarray | None = None) -> None:
    """``stages_to_atoms`` with its settings worked out (``plan``: made for ``data``'s and the
    EW operand's element types)."""
    channels, out_dtype, bs, ew = plan.channels, plan.out_dtype, plan.bs, plan.ew
    pixels = data.shape[1] if data.ndim == 3 else -1
    data = _channel_blocks(data, channels, pixels, "DPU input")
    atom_bytes = c2 * out_dtype.itemsize
    if pixels % width or offsets.shape != (surfaces * (pixels // width),) or surfaces < 1 \
            or atom_bytes % 8 or target.dtype != np.uint64:
        raise EmulationError(f"{offsets.shape} row offsets for {surfaces} surfaces of {pixels} "
                             f"pixels, {width} per line, in {atom_bytes}-byte atoms of {target.dtype} words")
    if data.dtype != plan.data_dtype:
        raise EmulationError(f"a DPU stage plan for {plan.data_dtype} input got {data.dtype}")
    sums, layout, kernels_per_group = _NO_SUMS, SUMS_NONE, 1
    window_max = 0
    if bs is not None and bs.cpend_enable:
        sums, layout, kernels_per_group = _window_layout(window_sum, channels, pixels)
        window_max = _max_abs(sums)
        if window_max <= nm.INT32_MAX and sums.dtype != np.int32:  # one compiled variant
            sums = sums.astype(np.int32)
    operand = _NO_OPERAND
    if ew is not None:
        if ew_operand is None:
            raise EmulationError("the EW stage needs an operand")
        operand = np.asarray(ew_operand)
        if operand.dtype != plan.operand_dtype:
            raise EmulationError(f"a DPU stage plan for a {plan.operand_dtype} EW operand got {operand.dtype}")
        operand = _operand_pixels(operand, channels, pixels)
    per_block = max(1, BLOCK_ELEMENTS // channels)
    if layout == SUMS_GROUP_MAJOR or (data.shape[2] == 1 and channels > 1):
        per_block = max(per_block, GATHER_PIXELS)
    tile = np.zeros((per_block, surfaces * c2), out_dtype)
    data = _int32_pixels(data, channels)
    offsets = np.ascontiguousarray(offsets, np.int64)
    chain = plan.chain
    if chain is not None and window_max <= chain[1]:
        if _pixel_rows(data, channels, tile.shape[1], layout, kernels_per_group,
                       operand if ew is not None else None):
            _chain_pixels_to_atoms(data, sums, layout, plan.floats, operand, chain[0], surfaces, width, tile,
                                   offsets, target)
            return
        _chain_to_atoms(data, sums, layout, kernels_per_group, plan.floats, operand, chain[0], channels,
                        surfaces, width, tile, offsets, target)
        return
    _stages_to_atoms(data, sums, layout, kernels_per_group,
                     _stage_flags(bs is not None, plan.bn is not None, ew is not None),
                     _x_params(bs or _BYPASSED), plan.bs_operands, _x_params(plan.bn or _BYPASSED),
                     plan.bn_operands, operand, _ew_params(ew or _EW_BYPASSED),
                     _cvt_params(plan.cvt or _IDENTITY, out_dtype), channels, surfaces, width, tile, offsets, target)


def _pixel_rows(data: np.ndarray, channels: int, lanes: int, layout: int, kernels_per_group: int,
                operand: np.ndarray | None) -> bool:
    """Whether ``_chain_pixels_to_atoms`` takes these inputs: pixel-major data, atoms of ``lanes``
    lanes in all with none past the channels, window sums none, per pixel or per pixel and
    channel, an EW operand (if any) pixel-major or per channel."""
    if data.shape[0] != 1 or data.shape[2] != channels or lanes > channels:
        return False
    if layout == SUMS_PIXEL_MAJOR and kernels_per_group != 1 or layout == SUMS_GROUP_MAJOR:
        return False
    return operand is None or (operand.shape[0] == 1 and operand.shape[2] == channels)


def _operand_pixels(ew_operand: np.ndarray, channels: int, pixels: int) -> np.ndarray:
    """The EW operand as ``planned_to_atoms`` hands it to the kernels."""
    operand = np.asarray(ew_operand)
    if operand.shape == (1, 1, 1):
        operand = np.broadcast_to(operand, (1, 1, channels))
    _channel_blocks(operand, channels, 1 if operand.shape[1] == 1 else pixels, "EW operand")
    return _int32_pixels(operand, channels, "dpu operand")


def _int32_pixels(cube: np.ndarray, channels: int, name: str = "dpu data") -> np.ndarray:
    """A channel-block cube as the kernels take it: int32 (one compiled variant), NC1HWC2 atoms
    made pixel-major [1][P][C] first (gathering the atoms' short runs inside the stage kernels
    cost about twice as much: 0.9 ns an element). A converted cube is the thread's working
    buffer ``name`` (read by the one call that asked for it): a fresh multi-MiB array is fresh
    pages, each faulting on first touch (issue 20: 3.5 k page faults a PP-OCR det run here)."""
    surfaces, pixels, lanes = cube.shape
    if lanes == 1 or (surfaces == 1 and lanes == channels) or pixels == 1:
        if cube.dtype == np.int32 and cube.flags.c_contiguous:
            return cube
        out = working_buffer(name, cube.size, np.int32).reshape(cube.shape)
        np.copyto(out, cube, casting="unsafe")  # (the cast ascontiguousarray(cube, np.int32) makes)
        return out
    atom = lanes * cube.dtype.itemsize
    if atom % 8:
        pixel_major = cube.transpose(1, 0, 2).reshape(pixels, surfaces * lanes)
    else:  # atoms move as whole words, then one widening copy
        words = np.ascontiguousarray(cube).view(np.uint64)
        moved = working_buffer("dpu atom words", pixels * surfaces * (atom // 8), np.uint64)
        moved = moved.reshape(pixels, surfaces * (atom // 8))
        _atoms_to_pixels(words, moved)
        pixel_major = moved.view(cube.dtype)
    out = working_buffer(name, pixels * channels, np.int32).reshape(1, pixels, channels)
    out[0] = pixel_major[:, :channels]
    return out


@njit(cache=True)
def _atoms_to_pixels(words, out):
    """[S][P][atom words] -> [P][S * atom words]."""
    surfaces, pixels, atom_words = words.shape
    for p in range(pixels):
        row = out[p]
        for s in range(surfaces):
            for w in range(atom_words):
                row[s * atom_words + w] = words[s, p, w]


_BYPASSED, _EW_BYPASSED = XStageConfig(), EwConfig()
_IDENTITY = OutCvtConfig(1, 0, 0, nm.ROUND_HALF_EVEN)  # without OUT_CVT: int32, as it is
_NO_SUMS = np.zeros(1, np.int32)
_NO_OPERAND = np.zeros((1, 1, 1), np.int32)


def _build_stage_flags(bs: bool, bn: bool, ew: bool) -> np.ndarray:
    return np.array([bs, bn, ew], np.int64)


_stage_flags = Memo(_build_stage_flags)


@njit(cache=True)
def _max_abs(values):
    top = 0
    for i in range(values.shape[0]):
        top = max(top, abs(np.int64(values[i])))
    return top


def _magnitude(dtype: np.dtype) -> int:
    """The largest |value| of an integer type (2**31 for int32)."""
    info = np.iinfo(dtype)
    return max(-int(info.min), int(info.max))


def _build_chain_operands(matrix: np.ndarray, bs: XStageConfig | None) -> tuple[np.ndarray, tuple[int, ...]]:
    """The chain's float64 operands of an operand matrix (``kernels.dpu._OPERAND_MATRICES``,
    which returns the same object for the same operands) - ALU and CPEND times MUL * 2**-shift,
    then MUL * 2**-shift - and the operands' largest magnitudes."""
    tops = tuple(int(np.abs(row).max(initial=0)) for row in matrix)  # ALU, CPEND, MUL
    floats = np.asarray(matrix, np.float64).copy()
    # 0, 0, 1 where a part is off; MUL * 2**-shift is exact (a 16-bit integer scaled by a
    # power of two)
    if bs is None or not bs.alu_enable:
        floats[0] = 0
    if bs is None or not bs.cpend_enable:
        floats[1] = 0
    if bs is None or not bs.mul_enable:
        floats[2] = 1
    else:
        floats[2] *= 2.0 ** -bs.shift_positive
    # ALU and CPEND times MUL * 2**-shift (the chain's form, _chain_value). Exact wherever the
    # chain runs: _build_chain_settings requires |data| + |ALU| <= (CHAIN_BOUND - 1) // |MUL|,
    # so |ALU * MUL| < CHAIN_BOUND; likewise |CPEND * MUL| when a window sum of 1 is allowed,
    # and where none is (window limit 0) the chain runs only with every window sum 0, when any
    # finite CPEND' gives 0.
    floats[0] *= floats[2]
    floats[1] *= floats[2]
    return floats, tops


#: BS ALU, CPEND and MUL * 2**-shift [3][C] as float64 for the chain, and |operand| maxima,
#: per operand matrix object and BS config
_chain_operands = Memo(_build_chain_operands, identity=1)


def _then(bounds: tuple[int, int], low: int, high: int) -> tuple[int, int]:
    """One clamp ``min(max(v, L), U)`` doing the clamp ``bounds`` then ``min(max(v, low), high)``:
    a composition of clamps is the clamp between the images of -inf and +inf (NUMERICS.md 4.9)."""
    return min(max(bounds[0], low), high), min(max(bounds[1], low), high)


def _relu_bounds(bounds: tuple[int, int], stage) -> tuple[int, int]:
    """``bounds``, then a stage's saturate_int32 and relu_int (the limits numerics.relu_int uses)."""
    bounds = _then(bounds, nm.INT32_MIN, nm.INT32_MAX)
    return _then(bounds, 0 if stage.relu else -(2**62), stage.relux_value if stage.relux else 2**62)


def _build_chain_settings(bs: XStageConfig | None, bn: XStageConfig | None, ew: EwConfig | None,
                          cvt: OutCvtConfig | None, out_dtype: np.dtype, tops: tuple[int, int, int],
                          data_dtype: np.dtype, operand_dtype: np.dtype) -> tuple[np.ndarray, int] | None:
    """The float64 chain's settings (``CH_*``) and the largest |window sum| for which it
    computes exactly what the int64 stages do; None where it cannot: it takes BS with ALU add
    (or none), no PReLU and equal shifts; BN with ReLU / RELUX only; EW add (or none);
    OUT_CVT; half-even or half-away rounding; shifts up to CHAIN_MAX_SHIFT; and every
    intermediate integer must stay below CHAIN_BOUND (NUMERICS.md 4.9). ``tops``: the largest
    |BS ALU|, |CPEND|, |BS MUL| operand. The returned array is shared: never written (left
    writeable: a read-only array is another Numba type, another compiled variant)."""
    modes = (nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY)
    if cvt is None or cvt.round_mode not in modes or not 0 <= cvt.shift <= CHAIN_MAX_SHIFT:
        return None
    chain = np.zeros(CH_COUNT, np.float64)
    bounds = (-CHAIN_BOUND, CHAIN_BOUND)  # BS's and BN's clamps as one (none yet)
    value = _magnitude(data_dtype)  # bound on |v| so far
    window_limit = 1 << 63
    if bs is not None:
        if (bs.alu_enable and bs.alu_algo != nm.ALU_ADD) or bs.prelu or (bs.mul_enable and (
                bs.shift_positive != bs.shift_negative or not 0 <= bs.shift_positive <= CHAIN_MAX_SHIFT)):
            return None
        # |data + CPEND * window + ALU| * |MUL| < CHAIN_BOUND, solved for the window sums
        largest = (CHAIN_BOUND - 1) // (max(tops[2], 1) if bs.mul_enable else 1)
        value += tops[0] if bs.alu_enable else 0
        if value > largest:
            return None
        if bs.cpend_enable and tops[1]:
            window_limit = (largest - value) // tops[1]
        bounds = _relu_bounds(bounds, bs)
        value = 1 << 31
    if bn is not None:
        if bn.alu_enable or bn.mul_enable:
            return None
        bounds = _relu_bounds(bounds, bn)
        value = 1 << 31
    chain[CH_LOW1], chain[CH_HIGH1] = bounds
    if ew is not None:
        if ew.op_enable and (ew.op_type != nm.EW_OP_ALU or ew.alu_algo != nm.ALU_ADD):
            return None
        offset, scale, shift = (ew.cvt_offset, ew.cvt_scale, ew.cvt_shift) if ew.cvt_enable else (0, 1, 0)
        if ew.cvt_enable and (ew.cvt_round not in modes or not 0 <= shift <= CHAIN_MAX_SHIFT):
            return None
        if (_magnitude(operand_dtype) + abs(offset)) * max(abs(scale), 1) >= CHAIN_BOUND:
            return None
        chain[CH_EW_ON], chain[CH_EW_OFFSET], chain[CH_EW_K] = 1, offset, scale * 2.0 ** -shift
        chain[CH_EW_EVEN] = ew.cvt_round == nm.ROUND_HALF_EVEN
        chain[CH_EW_ADD] = ew.op_enable
        chain[CH_EW_LOW], chain[CH_EW_HIGH] = _relu_bounds((-CHAIN_BOUND, CHAIN_BOUND), ew)
        value = 1 << 31
    if value * max(abs(cvt.scale), 1) >= CHAIN_BOUND or abs(cvt.offset) >= CHAIN_BOUND:
        return None
    chain[CH_K], chain[CH_EVEN] = cvt.scale * 2.0 ** -cvt.shift, cvt.round_mode == nm.ROUND_HALF_EVEN
    chain[CH_OFFSET] = cvt.offset
    chain[CH_LOW], chain[CH_HIGH] = _OUTPUT_RANGES[np.dtype(out_dtype)]
    return chain, window_limit


#: ``_build_chain_settings`` once per (hashable) settings: a network runs the same ones every
#: inference.
chain_settings = Memo(_build_chain_settings)


def _window_layout(window_sum: np.ndarray | None, channels: int, pixels: int) -> tuple[np.ndarray, int, int]:
    """Window sums [G][...] as the kernel reads them: flat, with their layout code."""
    if window_sum is None or window_sum.ndim < 2 or window_sum.shape[0] == 0 \
            or channels % window_sum.shape[0] or window_sum.size != window_sum.shape[0] * pixels:
        raise EmulationError(f"CPEND needs window sums [G][{pixels} pixels] with G dividing "
                             f"{channels}, got {None if window_sum is None else window_sum.shape}")
    groups = window_sum.shape[0]
    sums = window_sum.reshape(groups, pixels)
    if sums.dtype not in (np.int32, np.int64):
        sums = sums.astype(np.int64)
    if groups == 1:
        return np.ascontiguousarray(sums[0]), SUMS_SHARED, channels
    if sums.T.flags.c_contiguous:  # a pixel-major buffer seen as [G][P]
        return sums.T.reshape(-1), SUMS_PIXEL_MAJOR, channels // groups
    return np.ascontiguousarray(sums).reshape(-1), SUMS_GROUP_MAJOR, channels // groups
