"""The fp path's BS -> BN -> EW stages in one pass (issue 20).

NUMERICS.md 4.6: with PROC_PRECISION fp16 the DPU runs BS (ALU then MUL), BN (MUL then ALU) and
EW in fp32, every operation one fp32 rounding, then ReLU / ReLUX per stage. ``kernels.dpu`` runs
each stage as its own pass over the cube (``bs_stage_fp``, ``bn_stage_fp``, ``ew_stage_fp``);
:class:`FloatChain` records the stages a task enables and runs them element by element in one
pass, the same per-element operations in the same order (``numerics.alu_float`` /
``relu_float``), so the bits are the same: one cube read and written instead of one per stage,
and one kernel call per task instead of one per stage (tests/emulator/test_dpu_fp_chain.py
checks it against a numpy model of 4.6 and against the per-stage kernels).

The LUT (NUMERICS.md 5.1) sits between BN and EW: ``result(lut)`` and ``fp16_step`` run it in the
same pass (``lut_fp``'s per-element loop on this kernel's stack copy of the tables). The pass goes
piece by piece (NUMERICS.md 37): each piece of up to ``CHUNK`` elements through every stage while
it is in the L1 cache, a piece as long as the X operands and the EW operand's stepping allow -
channels whose BS / BN operands are the same bits run as one piece, so the 40-pixel planes of
ppocr_rec's attention run like one plane (tests/emulator/test_dpu_fp_chain_pieces.py); maps whose
planes are at most half a piece go whole planes to a piece (NUMERICS.md 53). ``fp16_step`` runs the
stage forms the compiled networks use through ``dpu_fp_fused.fused_chain`` instead (one loop, every
element through every stage in registers; the same element code, so the same bits).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import lut_fp
from npuemu.emulator.kernels.canonical_nan import canonical_nans
from npuemu.emulator.kernels.dpu import EwConfig, XStageConfig
from npuemu.emulator.kernels.dpu_convert import widen_channels, widen_rows
from npuemu.emulator.kernels.dpu_fp_elements import (E_ALGO, E_COUNT, E_ON, E_OP_ON, E_OP_TYPE, E_PRELU, E_RELU,
                                                     E_RELUX, X_ALGO, X_ALU_ON, X_COUNT, X_MUL_FIRST, X_MUL_ON,
                                                     X_PRELU, X_RELU, X_RELUX)
from npuemu.emulator.kernels.dpu_fp_elements import ew_value as _ew_value
from npuemu.emulator.kernels.dpu_fp_elements import x_value as _x_value
from npuemu.emulator.kernels.dpu_fp_atoms import PIECE, ew_atoms
from npuemu.emulator.kernels.dpu_fp_fused import form_of, fused_chain, operand_form
from npuemu.emulator.kernels.fp16_atoms import planes_to_fp16_atoms, store_channels
from npuemu.emulator.kernels.lut_fp import PACKED, _fill_table, _lut_values, _stack_table
from npuemu.emulator.memo import Memo
from npuemu.isa.errors import EmulationError


@njit(cache=True)
def _x_pass(source, target, algo, alu_on, mul_on, prelu, mul_first, relu_on, relux_on, relux_value, alu, mul):
    # _x_value over one channel's pixels; the settings are loop-invariant scalars here, which lets
    # LLVM specialise the loop
    for i in range(source.shape[0]):
        target[i] = _x_value(source[i], algo, alu_on, mul_on, prelu, mul_first, relu_on, relux_on, relux_value,
                             alu, mul)


@njit(cache=True)
def _x_planes(source, target, plane, algo, alu_on, mul_on, prelu, mul_first, relu_on, relux_on, relux_value,
              alus, muls):
    # _x_pass over whole planes of small maps, channel c's operands alus[c] / muls[c], in one call:
    # a call per 49-pixel plane cost ~40 ns of the ~90 a plane took (MobileNetV2's 7x7 maps)
    for c in range(alus.shape[0]):
        alu, mul, base = alus[c], muls[c], c * plane
        for i in range(plane):
            target[base + i] = _x_value(source[base + i], algo, alu_on, mul_on, prelu, mul_first, relu_on,
                                        relux_on, relux_value, alu, mul)


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


#: elements a piece of the cube runs through every stage while it is in the L1 cache (two scratch
#: pieces of 8 KiB; the LUT's tables take another ~4 KiB of the kernel's stack)
CHUNK = 2048
# the int64 geometry vector of ``FloatChain.settings``' layout
G_CHUNK, G_PLANE, G_WIDTH, G_SC, G_SY, G_SX, G_ALIGN, G_COUNT = range(8)


@njit(cache=True, inline="always")
def _operand_at(start, geometry):
    # the EW operand's element (its broadcast strides) at the cube's flat element ``start``
    plane, width = geometry[G_PLANE], geometry[G_WIDTH]
    channel = start // plane
    y, x = (start - channel * plane) // width, (start - channel * plane) % width
    return channel * geometry[G_SC] + y * geometry[G_SY] + x * geometry[G_SX]


@njit(cache=True, inline="always")
def _tail(table, pointer, lut_params, lut, e_params, e_relux, geometry, others, scratch, results, source, start, stop,
          done, passes, lut_in, stages):
    # the LUT and EW of the piece [start, stop) whose X stages' result is ``source`` (``done`` passes
    # run); inlined into _run_chain, whose stack holds ``table``
    count, chunk = stop - start, geometry[G_CHUNK]
    if lut:
        if stages == 0:
            scratch[lut_in * chunk:][:count] = source
        target = results[start:stop] if done == passes - 1 else scratch[done % 2 * chunk:][:count]
        # (its input a fresh slice, not ``source``: LLVM vectorises the loop's gathers only then)
        _lut_values(table, pointer, lut_params, scratch[lut_in * chunk:][:count], target)
        source = target
    if e_params[E_ON] != 0:
        align, step, p, at = geometry[G_ALIGN], geometry[G_SX], e_params, start
        while at < stop:  # (in G_ALIGN units, in which the operand steps by G_SX)
            end = min(stop, (at // align + 1) * align)
            first = _operand_at(at, geometry)
            _ew_pass(source[at - start:end - start], results[at:end], others[first:first + (end - at if step else 1)],
                     step, p[E_OP_ON] != 0, p[E_OP_TYPE], p[E_ALGO], p[E_PRELU] != 0, p[E_RELU] != 0,
                     p[E_RELUX] != 0, e_relux)
            at = end
    elif passes == 0:
        results[start:stop] = source


@njit(cache=True)
def _run_chain(data, x_params, x_relux, alu, mul, stages, e_params, e_relux, layout, operand, packed, lut_params,
               out, work):
    """The X stages, the LUT (``packed`` non-empty: ``lut_fp.prepared``'s tables and parameters) and
    EW, piece by piece: each piece of at most G_CHUNK elements goes through every stage before the
    next (every element the same operations in the same order: the same bits as stage after stage
    over the cube). ``layout``: (channel runs sharing their X operands, geometry): a piece stays in
    one run, EW in one G_ALIGN unit, in which its operand steps by G_SX (NUMERICS.md 37). Planes of
    at most half a piece go whole planes to a piece, each X stage in one call (NUMERICS.md 53).
    ``data``, ``operand``, ``out``: the [C][H][W] arrays flat; ``x_params``: the [2][X_COUNT]
    settings flat; ``alu``, ``mul``: the [2][C] operands flat (a reshape in a kernel is a helper
    call, 10-40 ns, and a small task's call made ~10); ``work``: float32, at least 2 x G_CHUNK
    elements, the two scratch pieces (the caller's: a 16 KiB ``np.empty`` here cost ~0.3 us a call)."""
    pointer = _stack_table()  # (the LUT's tables on this kernel's own stack: lut_fp._stack_table)
    table = carray(pointer, (PACKED,))
    lut = packed.size != 0
    if lut:
        _fill_table(table, packed)
    segments, geometry = layout
    chunk, plane, align = geometry[G_CHUNK], geometry[G_PLANE], geometry[G_ALIGN]
    sources, results, others, channels = data, out, operand, segments[segments.size - 1]
    passes = stages + (1 if lut else 0) + (1 if e_params[E_ON] != 0 else 0)
    # the passes alternate between two scratch pieces, the last one into the result: a pass in
    # place fails LLVM's overlap check and runs unvectorised (~10x slower)
    scratch = work[:2 * chunk]
    lut_in = (stages + 1) % 2  # the scratch piece the LUT reads (the last X stage's, else a copy)
    small, k, start = 2 * plane <= chunk, 0, 0
    while start < channels * plane:
        c0 = start // plane
        while segments[k + 1] <= c0:
            k += 1
        if small:  # (whole planes; in one call of _x_pass when they share their operands)
            c1 = min(c0 + chunk // plane, channels)
            stop, flat = c1 * plane, segments[k + 1] >= c1
        else:
            c1, flat = c0 + 1, True
            stop = min(start + chunk, segments[k + 1] * plane, (start // align + 1) * align)
        source, count = sources[start:stop], stop - start
        for s in range(stages):
            target = results[start:stop] if s == passes - 1 else scratch[s % 2 * chunk:][:count]
            p, at = x_params[s * X_COUNT:(s + 1) * X_COUNT], s * channels
            settings = (p[X_ALGO], p[X_ALU_ON] != 0, p[X_MUL_ON] != 0, p[X_PRELU] != 0, p[X_MUL_FIRST] != 0,
                        p[X_RELU] != 0, p[X_RELUX] != 0, x_relux[s])
            if flat:
                _x_pass(source, target, *settings, alu[at + segments[k]], mul[at + segments[k]])
            else:
                _x_planes(source, target, plane, *settings, alu[at + c0:at + c1], mul[at + c0:at + c1])
            source = target
        _tail(table, pointer, lut_params, lut, e_params, e_relux, geometry, others, scratch, results, source,
              start, stop, stages, passes, lut_in, stages)
        start = stop


# fp16_step's int64 vector (``pack_step``): the X stage count, the chain's form in dpu_fp_fused.FORMS when
# it runs fused (-1: the passes of _run_chain), whether it runs from atoms to atoms (dpu_fp_atoms), the X and
# EW settings, the geometry,
# the cube's and the EW operand's shapes, then blocks - the run bounds (their count first), three
# reads and the store (each: row count, four fields, the row offsets)
P_STAGES, P_FUSED, P_ATOMS, P_X = 0, 1, 2, 3
P_E = P_X + 2 * X_COUNT
P_GEOMETRY = P_E + E_COUNT
P_SHAPES = P_GEOMETRY + G_COUNT
P_RUNS = P_SHAPES + 6
_FIELDS = 5
#: ``fp16_step``'s ``work`` holds the chain's two scratch pieces, then the arrays it is handed empty
#: (result, cube, operand; each at most ``WORK_ARRAY`` elements)
WORK_ARRAY = 1 << 14
WORK = 2 * CHUNK + 3 * WORK_ARRAY
assert PIECE <= CHUNK  # (an atoms-to-atoms run takes its two pieces from the scratch pieces: dpu_fp_atoms)
#: an empty [C][H][W] array: ``fp16_step`` places this array in ``work``
IN_WORK = np.zeros((0, 0, 0), np.float32)


@njit(cache=True, inline="always")
def _read_block(region, target, plane, ints, cursor, table):
    # a widen_rows read of region's rows into target (float32 [C][H][W] flat, ``plane`` = H*W); the
    # next block's cursor
    count, height, lanes, first, step = ints[cursor], ints[cursor + 1], ints[cursor + 2], ints[cursor + 3], \
        ints[cursor + 4]
    if count and plane == 1:  # (1x1 planes: the channels flat, dpu_convert.widen_channels)
        widen_channels(region, ints[cursor + _FIELDS:cursor + _FIELDS + count], lanes, first, step, table,
                       target.view(np.uint32))
    elif count:
        planes = target.reshape(target.size // plane, plane).view(np.uint32)
        widen_rows(region, ints[cursor + _FIELDS:cursor + _FIELDS + count], height, lanes, first, step, table, planes)
    return cursor + _FIELDS + count


@njit(cache=True, inline="always")
def _placed(given, work, at, shape):
    # ``given`` flat, or (empty: IN_WORK) the [C][H][W] array of ``shape`` at work[at:], flat
    if given.size != 0 or shape[0] * shape[1] * shape[2] == 0:
        return given.reshape(-1)
    return work[at:at + shape[0] * shape[1] * shape[2]]


@njit(cache=True, inline="always")
def _atoms(main, written, ints, main_block, store_block, operand, channels, e_relux, work):
    # fp16_step's run from atoms to atoms (``pack_step``'s ``atoms``): the main block's rows (surface r //
    # its height) through EW into the store block's, the settings of dpu_fp_fused.fused_chain's ``e``
    count, height, targets = ints[main_block], ints[main_block + 1], store_block + _FIELDS
    p = ints[P_E:P_GEOMETRY]
    on = p[E_ON] != 0
    ew_atoms(main, ints[main_block + _FIELDS:main_block + _FIELDS + count], written,
             ints[targets:targets + ints[store_block]], height, ints[store_block + 4] * ints[store_block + 1],
             ints[store_block + 1], channels, operand, ints[P_FUSED], (on and p[E_RELU] != 0, on and p[E_RELUX] != 0,
                                                                      e_relux), work)


@njit(cache=True)
def fp16_step(cube, operand, out, main, other, second, written, ints, floats, table, packed, lut_params, work):
    """One fp16 DPU task's run in one call (issue 20, units/dpu_plan_fp.py): the reads, the chain
    (with the LUT) and the fp16 store - the kernels the separate calls ran, in the same order on
    the same arrays. Everything a task holds from run to run is in ``ints`` and ``floats``
    (``pack_step``): a call unboxes 13 flat arguments instead of ~30 arrays in nested tuples (a
    16-element task's call 3.3 -> 1.8 us).

    Reads (``dpu_convert.widen_rows`` with ``table``, ``fp16.widening_table``; regions as uint16,
    each skipped when it has no rows): ``main``'s rows into ``cube`` (the MRDMA), ``other``'s and
    ``second``'s into ``operand`` (the ERDMA operand, or a split operand's two sources); then
    ``FloatChain.settings`` from ``cube`` into ``out`` (float32 [C][H][W]) with the LUT between BN
    and EW (``packed`` non-empty: ``lut_fp.prepared``'s tables and ``lut_params``); then the store
    of ``out``'s planes into ``written``'s atom rows (``fp16_atoms.planes_to_fp16_atoms``) when it
    has rows. ``work`` (float32, ``WORK`` elements): the chain's scratch pieces, and ``out``, ``cube``
    and ``operand`` where they are handed empty (``IN_WORK``; the shapes ``pack_step`` was given): one
    working buffer that small tasks share stays in the cache (NUMERICS.md, section on the fp chain's
    working buffer)."""
    shapes, base = ints[P_SHAPES:P_RUNS], 2 * CHUNK
    scratch_out = out.size == 0  # (``out`` handed empty: in ``work``, which nobody reads after the call)
    out = _placed(out, work, base, shapes[:3])
    cube = _placed(cube, work, base + WORK_ARRAY, shapes[:3])
    operand = _placed(operand, work, base + 2 * WORK_ARRAY, shapes[3:])
    cursor = P_RUNS + 1 + ints[P_RUNS]
    runs, geometry = ints[P_RUNS + 1:cursor], ints[P_GEOMETRY:P_SHAPES]
    channels, plane = runs[runs.size - 1], geometry[G_PLANE]
    main_block = cursor
    if ints[P_ATOMS]:  # (the main rows go straight into the store's: _atoms)
        cursor += _FIELDS + ints[cursor]
    else:
        cursor = _read_block(main, cube, plane, ints, cursor, table)
    # (the operand's plane: its H*W, or 1 for a per-channel operand)
    cursor = _read_block(other, operand, operand.size // channels, ints, cursor, table)
    cursor = _read_block(second, operand, operand.size // channels, ints, cursor, table)
    if ints[P_ATOMS]:
        _atoms(main, written, ints, main_block, cursor, operand, channels, floats[2], work)
        return
    count = ints[cursor]
    # (no stage, no LUT, a store and ``out`` in ``work``: the cube itself is stored - the chain's copy of it
    # into ``out`` cost ~0.1 us of a 128-element task's ~0.4)
    through = count != 0 and scratch_out and ints[P_STAGES] == 0 and packed.size == 0 and ints[P_E + E_ON] == 0
    done = through or ints[P_FUSED] >= 0 and fused_chain(cube, out, channels, plane, ints[P_X:P_E], floats[0:2],
                                              floats[3:3 + 2 * channels], floats[3 + 2 * channels:],
                                              ints[P_E:P_GEOMETRY], floats[2], ints[P_FUSED],
                                              operand.size == cube.size, packed, lut_params, operand)
    if not done:
        _run_chain(cube, ints[P_X:P_E], floats[0:2], floats[3:3 + 2 * channels], floats[3 + 2 * channels:],
                   ints[P_STAGES], ints[P_E:P_GEOMETRY], floats[2], (runs, geometry), operand, packed, lut_params, out,
                   work)
    c2, planes, height, width = ints[cursor + 1], ints[cursor + 2], ints[cursor + 3], ints[cursor + 4]
    result = cube if through else out
    if count and height * width == 1:  # (1x1 planes: the channels flat, fp16_atoms.store_channels)
        store_channels(result[:planes].view(np.uint32), c2, ints[cursor + _FIELDS:cursor + _FIELDS + count], written)
    elif count:
        stored = result[:planes * height * width].reshape(planes, height, width).view(np.uint32)
        planes_to_fp16_atoms(stored, c2, ints[cursor + _FIELDS:cursor + _FIELDS + count], written)


def pack_step(settings: tuple, reads: list, store: tuple | None, shapes: tuple = (0,) * 6,
              lut: bool = False, atoms: bool = False) -> tuple:
    """``fp16_step``'s (ints, floats) of a ``FloatChain.settings`` tuple, three reads (each None or
    (row offsets, height, lanes, first surface, surface step)), the store (None or (row offsets,
    C2, channels, height, width)) and ``shapes``: the cube's and the EW operand's (C, H, W), for the
    arrays handed empty (``IN_WORK``) and for ``dpu_fp_fused.form_of``, with ``lut`` (the LUT on): the
    chains it takes run fused (none without ``shapes``); ``atoms``: the step runs from the main read's
    rows into the store's (``dpu_fp_atoms.ew_atoms``; the caller's checks: units/dpu_plan_fp.py)."""
    x_params, x_relux, alu, mul, stages, e_params, e_relux, (runs, geometry) = settings
    fused = form_of(x_params, stages, e_params, lut, operand_form(shapes[:3], shapes[3:]), shapes[1] * shapes[2],
                    tiny=True) if any(shapes) else -1
    blocks = [[stages, fused, int(atoms)], x_params.reshape(-1), e_params, geometry, shapes, [runs.size], runs]
    for block in list(reads) + [store]:
        offsets, fields = (np.zeros(0, np.int64), (1,) * (_FIELDS - 1)) if block is None else (block[0], block[1:])
        blocks += [[offsets.size, *fields], offsets]
    ints = np.concatenate([np.asarray(block, np.int64).reshape(-1) for block in blocks])
    floats = np.concatenate([x_relux, [e_relux], np.ascontiguousarray(alu).reshape(-1),
                             np.ascontiguousarray(mul).reshape(-1)]).astype(np.float32)
    return ints, floats


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
#: ``fp16_step``'s ``lut`` when the LUT is off (no tables)
NO_LUT = (np.zeros(0, np.float32), np.zeros(nm.LUTP_COUNT, np.int64))


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

    def result(self, lut: tuple | None = None, chunk: int = CHUNK) -> np.ndarray:
        """float32 [C][H][W]: the recorded stages applied (the input itself when none are and it holds no
        NaN), every NaN the canonical 0x7FC00000 (the DPU's stores, NUMERICS.md 37: an fp32 output takes
        these values as they are, the fp16 / bf16 conversions canonicalise again); ``lut``
        (a ``LutConfig`` and the LE and LO tables): the LUT on the fp path (NUMERICS.md 5.1) between
        BN and EW (``lut_fp.lut_stage_fp``'s bits) in the same pass; ``chunk``: the piece size."""
        if not self._x and self._ew is None and lut is None:
            # (the input itself, unless it holds a NaN: NaNs leave the DPU canonical, below)
            if not np.isnan(self._data).any():
                return self._data
            out = np.array(self._data)
            canonical_nans(out.reshape(-1))
            return out
        out = np.empty_like(self._data)
        x_params, x_relux, alu, mul, stages, e_params, e_relux, layout = self.settings(chunk)
        tables = NO_LUT if lut is None else lut_fp.prepared(*lut)
        _run_chain(self._data.reshape(-1), x_params.reshape(-1), x_relux, alu.reshape(-1), mul.reshape(-1), stages,
                   e_params, e_relux, layout, self._operand.reshape(-1), tables[0], tables[1], out.reshape(-1),
                   np.empty(2 * chunk, np.float32))
        canonical_nans(out.reshape(-1))  # (every NaN the canonical NaN: the fp32 outputs' rule, NUMERICS.md 37)
        return out

    def settings(self, chunk: int = CHUNK) -> tuple:
        """The recorded stages as ``_run_chain``'s settings arguments: (X settings, X ReLUX values,
        ALU operands [2][C], MUL operands [2][C], X stage count, EW settings, EW ReLUX value, layout),
        the layout for this chain's cube and EW operand shapes, pieces of at most ``chunk`` elements."""
        x_params, x_relux = _X_SETTINGS(tuple(self._x))
        operands = np.empty((2, 2, self._data.shape[0]), np.float32)  # [stage][ALU, MUL][C]
        for s, (alu, mul) in enumerate(self._operands):
            operands[s, 0], operands[s, 1] = alu, mul  # one value broadcast, or one per channel
        e_params, e_relux = self._ew if self._ew is not None else _NO_EW
        layout = (_runs(operands[:len(self._x)]), _geometry(self._data.shape, self._operand.shape, chunk))
        alu, mul = np.ascontiguousarray(operands[:, 0]), np.ascontiguousarray(operands[:, 1])
        return x_params, x_relux, alu, mul, len(self._x), e_params, e_relux, layout


def _runs(operands: np.ndarray) -> np.ndarray:
    """int64 channel bounds of the runs of channels whose X stage operands (float32 [stages][2][C])
    have the same bits (-0.0 is not 0.0): a piece of the chain takes one run's operands."""
    channels = operands.shape[-1]
    bits = operands.view(np.uint32).reshape(-1, channels)
    change = np.flatnonzero(np.any(bits[:, 1:] != bits[:, :-1], axis=0)) + 1
    return np.concatenate(([0], change, [channels])).astype(np.int64)


def _geometry(shape: tuple, operand_shape: tuple, chunk: int) -> np.ndarray:
    """``_run_chain``'s geometry: the piece size, plane and row sizes, the EW operand's element strides
    over the cube (0 along a broadcast axis; along an axis of size 1 the stride that continues the
    next one) and G_ALIGN, the unit a piece stays in for the operand to step by G_SX: a row, a
    plane, or the cube."""
    channels, height, width = shape
    oc, oh, ow = operand_shape
    sc, sy, sx = (oh * ow if oc > 1 else 0), (ow if oh > 1 else 0), (1 if ow > 1 else 0)
    # (1x1 planes: the next element is the next channel, so x steps as the channels do - a per-pixel or
    # per-channel operand then steps by 1 over the whole cube, not one EW call an element: silero-vad's
    # 128x1x1 LSTM adds, 3.0 -> 0.6 us)
    sx = (sy if height > 1 else sc) if width == 1 else sx
    sy = width * sx if height == 1 else sy
    sc = height * width * sx if channels == 1 else sc
    plane = max(height * width, 1)
    align = width if sy != width * sx else plane if sc != plane * sx else max(channels * plane, 1)
    geometry = np.zeros(G_COUNT, np.int64)
    geometry[[G_CHUNK, G_PLANE, G_WIDTH, G_SC, G_SY, G_SX, G_ALIGN]] = chunk, plane, max(width, 1), sc, sy, sx, align
    return geometry
