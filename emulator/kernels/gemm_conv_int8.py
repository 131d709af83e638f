"""int8 convolutions on the VNNI products (``gemm_int8``; issue 20, NUMERICS.md 29).

The prepared form of ``conv_pixels.prepare_conv_int8_pixels`` where ``gemm_int8.available()``:
the operand rows are the NC1HWC2 atoms themselves (output pixel (oy, ox) at atom pixel
(oy * stride_y, ox * stride_x); one run of lanes per surface and kernel tap), read in place when
every window lies inside the input, else from a padded copy of the atoms (the pad value outside
the input, as ``conv_pixels._gather``). The weights are packed once with a column of ones for the
window sums. Outputs, window sums and the CORE stage are those of ``conv_pixels``: the products
are the same exact integers (NUMERICS.md 3.5, 29), only computed in int32.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import gemm_int8
from npuemu.emulator.kernels.mac import ConvGeometry

#: Largest int32 sums block (elements, 256 KiB) a run computes before its CORE pass
ACC_ELEMENTS = 1 << 16
#: Operand bytes per block of rows of the fused products (they stay in L2 across column blocks)
BLOCK_BYTES = 1 << 18
#: Largest buffers (elements, all together) a prepared small layer keeps of its own
OWN_BUFFER_ELEMENTS = 1 << 15


def pack_conv_weights(weights: np.ndarray, c2: int, surfaces: int, lanes: int, count: int = 0,
                      blend: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """int8 [M][C][KH][KW] -> ``gemm_int8.pack`` of the columns [max(M + 1, count)]
    [taps * surfaces * lanes]: the reduction in (tap, surface, lane) order, channel
    ``surface * c2 + lane``; w + 128 for the C channels, 0 past them; column M is the window sum
    (1 per channel); the columns past it 0. With ``blend``: no column M (the columns
    [max(M, count)]) and, second, ``gemm_int8.ones_vectors`` of those ones; else
    ``gemm_int8.NO_ONES``."""
    kernels, channels = weights.shape[:2]
    taps = weights.shape[2] * weights.shape[3]
    columns = np.zeros((max(kernels + 1, count), taps, surfaces, lanes), np.uint8)
    shifted = (weights.astype(np.int16) + 128).astype(np.uint8).reshape(kernels, channels, taps)
    for surface in range(surfaces):
        first, last = surface * c2, min(channels, surface * c2 + lanes)
        columns[:kernels, :, surface, :last - first] = shifted[:, first:last].transpose(0, 2, 1)
        columns[kernels, :, surface, :last - first] = 1
    columns = columns.reshape(columns.shape[0], -1)
    if blend:
        return gemm_int8.pack(np.delete(columns, kernels, axis=0)[:max(kernels, count)]), \
            gemm_int8.ones_vectors(columns[kernels])
    return gemm_int8.pack(columns), gemm_int8.NO_ONES


def blends_window_sums(kernels: int, out_channels: int) -> bool:
    """Whether the fused products blend the window sums (``gemm_int8._blend``) rather than pack a
    column of ones: where that column would take a vector of 16 columns of its own (the kernel
    count a multiple of 16 and no spare output column past the kernels in its last vector)."""
    return -(-max(kernels + 1, out_channels) // 16) > -(-max(kernels, out_channels) // 16)


def _edge_terms(extra: np.ndarray, geometry: ConvGeometry, height: int, width: int, pad_value: int):
    """What the channels ``extra`` [M][E][KH][KW] (0 inside the input, the pad value outside it)
    add: the output pixels whose windows reach outside, per pixel and kernel the pad value times
    the summed weights of its outside taps (int64 [B][M]), and to its window sum the pad value
    per outside tap and channel; None when they add nothing."""
    kernels, count = extra.shape[:2]
    summed = extra.sum(axis=1, dtype=np.int64).reshape(kernels, -1)
    g = geometry
    taps_y, taps_x = np.divmod(np.arange(g.kernel_h * g.kernel_w), g.kernel_w)
    iy = (np.arange(g.out_h) * g.stride_y)[:, None] + taps_y * g.dilation_y - g.pad_top  # [OH][taps]
    ix = (np.arange(g.out_w) * g.stride_x)[:, None] + taps_x * g.dilation_x - g.pad_left
    outside = ((iy < 0) | (iy >= height))[:, None] | ((ix < 0) | (ix >= width))[None]  # [OH][OW][taps]
    outside = outside.reshape(g.out_h * g.out_w, -1)
    pixels = np.flatnonzero(outside.any(axis=1))
    if pad_value == 0 or pixels.size == 0:
        return None
    reached = outside[pixels].astype(np.int64)
    return pixels, pad_value * (reached @ summed.T), pad_value * count * reached.sum(axis=1)


@njit(cache=True)
def _add_edges(out, sums, pixels, terms, sum_terms):
    # ``_edge_terms`` added to the exact CORE outputs (no shift) and window sums
    for i in range(pixels.shape[0]):
        p = pixels[i]
        for m in range(terms.shape[1]):
            out[p, m] += terms[i, m]
        sums[p] += sum_terms[i]


@njit(cache=True)
def _copy_padded(atoms, surfaces, channels, real, pad_value, pad_top, pad_left, padded):
    # padded [surfaces][Hp][Wp][lanes]: the atoms inside the input, lanes from ``real`` on 0 there
    # (DATAIN_CHANNEL_REAL: conv_pixels' virtual columns), the pad value outside on the first
    # ``channels`` lanes, 0 past them (never read: their weights are 0). Both as 4-byte words
    # (uint32 views; lanes and C2 multiples of 4): a kept word is the atom's word under a byte
    # mask, a padding word one pattern; unsigned flat offsets (no wraparound branch: the copies
    # vectorise)
    u = np.uint64
    height, width, words_in = u(atoms.shape[1]), u(atoms.shape[2]), u(atoms.shape[3])
    padded_h, padded_w, words = u(padded.shape[1]), u(padded.shape[2]), u(padded.shape[3])
    source, target = atoms.reshape(-1), padded.reshape(-1)
    left, right = min(u(pad_left), padded_w), min(u(pad_left) + width, padded_w)  # the input's columns
    outside, masks = np.zeros(padded.shape[3], np.uint32), np.zeros(padded.shape[3], np.uint32)
    for s in range(surfaces):
        count = min(4 * padded.shape[3], channels - s * 4 * atoms.shape[3])
        keep = min(count, max(real - s * 4 * atoms.shape[3], 0))
        for w in range(padded.shape[3]):
            outside[w], masks[w] = 0, 0
            for b in range(4):
                if 4 * w + b < count:
                    outside[w] |= np.uint32(pad_value & 0xFF) << np.uint32(8 * b)
                if 4 * w + b < keep:
                    masks[w] |= np.uint32(0xFF) << np.uint32(8 * b)
        whole = masks[-1] == 0xFFFFFFFF and words == words_in  # an input row is one run of words
        for py in range(padded.shape[1]):
            iy = py - pad_top
            row = (u(s) * padded_h + u(py)) * padded_w * words
            if iy < 0 or iy >= atoms.shape[1]:
                _fill(target, row, padded_w, outside)
                continue
            _fill(target, row, left, outside)
            _fill(target, row + right * words, padded_w - right, outside)
            at, start = row + left * words, (u(s) * height + u(iy)) * width * words_in
            if whole:
                for i in range((right - left) * words):
                    target[at + i] = source[start + i]
                continue
            if words == 1:  # (the image input's 3 channels: one word a pixel)
                for px in range(right - left):
                    target[at + px] = source[start + px * words_in] & masks[0]
                continue
            for px in range(right - left):
                for w in range(words):
                    target[at + px * words + w] = source[start + px * words_in + w] & masks[w]


@njit(cache=True, inline="always")
def _fill(target, at, pixels, pattern):
    # ``pixels`` copies of the words ``pattern`` from flat word ``at`` on (unsigned offsets)
    words = np.uint64(pattern.shape[0])
    for px in range(pixels):
        for w in range(words):
            target[at + px * words + w] = pattern[w]


@njit(cache=True)
def _core_int(acc, kernels, clip_truncate, mode, out, sums):
    # CORE stage of the int32 sums acc [>= P][N] (column ``kernels``: the window sums, and
    # 128 times them in every other column, the weights' offset) -> out [P][out_channels], sums [P]
    for p in range(out.shape[0]):
        window = acc[p, kernels]
        shift = np.int32(128) * window
        row, target = acc[p], out[p]
        if clip_truncate == 0:  # an exact sum of magnitude < 2**31: the CORE output itself
            for m in range(kernels):
                target[m] = row[m] - shift
        else:
            for m in range(kernels):
                target[m] = nm.core_output(np.int64(row[m] - shift), clip_truncate, mode)
        for m in range(kernels, out.shape[1]):
            target[m] = 0
        sums[p] = window


def prepare(feature_shape: tuple[int, int, int, int], channels: int, real: int, weights: np.ndarray,
            geometry: ConvGeometry, pad_value: int, clip_truncate: int, round_mode: int, out_channels: int,
            scratch):
    """``run(feature) -> (out, sums)`` as ``conv_pixels.prepare_conv_int8_pixels``' (whose checks
    passed), or None where the VNNI path does not apply (no VNNI, C2 not a multiple of 4, a pad
    value outside int8, a reduction past ``gemm_int8.MAX_REDUCTION``). ``real``: the real channels
    the float path feeds (``PixelOperands.channels``): lanes from there on read 0 inside the input.
    ``scratch(name, size, dtype)``: the thread's working buffers."""
    surfaces_all, height, width, c2 = feature_shape
    if not gemm_int8.available() or c2 % 4 or not -128 <= pad_value <= 127:
        return None  # (before the edge terms: nothing worked out for a refusal)
    kernels = weights.shape[0]
    # the CORE fused into the products (gemm_int8.products_core) without a shift, unless the
    # window sums' column block would not run first
    fused = clip_truncate == 0 and (kernels >= 16 * gemm_int8.NV or out_channels <= 16 * gemm_int8.NV)
    inside = geometry.pad_top == geometry.pad_left == 0 and geometry.padded_h <= height \
        and geometry.padded_w <= width
    edges = None
    if real < channels and (inside or fused):
        # the channels past ``real`` read 0 inside the input: they add nothing there; outside it
        # (the sums final: fused) their products, the pad value times their summed weights, are
        # added to the pixels whose windows reach there
        if not inside:
            edges = _edge_terms(weights[:, real:], geometry, height, width, pad_value)
        weights, channels = weights[:, :real], real
    surfaces = -(-channels // c2)
    lanes = -(-min(channels, c2) // 4) * 4
    taps = geometry.kernel_h * geometry.kernel_w
    if taps * surfaces * lanes > gemm_int8.MAX_REDUCTION or surfaces > surfaces_all:
        return None
    packed, ones = pack_conv_weights(weights, c2, surfaces, lanes, out_channels if fused else 0,
                                     fused and blends_window_sums(kernels, out_channels))
    direct = inside and real >= channels
    source_h, source_w, segs, bases = _operand_rows(geometry, direct, height, width, c2, surfaces, lanes)
    pixels, columns = geometry.out_h * geometry.out_w, packed.shape[0] * 16
    if fused:  # a block's operand rows near the core across the column blocks
        block = max(2 * gemm_int8.MR, BLOCK_BYTES // (taps * surfaces * lanes) // 8 * 8)
    else:
        block = max(gemm_int8.MR, ACC_ELEMENTS // columns // gemm_int8.MR * gemm_int8.MR)
    block = min(bases.size, block)
    copy = (surfaces, channels, real, pad_value, geometry.pad_top, geometry.pad_left)
    sizes = (0 if direct else surfaces * source_h * source_w * lanes, pixels, out_channels, 0 if fused else block * columns)
    # a small layer keeps its own buffers (the thread's shared ones cost more to look up than
    # such a layer computes; as conv_pixels); their contents never outlive a run
    own = _buffers(*sizes) if sum(sizes) - pixels + pixels * out_channels <= OWN_BUFFER_ELEMENTS else None
    shape, padded_shape = (1, geometry.out_h, geometry.out_w), (surfaces, source_h, source_w, lanes // 4)
    # own buffers: their views made once, and the last feature's flat / word view kept (a step hands
    # in its own feature array every run: issue 20, fixed cost per task)
    views = None if own is None else (own[0], own[1], own[2].reshape(shape), own[3].reshape(-1, columns),
                                      None if direct else own[0].view(np.uint32).reshape(padded_shape))
    last = [None, None]

    def run(feature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if views is None:
            source, out, sums, acc = _buffers(*sizes, scratch)
            acc, window = acc.reshape(-1, columns), sums.reshape(shape)
            padded = None if direct else source.view(np.uint32).reshape(padded_shape)
        else:
            source, out, window, acc, padded = views
            sums = own[2]
        if feature is last[0]:
            flat = last[1]
        else:
            flat = feature.reshape(-1) if direct else feature.view(np.uint32)
            if views is not None:  # (a small layer's: a large feature is not held between runs)
                last[:] = [feature, flat]
        if direct:
            source = flat
        else:
            _copy_padded(flat, *copy, padded)
        _run_blocks(source, bases, segs, lanes // 4, packed, ones, acc, block, kernels, clip_truncate, round_mode,
                    fused, out, sums)
        if edges is not None:
            _add_edges(out, sums, *edges)
        return out, window

    parts = (bases, segs, packed, ones, (lanes // 4, block, kernels, clip_truncate, round_mode, int(fused)))
    run.gemm_parts, run.gemm_placed = _step_forms(parts, None if direct else (copy, padded_shape, edges), views, own,
                                                  sizes, shape, columns)
    return run


def _step_forms(parts: tuple, padding: tuple | None, views: tuple | None, own: tuple | None, sizes: tuple,
                shape: tuple, columns: int) -> tuple:
    """``prepare``'s ``run.gemm_parts`` (buffers of its own) and ``run.gemm_placed`` (none of its own), None
    each where it does not apply. ``placed(place)``: the parts with the buffers ``place(shape, dtype)`` gives
    (a one-call step's arena, kernels/int8_core_step.py ``placer``: every element written each run - the
    padded copy's too, ``_copy_padded`` writing each of its words), or None where they do not fit.
    ``parts``: ``_parts``' first five arguments; ``padding``: None where the windows lie inside the input
    (read in place), else (``_copy_padded``'s scalars, the padded copy's word shape, the edge terms or None)."""
    kernels = parts[4][2]
    if views is not None:
        return _parts(*parts, views, own, _padded_parts(padding, views[0], views[4], kernels)), None
    padded_size, pixels, out_channels, acc_size = sizes

    def placed(place) -> tuple | None:
        made = (place((pixels * out_channels + 16,), np.int32), place((pixels,), np.int64),
                place((max(acc_size, 1),), np.int32)) + (() if padding is None else (place((padded_size,), np.int8),))
        if any(part is None for part in made):
            return None
        results, sums, acc = made[:3]
        source = made[3] if padding is not None else None
        padded = None if padding is None else source.view(np.uint32).reshape(padding[1])
        held = (source, results[:pixels * out_channels].reshape(pixels, out_channels), sums, acc[:acc_size])
        return _parts(*parts, held[:2] + (sums.reshape(shape), held[3].reshape(-1, columns)), held,
                      _padded_parts(padding, source, padded, kernels))

    return None, placed


def _padded_parts(padding: tuple | None, source: np.ndarray, padded: np.ndarray, kernels: int) -> tuple | None:
    """What a step with windows reaching outside the input passes besides ``_run_blocks``' arguments: the
    padded copy (int8 ``source`` and its words ``padded``), the edge terms (``_add_edges``' three arrays,
    empty where there are none) and ``_copy_padded``'s scalars; None for windows inside the input."""
    if padding is None:
        return None
    copy, _, edges = padding
    if edges is None:
        edges = (np.zeros(0, np.int64), np.zeros((0, kernels), np.int64), np.zeros(0, np.int64))
    return (source, padded) + tuple(np.ascontiguousarray(part, np.int64) for part in edges) \
        + (tuple(int(value) for value in copy),)


def _parts(bases: np.ndarray, segs: np.ndarray, packed: np.ndarray, ones: np.ndarray, scalars: tuple, views: tuple,
           own: tuple, padded: tuple | None = None) -> tuple:
    """``run.gemm_parts`` of ``prepare`` (buffers of its own): what ``run`` passes ``_run_blocks`` and hands
    back, for a step running it in one compiled call with its feature copy (units/cna_core.py ``_fused_int8``,
    kernels/int8_core_step.py ``gemm_step``), and last ``_padded_parts``' (``gemm_padded_step``'s padded
    copy, edge terms and copy scalars; None for windows inside the input)."""
    return bases, segs, packed, ones, views[3], views[1], own[2], views[2], scalars, padded


def _operand_rows(geometry: ConvGeometry, direct: bool, height: int, width: int, c2: int, surfaces: int,
                  lanes: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """Where the operand rows lie: the atoms themselves (``direct``) or their padded copy
    ([surfaces][Hp][Wp][lanes]): its height and width, the runs (one per tap and surface, byte
    offsets) and each output pixel's first byte (padded to a multiple of MR with row 0's)."""
    source_h, source_w, pitch = (height, width, c2) if direct else (geometry.padded_h, geometry.padded_w, lanes)
    taps_y, taps_x = np.divmod(np.arange(geometry.kernel_h * geometry.kernel_w), geometry.kernel_w)
    tap_offsets = (taps_y * geometry.dilation_y * source_w + taps_x * geometry.dilation_x) * pitch
    segs = (tap_offsets[:, None] + np.arange(surfaces) * (source_h * source_w * pitch)).reshape(-1).astype(np.int64)
    pixels = geometry.out_h * geometry.out_w
    oy, ox = np.divmod(np.arange(pixels), geometry.out_w)
    bases = np.zeros(-(-pixels // gemm_int8.MR) * gemm_int8.MR, np.int64)
    bases[:pixels] = (oy * geometry.stride_y * source_w + ox * geometry.stride_x) * pitch
    return source_h, source_w, segs, bases


def _buffers(padded: int, pixels: int, out_channels: int, acc: int,
             make=lambda name, size, dtype: np.empty(size, dtype)):
    """A run's padded copy of the atoms (int8), outputs (16 elements more: the fused products'
    last vector may spill past them), window sums and int32 sums block."""
    return (make("int8 padded", padded, np.int8),
            make("results", pixels * out_channels + 16, np.int32)[:pixels * out_channels].reshape(pixels, out_channels),
            make("window sums", pixels, np.int64), make("int32 sums", acc, np.int32))


@njit(cache=True)
def _run_blocks(source, bases, segs, quads, packed, ones, acc, block, kernels, clip_truncate, mode, fused, out, sums):
    # the products a block of rows at a time (its operand rows, or its int32 sums and their CORE
    # pass, stay near the core): one compiled call per run
    pixels = out.shape[0]
    for first in range(0, pixels, block):
        count = min(block, pixels - first)
        rows = -(-count // gemm_int8.MR) * gemm_int8.MR
        if fused:
            gemm_int8.products_core(source, bases[first:first + rows], segs, quads, packed, kernels,
                                    out[first:first + count], sums[first:first + count], ones)
        else:
            gemm_int8.products(source, bases[first:first + rows], segs, quads, packed, acc[:rows])
            _core_int(acc, kernels, clip_truncate, mode, out[first:first + count], sums[first:first + count])
