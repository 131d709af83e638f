"""``dpu_pixel.planned_to_atoms`` for one task's fixed shapes (issue 20: a core's task
programs, emulator/task_plan.py): the checks, the row offsets and the block size worked out
once, so a run is the window sums' layout and maximum (data: they choose the kernel), the EW
operand's conversion, a fresh tile and the kernel - the same calls on the same values as
``planned_to_atoms`` makes, so the same atoms.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_folded_lines as folded_lines
from npuemu.emulator.kernels import dpu_pixel as dp

#: pixels per block at least where ``_planes_chain`` moves window-sum planes into pixel rows
PLANE_PIXELS = 64
#: largest array (elements) holding window sums whose view a prepared step keeps between runs
_SEEN_SUMS = 1 << 16


def prepare_planned_to_atoms(plan: dp.StagePlan, pixels: int, width: int, target: np.ndarray,
                             offsets: np.ndarray, c2: int, surfaces: int,
                             ew_constant: np.ndarray | None = None) -> Callable | None:
    """``run(data, window_sum, ew_operand)`` doing ``planned_to_atoms(plan, data, width, target,
    offsets, c2, surfaces, window_sum, ew_operand)`` for ``data`` int32 [1][pixels][channels]
    (C-contiguous; other data goes through ``planned_to_atoms`` itself); None where
    ``planned_to_atoms`` would refuse these shapes (it then raises its own error).
    ``run.direct``: see ``_direct_run`` (None where it does not apply); ``ew_constant``: the EW
    operand every run passes (a register's), converted for ``run.direct`` once."""
    channels, out_dtype, bs, ew, chain = plan.channels, plan.out_dtype, plan.bs, plan.ew, plan.chain
    if pixels % width or offsets.shape != (surfaces * (pixels // width),) or surfaces < 1 \
            or c2 * out_dtype.itemsize % 8 or target.dtype != np.uint64 or plan.data_dtype != np.int32:
        return None
    offsets = np.ascontiguousarray(offsets, np.int64)
    cpend = bs is not None and bs.cpend_enable
    shape, lanes = (1, pixels, channels), surfaces * c2
    shared = (1, pixels // width, width)  # window sums of one group, [1][OH][OW]
    params = None if chain is not None else (
        dp._stage_flags(bs is not None, plan.bn is not None, ew is not None), dp._x_params(bs or dp._BYPASSED),
        plan.bs_operands, dp._x_params(plan.bn or dp._BYPASSED), plan.bn_operands, None,
        dp._ew_params(ew or dp._EW_BYPASSED), dp._cvt_params(plan.cvt or dp._IDENTITY, out_dtype))

    def run(data: np.ndarray, window_sum: np.ndarray | None, ew_operand: np.ndarray | None) -> None:
        if data.shape != shape or data.dtype != np.int32 or not data.flags.c_contiguous or (ew is not None and (
                ew_operand is None or np.asarray(ew_operand).dtype != plan.operand_dtype)):
            dp.planned_to_atoms(plan, data, width, target, offsets, c2, surfaces, window_sum, ew_operand)
            return
        sums, layout, kernels_per_group, window_max = dp._NO_SUMS, dp.SUMS_NONE, 1, 0
        if cpend:
            if window_sum is not None and window_sum.shape == shared and window_sum.dtype == np.int64 \
                    and window_sum.flags.c_contiguous:  # a convolution's: _window_layout's one-group case
                sums, layout, kernels_per_group = window_sum.reshape(pixels), dp.SUMS_SHARED, channels
            else:
                sums, layout, kernels_per_group = dp._window_layout(window_sum, channels, pixels)
            window_max = dp._max_abs(sums)
            if window_max <= nm.INT32_MAX and sums.dtype != np.int32:
                sums = sums.astype(np.int32)
        operand = dp._NO_OPERAND if ew is None else _operand(ew_operand, channels, pixels)
        per_block = max(1, dp.BLOCK_ELEMENTS // channels)
        if layout == dp.SUMS_GROUP_MAJOR:  # (data [1][P][C]: its lanes are the channels)
            per_block = max(per_block, dp.GATHER_PIXELS)
        tile = np.zeros((per_block, lanes), out_dtype)
        if chain is not None and window_max <= chain[1]:
            if dp._pixel_rows(data, channels, lanes, layout, kernels_per_group, operand if ew is not None else None):
                dp._chain_pixels_to_atoms(data, sums, layout, plan.floats, operand, chain[0], surfaces, width, tile,
                                          offsets, target)
                return
            dp._chain_to_atoms(data, sums, layout, kernels_per_group, plan.floats, operand, chain[0], channels,
                               surfaces, width, tile, offsets, target)
            return
        stage = params or (
            dp._stage_flags(bs is not None, plan.bn is not None, ew is not None), dp._x_params(bs or dp._BYPASSED),
            plan.bs_operands, dp._x_params(plan.bn or dp._BYPASSED), plan.bn_operands, None,
            dp._ew_params(ew or dp._EW_BYPASSED), dp._cvt_params(plan.cvt or dp._IDENTITY, out_dtype))
        dp._stages_to_atoms(data, sums, layout, kernels_per_group, *stage[:5], operand, *stage[6:], channels,
                            surfaces, width, tile, offsets, target)

    run.direct = _direct_run(plan, pixels, width, target, offsets, c2, surfaces, run, ew_constant)
    return run


def _direct_run(plan: dp.StagePlan, pixels: int, width: int, target: np.ndarray, offsets: np.ndarray, c2: int,
                surfaces: int, general: Callable, ew_constant: np.ndarray | None) -> Callable | None:
    """``direct(data, window_sum, ew_operand)``: ``run`` for the caller that hands it data int32
    [1][pixels][channels] C-contiguous (a prepared DPU step, units/dpu_plan.py), window sums as a
    convolution leaves them (int64 [1][OH][OW] C-contiguous) or a depthwise one (int32 [C][OH][OW], a view
    of a pixel-major [P][C] buffer: read in place as it is; else ``run`` takes them) and an EW operand
    of the plan's element type, in one Numba call: the window sums' maximum and int32 copy, the tile's
    zeros and ``_chain_pixels_to_atoms`` (issue 20: fixed cost per task), the same calls on the same
    values as ``run``'s. Sums past the chain's bound or int32, operands ``_pixel_rows`` refuses: ``run``.
    ``ew_constant`` (passed on every run) is converted once, others per run (int8 atoms into int8
    lines: ``_ew_lines_store``). None: no chain, or atoms with lanes past the channels."""
    channels, chain, bs, ew, lanes = plan.channels, plan.chain, plan.bs, plan.ew, surfaces * c2
    if chain is None or lanes > channels:
        return None
    cpend = bs is not None and bs.cpend_enable
    layout = dp.SUMS_SHARED if cpend else dp.SUMS_NONE
    shared = (1, pixels // width, width)
    sums = np.zeros(pixels if cpend else 1, np.int32)  # (CPEND: every element written before it is read)
    no_window = np.zeros(0, np.int64)
    tile = np.zeros((max(1, dp.BLOCK_ELEMENTS // channels), lanes), plan.out_dtype)
    settings, top, floats = chain[0], min(chain[1], nm.INT32_MAX), plan.floats
    offsets = np.ascontiguousarray(offsets, np.int64)
    constant = (None, None)  # the register EW operand and its conversion (a copy: _operand's may be scratch)
    if ew is not None and ew_constant is not None and np.asarray(ew_constant).dtype == plan.operand_dtype:
        converted = np.array(_operand(ew_constant, channels, pixels))
        if converted.shape[0] == 1 and converted.shape[2] == channels:
            constant = (ew_constant, converted)
    in_lines = _ew_lines_store(plan, pixels, width, target, offsets, c2, surfaces, general)

    # a depthwise CORE's window sums: [C][OH][OW] int32 viewing a [P][C] buffer (one group per channel)
    per_channel = ((channels, pixels // width, width), (4, 4 * channels * width, 4 * channels)) if channels > 1 \
        else None
    # or [C][OH][OW] int32 planes (C-contiguous): moved to pixel rows a block at a time (``_planes_chain``)
    planes = (channels, pixels // width, width) if channels > 1 else None
    # (their blocks: at least PLANE_PIXELS pixels, so each plane's run is not a few elements)
    plane_tile = np.zeros((max(tile.shape[0], PLANE_PIXELS), lanes), plan.out_dtype)
    block = np.empty(plane_tile.shape, np.int32)  # (each block's rows written before they are read)
    forms = (shared, per_channel, planes, pixels, channels)
    seen = [None, None]  # the last window sums taken and their view: a small CORE step's are one array

    def direct(data: np.ndarray, window_sum: np.ndarray | None, ew_operand: np.ndarray | None) -> None:
        window, rows = no_window, 0
        if cpend and window_sum is not None and window_sum is seen[0]:
            window, rows = seen[1]
        elif cpend:
            view = _sums_view(window_sum, *forms)
            if view is None:
                general(data, window_sum, ew_operand)
                return
            if (window_sum if window_sum.base is None else window_sum.base).size <= _SEEN_SUMS:
                seen[:] = [window_sum, view]  # (sums in a large array, the thread's scratch: not held)
            window, rows = view
        if in_lines is not None and rows != 2 and in_lines(data, window, rows == 1, window_sum, ew_operand):
            return
        if ew is None:
            operand = dp._NO_OPERAND
        elif ew_operand is constant[0]:
            operand = constant[1]
        else:
            if ew_operand is None or np.asarray(ew_operand).dtype != plan.operand_dtype:
                general(data, window_sum, ew_operand)
                return
            operand = _operand(ew_operand, channels, pixels)
            if operand.shape[0] != 1 or operand.shape[2] != channels:  # (not _pixel_rows' operand)
                general(data, window_sum, ew_operand)
                return
        if rows == 2:
            done = _planes_chain(data, window, floats, operand, settings, top, surfaces, width, plane_tile, offsets,
                                 target, block)
        elif rows == 1:
            done = _rows_chain(data, window, floats, operand, settings, top, surfaces, width, tile, offsets, target)
        else:
            done = _window_chain(data, window, sums, layout, floats, operand, settings, top, surfaces, width, tile,
                                 offsets, target)
        if not done:
            general(data, window_sum, ew_operand)

    direct.chain_form = _chain_form(in_lines, forms, no_window, cpend, ew, constant, general, floats, settings, top,
                                    (surfaces, width, sums, layout, tile, plane_tile, block, offsets, target))
    return direct


def _chain_form(in_lines: Callable | None, forms: tuple, no_window: np.ndarray, cpend: bool, ew, constant: tuple,
                general: Callable, floats: np.ndarray, settings: np.ndarray, top, buffers: tuple) -> Callable:
    """``direct.chain_form`` of ``_direct_run`` (its values: ``forms`` the window-sum shapes, pixels and
    channels; ``buffers`` surfaces, width and the kernels' arrays)."""
    pixels, channels = forms[3], forms[4]
    surfaces, width, sums, layout, tile, plane_tile, block, offsets, target = buffers

    def chain_form(data: np.ndarray, window_sum: np.ndarray | None, ew_operand: np.ndarray | None):
        """(``"rows"``, ``"window"`` or ``"planes"``, the arguments after ``data`` of the ``_rows_chain`` /
        ``_window_chain`` / ``_planes_chain`` call ``direct`` makes for these very arrays on every run,
        ``general``'s call where that returns False) - for a caller running the chain in one compiled call
        with the CORE (kernels/int8_core_step.py); None where ``direct`` would take another way (or may,
        by run)."""
        if data.shape != (1, pixels, channels) or data.dtype != np.int32 or not data.flags.c_contiguous:
            return None
        window, rows = no_window, 0
        if cpend:
            view = _sums_view(window_sum, *forms)
            if view is None:
                return None
            window, rows = view
        if in_lines is not None:  # (the EW operand: an array of its own the caller fills every run, ERDMA atoms)
            return _ew_form(data, window, rows, window_sum, ew_operand,
                            (pixels, channels, general, floats, settings, top, layout) + buffers)
        if ew is None:
            operand = dp._NO_OPERAND
        elif ew_operand is not None and ew_operand is constant[0]:
            operand = constant[1]
        else:
            return None
        fallback = (general, data, window_sum, ew_operand)
        if rows == 1:
            return "rows", (window, floats, operand, settings, top, surfaces, width, tile, offsets, target), fallback
        if rows == 0:
            return "window", (window, sums, layout, floats, operand, settings, top, surfaces, width, tile, offsets,
                              target), fallback
        return "planes", (window, floats, operand, settings, top, surfaces, width, plane_tile, offsets, target,
                          block), fallback

    return chain_form


def _ew_form(data: np.ndarray, window: np.ndarray, rows: int, window_sum, ew_operand, held: tuple):
    """``chain_form``'s (``"ew"``, ``_ew_chain``'s arguments after ``data``, ``general``'s call) where ``direct``
    takes ``in_lines`` on every run: the operand ``ew_operand`` int8 atoms [S][P][16] of ``in_lines``' shape,
    C-contiguous, window sums not planes; None otherwise. ``held``: the values ``chain_form`` holds."""
    pixels, channels, general, floats, settings, top, layout, surfaces, width, *_, offsets, target = held
    shape = (-(-channels // folded_lines.LANES), pixels, folded_lines.LANES)
    if rows == 2 or type(ew_operand) is not np.ndarray or ew_operand.dtype != np.int8 or ew_operand.shape != shape \
            or not ew_operand.flags.c_contiguous:
        return None
    return "ew", (window, dp.SUMS_PIXEL_MAJOR if rows == 1 else layout, floats, ew_operand, settings, top, surfaces,
                  width, offsets, target), (general, data, window_sum, ew_operand)


def _sums_view(window_sum: np.ndarray | None, shared: tuple, per_channel: tuple | None, planes: tuple | None,
               pixels: int, channels: int) -> tuple[np.ndarray, int] | None:
    """``_direct_run``'s window sums as its kernels read them, a view of ``window_sum`` (kept between
    runs while the same array comes back: issue 20, fixed cost per task): a convolution's int64
    [1][OH][OW] flat (0); a depthwise CORE's int32 [C][OH][OW] viewing a [P][C] buffer, that buffer
    flat (1: ``_window_layout``'s [P][C] view); int32 planes [C][P] (2: its group-major form); None
    for other sums (then ``run``)."""
    if window_sum is None:
        return None
    if window_sum.shape == shared and window_sum.dtype == np.int64 and window_sum.flags.c_contiguous:
        return window_sum.reshape(pixels), 0
    if per_channel is not None and window_sum.dtype == np.int32 \
            and (window_sum.shape, window_sum.strides) == per_channel:
        return window_sum.reshape(channels, pixels).T.reshape(-1), 1
    if planes is not None and window_sum.dtype == np.int32 and window_sum.shape == planes \
            and window_sum.flags.c_contiguous:
        return window_sum.reshape(channels, pixels), 2
    return None


@njit(cache=True)
def _window_chain(data, window, sums, layout, floats, operand, settings, top, surfaces, width, tile, offsets,
                  target):
    """``prepare_planned_to_atoms``'s run from its window sums on, for pixel rows (``_direct_run``):
    False, having done nothing, where the window sums' largest magnitude passes ``top`` (the
    chain's bound, at most int32's); else they are copied to int32 ``sums`` (as ``astype``), the
    tile zeroed (as ``np.zeros``) and ``_chain_pixels_to_atoms`` run - or, for the folded chain
    into int8 atoms of 16 lanes, ``dpu_folded_lines`` writes the same atoms straight into their
    lines (``_rows_chain`` likewise)."""
    largest = 0
    for i in range(window.shape[0]):
        largest = max(largest, abs(np.int64(window[i])))
    if largest > top:
        return False
    if folded_lines.takes(settings, tile.itemsize, tile.shape[1], surfaces):  # (the same atoms, NUMERICS.md 50)
        folded_lines.folded_lines(data, window, layout, floats, settings, surfaces, width, offsets, target)
        return True
    for i in range(window.shape[0]):
        sums[i] = np.int32(window[i])
    tile[:] = 0
    dp._chain_pixels_to_atoms(data, sums, layout, floats, operand, settings, surfaces, width, tile, offsets,
                              target)
    return True


@njit(cache=True)
def _rows_chain(data, window, floats, operand, settings, top, surfaces, width, tile, offsets, target):
    """``_window_chain`` for int32 window sums per pixel and channel (a depthwise CORE's, [P][C]
    flat: SUMS_PIXEL_MAJOR, one group per channel): read where they are (``run`` takes the same
    array, ``_window_layout``'s view, without a copy). The bound check reads the sums as int32's
    least and greatest (two vector operations per 16 sums, not three per 8 as int64 magnitudes)."""
    least, greatest = np.int32(0), np.int32(0)
    for i in range(window.shape[0]):
        least, greatest = min(least, window[i]), max(greatest, window[i])
    if max(-np.int64(least), np.int64(greatest)) > top:
        return False
    if folded_lines.takes(settings, tile.itemsize, tile.shape[1], surfaces):  # (the same atoms, NUMERICS.md 50)
        folded_lines.folded_lines(data, window, dp.SUMS_PIXEL_MAJOR, floats, settings, surfaces, width, offsets,
                                  target)
        return True
    tile[:] = 0
    dp._chain_pixels_to_atoms(data, window, dp.SUMS_PIXEL_MAJOR, floats, operand, settings, surfaces, width, tile,
                              offsets, target)
    return True


def _ew_lines_store(plan: dp.StagePlan, pixels: int, width: int, target: np.ndarray, offsets: np.ndarray, c2: int,
                    surfaces: int, general: Callable) -> Callable | None:
    """``in_lines(data, window, per_channel, window_sum, ew_operand)`` for ``direct``'s window sums
    (``window``: flat, one per pixel and channel or not): True where it stored the atoms, the EW
    operand being the ERDMA's int8 atoms [S][P][16] (C-contiguous) read in place by ``_ew_chain``
    (``general`` where the window sums pass the chain's bound); False, having done nothing, for
    another operand. None where the chain does not go into int8 lines of 16 lanes with an EW stage
    (``dpu_folded_lines.ew_takes``) or the operand is not int8 (NUMERICS.md 55)."""
    settings, lanes = plan.chain[0], surfaces * c2
    if plan.ew is None or plan.operand_dtype != np.int8 or c2 != folded_lines.LANES \
            or not folded_lines.ew_takes(settings, np.dtype(plan.out_dtype).itemsize, lanes, surfaces):
        return None
    shape = (-(-plan.channels // folded_lines.LANES), pixels, folded_lines.LANES)
    layout = dp.SUMS_SHARED if plan.bs is not None and plan.bs.cpend_enable else dp.SUMS_NONE
    top, floats = min(plan.chain[1], nm.INT32_MAX), plan.floats
    offsets = np.ascontiguousarray(offsets, np.int64)

    def in_lines(data, window, per_channel, window_sum, ew_operand) -> bool:
        if type(ew_operand) is not np.ndarray or ew_operand.dtype != np.int8 or ew_operand.shape != shape \
                or not ew_operand.flags.c_contiguous:
            return False
        if not _ew_chain(data, window, dp.SUMS_PIXEL_MAJOR if per_channel else layout, floats, ew_operand, settings,
                         top, surfaces, width, offsets, target):
            general(data, window_sum, ew_operand)
        return True

    return in_lines


@njit(cache=True)
def _ew_chain(data, window, layout, floats, atoms, settings, top, surfaces, width, offsets, target):
    """``_window_chain`` / ``_rows_chain`` for a chain with the EW stage into int8 lines of 16
    lanes (``dpu_folded_lines.ew_takes``), the EW operand the ERDMA's int8 atoms [S][P][16]:
    False, having done nothing, where the window sums pass ``top``; else ``ew_lines`` writes the
    atoms ``_chain_pixels_to_atoms`` writes from the operand made pixel-major (NUMERICS.md 55)."""
    largest = 0
    for i in range(window.shape[0]):
        largest = max(largest, abs(np.int64(window[i])))
    if largest > top:
        return False
    folded_lines.ew_lines(data, window, layout, floats, atoms, settings, surfaces, width, offsets, target)
    return True


@njit(cache=True)
def _planes_chain(data, planes, floats, operand, settings, top, surfaces, width, tile, offsets, target, block):
    """``_rows_chain`` for window sums per channel as int32 planes [C][P] (a depthwise CORE's
    group-major sums: ``run`` takes them as SUMS_GROUP_MAJOR, one group per channel, through
    ``_chain_to_atoms``): each block's sums of the first L channels moved into ``block``
    [pixels per block][L] and ``_chain_pixels_to_atoms``' pixel-by-pixel kernels run on them
    (SUMS_PIXEL_MAJOR: channel c's sum at [pixel][c], the value the group-major form reads at
    [c][pixel]). False, having done nothing, where the sums pass ``top`` or the chain is one the
    pixel-by-pixel kernels do not take (no EW stage and OUT_CVT's scale < 0: ``run`` then)."""
    ew_on, k = settings[dp.CH_EW_ON] != 0, settings[dp.CH_K]
    if not ew_on and not k >= 0.0:
        return False
    largest = 0
    for c in range(planes.shape[0]):
        for p in range(planes.shape[1]):
            largest = max(largest, abs(np.int64(planes[c, p])))
    if largest > top:
        return False
    tile[:] = 0
    rows = data[0]
    per_block, lanes = tile.shape
    pixels = rows.shape[0]
    even, per_pixel = settings[dp.CH_EVEN] != 0, operand.shape[1] > 1
    for first in range(0, pixels, per_block):
        count = min(per_block, pixels - first)
        for c in range(lanes):
            source = planes[c, first:first + count]
            for b in range(count):
                block[b, c] = source[b]
        span = rows[first:first + count]
        if not ew_on:
            dp._folded_rows(span, block, dp.SUMS_PIXEL_MAJOR, 0, floats, settings, tile[:count], even)
        else:
            dp._ew_rows(span, block, dp.SUMS_PIXEL_MAJOR, 0, floats,
                        operand[0, first:first + count] if per_pixel else operand[0], settings, tile[:count])
        dp._store_atoms(tile, first, count, width, surfaces, offsets, target)
    return True


#: the EW operand as ``planned_to_atoms`` hands it to the kernels (a name of this module's: the tests
#: replace it here)
_operand = dp._operand_pixels
