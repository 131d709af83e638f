"""Runs of consecutive int8 task steps as one compiled call (issue 20: fixed cost per task).

A task program's int8 CNA + CORE -> DPU step whose CORE and DPU stage chain run as one call
(units/cna_core.py ``_fused_rows``, kernels/int8_core_step.py ``CHAINED``) costs ~3 us of Python
around ~3 us of kernel: the Cbuf bookkeeping, the derived-row drop, and the dispatch of a call of
25-27 array arguments (~45 ns each to unbox); one whose DPU stores through the folded LUT table
(kernels/lut_folded.py) makes two calls. A run of such steps (ppocr_cls: each FFFFF of its program,
four chained steps and one LUT step) is one call here: each op's arguments are written once into a
row of an int64 table (``OpTable``), and ``run_ops`` walks the rows, makes each argument's array
again from its address and shape (``numba.carray``: a view, no copy) and calls the op kind's kernel
- the very function the step calls, on the very memory. Where a chain refuses the window sums (its
data-dependent False, having written nothing) ``run_ops`` returns that op's position; the caller
runs the step's general stages (``_fused_rows``' fallback) and resumes at the next op.

The kinds are fixed, and so are their argument types (``_SPECS``, in the order of the kernel's
parameters and of ``run_ops``' views): a step whose arguments are not arrays of the spec's dtype,
dimensions and C layout (or integers where the spec says so) is no op and stays a step of its own.
The table holds addresses, not references: the steps hold the arrays (task_batches.py keeps each
step's calls on it, and a batch the LUT table its ops were made for).
(Tried first: a numba typed List of argument tuples per kind. Its unboxing costs ~2.5 us per list
per call - more than the separate calls it replaces: ppocr_cls went from 1.82 to 2.33 ms a run.)
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from npuemu.emulator.kernels import dpu_atoms, dpu_flying_lines, lut_folded
from npuemu.emulator.kernels import int8_core_step as steps

#: op kinds: a CORE step with its DPU stage chain (returns whether the chain took the window sums), a CORE
#: step alone, the folded LUT store (window sums int64 or int32), an op that does nothing (a place kept), and
#: a flying DPU task's MRDMA read with its float64 chain (``FLYING_CHAIN``: dpu_flying_lines.gather_chain), and a
#: convolution whose windows reach outside the input, with its chain and alone (``int8_core_step.gemm_padded_step``)
ROWS, PLANES, WINDOW, DEPTHWISE, GEMM, FOLDED64, FOLDED32, NOTHING, FLYING_CHAIN, WINDOW_PADDED, GEMM_PADDED, \
    FLYING_LINES, WINDOW_EW = range(13)
#: int64 words an argument takes in a table row: its address and up to 4 dimensions (an integer: its value)
WORDS = 5

# Argument specs: "dtype:ndim" an array (C layout), "n" an integer
_DEPTHWISE = "u1:1 i8:1 u1:2 u8:4 u8:4 i1:4 i2:2 i2:2 u1:4 i8:2 i4:2 i4:2 i4:2 i4:2 i8:1"
_CHAIN_TAIL = "f8:2 i4:3 f8:1 n n n i1:2 i8:1 u8:1"
_GEMM = "u1:1 i8:1 u1:2 i1:1 i8:1 i8:1 u1:3 u1:2 i4:2 i4:2 i8:1 i8:1"
_FOLDED = "n n i8:1 i8:2 i1:1 n n n n i1:2 i8:1 u8:1 i8:2"
# (gemm_padded_step's: _GEMM's with the atoms' and padded copy's words and the int8 copy after the rows, and the
# edge terms before the scalars)
_GEMM_PADDED = "u1:1 i8:1 u1:2 u4:4 u4:4 i1:1 i8:1 i8:1 u1:3 u1:2 i4:2 i4:2 i8:1 i8:1 i8:2 i8:1 i8:1"
_SPECS = {
    ROWS: f"{_DEPTHWISE} i4:3 i4:1 {_CHAIN_TAIL}",
    PLANES: f"{_DEPTHWISE} i4:3 i4:2 {_CHAIN_TAIL} i4:2",
    WINDOW: f"{_GEMM} i4:3 i8:1 i4:1 n {_CHAIN_TAIL}",
    DEPTHWISE: _DEPTHWISE,
    GEMM: _GEMM,
    WINDOW_PADDED: f"{_GEMM_PADDED} i4:3 i8:1 i4:1 n {_CHAIN_TAIL}",
    GEMM_PADDED: _GEMM_PADDED,
    FOLDED64: f"i4:3 i8:1 {_FOLDED}",
    FOLDED32: f"i4:3 i4:1 {_FOLDED}",
    # (dpu_flying_lines.gather_chain's: the region's bytes, the rows' offsets, the cube they are copied into,
    # then dpu_atoms' loop's arguments after the operand - none: EW off - and the loop's number)
    FLYING_CHAIN: "u1:1 i8:1 i1:3 f8:2 f8:1 n n n i1:1 i8:1 n",
    # (dpu_flying_lines.flying_lines': main cube and EW operand read where they lie, ``per_pixel`` as 0 / 1)
    FLYING_LINES: "i1:1 i8:1 i1:1 i8:1 n i8:1 n n n n i1:1 i8:1",
    # (int8_core_step.gemm_ew_chain's: the ERDMA read's memory, row offsets, rows and their atoms in the operand's place)
    WINDOW_EW: f"{_GEMM} i4:3 i8:1 n f8:2 u1:1 i8:1 u1:2 i1:3 f8:1 n n n i8:1 u8:1",
}
#: the kernel each kind runs (int8_core_step.CHAINED's calls, the CORE steps, the folded LUT store; and
#: FLYING_CHAIN: ``kind_of``)
KINDS = {steps.depthwise_rows_chain: ROWS, steps.depthwise_planes_chain: PLANES, steps.gemm_window_chain: WINDOW,
         steps.depthwise_step: DEPTHWISE, steps.gemm_step: GEMM, lut_folded.folded_to_atoms: FOLDED64,
         steps.gemm_padded_window_chain: WINDOW_PADDED, steps.gemm_padded_step: GEMM_PADDED,
         dpu_flying_lines.flying_lines: FLYING_LINES, steps.gemm_ew_chain: WINDOW_EW}


def kind_of(kernel, arguments: tuple) -> int | None:
    """The op kind of a call of ``kernel`` on ``arguments`` (None: no op runs it)."""
    if kernel is dpu_flying_lines.gather_chain:
        return FLYING_CHAIN if len(arguments) == 11 and arguments[-1] in range(4) else None
    kind = KINDS.get(kernel)
    if kind == FOLDED64 and len(arguments) > 1 and getattr(arguments[1], "dtype", None) == np.int32:
        return FOLDED32
    return kind


def _parse(spec: str) -> tuple:
    """(dtype or None for an integer, ndim) per argument of ``spec``."""
    return tuple((None, 0) if item == "n" else (np.dtype(item.split(":")[0]), int(item.split(":")[1]))
                 for item in spec.split())


_PARSED = {kind: _parse(spec) for kind, spec in _SPECS.items()}
#: table row width: the longest kind's
COLUMNS = 1 + WORDS * max(len(parsed) for parsed in _PARSED.values())


def nothing() -> np.ndarray:
    """A table row that does nothing (kind NOTHING)."""
    row = np.zeros(COLUMNS, np.int64)
    row[0] = NOTHING
    return row


def encoded(kind: int, arguments: tuple) -> np.ndarray | None:
    """A table row for op ``kind`` on ``arguments`` (its kind first, then per argument its address and
    dimensions, or its value), or None where one does not fit the spec."""
    parsed = _PARSED[kind]
    if len(arguments) != len(parsed):
        return None
    row = np.zeros(COLUMNS, np.int64)
    row[0] = kind
    for at, (value, (dtype, ndim)) in enumerate(zip(arguments, parsed)):
        column = 1 + WORDS * at
        if dtype is None:
            if not fits_integer(value):
                return None
            row[column] = int(value)
        elif not place_array(row, value, dtype, ndim, column):
            return None
    return row


def fits_integer(value) -> bool:
    """Whether ``value`` is an integer argument a row holds: an int or NumPy integer (not a bool) within int64."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
        and -(1 << 63) <= int(value) < 1 << 63


