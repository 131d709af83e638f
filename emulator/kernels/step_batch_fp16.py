"""Runs of consecutive fp16 task steps as one compiled call (issue 20: fixed cost per task).

The fp16 counterpart of kernels/step_batch.py (its int8 ``run_ops``), a separate compiled entry so an
int8 model compiles none of the fp16 kinds: an fp16 task's composed step (units/cna_core.py ``_fused_run``'s
``then_into``: a CORE kernel of kernels/conv_fp16_step.py, then the DPU's dpu_fp_chain ``fp16_step``) or
a flying fp16 DPU step (``fp16_step`` alone) makes ~5 us of Python around its kernels a run (ppocr_cls
fp16: 92 such steps). A run of them is one ``run_fp16_ops`` call: each call's arguments written once into
a row of an int64 table, the views made again from addresses and dimensions (``numba.carray``, no copy),
the same kernels called on the same memory, in the same order as the steps one by one. An int8 build's
flying int -> fp16 conversion (units/dpu_plan_convert.py) and an fp16 step's int8 output (units/dpu_plan_fp.py)
are kinds too (kernels/convert_stores.py), so that they join the fp16 steps beside them (silero-vad int8: four
and three a run).

Arguments by kind (``_SPECS``, in the kernel's order): arrays "dtype:ndim" (C layout; address then
dimensions), "n" an integer, "f4" a float32 scalar (its bits), "u4" a uint32 scalar, "t11" a tuple of 11
integers. An array argument may instead be a thread buffer, ``("buffer", index, shape)``: the DPU's
working buffer (``WORK_BUFFER``: dpu_plan_fp's thread arena) or a large task's result / operand / cube
(``conv_pixels.working_buffer``), found as the call runs (their addresses are the thread's, and a
working buffer may grow): ``run_fp16_ops`` takes them as arguments, each at least the size its ops
need (``buffer_sizes``). Arguments off the spec make no op (the step then stays a step of its own).
None of the kinds refuses or raises: ``run_fp16_ops`` runs every op.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from npuemu.emulator.kernels import conv_fp16_step, convert_stores, dpu_fp_chain
from npuemu.emulator.kernels.fp16_atoms_ir import halves_native
from npuemu.emulator.kernels.step_batch import _pointer, fits_integer, place_array

#: op kinds: conv_fp16_step's depthwise / gemm / narrow / few steps, dpu_fp_chain.fp16_step, a place kept, an
#: int8 flying task's conversion to fp16 and an fp16 task's int8 output (convert_stores' ``convert_store`` and
#: ``int8_store``: an int8 build's float islands' inputs and outputs)
DEPTHWISE, GEMM, NARROW, FEW, DPU, NOTHING, CONVERT, TO_INT8, NARROW_HALVES = range(9)
#: the thread buffers (``run_fp16_ops``' last arguments, in this order)
WORK_BUFFER, RESULT_BUFFER, OPERAND_BUFFER, CUBE_BUFFER = range(4)
BUFFERS = 4

_FEATURE = "u1:1 i8:1 u1:2 u2:4 i8:1"  # (data, offsets, rows, atoms, settings)
_GEMM = f"{_FEATURE} u4 u4:3 u4:1 f4:1 {{packed}} i8:1 f4:2 f4:2 u2:1 i8:1 u2:1 i8:1 u4:1"
_SPECS = {
    DEPTHWISE: f"{_FEATURE} f4:3 t11 f4 f4:1 f4:1 f4:3 n n",
    GEMM: _GEMM.format(packed="f4:3"),
    NARROW: _GEMM.format(packed="f4:2"),
    NARROW_HALVES: _GEMM.format(packed="u2:2"),  # (conv_fp16_step.narrow_halves_step: the weights' binary16 bits)
    FEW: f"{_FEATURE} f4:4 u4 u4:3 u4:1 f4:3",
    DPU: "f4:3 f4:3 f4:3 u2:1 u2:1 u2:1 u2:1 i8:1 f4:1 u4:1 f4:1 i8:1 f4:1",
    # (BS and BN settings each an array or None, no EW stage: ``_convert``'s four forms)
    CONVERT: "i1:1 i8:1 n n ?i8:1 i8:2 ?i8:1 i8:2 i4:2 none n n b f4 b f4:2 u4:3 n i8:1 u2:1",
    TO_INT8: "f4:1 b i1:1 u1:3 n i8:1 u1:1",
}


def _parse(spec: str) -> tuple:
    """Per argument: (its kind - "array", "optional" (an array or None), "n", "f4", "u4", "t11", "b" (a bool),
    "none" (None) -, dtype, ndim, its first column)."""
    parsed, column = [], 1
    for item in spec.split():
        if ":" in item:
            dtype, ndim = item.lstrip("?").split(":")
            parsed.append(("optional" if item[0] == "?" else "array", np.dtype(dtype), int(ndim), column))
            column += 1 + int(ndim)
        else:
            parsed.append((item, None, 0, column))
            column += 11 if item == "t11" else 1
    return tuple(parsed)


_PARSED = {kind: _parse(spec) for kind, spec in _SPECS.items()}
#: table row width: the widest kind's
COLUMNS = max(parsed[-1][3] + (1 + parsed[-1][2] if parsed[-1][0] in ("array", "optional") else 1)
              for parsed in _PARSED.values())
#: each kind's argument columns (compile-time constants in the kernels below)
_DW, _GE, _NA, _FE, _DP, _CV, _TI, _NH = (tuple(item[3] for item in _PARSED[kind])
                                          for kind in (DEPTHWISE, GEMM, NARROW, FEW, DPU, CONVERT, TO_INT8, NARROW_HALVES))


def kinds() -> dict:
    """The kernel each kind runs (looked up as called: a kernel wrapped in its module makes no op); the
    conv_fp16_step kinds only where compiled code widens halves with F16C (``entry``)."""
    known = {dpu_fp_chain.fp16_step: DPU, convert_stores.convert_store: CONVERT, convert_stores.int8_store: TO_INT8}
    if halves_native():
        known.update({conv_fp16_step.depthwise_step: DEPTHWISE, conv_fp16_step.gemm_step: GEMM,
                      conv_fp16_step.narrow_step: NARROW, conv_fp16_step.few_step: FEW,
                      conv_fp16_step.narrow_halves_step: NARROW_HALVES})
    return known


def entry():
    """The compiled entry for this target: ``run_fp16_ops``, or ``run_fp16_dpu_ops`` where compiled code has
    no F16C (``fp16_atoms_ir.halves_native``). Why: conv_fp16_step's kernels widen halves with F16C's
    instructions in their IR; without F16C they are never prepared, and compiling them (as a call in
    ``run_fp16_ops`` would) fails at link time (LLVM: no ``__extendhfsf2``)."""
    return run_fp16_ops if halves_native() else run_fp16_dpu_ops


def nothing() -> np.ndarray:
    """A table row that does nothing (kind NOTHING)."""
    row = np.zeros(COLUMNS, np.int64)
    row[0] = NOTHING
    return row


def _array(row: np.ndarray, value, dtype: np.dtype, ndim: int, column: int) -> bool:
    """``value``'s address (or thread buffer, as minus its index + 1) and dimensions into ``row``."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "buffer":
        _, index, shape = value
        if not 0 <= index < BUFFERS or len(shape) != ndim or dtype != np.float32:
            return False
        row[column] = -index - 1
        row[column + 1:column + 1 + ndim] = shape
        return True
    return place_array(row, value, dtype, ndim, column)


