"""DPU stages on [C][H][W] arrays: BS, BN, EW, OUT_CVT (the LUT is in ``lut.py``).

Each integer stage reads int32 values and writes int32 values, applying the per-element
formulas of ``npuemu.emulator.numerics`` (NUMERICS.md section 4). Stage settings arrive as
small frozen dataclasses holding decoded register fields; per-channel operands (BRDMA/NRDMA
blobs, or a register value repeated) as int32 [C] arrays; the EW operand as an int32 array
[C][H][W], [C][1][1] or [1][1][1] (per pixel, per channel, per tensor).

The fp16 pipeline runs the same stages in fp32 (``*_fp`` functions) and converts to fp16 with
round-to-nearest-even at the output (NUMERICS.md 7).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.fp16 import fp32_to_fp16
from npuemu.isa.errors import EmulationError

_OUTPUT_RANGES = {
    np.dtype(np.int8): (nm.INT8_MIN, nm.INT8_MAX),
    np.dtype(np.int16): (nm.INT16_MIN, nm.INT16_MAX),
    np.dtype(np.int32): (nm.INT32_MIN, nm.INT32_MAX),
}


@dataclass(frozen=True)
class XStageConfig:
    """BS or BN stage (BS_CFG/BN_CFG, *_MUL_CFG, DATA_FORMAT *_NEG shifts, BS_OW_CFG)."""

    alu_enable: bool = False  # not ALU_BYPASS
    alu_algo: int = nm.ALU_ADD
    mul_enable: bool = False  # not MUL_BYPASS
    shift_positive: int = 0  # *_MUL_SHIFT_VALUE
    shift_negative: int = 0  # DATA_FORMAT *_MUL_SHIFT_VALUE_NEG
    prelu: bool = False  # MUL_PRELU: the multiplier scales negative values only
    relu: bool = False  # not RELU_BYPASS
    relux: bool = False  # RELUX_EN
    relux_value: int = 0  # *_RELUX_CMP_VALUE
    cpend_enable: bool = False  # BS only: not BS_OW_CFG.OD_BYPASS

    def __post_init__(self) -> None:
        _check_algo(self.alu_algo)


@dataclass(frozen=True)
class EwConfig:
    """EW stage (EW_CFG, EW_CVT_OFFSET/SCALE_VALUE, DATA_FORMAT EW_TRUNCATE_NEG)."""

    cvt_enable: bool = False  # not OP_CVT_BYPASS
    cvt_offset: int = 0
    cvt_scale: int = 1
    cvt_shift: int = 0
    cvt_round: int = nm.ROUND_HALF_EVEN  # from EW_CFG.CVT_ROUND via numerics.out_cvt_round_mode
    op_enable: bool = False  # not OP_BYPASS
    op_type: int = nm.EW_OP_ALU
    alu_algo: int = nm.ALU_ADD
    truncate_positive: int = 0  # EW_TRUNCATE (MUL only)
    truncate_negative: int = 0  # DATA_FORMAT EW_TRUNCATE_NEG
    prelu: bool = False  # EW_MUL_PRELU
    relu: bool = False
    relux: bool = False
    relux_value: int = 0

    def __post_init__(self) -> None:
        _check_algo(self.alu_algo)
        if self.op_type not in (nm.EW_OP_ALU, nm.EW_OP_MUL):
            raise EmulationError(f"EW OP_TYPE {self.op_type} is neither 0 (ALU) nor 1 (MUL)")


@dataclass(frozen=True)
class OutCvtConfig:
    """OUT_CVT_OFFSET / SCALE / SHIFT; ``round_mode`` from CVT_ROUND via out_cvt_round_mode."""

    scale: int = 1  # signed 16-bit
    shift: int = 0
    offset: int = 0
    round_mode: int = nm.ROUND_HALF_EVEN


def _check_algo(algo: int) -> None:
    if not 0 <= algo < len(nm.ALU_ALGO_NAMES):
        raise EmulationError(f"ALU_ALGO {algo} is not one of 0..8 ({', '.join(nm.ALU_ALGO_NAMES)})")


def _check_cube(data: np.ndarray, dtype: type, name: str) -> np.ndarray:
    if data.ndim != 3:
        raise EmulationError(f"{name} must be [C][H][W], got shape {data.shape}")
    return np.ascontiguousarray(data, dtype=dtype)


def _per_channel(values: np.ndarray | int | float | None, channels: int, dtype: type,
                 name: str) -> np.ndarray:
    array = np.asarray(0 if values is None else values, dtype=dtype)
    if array.ndim == 0:
        return np.full(channels, array, dtype)
    if array.shape != (channels,):
        raise EmulationError(
            f"{name} must hold one value per channel ({channels}), got {array.shape}")
    return np.ascontiguousarray(array)


def _planes(cube: np.ndarray) -> np.ndarray:
    """[C][H][W] -> a [C][H*W] view."""
    return cube.reshape(cube.shape[0], -1)


def _broadcast_operand(operand: np.ndarray, shape: tuple, dtype: type) -> np.ndarray:
    operand = np.asarray(operand, dtype=dtype)
    if operand.ndim != 3 or any(o not in (1, s) for o, s in zip(operand.shape, shape)):
        raise EmulationError(f"EW operand of shape {operand.shape} does not broadcast to {shape}")
    return np.ascontiguousarray(operand)


# ---------------------------------------------------------------------------------------------
# Numba loops
# ---------------------------------------------------------------------------------------------
# The loops below take [C][H*W] (or flat) views made by numpy: Numba vectorises plain 1-D and
# 2-D loops far better than loops over its own reshape of a 3-D array.
@njit(cache=True)
def _bs_int(data, window_sum, kernels_per_group, alu, cpend, mul, shift_positive, shift_negative,
            alu_algo, alu_on, cpend_on, mul_on, prelu, relu_on, relux_on, relux_value, out):
    channels, pixels = data.shape
    for c in range(channels):
        group = c // kernels_per_group
        alu_c, cpend_c, mul_c = alu[c], cpend[c], mul[c]
        for p in range(pixels):
            total = window_sum[group, p] if cpend_on else 0
            out[c, p] = nm.bs_value(
                data[c, p], total, alu_c, cpend_c, mul_c, shift_positive, shift_negative,
                alu_algo, alu_on, cpend_on, mul_on, prelu, relu_on, relux_on, relux_value)


@njit(cache=True)
def _bn_int(data, alu, mul, shift_positive, shift_negative, alu_algo, alu_on, mul_on, prelu,
            relu_on, relux_on, relux_value, out):
    channels, pixels = data.shape
    for c in range(channels):
        alu_c, mul_c = alu[c], mul[c]
        for p in range(pixels):
            out[c, p] = nm.bn_value(data[c, p], alu_c, mul_c, shift_positive, shift_negative,
                                    alu_algo, alu_on, mul_on, prelu, relu_on, relux_on,
                                    relux_value)


@njit(cache=True)
def _ew_int(data, operand, cvt_on, cvt_offset, cvt_scale, cvt_shift, cvt_mode, op_on, op_type,
            alu_algo, truncate_positive, truncate_negative, prelu, relu_on, relux_on,
            relux_value, out):
    channels, height, width = data.shape
    per_c, per_y, per_x = operand.shape[0] > 1, operand.shape[1] > 1, operand.shape[2] > 1
    for c in range(channels):
        for y in range(height):
            for x in range(width):
                raw = operand[c if per_c else 0, y if per_y else 0, x if per_x else 0]
                converted = nm.ew_operand_value(raw, cvt_on, cvt_offset, cvt_scale, cvt_shift,
                                                cvt_mode)
                out[c, y, x] = nm.ew_value(
                    data[c, y, x], converted, op_on, op_type, alu_algo, truncate_positive,
                    truncate_negative, prelu, relu_on, relux_on, relux_value)


@njit(cache=True)
def _out_cvt_int(data, scale, shift, offset, mode, low, high, out):
    for i in range(data.shape[0]):
        out[i] = nm.out_cvt_value(data[i], scale, shift, offset, mode, low, high)


@njit(cache=True)
def _x_stage_fp(data, alu, mul, alu_algo, alu_on, mul_on, prelu, mul_first, relu_on, relux_on,
                relux_value, out):
    channels, height, width = data.shape
    for c in range(channels):
        for y in range(height):
            for x in range(width):
                value = data[c, y, x]
                scaled = mul_on and not (prelu and value >= 0)
                if mul_first and scaled:
                    value = np.float32(value * mul[c])
                if alu_on:
                    value = nm.alu_float(alu_algo, value, alu[c])
                if not mul_first and scaled:
                    value = np.float32(value * mul[c])
                out[c, y, x] = nm.relu_float(value, relu_on, relux_on, relux_value)


@njit(cache=True)
def _ew_fp(data, operand, op_on, op_type, alu_algo, prelu, relu_on, relux_on, relux_value, out):
    channels, height, width = data.shape
    per_c, per_y, per_x = operand.shape[0] > 1, operand.shape[1] > 1, operand.shape[2] > 1
    for c in range(channels):
        for y in range(height):
            for x in range(width):
                value = data[c, y, x]
                other = operand[c if per_c else 0, y if per_y else 0, x if per_x else 0]
                if op_on:
                    if op_type == nm.EW_OP_ALU:
                        value = nm.alu_float(alu_algo, value, other)
                    elif not (prelu and value >= 0):
                        value = np.float32(value * other)
                out[c, y, x] = nm.relu_float(value, relu_on, relux_on, relux_value)


# ---------------------------------------------------------------------------------------------
# Stage entry points
# ---------------------------------------------------------------------------------------------
def bs_stage(data: np.ndarray, config: XStageConfig, alu=None, mul=None, cpend=None,
             window_sum: np.ndarray | None = None) -> np.ndarray:
    """BS stage on int32 [C][H][W]. ``window_sum`` (int64 [G][H][W], from
    ``mac.window_sums``) is needed when CPEND is enabled; channel c uses group c*G//C."""
    data = _check_cube(data, np.int32, "BS input")
    channels = data.shape[0]
    if config.cpend_enable:
        if window_sum is None or window_sum.ndim != 3 or window_sum.shape[1:] != data.shape[1:] \
                or channels % window_sum.shape[0]:
            raise EmulationError(
                f"CPEND needs window sums [G][H][W] matching {data.shape}, got "
                f"{None if window_sum is None else window_sum.shape}")
        sums = np.ascontiguousarray(window_sum, dtype=np.int64)
    else:
        sums = np.zeros((1, 1, 1), np.int64)
    out = np.empty_like(data)
    kernels_per_group = channels // sums.shape[0] if config.cpend_enable else channels
    _bs_int(_planes(data), _planes(sums), kernels_per_group,
            _per_channel(alu, channels, np.int32, "BS ALU operand"),
            _per_channel(cpend, channels, np.int32, "CPEND operand"),
            _per_channel(mul, channels, np.int32, "BS MUL operand"),
            config.shift_positive, config.shift_negative, config.alu_algo, config.alu_enable,
            config.cpend_enable, config.mul_enable, config.prelu, config.relu, config.relux,
            config.relux_value, _planes(out))
    return out