def place_array(row: np.ndarray, value, dtype: np.dtype, ndim: int, column: int) -> bool:
    """``value``'s address and dimensions into ``row`` from ``column`` where it is an array argument a row
    holds - an ndarray of ``dtype`` and ``ndim`` dimensions, C-contiguous -; False (the row as it was) otherwise."""
    if not isinstance(value, np.ndarray) or value.dtype != dtype or value.ndim != ndim \
            or not value.flags.c_contiguous:
        return False
    row[column] = value.ctypes.data
    row[column + 1:column + 1 + ndim] = value.shape
    return True


class OpTable:
    """The ops of one program, their table rows in order."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []

    def add(self, row: np.ndarray) -> int:
        """Op ``row`` (``encoded``'s) appended: its position."""
        self.rows.append(row)
        return len(self.rows) - 1

    def frozen(self) -> np.ndarray:
        """The table [ops][COLUMNS] for ``run_ops``."""
        return np.array(self.rows, np.int64).reshape(-1, COLUMNS)


@intrinsic
def _pointer(typingctx, address, dtype):
    """The int64 ``address`` as a pointer to ``dtype`` elements."""
    if address != types.int64 or not isinstance(dtype, types.NumberClass):
        return None
    target = types.CPointer(dtype.instance_type)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(target))
    return target(address, dtype), codegen