def encoded(kind: int, arguments: tuple) -> np.ndarray | None:
    """A table row for op ``kind`` on ``arguments``, or None where one does not fit the spec."""
    parsed = _PARSED[kind]
    if len(arguments) != len(parsed):
        return None
    row = np.zeros(COLUMNS, np.int64)
    row[0] = kind
    for value, (form, dtype, ndim, column) in zip(arguments, parsed):
        if form == "array" or form == "optional" and value is not None:
            fits = _array(row, value, dtype, ndim, column)
        elif form in ("optional", "none"):  # (None: address 0)
            fits = value is None
        elif form == "b":
            fits = isinstance(value, (bool, np.bool_))
            row[column] = int(value) if fits else 0
        elif form == "n":
            fits = fits_integer(value)
            row[column] = int(value) if fits else 0
        elif form == "f4":
            fits = isinstance(value, np.float32)
            row[column] = int(np.array(value, np.float32).view(np.uint32)) if fits else 0
        elif form == "u4":
            fits = isinstance(value, np.uint32)
            row[column] = int(value) if fits else 0
        else:  # (t11)
            fits = isinstance(value, tuple) and len(value) == 11 and all(map(fits_integer, value))
            row[column:column + 11] = value if fits else 0
        if not fits:
            return None
    return row


def encoded_calls(calls: tuple) -> list | None:
    """The rows of ``calls`` ((kernel, arguments), or None: a place kept for a call to come), or None
    where one is no op kind's."""
    known, rows = kinds(), []
    for call in calls:
        kind = None if call is None else known.get(call[0])
        row = nothing() if call is None else None if kind is None else encoded(kind, call[1])
        if row is None:
            return None
        rows.append(row)
    return rows


