"""The fp path's BS -> BN -> EW stages in one pass (issue 20).

NUMERICS.md 4.6: with PROC_PRECISION fp16 the DPU runs BS (ALU then MUL), BN (MUL then ALU) and
EW in fp32, every operation one fp32 rounding, then ReLU / ReLUX per stage. ``kernels.dpu`` runs
each stage as its own pass over the cube (``bs_stage_fp``, ``bn_stage_fp``, ``ew_stage_fp``);
:class:`FloatChain` records the stages a task enables and runs them element by element in one
pass, the same per-element operations in the same order (``numerics.alu_float`` /
``relu_float``), so the bits are the same: one cube read and written instead of one per stage,
and one kernel call per task instead of one per stage (tests/emulator/test_dpu_fp_chain.py
checks it against a numpy model of 4.6 and against the per-stage kernels).

The LUT (NUMERICS.md 5.1) sits between BN and EW: a caller with the LUT on takes ``result()``
after BN, runs the LUT, and starts a new chain for EW.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.dpu import EwConfig, XStageConfig
from npuemu.emulator.kernels.dpu_convert import widen_rows
from npuemu.emulator.kernels.fp16_atoms import planes_to_fp16_atoms
from npuemu.emulator.memo import Memo
from npuemu.isa.errors import EmulationError

# settings of an X stage (BS, BN) and of the EW stage, as int64 vectors
X_ALGO, X_ALU_ON, X_MUL_ON, X_PRELU, X_MUL_FIRST, X_RELU, X_RELUX, X_COUNT = range(8)
E_ON, E_OP_ON, E_OP_TYPE, E_ALGO, E_PRELU, E_RELU, E_RELUX, E_COUNT = range(8)


@njit(cache=True)
def _x_pass(source, target, algo, alu_on, mul_on, prelu, mul_first, relu_on, relux_on, relux_value, alu, mul):
    # kernels.dpu._x_stage_fp's element over one channel's pixels (PReLU tests the stage's input);
    # the settings are loop-invariant scalars here, which lets LLVM specialise the loop
    for i in range(source.shape[0]):
        value = source[i]
        scaled = mul_on and not (prelu and value >= 0)
        if mul_first and scaled:
            value = np.float32(value * mul)
        if alu_on:
            value = nm.alu_float(algo, value, alu)
        if not mul_first and scaled:
            value = np.float32(value * mul)
        target[i] = nm.relu_float(value, relu_on, relux_on, relux_value)


@njit(cache=True, inline="always")
def _ew_value(value, other, op_on, op_type, algo, prelu, relu_on, relux_on, relux_value):
    # kernels.dpu._ew_fp's element
    if op_on:
        if op_type == nm.EW_OP_ALU:
            value = nm.alu_float(algo, value, other)
        elif not (prelu and value >= 0):
            value = np.float32(value * other)
    return nm.relu_float(value, relu_on, relux_on, relux_value)


@njit(cache=True)
def _ew_pass(source, target, others, step, op_on, op_type, algo, prelu, relu_on, relux_on, relux_value):
    # kernels.dpu._ew_fp's element over one row or plane: the operand steps 1 (per pixel) or 0 (one
    # value: read once, so that the loop vectorises)
    if step == 0:
        other = others[0]
        for i in range(source.shape[0]):
            target[i] = _ew_value(source[i], other, op_on, op_type, algo, prelu, relu_on, relux_on, relux_value)
    else:
        for i in range(source.shape[0]):
            target[i] = _ew_value(source[i], others[i], op_on, op_type, algo, prelu, relu_on, relux_on,
                                  relux_value)


@njit(cache=True)
def _run_chain(data, x_params, x_relux, x_alu, x_mul, stages, e_params, e_relux, operand, out):
    channels, height, width = data.shape
    planes, results = data.reshape(channels, height * width), out.reshape(channels, height * width)
    per_c, per_y, per_x = operand.shape[0] > 1, operand.shape[1] > 1, operand.shape[2] > 1
    # the passes alternate between the result plane and a scratch plane, the last one into the result:
    # a pass in place fails LLVM's overlap check and runs unvectorised (~10x slower)
    passes = stages + (1 if e_params[E_ON] != 0 else 0)
    scratch = np.empty(height * width if passes > 1 else 0, np.float32)
    for c in range(channels):
        source = planes[c]
        for s in range(stages):
            target = results[c] if (passes - 1 - s) % 2 == 0 else scratch
            p = x_params[s]
            _x_pass(source, target, p[X_ALGO], p[X_ALU_ON] != 0, p[X_MUL_ON] != 0, p[X_PRELU] != 0,
                    p[X_MUL_FIRST] != 0, p[X_RELU] != 0, p[X_RELUX] != 0, x_relux[s], x_alu[s, c], x_mul[s, c])
            source = target
        if e_params[E_ON] != 0:
            target = results[c]
            p = e_params
            settings = (p[E_OP_ON] != 0, p[E_OP_TYPE], p[E_ALGO], p[E_PRELU] != 0, p[E_RELU] != 0, p[E_RELUX] != 0,
                        e_relux)
            cube = operand[c if per_c else 0]
            if per_y and per_x:  # a whole operand plane
                _ew_pass(source, target, cube.reshape(height * width), 1, *settings)
            elif not per_y and not per_x:  # one value
                _ew_pass(source, target, cube[0], 0, *settings)
            else:  # a value per row or a row of values: row by row
                for y in range(height):
                    row = slice(y * width, (y + 1) * width)
                    _ew_pass(source[row], target[row], cube[y if per_y else 0], 1 if per_x else 0, *settings)


@njit(cache=True)
def chain_into(data, x_params, x_relux, alu, mul, stages, e_params, e_relux, operand, out):
    """``_run_chain`` (``FloatChain.settings``), or a copy of ``data`` into ``out`` when no stage is on."""
    if stages == 0 and e_params[E_ON] == 0:
        out[:] = data
    else:
        _run_chain(data, x_params, x_relux, alu, mul, stages, e_params, e_relux, operand, out)


@njit(cache=True)
def _read(read, table):
    data, offsets, height, lanes, first, step, target = read
    if offsets.size:
        widen_rows(data, offsets, height, lanes, first, step, table, target)


@njit(cache=True)
def fp16_step(cube, reads, table, operand, settings, out, store):
    """One fp16 DPU task's run in one call (issue 20, units/dpu_plan_fp.py): the reads, the chain
    and the fp16 store - the kernels the separate calls ran, in the same order on the same arrays.

    ``reads``: three ``dpu_convert.widen_rows`` reads (region as uint16, row offsets, height, lanes,
    first surface, surface step, target uint32 [C][H*W]) with ``table`` (``fp16.widening_table``),
    each skipped when it has no rows: the MRDMA's into ``cube``, the ERDMA operand's into
    ``operand`` (one source, or a split operand's two); ``settings``: ``FloatChain.settings``, run
    from ``cube`` into ``out`` (all float32 [C][H][W]); ``store``: (planes uint32 [C][H][W] of
    ``out``, C2, row offsets, the region as uint16) for ``fp16_atoms.planes_to_fp16_atoms``,
    skipped when it has no rows."""
    _read(reads[0], table)
    _read(reads[1], table)
    _read(reads[2], table)
    x_params, x_relux, alu, mul, stages, e_params, e_relux = settings
    chain_into(cube, x_params, x_relux, alu, mul, stages, e_params, e_relux, operand, out)
    planes, c2, offsets, region = store
    if offsets.size:
        planes_to_fp16_atoms(planes, c2, offsets, region)


def _check_per_channel(values, channels: int, name: str) -> None:
    if values is not None and np.ndim(values) and np.shape(values) != (channels,):
        raise EmulationError(f"{name} must hold one value per channel ({channels}), got {np.shape(values)}")


def _bits(value: float) -> int:
    # a ReLUX value as its fp32 bits: the memo keys must tell -0.0 from 0.0 (equal as floats)
    return int(np.float32(value).view(np.uint32))


def _x_settings(stages: tuple) -> tuple[np.ndarray, np.ndarray]:
    """int64 [2][X_COUNT] settings and float32 [2] ReLUX values of up to two X stages."""
    params, relux = np.zeros((2, X_COUNT), np.int64), np.zeros(2, np.uint32)
    for s, (settings, bits) in enumerate(stages):
        params[s], relux[s] = settings, bits
    return params, relux.view(np.float32)


def _ew_settings(settings: tuple, bits: int) -> tuple[np.ndarray, np.float32]:
    return np.array(settings, np.int64), np.uint32(bits).view(np.float32)


#: settings arrays by value (ReLUX by its bits): a network's tasks repeat a handful of stage
#: settings (the arrays are never written)
_X_SETTINGS: Memo[tuple] = Memo(_x_settings, limit=256)
_EW_SETTINGS: Memo[tuple] = Memo(_ew_settings, limit=256)
_NO_OPERAND = np.zeros((1, 1, 1), np.float32)
_NO_EW = (np.zeros(E_COUNT, np.int64), np.float32(0))


class FloatChain:
    """The fp stages of one task on a float32 [C][H][W] cube, recorded in order (``x_stage``:
    BS, then BN; ``ew``: last) and run together by ``result``."""

    __slots__ = ("_data", "_x", "_operands", "_ew", "_operand")

    def __init__(self, data: np.ndarray) -> None:
        if data.ndim != 3:
            raise EmulationError(f"fp stage input must be [C][H][W], got shape {data.shape}")
        self._data = np.ascontiguousarray(data, dtype=np.float32)
        self._x: list[tuple] = []  # per X stage: (settings, ReLUX value)
        self._operands: list[tuple] = []  # per X stage: (ALU, MUL) as given (None, one value or [C])
        self._ew: tuple | None = None
        self._operand = _NO_OPERAND

    def x_stage(self, config: XStageConfig, alu=None, mul=None, mul_first: bool = False) -> None:
        """BS (``mul_first`` False: ALU then MUL) or BN (True: MUL then ALU) in fp32, no shift; ``alu``
        and ``mul`` one value or one per channel (None: 0 and 1)."""
        if self._ew is not None or len(self._x) == 2:
            raise EmulationError("fp stages: BS and BN run before EW, at most one each")
        channels, name = self._data.shape[0], "BN" if mul_first else "BS"
        _check_per_channel(alu, channels, f"{name} ALU operand")
        _check_per_channel(mul, channels, f"{name} MUL operand")
        self._x.append(((config.alu_algo, config.alu_enable, config.mul_enable, config.prelu, mul_first,
                         config.relu, config.relux), _bits(config.relux_value)))
        self._operands.append((0 if alu is None else alu, 1 if mul is None else mul))

    def ew(self, config: EwConfig, operand: np.ndarray) -> None:
        """EW in fp32 with an operand broadcast over [C][H][W] (one value, per channel or per pixel)."""
        if self._ew is not None:
            raise EmulationError("fp stages: one EW stage per task")
        operand = np.asarray(operand, dtype=np.float32)
        shape = self._data.shape
        if operand.ndim != 3 or any(o not in (1, s) for o, s in zip(operand.shape, shape)):
            raise EmulationError(f"EW operand of shape {operand.shape} does not broadcast to {shape}")
        self._ew = _EW_SETTINGS((1, config.op_enable, config.op_type, config.alu_algo, config.prelu, config.relu,
                                 config.relux), _bits(config.relux_value))
        self._operand = np.ascontiguousarray(operand)

    def result(self) -> np.ndarray:
        """float32 [C][H][W]: the recorded stages applied (the input itself when none are)."""
        return self.runner()(self._data, self._operand)

    def runner(self):
        """``run(data, operand)``: ``result()`` of the recorded stages on a C-contiguous float32 cube of
        this chain's shape and a contiguous float32 EW operand of the recorded one's shape, the settings
        worked out once (issue 20: a task program's fp16 DPU step, units/dpu_plan_fp.py, runs it per run)."""
        if not self._x and self._ew is None:
            return _unchanged
        x_params, x_relux, alu, mul, stages, e_params, e_relux = self.settings()

        def run(data: np.ndarray, operand: np.ndarray) -> np.ndarray:
            out = np.empty_like(data)
            _run_chain(data, x_params, x_relux, alu, mul, stages, e_params, e_relux, operand, out)
            return out
        return run

    def settings(self) -> tuple:
        """The recorded stages as ``_run_chain``'s settings arguments: (X settings, X ReLUX values,
        ALU operands [2][C], MUL operands [2][C], X stage count, EW settings, EW ReLUX value)."""
        x_params, x_relux = _X_SETTINGS(tuple(self._x))
        operands = np.empty((2, 2, self._data.shape[0]), np.float32)  # [stage][ALU, MUL][C]
        for s, (alu, mul) in enumerate(self._operands):
            operands[s, 0], operands[s, 1] = alu, mul  # one value broadcast, or one per channel
        e_params, e_relux = self._ew if self._ew is not None else _NO_EW
        return x_params, x_relux, operands[:, 0], operands[:, 1], len(self._x), e_params, e_relux


def _unchanged(data: np.ndarray, operand: np.ndarray) -> np.ndarray:
    return data