@njit(cache=True)
def _v1(row, at, dtype):
    column = 1 + WORDS * at
    return carray(_pointer(row[column], dtype), (row[column + 1],))


@njit(cache=True)
def _v2(row, at, dtype):
    column = 1 + WORDS * at
    return carray(_pointer(row[column], dtype), (row[column + 1], row[column + 2]))


@njit(cache=True)
def _v3(row, at, dtype):
    column = 1 + WORDS * at
    return carray(_pointer(row[column], dtype), (row[column + 1], row[column + 2], row[column + 3]))


@njit(cache=True)
def _v4(row, at, dtype):
    column = 1 + WORDS * at
    return carray(_pointer(row[column], dtype), (row[column + 1], row[column + 2], row[column + 3], row[column + 4]))


@njit(cache=True)
def _n(row, at):
    return row[1 + WORDS * at]


@njit(cache=True)
def _depthwise_rows(r):
    u1, i1, i2, i4, i8, u8, f8 = np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint64, np.float64
    return steps.depthwise_rows_chain(
        _v1(r, 0, u1), _v1(r, 1, i8), _v2(r, 2, u1), _v4(r, 3, u8), _v4(r, 4, u8), _v4(r, 5, i1), _v2(r, 6, i2),
        _v2(r, 7, i2), _v4(r, 8, u1), _v2(r, 9, i8), _v2(r, 10, i4), _v2(r, 11, i4), _v2(r, 12, i4), _v2(r, 13, i4),
        _v1(r, 14, i8), _v3(r, 15, i4), _v1(r, 16, i4), _v2(r, 17, f8), _v3(r, 18, i4), _v1(r, 19, f8), _n(r, 20),
        _n(r, 21), _n(r, 22), _v2(r, 23, i1), _v1(r, 24, i8), _v1(r, 25, u8))


@njit(cache=True)
def _depthwise_planes(r):
    u1, i1, i2, i4, i8, u8, f8 = np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint64, np.float64
    return steps.depthwise_planes_chain(
        _v1(r, 0, u1), _v1(r, 1, i8), _v2(r, 2, u1), _v4(r, 3, u8), _v4(r, 4, u8), _v4(r, 5, i1), _v2(r, 6, i2),
        _v2(r, 7, i2), _v4(r, 8, u1), _v2(r, 9, i8), _v2(r, 10, i4), _v2(r, 11, i4), _v2(r, 12, i4), _v2(r, 13, i4),
        _v1(r, 14, i8), _v3(r, 15, i4), _v2(r, 16, i4), _v2(r, 17, f8), _v3(r, 18, i4), _v1(r, 19, f8), _n(r, 20),
        _n(r, 21), _n(r, 22), _v2(r, 23, i1), _v1(r, 24, i8), _v1(r, 25, u8), _v2(r, 26, i4))


