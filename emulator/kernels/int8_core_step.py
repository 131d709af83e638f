"""The CORE half of a small int8 task step in one compiled call (issue 20: fixed cost per task).

A task program's int8 CNA + CORE step (units/cna_core.py ``_direct_rows``) copies the feature rows
into an array of its own, zeroes the lanes past DATAIN_CHANNEL_REAL and runs the prepared kernel:
four to five Numba calls of 3-21 arguments each (~0.4 us a call and ~45 ns an argument to unbox),
which cost ppocr_cls more than its small kernels compute. Here the same calls run inside one
compiled function whose scalars come packed in one int64 array:

- ``depthwise_step``: the row copy and lane masking, ``depthwise._pad_pixels`` and
  ``depthwise_direct._padded_rows`` (a depthwise layer with more outputs than lanes, its own buffers), or
  ``depthwise_direct._padded_layer`` (as many outputs as lanes: ``depthwise.run_padded``'s kernels);
- ``gemm_step``: the row copy and lane masking and ``gemm_conv_int8._run_blocks`` (a convolution
  whose windows lie inside the input, read in place from the atoms, its own buffers);
- ``gemm_padded_step``: the row copy and lane masking, ``gemm_conv_int8._copy_padded`` (the atoms into
  the padded copy, the pad value outside the input), ``_run_blocks`` on that copy and ``_add_edges``
  (the channels past DATAIN_CHANNEL_REAL outside the input; none: empty arrays) - a convolution whose
  windows reach outside the input (silero-vad's encoder, ddddocr's CRNN);
- ``CHAINED``: either with the task's DPU stage chain after it (the chain call
  ``dpu_pixel_plan._direct_run`` would make on these outputs every run).

The kernels and their
arguments are those the separate calls pass, so the values are theirs bit for bit; the lane masking
zeroes what ``cna_core._masked_lanes``' two slices hold.

A step too large for buffers of its own (ppocr_cls' 20 wider layers: 0.3-0.7 MB each) places them in
its memory's ``arena``, shared by every such step (``placer``): each run writes every element it reads
(the depthwise outputs' zero columns too: ``DW_ZERO_TAIL``), and the task's DPU consumes the outputs
before the next task's CORE runs, as with the thread's working buffers the separate calls take.
"""

from __future__ import annotations

import weakref

import numpy as np
from numba import njit

from npuemu.emulator.kernels import depthwise as dw
from npuemu.emulator.kernels import depthwise_direct as direct
from npuemu.emulator.kernels import dpu_pixel_plan as chains
from npuemu.emulator.kernels import gemm_conv_int8 as gemm
from npuemu.emulator.memory import gather_rows

#: ``ints`` of both steps start with the row copy's lane masking: lines a surface, atom lanes, the first
#: masked surface (past the surfaces: none) and its first masked lane (and end, where a line is masked,
#: with its byte mask: ``mask_words``)
MASK_LINES, MASK_C2, MASK_GROUP, MASK_LANE = 0, 1, 2, 3
#: then ``depthwise_step``'s (the pad value's byte, then ``_padded_rows``' scalars in its order)
DW_PAD_BYTE, DW_TOP, DW_LEFT, DW_KIND, DW_KERNEL_H, DW_KERNEL_W, DW_OUT_H, DW_OUT_W, DW_STRIDE_Y, \
    DW_DILATION_Y, DW_KEPT, DW_SUMMED, DW_CLIP, DW_MODE, DW_ZERO_TAIL = range(4, 19)
#: (``DW_ZERO_TAIL``: 1 where the outputs' columns past the kept lanes must be written each run: buffers
#: in an arena; 0 for buffers of the step's own, whose zeros were written once) and ``DW_WHOLE``: 1 for a
#: layer with as many outputs as lanes, run as ``depthwise.run_padded`` runs it (``_padded_layer``)
DW_WHOLE = 19
#: or ``gemm_step``'s (``_run_blocks``' scalars in its order)
GEMM_QUADS, GEMM_BLOCK, GEMM_KERNELS, GEMM_CLIP, GEMM_MODE, GEMM_FUSED = range(4, 10)
#: and ``gemm_padded_step``'s after those (``_copy_padded``'s scalars in its order)
PAD_SURFACES, PAD_CHANNELS, PAD_REAL, PAD_VALUE, PAD_TOP, PAD_LEFT = range(10, 16)


