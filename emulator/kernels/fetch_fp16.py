"""The fp16 CORE's feature fetch into padded float32 planes with whole atoms transposed in registers
(issue 20; NUMERICS.md 49).

``mac._fetch_padded_half`` widens the atoms of 8 lanes with eight strided reads a pixel that LLVM turns
into wide loads and shuffles (~0.2 ns an element; MobileNetV2 fp16: ~0.7 ms a run). Here 8 atoms at a
time are widened (``fp16_atoms_ir.widen8``: F16C, the signalling-NaN repair) and transposed in
registers into the 8 channel planes (``fp16_atoms_ir.store_planes``). The values are the exact
widenings either way and the border gets the pad value as before (``mac._pad_border``): the same bits.
Runs of at least ``LONG_RUN`` atoms (rows back to back) keep mac's loop, which is faster there;
groups of fewer lanes and targets without F16C keep ``mac._fetch_padded_half``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels import mac
from npuemu.emulator.kernels.fp16_atoms_ir import LANES, halves_native, widen_to_planes

#: a run of at least this many atoms goes through ``mac._widen_atoms8`` (its vector loop's fixed costs
#: paid off; measured: 5600-11200 atoms ~25% faster than the transposes, 160-1568 atoms 2-3x slower,
#: 3136 about even)
LONG_RUN = 2048


@njit(cache=True)
def _fetch_atoms(bits16, channels, pad_top, pad_left, pad_bits, padded_bits, table, long_run):
    # mac._fetch_padded_half's planes: the border, then each whole group's rows by widen_to_planes (a
    # run of rows back to back where the planes have no left or right border), the rest by mac's loop
    groups, height, width, _ = bits16.shape
    _, padded_h, padded_w = padded_bits.shape
    _border(padded_bits, channels, height, width, pad_top, pad_left, pad_bits)
    rows, columns = min(height, padded_h - pad_top), min(width, padded_w - pad_left)
    plane_bytes = padded_h * padded_w * 4
    whole = min(groups, channels // LANES)
    if rows > 0 and columns > 0:
        for group in range(whole):
            target = padded_bits[group * LANES].ctypes.data
            source = bits16[group].ctypes.data
            if pad_left == 0 and columns == width == padded_w:
                if rows * width >= long_run:  # mac's loop (measured ~25% faster on runs of 5000+ atoms)
                    planes = padded_bits[group * LANES:(group + 1) * LANES].reshape(LANES, padded_h * padded_w)
                    mac._widen_atoms8(bits16[group, :rows].reshape(-1), planes, pad_top * padded_w, rows * width)
                    continue
                widen_to_planes(source, 0, target + pad_top * padded_w * 4, plane_bytes, rows * width)
                continue
            for y in range(rows):
                first = target + ((y + pad_top) * padded_w + pad_left) * 4
                widen_to_planes(source + y * width * LANES * 2, 0, first, plane_bytes, columns)
    if whole < groups and whole * LANES < channels:  # a last group of fewer lanes: the table loop
        mac._fetch_padded_half(bits16[whole:], channels - whole * LANES, pad_top, pad_left, pad_bits,
                               padded_bits[whole * LANES:], table)


@njit(cache=True)
def _border(padded, channels, height, width, pad_top, pad_left, value):
    # mac._pad_border's writes (the pad value on the rows outside the input and left and right of it),
    # none where the planes have no border, else loops over row views: its two slice assignments a
    # channel and row cost ~1 us a call on ppocr_cls's 1x1 steps of 200 channels, which have no border
    _, padded_h, padded_w = padded.shape
    if pad_top < 0 or pad_left < 0:  # (mac's slices of a negative start, as they were)
        mac._pad_border(padded, channels, height, width, pad_top, pad_left, value)
        return
    top, bottom = min(pad_top, padded_h), min(pad_top + height, padded_h)
    left, right = min(pad_left, padded_w), min(pad_left + width, padded_w)
    if top == 0 and bottom == padded_h and left == 0 and right == padded_w:
        return
    for c in range(channels):
        for y in range(padded_h):
            row = padded[c, y]
            inside = top <= y < bottom
            for x in range(left if inside else padded_w):
                row[x] = value
            for x in range(right if inside else padded_w, padded_w):
                row[x] = value


def fetch_padded_half(bits16: np.ndarray, channels: int, pad_top: int, pad_left: int, pad_bits, padded_bits: np.ndarray,
                      table: np.ndarray) -> None:
    """``mac._fetch_padded_half`` (same arguments: uint16 atoms [C1][H][W][8], C-contiguous, into the
    uint32 view of float32 planes [C][Hp][Wp], C-contiguous), whole atoms transposed in registers."""
    if bits16.shape[3] != LANES or not halves_native() or not padded_bits.flags.c_contiguous \
            or not bits16.flags.c_contiguous:
        mac._fetch_padded_half(bits16, channels, pad_top, pad_left, pad_bits, padded_bits, table)
        return
    _fetch_atoms(bits16, channels, pad_top, pad_left, pad_bits, padded_bits, table, LONG_RUN)