@njit(cache=True)
def _gemm_window(r):
    u1, i1, i4, i8, u8, f8 = np.uint8, np.int8, np.int32, np.int64, np.uint64, np.float64
    return steps.gemm_window_chain(
        _v1(r, 0, u1), _v1(r, 1, i8), _v2(r, 2, u1), _v1(r, 3, i1), _v1(r, 4, i8), _v1(r, 5, i8), _v3(r, 6, u1),
        _v2(r, 7, u1), _v2(r, 8, i4), _v2(r, 9, i4), _v1(r, 10, i8), _v1(r, 11, i8), _v3(r, 12, i4), _v1(r, 13, i8),
        _v1(r, 14, i4), _n(r, 15), _v2(r, 16, f8), _v3(r, 17, i4), _v1(r, 18, f8), _n(r, 19), _n(r, 20), _n(r, 21),
        _v2(r, 22, i1), _v1(r, 23, i8), _v1(r, 24, u8))


@njit(cache=True)
def _depthwise(r):
    u1, i1, i2, i4, i8, u8 = np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint64
    steps.depthwise_step(
        _v1(r, 0, u1), _v1(r, 1, i8), _v2(r, 2, u1), _v4(r, 3, u8), _v4(r, 4, u8), _v4(r, 5, i1), _v2(r, 6, i2),
        _v2(r, 7, i2), _v4(r, 8, u1), _v2(r, 9, i8), _v2(r, 10, i4), _v2(r, 11, i4), _v2(r, 12, i4), _v2(r, 13, i4),
        _v1(r, 14, i8))


@njit(cache=True)
def _gemm(r):
    u1, i1, i4, i8 = np.uint8, np.int8, np.int32, np.int64
    steps.gemm_step(
        _v1(r, 0, u1), _v1(r, 1, i8), _v2(r, 2, u1), _v1(r, 3, i1), _v1(r, 4, i8), _v1(r, 5, i8), _v3(r, 6, u1),
        _v2(r, 7, u1), _v2(r, 8, i4), _v2(r, 9, i4), _v1(r, 10, i8), _v1(r, 11, i8))


@njit(cache=True)
def _gemm_padded_window(r):
    u1, i1, i4, i8, u4, u8, f8 = np.uint8, np.int8, np.int32, np.int64, np.uint32, np.uint64, np.float64
    return steps.gemm_padded_window_chain(
        _v1(r, 0, u1), _v1(r, 1, i8), _v2(r, 2, u1), _v4(r, 3, u4), _v4(r, 4, u4), _v1(r, 5, i1), _v1(r, 6, i8),
        _v1(r, 7, i8), _v3(r, 8, u1), _v2(r, 9, u1), _v2(r, 10, i4), _v2(r, 11, i4), _v1(r, 12, i8), _v1(r, 13, i8),
        _v2(r, 14, i8), _v1(r, 15, i8), _v1(r, 16, i8), _v3(r, 17, i4), _v1(r, 18, i8), _v1(r, 19, i4), _n(r, 20),
        _v2(r, 21, f8), _v3(r, 22, i4), _v1(r, 23, f8), _n(r, 24), _n(r, 25), _n(r, 26), _v2(r, 27, i1),
        _v1(r, 28, i8), _v1(r, 29, u8))


@njit(cache=True)
def _gemm_padded(r):
    u1, i1, i4, i8, u4 = np.uint8, np.int8, np.int32, np.int64, np.uint32
    steps.gemm_padded_step(
        _v1(r, 0, u1), _v1(r, 1, i8), _v2(r, 2, u1), _v4(r, 3, u4), _v4(r, 4, u4), _v1(r, 5, i1), _v1(r, 6, i8),
        _v1(r, 7, i8), _v3(r, 8, u1), _v2(r, 9, u1), _v2(r, 10, i4), _v2(r, 11, i4), _v1(r, 12, i8), _v1(r, 13, i8),
        _v2(r, 14, i8), _v1(r, 15, i8), _v1(r, 16, i8))