#: bytes of a memory's arena (``arena``): the largest step placed in it (a depthwise layer's padded
#: input, row buffers, outputs and window sums; a convolution's outputs, window sums and padded copy):
#: 16 MiB, a 112x112 layer's 96 int32 outputs and their sums with room (NUMERICS.md 88; made with
#: ``np.empty``, so only the pages the steps write are resident)
ARENA_BYTES = 1 << 24
#: the arena of each owner (a Memory: one runtime's chain, whose tasks run one after another in one thread)
_ARENAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ALIGN = 64  # a piece's start in an arena (bytes): whole cache lines


def arena(owner) -> np.ndarray:
    """The uint8 array (ARENA_BYTES, 64-byte aligned) the one-call int8 steps of ``owner`` place
    their working arrays and results in (``placer``), made at the first call."""
    work = _ARENAS.get(owner)
    if work is None:
        raw = np.empty(ARENA_BYTES + _ALIGN, np.uint8)
        start = -raw.ctypes.data % _ALIGN
        work = _ARENAS[owner] = raw[start:start + ARENA_BYTES]
    return work


def placer(work: np.ndarray):
    """``place(shape, dtype)``: a step's array, the next piece of the arena ``work`` (every step
    places its arrays from the arena's start), or None once they no longer fit."""
    offset = [0]

    def place(shape: tuple, dtype) -> np.ndarray | None:
        dtype = np.dtype(dtype)
        size = int(np.prod(shape)) * dtype.itemsize
        start = offset[0]
        if start + size > work.size:
            return None
        offset[0] = start + -(-size // _ALIGN) * _ALIGN
        return work[start:start + size].view(dtype).reshape(shape)

    return place


@njit(cache=True)
def gather_masked(data, offsets, rows, ints):
    """Rows ``data[offsets[r]:][:row bytes]`` into ``rows`` [S * H][W * C2] (the atoms' lines), then
    0 in the lanes from ``ints[MASK_LANE]`` on of surface ``ints[MASK_GROUP]``'s lines and in every
    lane of the surfaces after it (channels past DATAIN_CHANNEL_REAL read as 0, REGISTER_SEMANTICS 2.2).
    Those lines are copied through the byte mask of a line that ends ``ints`` (``mask_words``; one
    vectorised AND: a loop over each atom's masked lanes ran scalar, ~4 us of ppocr_cls' first
    depthwise layer's 20)."""
    row_bytes = rows.shape[1]
    lines, group = ints[MASK_LINES], ints[MASK_GROUP]
    masked_from = group * lines
    words = -(-row_bytes // 8)
    keep = ints[ints.size - words:].view(np.uint8) if masked_from < offsets.size else ints[:0].view(np.uint8)
    for r in range(offsets.size):
        source = data[offsets[r]:offsets[r] + row_bytes]
        target = rows[r]
        if r >= masked_from + lines:
            target[:] = 0
        elif r >= masked_from:
            for i in range(row_bytes):
                target[i] = source[i] & keep[i]
        else:
            for i in range(row_bytes):
                target[i] = source[i]


def mask_words(row_bytes: int, c2: int, lane: int) -> tuple[int, ...]:
    """The byte mask of a masked line (255 in each atom's lanes below ``lane``, else 0) as the int64
    words ``gather_masked`` reads at the end of ``ints``."""
    keep = np.zeros(-(-row_bytes // 8) * 8, np.uint8)
    keep[:row_bytes].reshape(-1, c2)[:, :lane] = 255
    return tuple(int(word) for word in keep.view(np.int64))


@njit(cache=True)
def depthwise_step(data, offsets, rows, words, phased_words, phased, tiled, weights, packed, starts, acc, total,
                   out, sums, ints):
    """``gather_masked`` into the atoms (``rows`` and ``words``: two views of them), then the prepared
    depthwise run (kernels/depthwise_direct.py ``runner``'s ``run`` with its own buffers): the padded
    copy into ``phased_words`` (``phased``: its int8 view) and the row kernels into ``out`` / ``sums``; with
    ``ints[DW_WHOLE]`` the kernels of ``depthwise.run_padded`` on the whole layer (as many outputs as lanes)."""
    gather_masked(data, offsets, rows, ints)
    pad_word = np.uint64(ints[DW_PAD_BYTE]) * np.uint64(0x0101010101010101)
    dw._pad_pixels(words, pad_word, phased_words, ints[DW_TOP], ints[DW_LEFT])
    if ints[DW_WHOLE] != 0:  # (``acc`` / ``total`` unused)
        direct._padded_layer(phased, tiled, weights, packed, ints[DW_KIND], ints[DW_KERNEL_H], ints[DW_KERNEL_W],
                             ints[DW_OUT_H], ints[DW_OUT_W], ints[DW_STRIDE_Y], ints[DW_DILATION_Y], starts, out, sums,
                             ints[DW_SUMMED], ints[DW_CLIP], ints[DW_MODE])
        return
    direct._padded_rows(phased, tiled, weights, packed, ints[DW_KIND], ints[DW_KERNEL_H], ints[DW_KERNEL_W],
                        ints[DW_OUT_H], ints[DW_OUT_W], ints[DW_STRIDE_Y], ints[DW_DILATION_Y], starts, acc, total,
                        out, sums, ints[DW_KEPT], ints[DW_SUMMED], ints[DW_CLIP], ints[DW_MODE],
                        ints[DW_ZERO_TAIL] != 0)


@njit(cache=True)
def gemm_step(data, offsets, rows, source, bases, segs, packed, ones, acc, out, sums, ints):
    """``gather_masked`` into the atoms (``rows`` and ``source``: two views of them), then the
    prepared convolution's products and CORE pass (gemm_conv_int8.py ``prepare``'s ``run`` for
    windows inside the input, its own buffers)."""
    gather_masked(data, offsets, rows, ints)
    gemm._run_blocks(source, bases, segs, ints[GEMM_QUADS], packed, ones, acc, ints[GEMM_BLOCK], ints[GEMM_KERNELS],
                     ints[GEMM_CLIP], ints[GEMM_MODE], ints[GEMM_FUSED] != 0, out, sums)


@njit(cache=True)
def gemm_padded_step(data, offsets, rows, atoms, padded, source, bases, segs, packed, ones, acc, out, sums, pixels,
                     terms, sum_terms, ints):
    """``gather_masked`` into the atoms (``rows`` and ``atoms``: two views of them, the latter as 4-byte
    words), then the prepared convolution's ``run`` for windows reaching outside the input: the padded
    copy into ``padded`` (``source``: its int8 view), the products and CORE pass on it, and the edge
    terms (``pixels``, ``terms``, ``sum_terms``: none where empty)."""
    gather_masked(data, offsets, rows, ints)
    gemm._copy_padded(atoms, ints[PAD_SURFACES], ints[PAD_CHANNELS], ints[PAD_REAL], ints[PAD_VALUE], ints[PAD_TOP],
                      ints[PAD_LEFT], padded)
    gemm._run_blocks(source, bases, segs, ints[GEMM_QUADS], packed, ones, acc, ints[GEMM_BLOCK], ints[GEMM_KERNELS],
                     ints[GEMM_CLIP], ints[GEMM_MODE], ints[GEMM_FUSED] != 0, out, sums)
    gemm._add_edges(out, sums, pixels, terms, sum_terms)


# The step's DPU stage chain in the same call (dpu_pixel_plan.py ``_direct_run``'s ``chain_form``): its
# ``_rows_chain`` (a depthwise CORE's window sums, one per pixel and channel), ``_planes_chain`` (int32
# planes [C][P]: a one-pixel depthwise layer's) or ``_window_chain`` (a convolution's) on the CORE's
# outputs ``blocks`` [1][P][C]; False where the chain refused the window sums (having written
# nothing: the caller then runs the general stages)


@njit(cache=True)
def depthwise_rows_chain(data, offsets, rows, words, phased_words, phased, tiled, weights, packed, starts, acc,
                         total, out, sums, ints, blocks, window, floats, operand, settings, top, surfaces, width,
                         tile, out_offsets, target):
    depthwise_step(data, offsets, rows, words, phased_words, phased, tiled, weights, packed, starts, acc, total, out,
                   sums, ints)
    return chains._rows_chain(blocks, window, floats, operand, settings, top, surfaces, width, tile, out_offsets,
                              target)


@njit(cache=True)
def gemm_window_chain(data, offsets, rows, source, bases, segs, packed, ones, acc, out, sums, ints, blocks, window,
                      window_sums, layout, floats, operand, settings, top, surfaces, width, tile, out_offsets, target):
    gemm_step(data, offsets, rows, source, bases, segs, packed, ones, acc, out, sums, ints)
    return chains._window_chain(blocks, window, window_sums, layout, floats, operand, settings, top, surfaces, width,
                                tile, out_offsets, target)


@njit(cache=True)
def depthwise_planes_chain(data, offsets, rows, words, phased_words, phased, tiled, weights, packed, starts, acc,
                           total, out, sums, ints, blocks, planes, floats, operand, settings, top, surfaces, width,
                           tile, out_offsets, target, block):
    depthwise_step(data, offsets, rows, words, phased_words, phased, tiled, weights, packed, starts, acc, total, out,
                   sums, ints)
    return chains._planes_chain(blocks, planes, floats, operand, settings, top, surfaces, width, tile, out_offsets,
                                target, block)


@njit(cache=True)
def gemm_padded_window_chain(data, offsets, rows, atoms, padded, source, bases, segs, packed, ones, acc, out, sums,
                             pixels, terms, sum_terms, ints, blocks, window, window_sums, layout, floats, operand,
                             settings, top, surfaces, width, tile, out_offsets, target):
    gemm_padded_step(data, offsets, rows, atoms, padded, source, bases, segs, packed, ones, acc, out, sums, pixels,
                     terms, sum_terms, ints)
    return chains._window_chain(blocks, window, window_sums, layout, floats, operand, settings, top, surfaces, width,
                                tile, out_offsets, target)


@njit(cache=True)
def gemm_ew_chain(data, offsets, rows, source, bases, segs, packed, ones, acc, out, sums, ints, blocks, window, layout,
                  floats, region, ew_offsets, ew_rows, atoms, settings, top, surfaces, width, out_offsets, target):
    """``gemm_step``, then the ERDMA operand's rows copied out of ``region`` into ``ew_rows`` (``atoms``: the
    same bytes as int8 atoms [S][P][16]: ``dpu_plan._ew_reader``'s read) and the chain with its EW stage
    (``dpu_pixel_plan._ew_chain``, what ``_ew_lines_store``'s ``in_lines`` calls): False where it refuses the
    window sums, ``ew_rows`` then holding the operand the general stages take."""
    gemm_step(data, offsets, rows, source, bases, segs, packed, ones, acc, out, sums, ints)
    gather_rows(region, ew_offsets, ew_rows)
    return chains._ew_chain(blocks, window, layout, floats, atoms, settings, top, surfaces, width, out_offsets, target)


#: (CORE kernel, chain kind) -> the call running both (the pairs the int8 builds make: a depthwise
#: CORE's sums reach the DPU per pixel and channel, or as planes where the layer is one pixel; a
#: convolution's per pixel)
CHAINED = {(depthwise_step, "rows"): depthwise_rows_chain, (depthwise_step, "planes"): depthwise_planes_chain,
           (gemm_step, "window"): gemm_window_chain, (gemm_padded_step, "window"): gemm_padded_window_chain,
           (gemm_step, "ew"): gemm_ew_chain}