def bn_stage(data: np.ndarray, config: XStageConfig, alu=None, mul=None) -> np.ndarray:
    """BN stage on int32 [C][H][W] (MUL, then ALU, then the shift; NUMERICS.md 4.2)."""
    data = _check_cube(data, np.int32, "BN input")
    channels = data.shape[0]
    out = np.empty_like(data)
    _bn_int(_planes(data), _per_channel(alu, channels, np.int32, "BN ALU operand"),
            _per_channel(mul, channels, np.int32, "BN MUL operand"), config.shift_positive,
            config.shift_negative, config.alu_algo, config.alu_enable, config.mul_enable,
            config.prelu, config.relu, config.relux, config.relux_value, _planes(out))
    return out


def ew_stage(data: np.ndarray, config: EwConfig, operand: np.ndarray) -> np.ndarray:
    """EW stage on int32 [C][H][W] with a raw (unconverted) operand."""
    data = _check_cube(data, np.int32, "EW input")
    out = np.empty_like(data)
    _ew_int(data, _broadcast_operand(operand, data.shape, np.int32), config.cvt_enable,
            config.cvt_offset, config.cvt_scale, config.cvt_shift, config.cvt_round,
            config.op_enable, config.op_type, config.alu_algo, config.truncate_positive,
            config.truncate_negative, config.prelu, config.relu, config.relux,
            config.relux_value, out)
    return out