@njit(cache=True)
def _folded(r, sums):
    i1, i8 = np.int8, np.int64
    lut_folded.folded_to_atoms(
        _v3(r, 0, np.int32), sums, _n(r, 2), _n(r, 3), _v1(r, 4, i8), _v2(r, 5, i8), _v1(r, 6, i1), _n(r, 7), _n(r, 8),
        _n(r, 9), _n(r, 10), _v2(r, 11, i1), _v1(r, 12, i8), _v1(r, 13, np.uint64), _v2(r, 14, i8))


@njit(cache=True)
def _flying_chain(r):
    f8, i1, i8 = np.float64, np.int8, np.int64
    cube = _v3(r, 2, i1)
    dpu_flying_lines.gather_cube(_v1(r, 0, np.uint8), _v1(r, 1, i8), cube)
    loop = _n(r, 10)
    # (the cube as the EW operand too: unread with EW off)
    arguments = (cube, cube, _v2(r, 3, f8), _v1(r, 4, f8), _n(r, 5), _n(r, 6), _n(r, 7), _v1(r, 8, i1), _v1(r, 9, i8))
    if loop == 0:  # (dpu_flying_lines.flying_loop's numbers)
        dpu_atoms._atoms_away(*arguments)
    elif loop == 1:
        dpu_atoms._atoms_away_relu(*arguments)
    elif loop == 2:
        dpu_atoms._atoms_even(*arguments)
    else:
        dpu_atoms._atoms_even_relu(*arguments)


@njit(cache=True)
def _flying_lines(r):
    i1, i8 = np.int8, np.int64
    dpu_flying_lines.flying_lines(_v1(r, 0, i1), _v1(r, 1, i8), _v1(r, 2, i1), _v1(r, 3, i8), _n(r, 4) != 0,
                                  _v1(r, 5, i8), _n(r, 6), _n(r, 7), _n(r, 8), _n(r, 9), _v1(r, 10, i1), _v1(r, 11, i8))


@njit(cache=True)
def _gemm_ew(r):
    u1, i1, i4, i8, u8, f8 = np.uint8, np.int8, np.int32, np.int64, np.uint64, np.float64
    return steps.gemm_ew_chain(
        _v1(r, 0, u1), _v1(r, 1, i8), _v2(r, 2, u1), _v1(r, 3, i1), _v1(r, 4, i8), _v1(r, 5, i8), _v3(r, 6, u1),
        _v2(r, 7, u1), _v2(r, 8, i4), _v2(r, 9, i4), _v1(r, 10, i8), _v1(r, 11, i8), _v3(r, 12, i4), _v1(r, 13, i8),
        _n(r, 14), _v2(r, 15, f8), _v1(r, 16, u1), _v1(r, 17, i8), _v2(r, 18, u1), _v3(r, 19, i1), _v1(r, 20, f8),
        _n(r, 21), _n(r, 22), _n(r, 23), _v1(r, 24, i8), _v1(r, 25, u8))


@njit(cache=True)
def run_ops(table, start, stop):
    """Ops ``start`` to ``stop`` of ``table`` (``OpTable.frozen``): where one refuses (its chain
    returned False, having written nothing) its position, else ``stop``."""
    for at in range(start, stop):
        row = table[at]
        kind = row[0]
        done = True
        if kind == ROWS:
            done = _depthwise_rows(row)
        elif kind == PLANES:
            done = _depthwise_planes(row)
        elif kind == WINDOW:
            done = _gemm_window(row)
        elif kind == DEPTHWISE:
            _depthwise(row)
        elif kind == GEMM:
            _gemm(row)
        elif kind == FOLDED64:
            _folded(row, _v1(row, 1, np.int64))
        elif kind == FOLDED32:
            _folded(row, _v1(row, 1, np.int32))
        elif kind == FLYING_CHAIN:
            _flying_chain(row)
        elif kind == WINDOW_PADDED:
            done = _gemm_padded_window(row)
        elif kind == GEMM_PADDED:
            _gemm_padded(row)
        elif kind == FLYING_LINES:
            _flying_lines(row)
        elif kind == WINDOW_EW:
            done = _gemm_ew(row)
        if not done:
            return at
    return stop