def buffer_sizes(rows) -> tuple:
    """The elements each thread buffer must have for ``rows`` (0: none of them uses it)."""
    sizes = [0] * BUFFERS
    for row in rows:
        if row[0] == NOTHING:
            continue
        for form, _, ndim, column in _PARSED[int(row[0])]:
            if form == "array" and row[column] < 0:
                index = -int(row[column]) - 1
                sizes[index] = max(sizes[index], int(np.prod(row[column + 1:column + 1 + ndim])))
    return tuple(sizes)


@intrinsic
def _float32(typingctx, bits):
    """The float32 whose bits are the low 32 of ``bits``."""
    if bits != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())
    return types.float32(bits), codegen


@njit(cache=True, inline="always")
def _at(r, c, b):
    # (an address, or a thread buffer's: minus its index + 1)
    a = r[c]
    return b[-a - 1] if a < 0 else a


@njit(cache=True)
def _v1(r, c, b, dtype):
    return carray(_pointer(_at(r, c, b), dtype), (r[c + 1],))


@njit(cache=True)
def _v2(r, c, b, dtype):
    return carray(_pointer(_at(r, c, b), dtype), (r[c + 1], r[c + 2]))


@njit(cache=True)
def _v3(r, c, b, dtype):
    return carray(_pointer(_at(r, c, b), dtype), (r[c + 1], r[c + 2], r[c + 3]))


@njit(cache=True)
def _v4(r, c, b, dtype):
    return carray(_pointer(_at(r, c, b), dtype), (r[c + 1], r[c + 2], r[c + 3], r[c + 4]))


@njit(cache=True)
def _t11(r, c):
    return (r[c], r[c + 1], r[c + 2], r[c + 3], r[c + 4], r[c + 5], r[c + 6], r[c + 7], r[c + 8], r[c + 9], r[c + 10])


@njit(cache=True)
def _depthwise(r, b):
    u1, u2, f4, i8, c = np.uint8, np.uint16, np.float32, np.int64, _DW
    conv_fp16_step.depthwise_step(
        _v1(r, c[0], b, u1), _v1(r, c[1], b, i8), _v2(r, c[2], b, u1), _v4(r, c[3], b, u2), _v1(r, c[4], b, i8),
        _v3(r, c[5], b, f4), _t11(r, c[6]), _float32(r[c[7]]), _v1(r, c[8], b, f4), _v1(r, c[9], b, f4),
        _v3(r, c[10], b, f4), r[c[11]], r[c[12]])


@njit(cache=True)
def _gemm(r, b, narrow):
    # (narrow: 0 gemm_step, 1 narrow_step, 2 narrow_halves_step)
    u1, u2, u4, f4, i8 = np.uint8, np.uint16, np.uint32, np.float32, np.int64
    c = _NH if narrow == 2 else _NA if narrow else _GE
    head = (_v1(r, c[0], b, u1), _v1(r, c[1], b, i8), _v2(r, c[2], b, u1), _v4(r, c[3], b, u2), _v1(r, c[4], b, i8),
            np.uint32(r[c[5]]), _v3(r, c[6], b, u4), _v1(r, c[7], b, u4), _v1(r, c[8], b, f4))
    tail = (_v1(r, c[10], b, i8), _v2(r, c[11], b, f4), _v2(r, c[12], b, f4), _v1(r, c[13], b, u2),
            _v1(r, c[14], b, i8), _v1(r, c[15], b, u2), _v1(r, c[16], b, i8), _v1(r, c[17], b, u4))
    if narrow == 2:
        conv_fp16_step.narrow_halves_step(*head, _v2(r, c[9], b, u2), *tail)
    elif narrow:
        conv_fp16_step.narrow_step(*head, _v2(r, c[9], b, f4), *tail)
    else:
        conv_fp16_step.gemm_step(*head, _v3(r, c[9], b, f4), *tail)


@njit(cache=True)
def _few(r, b):
    u1, u2, u4, f4, i8, c = np.uint8, np.uint16, np.uint32, np.float32, np.int64, _FE
    conv_fp16_step.few_step(
        _v1(r, c[0], b, u1), _v1(r, c[1], b, i8), _v2(r, c[2], b, u1), _v4(r, c[3], b, u2), _v1(r, c[4], b, i8),
        _v4(r, c[5], b, f4), np.uint32(r[c[6]]), _v3(r, c[7], b, u4), _v1(r, c[8], b, u4), _v3(r, c[9], b, f4))


