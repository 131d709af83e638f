"""DPU stages on [C][H][W] arrays: BS, BN, EW, OUT_CVT (the LUT is in ``lut.py``).

The integer stages run fused (``int_stages``: BS -> BN -> EW -> OUT_CVT, each optional, in one
pass over the cube), applying the per-element formulas of ``npuemu.emulator.numerics``
(NUMERICS.md section 4); ``bs_stage`` etc. run one stage alone. Stage settings arrive as
small frozen dataclasses holding decoded register fields; per-channel operands (BRDMA/NRDMA
blobs, or a register value repeated) as int32 [C] arrays; the EW operand as an int32 array
[C][H][W], [C][1][1] or [1][1][1] (per pixel, per channel, per tensor).

The fp16 pipeline runs the same stages in fp32 (``*_fp`` functions) and converts to fp16 with
round-to-nearest-even at the output (NUMERICS.md 7).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, types
from numba.extending import overload

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.fp16 import fp32_to_fp16_canonical
from npuemu.emulator.memo import Memo
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
# Integer stage parameters travel as small int64 vectors (fewer kernel arguments, one layout).
(XP_ALGO, XP_ALU_ON, XP_CPEND_ON, XP_MUL_ON, XP_SHIFT_POS, XP_SHIFT_NEG, XP_PRELU, XP_RELU,
 XP_RELUX, XP_RELUX_VALUE, XP_COUNT) = range(11)
(EP_CVT_ON, EP_CVT_OFFSET, EP_CVT_SCALE, EP_CVT_SHIFT, EP_CVT_MODE, EP_OP_ON, EP_OP_TYPE, EP_ALGO,
 EP_TRUNC_POS, EP_TRUNC_NEG, EP_PRELU, EP_RELU, EP_RELUX, EP_RELUX_VALUE, EP_COUNT) = range(15)
(CP_SCALE, CP_SHIFT, CP_OFFSET, CP_MODE, CP_LOW, CP_HIGH, CP_COUNT) = range(7)


#: Pixels per block of the stage loops: the int64 block (16 KiB) stays in L1 between stages.
BLOCK = 2048


def _at(values, index):
    """``values[index]`` of a per-element operand array, or the operand itself (a per-channel
    scalar): one stage loop serves the channel-major pass and the pixel-major one."""
    raise NotImplementedError  # only called from Numba code (see the overload below)


@overload(_at, inline="always")
def _at_overload(values, index):
    if isinstance(values, types.Array):
        return lambda values, index: values[index]
    return lambda values, index: values


@njit(cache=True)
def _bs_block(block, sums, bs, alu, cpend, mul):
    """BS over ``block``; ``alu``, ``cpend``, ``mul``: one value for the block, or one per element."""
    algo, alu_on, cpend_on, mul_on = bs[XP_ALGO], bs[XP_ALU_ON] != 0, bs[XP_CPEND_ON] != 0, \
        bs[XP_MUL_ON] != 0
    pos, neg, prelu = bs[XP_SHIFT_POS], bs[XP_SHIFT_NEG], bs[XP_PRELU] != 0
    relu, relux, relux_value = bs[XP_RELU] != 0, bs[XP_RELUX] != 0, bs[XP_RELUX_VALUE]
    # Two copies of one loop: LLVM vectorises the second only because it knows there that no
    # integer division (which cannot be speculated into a select) is ever executed.
    if algo == nm.ALU_DIV:
        for p in range(block.shape[0]):
            block[p] = nm.bs_value(block[p], sums[p], _at(alu, p), _at(cpend, p), _at(mul, p), pos,
                                   neg, algo, alu_on, cpend_on, mul_on, prelu, relu, relux, relux_value)
        return
    for p in range(block.shape[0]):
        block[p] = nm.bs_value(block[p], sums[p], _at(alu, p), _at(cpend, p), _at(mul, p), pos, neg,
                               algo, alu_on, cpend_on, mul_on, prelu, relu, relux, relux_value)


@njit(cache=True)
def _bn_block(block, bn, alu, mul):
    """BN over ``block``; ``alu``, ``mul``: one value for the block, or one per element."""
    algo, alu_on, mul_on = bn[XP_ALGO], bn[XP_ALU_ON] != 0, bn[XP_MUL_ON] != 0
    pos, neg, prelu = bn[XP_SHIFT_POS], bn[XP_SHIFT_NEG], bn[XP_PRELU] != 0
    relu, relux, relux_value = bn[XP_RELU] != 0, bn[XP_RELUX] != 0, bn[XP_RELUX_VALUE]
    if algo == nm.ALU_DIV:  # see _bs_block
        for p in range(block.shape[0]):
            block[p] = nm.bn_value(block[p], _at(alu, p), _at(mul, p), pos, neg, algo, alu_on, mul_on,
                                   prelu, relu, relux, relux_value)
        return
    for p in range(block.shape[0]):
        block[p] = nm.bn_value(block[p], _at(alu, p), _at(mul, p), pos, neg, algo, alu_on, mul_on,
                               prelu, relu, relux, relux_value)


@njit(cache=True)
def _ew_block(block, operand, ew):
    cvt_on, offset, scale = ew[EP_CVT_ON] != 0, ew[EP_CVT_OFFSET], ew[EP_CVT_SCALE]
    shift, mode, op_on, op_type = ew[EP_CVT_SHIFT], ew[EP_CVT_MODE], ew[EP_OP_ON] != 0, \
        ew[EP_OP_TYPE]
    algo, pos, neg, prelu = ew[EP_ALGO], ew[EP_TRUNC_POS], ew[EP_TRUNC_NEG], ew[EP_PRELU] != 0
    relu, relux, relux_value = ew[EP_RELU] != 0, ew[EP_RELUX] != 0, ew[EP_RELUX_VALUE]
    if algo == nm.ALU_DIV:  # see _bs_block
        for p in range(block.shape[0]):
            other = nm.ew_operand_value(operand[p], cvt_on, offset, scale, shift, mode)
            block[p] = nm.ew_value(block[p], other, op_on, op_type, algo, pos, neg, prelu, relu,
                                   relux, relux_value)
        return
    for p in range(block.shape[0]):
        other = nm.ew_operand_value(operand[p], cvt_on, offset, scale, shift, mode)
        block[p] = nm.ew_value(block[p], other, op_on, op_type, algo, pos, neg, prelu, relu,
                               relux, relux_value)


@njit(cache=True)
def _out_cvt_flat(block, out, scale, shift, offset, mode, low, high):
    for i in range(block.shape[0]):
        out[i] = nm.out_cvt_value(block[i], scale, shift, offset, mode, low, high)


@njit(cache=True)
def _stages_int(data, sums, kernels_per_group, bs, bs_operands, bn, bn_operands, operand, ew,
                cvt, out):
    """BS -> BN -> EW -> OUT_CVT over [C][H*W]; a stage whose settings are None is bypassed
    (Numba compiles each combination of stages on its own, without the others' code).

    Each channel goes through in blocks: one read of the input, one write of the output, the
    stages in between on an int64 block in L1, one simple loop per stage (simple loops are
    what LLVM vectorises; writing NC1HWC2 atoms directly, with strided stores, was 3x slower).
    ``bs_operands`` is int64 [3][C] (ALU, CPEND, MUL), ``bn_operands`` [2][C] (ALU, MUL),
    ``sums`` [G][H*W] (one zero row without CPEND), ``operand`` [C or 1][H*W]; the settings
    vectors follow the XP_/EP_/CP_ layouts above."""
    channels, pixels = data.shape
    cpend_on = False
    if bs is not None:
        cpend_on = bs[XP_CPEND_ON] != 0
    scratch = np.empty(BLOCK, np.int64)
    for c in range(channels):
        sums_row = sums[c // kernels_per_group] if cpend_on else sums[0]
        operand_row = operand[c if operand.shape[0] > 1 else 0]
        for start in range(0, pixels, BLOCK):
            stop = min(start + BLOCK, pixels)
            block = scratch[:stop - start]
            source = data[c, start:stop]
            for p in range(block.shape[0]):
                block[p] = source[p]
            if bs is not None:
                _bs_block(block, sums_row[start:stop], bs, bs_operands[0, c], bs_operands[1, c],
                          bs_operands[2, c])
            if bn is not None:
                _bn_block(block, bn, bn_operands[0, c], bn_operands[1, c])
            if ew is not None:
                _ew_block(block, operand_row[start:stop], ew)
            target = out[c, start:stop]
            if cvt is not None:
                _out_cvt_flat(block, target, cvt[CP_SCALE], cvt[CP_SHIFT], cvt[CP_OFFSET], cvt[CP_MODE],
                              cvt[CP_LOW], cvt[CP_HIGH])
            else:
                for p in range(block.shape[0]):
                    target[p] = block[p]


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
                    value = nm.nan_first(value, np.float32(value * mul[c]))
                if alu_on:
                    value = nm.alu_float(alu_algo, value, alu[c])
                if not mul_first and scaled:
                    value = nm.nan_first(value, np.float32(value * mul[c]))
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
                        value = nm.nan_first(value, np.float32(value * other))
                out[c, y, x] = nm.relu_float(value, relu_on, relux_on, relux_value)


# ---------------------------------------------------------------------------------------------
# Stage entry points
# ---------------------------------------------------------------------------------------------
# Settings vectors are built once per (frozen, hashable) config: a network runs the same
# configs every inference. The memoised arrays are never written.
def _build_x_params(c: XStageConfig) -> np.ndarray:
    return np.array((c.alu_algo, c.alu_enable, c.cpend_enable, c.mul_enable, c.shift_positive,
                     c.shift_negative, c.prelu, c.relu, c.relux, c.relux_value), np.int64)  # XP_* order


def _build_ew_params(c: EwConfig) -> np.ndarray:
    return np.array((c.cvt_enable, c.cvt_offset, c.cvt_scale, c.cvt_shift, c.cvt_round, c.op_enable,
                     c.op_type, c.alu_algo, c.truncate_positive, c.truncate_negative, c.prelu, c.relu,
                     c.relux, c.relux_value), np.int64)  # EP_* order


def _operand_planes(operand: np.ndarray, shape: tuple) -> np.ndarray:
    """EW operand -> [C or 1][H*W], spatial broadcasts expanded: one loop shape (a per-pixel
    load) keeps the stage loop vectorisable; a loop-invariant operand variant was 3x slower."""
    operand = _broadcast_operand(operand, shape, np.int32)
    operand = np.broadcast_to(operand, (operand.shape[0],) + shape[1:])
    return np.ascontiguousarray(operand.reshape(operand.shape[0], -1))


def _build_cvt_params(cvt: OutCvtConfig, dtype: np.dtype) -> np.ndarray:
    return np.array((cvt.scale, cvt.shift, cvt.offset, cvt.round_mode) + _OUTPUT_RANGES[dtype], np.int64)  # CP_*


_x_params = Memo(_build_x_params)
_ew_params = Memo(_build_ew_params)
_cvt_params = Memo(_build_cvt_params)


class _OperandMatrices:
    """Per-channel operands as an int64 [n][C] matrix (one contiguous row per operand), built
    once per set of operands that cannot change: integers (register values, compared by
    value), None, and read-only arrays (BRDMA blobs from the memory's derived cache, compared
    by identity)."""

    def __init__(self) -> None:
        # operands without arrays (BN, register-value BS), by value
        self._by_value: Memo[np.ndarray] = Memo()
        # with arrays: the (at most three) array operands or None by identity, then the other
        # operands, the channel and row counts
        self._by_array: Memo[np.ndarray] = Memo(identity=3)

    def get(self, channels: int, operands: tuple, columns: int) -> np.ndarray:
        arrays, scalars, by_array = [None, None, None], [None, None, None], False
        for index, (value, _) in enumerate(operands):  # one pass: sort and check the operands
            if isinstance(value, np.ndarray):
                if value.flags.writeable:
                    return self._build(channels, operands, columns)  # may change: not memoised
                arrays[index], by_array = value, True
            elif value is None or isinstance(value, (int, np.integer)):
                scalars[index] = value
            else:
                return self._build(channels, operands, columns)
        if by_array:
            memo, key = self._by_array, (*arrays, tuple(scalars), channels, columns)
        else:
            memo, key = self._by_value, (tuple(scalars), channels, columns)
        matrix = memo.get(*key)
        return matrix if matrix is not None else memo.put(self._build(channels, operands, columns), *key)

    @staticmethod
    def _build(channels: int, operands: tuple, columns: int) -> np.ndarray:
        matrix = np.zeros((columns, channels), np.int64)
        for column, (value, name) in enumerate(operands):
            matrix[column] = _per_channel(value, channels, np.int32, name)
        return matrix


_OPERAND_MATRICES = _OperandMatrices()
_zero_rows: dict[np.dtype, np.ndarray] = {}


def _zero_row(length: int, dtype: type) -> np.ndarray:
    """A [1][length] row of zeros, shared between calls and never written: the stage loops
    read the window sums and the EW operand unconditionally, and zeroing a fresh row each call
    cost about as much as the stages themselves. (Left writeable: a read-only array is another
    Numba type, which would double the kernel's compiled variants.)"""
    dtype = np.dtype(dtype)
    row = _zero_rows.get(dtype)
    if row is None or row.shape[1] < length:
        row = np.zeros((1, max(length, 1 << 16)), dtype)
        _zero_rows[dtype] = row
    return row[:, :max(length, 1)]


def int_stages(data: np.ndarray, *, bs: XStageConfig | None = None, bs_alu=None, bs_mul=None,
               bs_cpend=None, window_sum: np.ndarray | None = None,
               bn: XStageConfig | None = None, bn_alu=None, bn_mul=None,
               ew: EwConfig | None = None, ew_operand: np.ndarray | None = None,
               cvt: OutCvtConfig | None = None, out_dtype: type = np.int8) -> np.ndarray:
    """The integer DPU stages BS -> BN -> EW -> OUT_CVT on int32 [C][H][W] in one pass; a stage
    given no config is bypassed. Without OUT_CVT the result is int32, otherwise ``out_dtype``
    (int8, int16 or int32). ``window_sum`` (int64 or int32 [G][H][W], the CNA's window sums) is
    needed when BS has CPEND enabled; channel c uses group c*G//C. The EW operand is raw
    (unconverted), shaped [C][H][W] or broadcastable to it."""
    data = _check_cube(data, np.int32, "DPU input")
    channels, pixels = data.shape[0], data.shape[1] * data.shape[2]
    sums = _zero_row(pixels, np.int64)
    kernels_per_group = 1
    if bs is not None and bs.cpend_enable:
        if window_sum is None or window_sum.ndim != 3 or window_sum.shape[1:] != data.shape[1:] \
                or channels % window_sum.shape[0]:
            raise EmulationError(
                f"CPEND needs window sums [G][H][W] matching {data.shape}, got "
                f"{None if window_sum is None else window_sum.shape}")
        # int32 sums (depthwise) are read as they are: no widening copy of a full cube
        sums = _planes(np.ascontiguousarray(
            window_sum, dtype=window_sum.dtype if window_sum.dtype == np.int32 else np.int64))
        kernels_per_group = channels // window_sum.shape[0]
    bs_operands = _OPERAND_MATRICES.get(channels, () if bs is None else (
        (bs_alu, "BS ALU operand"), (bs_cpend, "CPEND operand"), (bs_mul, "BS MUL operand")), 3)
    bn_operands = _OPERAND_MATRICES.get(channels, () if bn is None else (
        (bn_alu, "BN ALU operand"), (bn_mul, "BN MUL operand")), 2)
    operand = _zero_row(pixels, np.int32)
    if ew is not None:
        if ew_operand is None:
            raise EmulationError("the EW stage needs an operand")
        operand = _operand_planes(ew_operand, data.shape)
    dtype = np.dtype(np.int32)
    if cvt is not None:
        dtype = np.dtype(out_dtype)
        if dtype not in _OUTPUT_RANGES:
            raise EmulationError(f"integer OUT_CVT writes int8, int16 or int32, not {dtype}")
    out = np.empty(data.shape, dtype)
    _stages_int(_planes(data), sums, kernels_per_group, None if bs is None else _x_params(bs),
                bs_operands, None if bn is None else _x_params(bn), bn_operands, operand,
                None if ew is None else _ew_params(ew), None if cvt is None else _cvt_params(cvt, dtype),
                _planes(out))
    return out


def bs_stage(data: np.ndarray, config: XStageConfig, alu=None, mul=None, cpend=None,
             window_sum: np.ndarray | None = None) -> np.ndarray:
    """BS stage alone on int32 [C][H][W] (see ``int_stages``)."""
    return int_stages(data, bs=config, bs_alu=alu, bs_mul=mul, bs_cpend=cpend,
                      window_sum=window_sum)


def bn_stage(data: np.ndarray, config: XStageConfig, alu=None, mul=None) -> np.ndarray:
    """BN stage alone on int32 [C][H][W] (MUL, then ALU, then the shift; NUMERICS.md 4.2)."""
    return int_stages(data, bn=config, bn_alu=alu, bn_mul=mul)


def ew_stage(data: np.ndarray, config: EwConfig, operand: np.ndarray) -> np.ndarray:
    """EW stage alone on int32 [C][H][W] with a raw (unconverted) operand."""
    return int_stages(data, ew=config, ew_operand=operand)


def out_cvt(data: np.ndarray, config: OutCvtConfig, out_dtype: type = np.int8) -> np.ndarray:
    """OUT_CVT and saturation to the output precision (int8, int16 or int32), any shape."""
    data = np.asarray(data)
    flat = np.ascontiguousarray(data, dtype=np.int32).reshape(1, 1, -1)
    return int_stages(flat, cvt=config, out_dtype=out_dtype).reshape(data.shape)


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
    not applied on the fp path, NUMERICS.md 7); every NaN the canonical 0x7E00 (default-NaN mode)."""
    return fp32_to_fp16_canonical(data)
