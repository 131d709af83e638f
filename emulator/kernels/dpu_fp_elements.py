"""One element of the fp path's X stages (BS, BN) and EW stage (NUMERICS.md 4.6), and the layout of
their int64 settings vectors: shared by the chain's passes (``dpu_fp_chain``) and its fused loop
(``dpu_fp_fused``), so that both run the same per-element code (kernels.dpu's ``_x_stage_fp`` and
``_ew_fp`` elements: every operation one fp32 rounding, then ReLU / ReLUX)."""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm

# settings of an X stage (BS, BN) and of the EW stage, as int64 vectors
X_ALGO, X_ALU_ON, X_MUL_ON, X_PRELU, X_MUL_FIRST, X_RELU, X_RELUX, X_COUNT = range(8)
E_ON, E_OP_ON, E_OP_TYPE, E_ALGO, E_PRELU, E_RELU, E_RELUX, E_COUNT = range(8)


@njit(cache=True, inline="always")
def x_value(value, algo, alu_on, mul_on, prelu, mul_first, relu_on, relux_on, relux_value, alu, mul):
    """kernels.dpu._x_stage_fp's element (PReLU tests the stage's input)."""
    scaled = mul_on and not (prelu and value >= 0)
    if mul_first and scaled:
        value = nm.nan_first(value, np.float32(value * mul))
    if alu_on:
        value = nm.alu_float(algo, value, alu)
    if not mul_first and scaled:
        value = nm.nan_first(value, np.float32(value * mul))
    return nm.relu_float(value, relu_on, relux_on, relux_value)


@njit(cache=True, inline="always")
def ew_value(value, other, op_on, op_type, algo, prelu, relu_on, relux_on, relux_value):
    """kernels.dpu._ew_fp's element."""
    if op_on:
        if op_type == nm.EW_OP_ALU:
            value = nm.alu_float(algo, value, other)
        elif not (prelu and value >= 0):
            value = nm.nan_first(value, np.float32(value * other))
    return nm.relu_float(value, relu_on, relux_on, relux_value)