@njit(cache=True)
def _dpu(r, b):
    u2, u4, f4, i8, c = np.uint16, np.uint32, np.float32, np.int64, _DP
    dpu_fp_chain.fp16_step(
        _v3(r, c[0], b, f4), _v3(r, c[1], b, f4), _v3(r, c[2], b, f4), _v1(r, c[3], b, u2), _v1(r, c[4], b, u2),
        _v1(r, c[5], b, u2), _v1(r, c[6], b, u2), _v1(r, c[7], b, i8), _v1(r, c[8], b, f4), _v1(r, c[9], b, u4),
        _v1(r, c[10], b, f4), _v1(r, c[11], b, i8), _v1(r, c[12], b, f4))


@njit(cache=True)
def _convert(r, b):
    i1, i4, i8, f4, c = np.int8, np.int32, np.int64, np.float32, _CV
    head = (_v1(r, c[0], b, i1), _v1(r, c[1], b, i8), r[c[2]], r[c[3]])
    bs_operands, bn_operands, operand = _v2(r, c[5], b, i8), _v2(r, c[7], b, i8), _v2(r, c[8], b, i4)
    tail = (np.int64(r[c[10]]), r[c[11]], r[c[12]] != 0, _float32(r[c[13]]), r[c[14]] != 0, _v2(r, c[15], b, f4),
            _v3(r, c[16], b, np.uint32), r[c[17]], _v1(r, c[18], b, i8), _v1(r, c[19], b, np.uint16))
    store = convert_stores.convert_store
    if r[c[4]] != 0 and r[c[6]] != 0:  # (BS and BN each an array, or None: an address 0)
        store(*head, _v1(r, c[4], b, i8), bs_operands, _v1(r, c[6], b, i8), bn_operands, operand, None, *tail)
    elif r[c[4]] != 0:
        store(*head, _v1(r, c[4], b, i8), bs_operands, None, bn_operands, operand, None, *tail)
    elif r[c[6]] != 0:
        store(*head, None, bs_operands, _v1(r, c[6], b, i8), bn_operands, operand, None, *tail)
    else:
        store(*head, None, bs_operands, None, bn_operands, operand, None, *tail)


@njit(cache=True)
def _to_int8(r, b):
    c = _TI
    convert_stores.int8_store(_v1(r, c[0], b, np.float32), r[c[1]] != 0, _v1(r, c[2], b, np.int8),
                              _v3(r, c[3], b, np.uint8), r[c[4]], _v1(r, c[5], b, np.int64), _v1(r, c[6], b, np.uint8))


@njit(cache=True)
def _bases(work, result, operand, cube):
    bases = np.empty(BUFFERS, np.int64)
    bases[WORK_BUFFER], bases[RESULT_BUFFER] = work.ctypes.data, result.ctypes.data
    bases[OPERAND_BUFFER], bases[CUBE_BUFFER] = operand.ctypes.data, cube.ctypes.data
    return bases


@njit(cache=True)
def run_fp16_dpu_ops(table, start, stop, work, result, operand, cube):
    """``run_fp16_ops`` with the DPU, CONVERT and TO_INT8 kinds alone (``entry``: a target without F16C, where
    no other kind is made)."""
    bases = _bases(work, result, operand, cube)
    for at in range(start, stop):
        if table[at][0] == DPU:
            _dpu(table[at], bases)
        elif table[at][0] == CONVERT:
            _convert(table[at], bases)
        elif table[at][0] == TO_INT8:
            _to_int8(table[at], bases)
    return stop


@njit(cache=True)
def run_fp16_ops(table, start, stop, work, result, operand, cube):
    """Ops ``start`` to ``stop`` of ``table`` (rows of ``encoded``, [ops][COLUMNS]), the thread buffers given (float32,
    each at least ``buffer_sizes``' elements): ``stop`` (no op refuses)."""
    bases = _bases(work, result, operand, cube)
    for at in range(start, stop):
        row = table[at]
        kind = row[0]
        if kind == DEPTHWISE:
            _depthwise(row, bases)
        elif kind == GEMM:
            _gemm(row, bases, 0)
        elif kind == NARROW:
            _gemm(row, bases, 1)
        elif kind == NARROW_HALVES:
            _gemm(row, bases, 2)
        elif kind == FEW:
            _few(row, bases)
        elif kind == DPU:
            _dpu(row, bases)
        elif kind == CONVERT:
            _convert(row, bases)
        elif kind == TO_INT8:
            _to_int8(row, bases)
    return stop