def out_cvt(data: np.ndarray, config: OutCvtConfig, out_dtype: type = np.int8) -> np.ndarray:
    """OUT_CVT and saturation to the output precision (int8, int16 or int32)."""
    dtype = np.dtype(out_dtype)
    if dtype not in _OUTPUT_RANGES:
        raise EmulationError(f"integer OUT_CVT writes int8, int16 or int32, not {dtype}")
    data = np.ascontiguousarray(data, dtype=np.int32)
    low, high = _OUTPUT_RANGES[dtype]
    out = np.empty(data.shape, dtype)
    _out_cvt_int(data.reshape(-1), config.scale, config.shift, config.offset, config.round_mode,
                 low, high, out.reshape(-1))
    return out


def bs_stage_fp(data: np.ndarray, config: XStageConfig, alu=None, mul=None) -> np.ndarray:
    """BS in fp32 (fp16 pipeline): ALU then MUL, no shift, no CPEND."""
    return _x_stage_fp_entry(data, config, alu, mul, mul_first=False, name="BS")


def bn_stage_fp(data: np.ndarray, config: XStageConfig, alu=None, mul=None) -> np.ndarray:
    """BN in fp32 (fp16 pipeline): MUL then ALU, no shift."""
    return _x_stage_fp_entry(data, config, alu, mul, mul_first=True, name="BN")


def _x_stage_fp_entry(data, config, alu, mul, mul_first, name):
    data = _check_cube(data, np.float32, f"{name} input")
    channels = data.shape[0]
    out = np.empty_like(data)
    _x_stage_fp(data, _per_channel(alu, channels, np.float32, f"{name} ALU operand"),
                _per_channel(1.0 if mul is None else mul, channels, np.float32,
                             f"{name} MUL operand"),
                config.alu_algo, config.alu_enable, config.mul_enable, config.prelu, mul_first,
                config.relu, config.relux, np.float32(config.relux_value), out)
    return out


def ew_stage_fp(data: np.ndarray, config: EwConfig, operand: np.ndarray) -> np.ndarray:
    """EW in fp32 (the operand converter is not used on the fp path)."""
    data = _check_cube(data, np.float32, "EW input")
    out = np.empty_like(data)
    _ew_fp(data, _broadcast_operand(operand, data.shape, np.float32), config.op_enable,
           config.op_type, config.alu_algo, config.prelu, config.relu, config.relux,
           np.float32(config.relux_value), out)
    return out


def out_cvt_fp16(data: np.ndarray) -> np.ndarray:
    """fp16 output of the fp32 pipeline: round to nearest even (OUT_CVT scale/shift/offset are
    not applied on the fp path, NUMERICS.md 7)."""
    return fp32_to_fp16(data)
