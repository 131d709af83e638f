"""``dpu_pixel.planned_to_atoms`` for one task's fixed shapes (issue 20: a core's task
programs, emulator/task_plan.py): the checks, the row offsets and the block size worked out
once, so a run is the window sums' layout and maximum (data: they choose the kernel), the EW
operand's conversion, a fresh tile and the kernel - the same calls on the same values as
``planned_to_atoms`` makes, so the same atoms.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_pixel as dp


def prepare_planned_to_atoms(plan: dp.StagePlan, pixels: int, width: int, target: np.ndarray,
                             offsets: np.ndarray, c2: int, surfaces: int) -> Callable | None:
    """``run(data, window_sum, ew_operand)`` doing ``planned_to_atoms(plan, data, width, target,
    offsets, c2, surfaces, window_sum, ew_operand)`` for ``data`` int32 [1][pixels][channels]
    (C-contiguous; other data goes through ``planned_to_atoms`` itself); None where
    ``planned_to_atoms`` would refuse these shapes (it then raises its own error)."""
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

    return run


def _operand(ew_operand: np.ndarray, channels: int, pixels: int) -> np.ndarray:
    """The EW operand as ``planned_to_atoms`` hands it to the kernels."""
    operand = np.asarray(ew_operand)
    if operand.shape == (1, 1, 1):
        operand = np.broadcast_to(operand, (1, 1, channels))
    dp._channel_blocks(operand, channels, 1 if operand.shape[1] == 1 else pixels, "EW operand")
    return dp._int32_pixels(operand, channels, "dpu operand")
