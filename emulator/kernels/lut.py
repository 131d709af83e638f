"""The DPU lookup table (LUT) stage: two 513-entry int16 tables, LE and LO (isa.lut_format).

Each table covers [START, END] with a step of 2**INDEX_SELECT, interpolates linearly between
entries, and extends past its ends with the under/overflow slopes; when both tables (or
neither) cover a value the priority bits of LUT_CFG choose (NUMERICS.md section 5). On the fp
path (PROC_PRECISION fp16) the same tables are read with fp32 arithmetic (section 5.1).

Speed (issue 20): the integer LUT is a pure function of its input given the tables and the
LUT_CFG settings, so the values over the tables' span ([min START, max END] with a margin, at
most DENSE_SPAN of them, ``dense_span``) are evaluated once per (settings, tables) and looked up
(``dense_values``); an input outside that span is evaluated as before. ``lut_stages_to_atoms`` runs a task's
BS -> BN -> LUT -> EW -> OUT_CVT pixel-major into NC1HWC2 atoms (units/dpu_plan.py); with a register
EW operand a value past the table's ends reads its end entry where the LUT is flat there, and BS + BN
run as one vectorised loop for their commonest settings (``flat_tails``, ``_bs_bn_plain``, NUMERICS.md 31).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels import dpu as kd
from npuemu.emulator.kernels.dpu import _bn_block, _bs_block, _ew_block, _out_cvt_flat
from npuemu.isa.errors import EmulationError
from npuemu.isa.lut_format import LUT_ENTRIES


@dataclass(frozen=True)
class LutTableConfig:
    """One table's registers: LUT_xx_START/END, LUT_INFO index select, slope scale/shift."""

    start: int = 0
    end: int = 0
    index_select: int = 0
    uflow_scale: int = 0
    uflow_shift: int = 0
    oflow_scale: int = 0
    oflow_shift: int = 0


@dataclass(frozen=True)
class LutConfig:
    """LUT_CFG priorities (0 = LE, 1 = LO) and the two tables' settings."""

    le: LutTableConfig = LutTableConfig()
    lo: LutTableConfig = LutTableConfig()
    hybrid_priority: int = 0
    uflow_priority: int = 0
    oflow_priority: int = 0

    def parameters(self) -> np.ndarray:
        """The int64 parameter vector ``numerics.lut_value`` reads (layout ``LUTP_*``)."""
        params = np.zeros(nm.LUTP_COUNT, np.int64)
        for table, base in ((self.le, nm.LUTP_LE_START), (self.lo, nm.LUTP_LO_START)):
            if table.end < table.start or not 0 <= table.index_select < 32:
                raise EmulationError(f"LUT table {table} needs START <= END and INDEX_SELECT 0..31")
            params[base:base + 7] = (table.start, table.end, table.index_select, table.uflow_scale,
                                     table.uflow_shift, table.oflow_scale, table.oflow_shift)
        params[nm.LUTP_HYBRID_PRIORITY] = self.hybrid_priority
        params[nm.LUTP_UFLOW_PRIORITY] = self.uflow_priority
        params[nm.LUTP_OFLOW_PRIORITY] = self.oflow_priority
        return params


#: the most values ``dense_values`` evaluates ahead (int32: 1 MiB); wider spans: per element
DENSE_SPAN = 1 << 18
#: (settings, tables) whose dense values are kept (oldest dropped first)
DENSE_KEPT = 64
_NO_DENSE = np.zeros(0, np.int32)


@njit(cache=True)
def _lut_values(data, le_table, lo_table, params, out):
    """``numerics.lut_value`` of every (int32) element."""
    for i in range(data.shape[0]):
        out[i] = nm.lut_value(data[i], le_table, lo_table, params)


@njit(cache=True)
def _lut(data, le_table, lo_table, params, out, dense, base):
    """The LUT of every int32 element: ``dense[x - base]`` (the values of ``_lut_values`` over
    a span, ``dense_values``) where x falls in it, ``numerics.lut_value`` elsewhere."""
    if data.shape[0] == 0:
        return
    if dense.shape[0] > 0:
        size = dense.shape[0]
        for i in range(data.shape[0]):
            j = np.int64(data[i]) - base
            out[i] = dense[j] if 0 <= j < size else nm.lut_value(data[i], le_table, lo_table, params)
        return
    low, high = np.int64(data.min()), np.int64(data.max())
    span = high - low + 1
    if 2 * span > data.shape[0]:
        for i in range(data.shape[0]):
            out[i] = nm.lut_value(data[i], le_table, lo_table, params)
        return
    # Fewer distinct inputs than elements: evaluate every value of [low, high] once, then
    # look the elements up (the same numbers, at a fraction of the per-element cost).
    values = np.empty(span, np.int32)
    for i in range(span):
        values[i] = nm.lut_value(low + i, le_table, lo_table, params)
    for i in range(data.shape[0]):
        out[i] = values[data[i] - low]


class _DenseValues:
    """The LUT's values over its tables' span per (settings, tables) bytes: built the second
    time a key is asked for (a one-off call, as in the kernel tests, does not pay for it)."""

    def __init__(self) -> None:
        self._values: dict[bytes, tuple[int, np.ndarray]] = {}
        self._asked: set[bytes] = set()

    def get(self, params: np.ndarray, le_table: np.ndarray, lo_table: np.ndarray,
            build: bool = False) -> tuple[int, np.ndarray]:
        """(base, values): values[i] is the LUT of base + i; no values (``_NO_DENSE``) while
        not built, or when the span is wider than DENSE_SPAN."""
        key = params.tobytes() + le_table.tobytes() + lo_table.tobytes()
        known = self._values.get(key)
        if known is not None:
            return known
        if not build and key not in self._asked:
            if len(self._asked) > 4 * DENSE_KEPT:
                self._asked.clear()
            self._asked.add(key)
            return 0, _NO_DENSE
        return _span_values(self._values, key, params, np.int32,
                            lambda xs, values: _lut_values(xs, le_table, lo_table, params, values))


def _span_values(kept: dict, key: bytes, params: np.ndarray, dtype, fill) -> tuple[int, np.ndarray]:
    """(base, values) over ``dense_span(params)``, ``fill(inputs, values)`` filling them (no values
    when the span is wider than DENSE_SPAN), kept under ``key`` in ``kept`` (its oldest dropped
    past DENSE_KEPT)."""
    low, high = dense_span(params)
    values = np.zeros(0, dtype)
    if high - low + 1 <= DENSE_SPAN:
        values = np.empty(high - low + 1, dtype)
        fill(np.arange(low, high + 1, dtype=np.int32), values)
    if len(kept) >= DENSE_KEPT:
        del kept[next(iter(kept))]
    kept[key] = (low, values)
    return low, values


dense_values = _DenseValues()


def dense_span(params: np.ndarray) -> tuple[int, int]:
    """The inputs ``dense_values`` covers: the tables' span [min START, max END] and as much
    again on either side (the stages before the LUT often overshoot it: ppocr_cls's reach 2.6x
    its ends), within DENSE_SPAN values and the int32 range."""
    low = min(int(params[nm.LUTP_LE_START]), int(params[nm.LUTP_LO_START]))
    high = max(int(params[nm.LUTP_LE_END]), int(params[nm.LUTP_LO_END]))
    width = high - low + 1
    if 3 * width <= DENSE_SPAN:
        low, high = low - width, high + width
    return max(low, nm.INT32_MIN), min(high, nm.INT32_MAX)


def _table(values: np.ndarray, name: str) -> np.ndarray:
    table = np.asarray(values)
    if table.shape != (LUT_ENTRIES,):
        raise EmulationError(
            f"LUT {name} table must hold {LUT_ENTRIES} entries, got {table.shape}")
    if table.min(initial=0) < nm.INT16_MIN or table.max(initial=0) > nm.INT16_MAX:
        raise EmulationError(f"LUT {name} table entries must be int16")
    return np.ascontiguousarray(table, dtype=np.int16)


def lut_stage(data: np.ndarray, config: LutConfig, le_table: np.ndarray,
              lo_table: np.ndarray) -> np.ndarray:
    """Apply the LUT to every int32 element (any shape); result int32."""
    source = np.ascontiguousarray(data, dtype=np.int32)
    out = np.empty(source.shape, np.int32)
    le, lo, params = _table(le_table, "LE"), _table(lo_table, "LO"), config.parameters()
    base, dense = dense_values.get(params, le, lo)
    _lut(source.reshape(-1), le, lo, params, out.reshape(-1), dense, base)
    return out


def _apply(kernel, dtype, data: np.ndarray, config: LutConfig, le_table: np.ndarray,
           lo_table: np.ndarray) -> np.ndarray:
    source = np.ascontiguousarray(data, dtype=dtype)
    out = np.empty(source.shape, dtype)
    kernel(source.reshape(-1), _table(le_table, "LE"), _table(lo_table, "LO"), config.parameters(), out.reshape(-1))
    return out


@njit(cache=True)
def _lut_float(data, le_table, lo_table, params, out):
    for i in range(data.shape[0]):
        out[i] = nm.lut_value_float(data[i], le_table, lo_table, params)


def lut_stage_fp(data: np.ndarray, config: LutConfig, le_table: np.ndarray,
                 lo_table: np.ndarray) -> np.ndarray:
    """The LUT on the fp path (NUMERICS.md 5.1): fp32 elements in, fp32 out (any shape)."""
    return _apply(_lut_float, np.float32, data, config, le_table, lo_table)


@njit(cache=True)
def _lut_block(block, le_table, lo_table, params, dense, base):
    """The LUT over an int64 block as ``lut_stage`` applies it to the int32 cube the stages
    before it leave: each value kept to its low 32 bits first (an int32 store), the result int32."""
    size = dense.shape[0]
    for i in range(block.shape[0]):
        x = np.int32(block[i])
        j = np.int64(x) - base
        block[i] = dense[j] if 0 <= j < size else nm.lut_value(x, le_table, lo_table, params)


@njit(cache=True)
def _lut_stages_to_atoms(data, sums, sums_layout, kernels_per_group, stages, bs, bs_operands, bn, bn_operands,
                         operand, ew, cvt, lut, channels, surfaces, width, tile, offsets, target):
    """``dpu_pixel._stages_to_atoms`` with the LUT between BN and EW: per block of pixels BS, BN
    (``stages`` [3]: BS, BN, EW on or off), the LUT (``_lut_block``; ``lut``: the LE and LO
    tables, the LUT_CFG parameters, the dense values and their base), EW, OUT_CVT, the atoms."""
    le_table, lo_table, params, dense, base = lut
    per_block, lanes_out = tile.shape
    computed = min(channels, lanes_out)
    block, window, other = dp._scratch(per_block * computed, np.int64)
    alu, cpend, mul = dp._tiled(bs_operands, computed, per_block, np.int64)
    bn_alu, bn_mul, _ = dp._tiled(bn_operands, computed, per_block, np.int64)
    scale, shift, offset = cvt[dp.CP_SCALE], cvt[dp.CP_SHIFT], cvt[dp.CP_OFFSET]
    mode, low, high = cvt[dp.CP_MODE], cvt[dp.CP_LOW], cvt[dp.CP_HIGH]
    flat_tile = tile.reshape(-1)
    for first in range(0, data.shape[1], per_block):
        count = min(per_block, data.shape[1] - first)
        n = count * computed
        dp._load_inputs(data, sums, sums_layout, kernels_per_group, channels, operand, stages[2] != 0,
                        first, count, computed, block, window, other)
        if stages[0] != 0:
            _bs_block(block[:n], window[:n], bs, alu[:n], cpend[:n], mul[:n])
        if stages[1] != 0:
            _bn_block(block[:n], bn, bn_alu[:n], bn_mul[:n])
        _lut_block(block[:n], le_table, lo_table, params, dense, base)
        if stages[2] != 0:
            _ew_block(block[:n], other[:n], ew)
        if lanes_out == computed:
            _out_cvt_flat(block[:n], flat_tile[:n], scale, shift, offset, mode, low, high)
        else:
            for b in range(count):
                _out_cvt_flat(block[b * computed:(b + 1) * computed], tile[b, :computed], scale,
                              shift, offset, mode, low, high)
        dp._store_atoms(tile, first, count, width, surfaces, offsets, target)


# ---------------------------------------------------------------------------------------------
# LUT, EW and OUT_CVT as one table: with no per-element EW operand (a register value, or none)
# the stages after BN are a function of the LUT's input alone
# ---------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _after_lut(x, le_table, lo_table, params, other, ew, cvt):
    """OUT_CVT(EW(LUT(x))) as ``_lut_block``, ``kernels.dpu._ew_block`` and ``_out_cvt_flat``
    compute it for one element (``other``: the raw EW operand)."""
    value = np.int64(nm.lut_value(x, le_table, lo_table, params))
    converted = nm.ew_operand_value(other, ew[kd.EP_CVT_ON] != 0, ew[kd.EP_CVT_OFFSET], ew[kd.EP_CVT_SCALE],
                                    ew[kd.EP_CVT_SHIFT], ew[kd.EP_CVT_MODE])
    value = nm.ew_value(value, converted, ew[kd.EP_OP_ON] != 0, ew[kd.EP_OP_TYPE], ew[kd.EP_ALGO],
                        ew[kd.EP_TRUNC_POS], ew[kd.EP_TRUNC_NEG], ew[kd.EP_PRELU] != 0, ew[kd.EP_RELU] != 0,
                        ew[kd.EP_RELUX] != 0, ew[kd.EP_RELUX_VALUE])
    return nm.out_cvt_value(value, cvt[kd.CP_SCALE], cvt[kd.CP_SHIFT], cvt[kd.CP_OFFSET], cvt[kd.CP_MODE],
                            cvt[kd.CP_LOW], cvt[kd.CP_HIGH])


@njit(cache=True)
def _after_lut_values(xs, le_table, lo_table, params, other, ew, cvt, out):
    for i in range(xs.shape[0]):
        out[i] = _after_lut(xs[i], le_table, lo_table, params, other, ew, cvt)


@njit(cache=True)
def _table_block(block, out, lut, other, ew, cvt, flat_below, flat_above):
    """``out[i]``: the stages after BN of ``np.int32(block[i])`` (an int32 store first, as
    ``_lut_block``), from the table where it covers the value - or, past an end where
    ``flat_below`` / ``flat_above`` says the stages are constant (``flat_tails``), from that
    end's entry."""
    le_table, lo_table, params, table, base = lut
    size = table.shape[0]
    for i in range(block.shape[0]):
        x = np.int32(block[i])
        j = np.int64(x) - base
        if 0 <= j < size:
            out[i] = table[j]
        elif j < 0 and flat_below:
            out[i] = table[0]
        elif j >= size and flat_above:
            out[i] = table[size - 1]
        else:
            out[i] = _after_lut(x, le_table, lo_table, params, other, ew, cvt)


@njit(cache=True, inline="always")
def _round_shift(product, shift):
    # one product's rounding by one shift (ROUND_HALF_AWAY's branch-free form, shifts 1..62)
    return (product + (np.int64(1) << (shift - 1)) + (product >> 63)) >> shift


@njit(cache=True, inline="always")
def _scale_shift(value, mul, positive, negative):
    # numerics.shift_by_sign(value * mul, ...) for shifts 1..62: both roundings, one selected
    product = value * mul
    up, down = _round_shift(product, positive), _round_shift(product, negative)
    return up if product >= 0 else down


@njit(cache=True)
def _bs_bn_plain(block, window, alu, cpend, mul, bs, bn_mul, bn):
    """``_bs_block`` then ``_bn_block`` for their most common settings (``plain_bs_bn``: BS ALU add,
    CPEND, MUL on, BN MUL on and its ALU off, neither PReLU, shifts 1..62) in one loop with the
    branches of ``numerics.bs_value`` / ``bn_value`` that these settings never take left out (LLVM
    vectorises it; the general forms run scalar). The same operations in the same order."""
    pos, neg, bn_pos, bn_neg = bs[kd.XP_SHIFT_POS], bs[kd.XP_SHIFT_NEG], bn[kd.XP_SHIFT_POS], bn[kd.XP_SHIFT_NEG]
    cpend_on = bs[kd.XP_CPEND_ON] != 0
    low = np.int64(0) if bs[kd.XP_RELU] != 0 else np.int64(-(2**62))
    high = np.int64(bs[kd.XP_RELUX_VALUE]) if bs[kd.XP_RELUX] != 0 else np.int64(2**62)
    bn_low = np.int64(0) if bn[kd.XP_RELU] != 0 else np.int64(-(2**62))
    bn_high = np.int64(bn[kd.XP_RELUX_VALUE]) if bn[kd.XP_RELUX] != 0 else np.int64(2**62)
    for i in range(block.shape[0]):
        value = block[i] + (cpend[i] * window[i] if cpend_on else np.int64(0)) + alu[i]
        value = min(max(min(max(_scale_shift(value, mul[i], pos, neg), nm.INT32_MIN), nm.INT32_MAX), low), high)
        value = _scale_shift(value, bn_mul[i], bn_pos, bn_neg)
        block[i] = min(max(min(max(value, nm.INT32_MIN), nm.INT32_MAX), bn_low), bn_high)


def plain_bs_bn(stages: np.ndarray, bs: np.ndarray, bn: np.ndarray) -> bool:
    """Whether ``_bs_bn_plain`` stands for ``_bs_block`` + ``_bn_block`` under these settings."""
    return bool(stages[0] != 0 and stages[1] != 0 and bs[kd.XP_ALGO] == nm.ALU_ADD and bs[kd.XP_ALU_ON] != 0
                and bs[kd.XP_MUL_ON] != 0 and bs[kd.XP_PRELU] == 0 and bn[kd.XP_ALU_ON] == 0
                and bn[kd.XP_MUL_ON] != 0 and bn[kd.XP_PRELU] == 0
                and all(1 <= int(v) <= 62 for v in (bs[kd.XP_SHIFT_POS], bs[kd.XP_SHIFT_NEG], bn[kd.XP_SHIFT_POS],
                                                    bn[kd.XP_SHIFT_NEG])))


def flat_tails(params: np.ndarray, base: int, size: int) -> tuple[bool, bool]:
    """Whether the LUT is constant below the table ``base ..`` of ``size`` values, and above it
    (NUMERICS.md 31): past both tables' ends (below every START, above every END) both tables
    under- (over-)flow, so the status, the table the priority bits choose and its end entry are
    fixed, and with both tables' slope SCALE 0 the slope term is 0 whatever x - so LUT(x), and
    EW and OUT_CVT of it with a register operand, are the value at the table's end entry."""
    if size == 0:
        return False, False
    below = base < min(int(params[nm.LUTP_LE_START]), int(params[nm.LUTP_LO_START])) \
        and params[nm.LUTP_LE_UFLOW_SCALE] == 0 and params[nm.LUTP_LO_UFLOW_SCALE] == 0
    above = base + size - 1 > max(int(params[nm.LUTP_LE_END]), int(params[nm.LUTP_LO_END])) \
        and params[nm.LUTP_LE_OFLOW_SCALE] == 0 and params[nm.LUTP_LO_OFLOW_SCALE] == 0
    return bool(below), bool(above)


def table_flags(stages: np.ndarray, bs: np.ndarray, bn: np.ndarray, params: np.ndarray, base: int,
                size: int) -> tuple[bool, bool, bool, bool]:
    """How ``_lut_table_to_atoms`` runs a one-table LUT task (a function of its settings and the
    table's span alone, worked out once per table by units/dpu_plan.py): (flat below, flat above,
    ``plain_bs_bn``, both tails flat with plain BS + BN - ``_plain_table_to_atoms``'s case)."""
    below, above = flat_tails(params, base, size) if FLAT_TAILS else (False, False)
    plain = PLAIN_STAGES and plain_bs_bn(stages, bs, bn)
    return below, above, plain, CLAMPED_TABLE and plain and below and above


def _lut_table_to_atoms(data, sums, sums_layout, kernels_per_group, stages, bs, bs_operands, bn, bn_operands,
                        other, ew, cvt, lut, channels, surfaces, width, tile, offsets, target, flags=None):
    """``_lut_table_general`` with ``flat_tails`` and ``plain_bs_bn`` worked out (NUMERICS.md 31;
    ``flags``: ``table_flags``' answer for these settings and table, when known), or
    ``_plain_table_to_atoms`` where they allow it on a pixel-major cube (NUMERICS.md 32)."""
    below, above, plain, clamped = flags or table_flags(stages, bs, bn, lut[2], int(lut[4]), lut[3].shape[0])
    if clamped and data.shape[0] == 1:
        _plain_table_to_atoms(data, sums, sums_layout, kernels_per_group, bs, bs_operands, bn, bn_operands, lut[3],
                              lut[4], channels, surfaces, width, tile, offsets, target)
        return
    _lut_table_general(data, sums, sums_layout, kernels_per_group, stages, bs, bs_operands, bn, bn_operands, other,
                       ew, cvt, lut, channels, surfaces, width, tile, offsets, target, below, above, plain)


#: ``_lut_table_to_atoms`` reads a flat tail from the table's end entries (the tests turn it off
#: to compare)
FLAT_TAILS = True
#: ... and runs BS and BN as ``_bs_bn_plain`` where ``plain_bs_bn`` allows
PLAIN_STAGES = True
#: ... and both at once as ``_plain_table_to_atoms`` where both tails are flat
CLAMPED_TABLE = True
#: channels from which ``_plain_table_to_atoms`` runs a pixel at a time: a row this long keeps
#: the loop busy, and the operands stay in L1 untiled (a block's six tiled int64 streams do not)
ROW_RUN = 64


@njit(cache=True, inline="always")
def _plain_indices(data, window, shared, cpend, alu, mul, bn_mul, bs, bn, base, last, out):
    """``_bs_bn_plain`` of each element, kept to int32 (``_table_block``'s int32 store), less the
    table's ``base`` and clamped into [0, ``last``] (``_table_block`` with both tails flat reads
    the end entries there): ``out`` int64. The window sum of element i is ``window[i] + shared``
    (one of them 0); ``cpend`` is 0 where CPEND is off. One branch-free loop (vectorised), the
    shifts' select left out where each stage shifts both signs alike."""
    pos, neg, bn_pos, bn_neg = bs[kd.XP_SHIFT_POS], bs[kd.XP_SHIFT_NEG], bn[kd.XP_SHIFT_POS], bn[kd.XP_SHIFT_NEG]
    low = np.int64(0) if bs[kd.XP_RELU] != 0 else np.int64(-(2**62))
    high = np.int64(bs[kd.XP_RELUX_VALUE]) if bs[kd.XP_RELUX] != 0 else np.int64(2**62)
    bn_low = np.int64(0) if bn[kd.XP_RELU] != 0 else np.int64(-(2**62))
    bn_high = np.int64(bn[kd.XP_RELUX_VALUE]) if bn[kd.XP_RELUX] != 0 else np.int64(2**62)
    if pos == neg and bn_pos == bn_neg:
        for i in range(out.shape[0]):
            value = np.int64(data[i]) + cpend[i] * (window[i] + shared) + alu[i]
            value = min(max(min(max(_round_shift(value * mul[i], pos), nm.INT32_MIN), nm.INT32_MAX), low), high)
            value = min(max(min(max(_round_shift(value * bn_mul[i], bn_pos), nm.INT32_MIN), nm.INT32_MAX), bn_low),
                        bn_high)
            out[i] = min(max(np.int64(np.int32(value)) - base, 0), last)
    else:
        for i in range(out.shape[0]):
            value = np.int64(data[i]) + cpend[i] * (window[i] + shared) + alu[i]
            value = min(max(min(max(_scale_shift(value, mul[i], pos, neg), nm.INT32_MIN), nm.INT32_MAX), low), high)
            value = min(max(min(max(_scale_shift(value, bn_mul[i], bn_pos, bn_neg), nm.INT32_MIN), nm.INT32_MAX),
                            bn_low), bn_high)
            out[i] = min(max(np.int64(np.int32(value)) - base, 0), last)


@njit(cache=True)
def _plain_table_to_atoms(data, sums, sums_layout, kernels_per_group, bs, bs_operands, bn, bn_operands, table, base,
                          channels, surfaces, width, tile, offsets, target):
    """``_lut_table_general`` for plain BS + BN (``plain_bs_bn``) and a table flat past both ends
    (``flat_tails``) on a pixel-major cube ``data`` [1][P][L] (NUMERICS.md 32): per block, the
    table indices in one vectorised pass (``_plain_indices``; no int64 block, no per-element
    branches), then the table read into ``tile``, then the atoms. Where the atoms hold exactly the
    computed channels and they are fewer than ROW_RUN a block is one flat run (read in place when the
    cube's rows are those channels, else their lanes copied out first; the per-channel operands
    tiled over it); otherwise one run per pixel (the operands read as they are, a shared window
    sum read per pixel)."""
    per_block, lanes_out = tile.shape
    computed = min(channels, lanes_out)
    flat = lanes_out == computed and computed < ROW_RUN
    direct = flat and data.shape[2] == computed
    tiled = min(per_block, data.shape[1]) if flat else 1  # (per-channel operands over a block's pixels)
    alu, cpend, mul = dp._tiled(bs_operands, computed, tiled, np.int64)
    _, bn_mul, _ = dp._tiled(bn_operands, computed, tiled, np.int64)
    if bs[kd.XP_CPEND_ON] == 0:
        cpend[:] = 0
    shared = not flat and sums_layout == dp.SUMS_SHARED  # (one sum per pixel: read as it is)
    one_row = not flat and (shared or sums_layout == dp.SUMS_NONE)  # (zeros: no sums loaded)
    window = np.zeros(computed if one_row else per_block * computed, np.int64)
    indices = np.empty(tiled * computed, np.int64)
    staged = np.empty(0 if direct or not flat else tiled * computed, data.dtype)
    last, cube, flat_tile = table.shape[0] - 1, data.reshape(-1), tile.reshape(-1)
    for first in range(0, data.shape[1], per_block):
        count = min(per_block, data.shape[1] - first)
        if sums_layout != dp.SUMS_NONE and not shared:
            dp._load_window(sums, sums_layout, channels // kernels_per_group, kernels_per_group, first, count,
                            computed, window)
        if flat:
            n = count * computed
            if direct:
                values = cube[first * computed:first * computed + n]
            else:
                dp._load_block(data, first, count, computed, staged)
                values = staged[:n]
            _plain_indices(values, window[:n], np.int64(0), cpend[:n], alu[:n], mul[:n], bn_mul[:n], bs, bn, base,
                           last, indices[:n])
            for i in range(n):
                flat_tile[i] = table[indices[i]]
        else:
            for b in range(count):
                row = window if one_row else window[b * computed:(b + 1) * computed]
                _plain_indices(data[0, first + b, :computed], row, np.int64(sums[first + b]) if shared else np.int64(0),
                               cpend, alu, mul, bn_mul, bs, bn, base, last, indices)
                out = tile[b]
                for i in range(computed):
                    out[i] = table[indices[i]]
        dp._store_atoms(tile, first, count, width, surfaces, offsets, target)


@njit(cache=True)
def _lut_table_general(data, sums, sums_layout, kernels_per_group, stages, bs, bs_operands, bn, bn_operands,
                       other, ew, cvt, lut, channels, surfaces, width, tile, offsets, target, flat_below, flat_above,
                       plain):
    """``_lut_stages_to_atoms`` with LUT, EW and OUT_CVT read from one table (``lut``: the LE and
    LO tables, the LUT_CFG parameters, ``after_lut_values``'s table and base; ``other``: the
    register EW operand)."""
    per_block, lanes_out = tile.shape
    computed = min(channels, lanes_out)
    block, window, _ = dp._scratch(per_block * computed, np.int64)
    alu, cpend, mul = dp._tiled(bs_operands, computed, per_block, np.int64)
    bn_alu, bn_mul, _ = dp._tiled(bn_operands, computed, per_block, np.int64)
    flat_tile = tile.reshape(-1)
    for first in range(0, data.shape[1], per_block):
        count = min(per_block, data.shape[1] - first)
        n = count * computed
        dp._load_inputs(data, sums, sums_layout, kernels_per_group, channels, data, False, first, count,
                        computed, block, window, window)
        if plain:
            _bs_bn_plain(block[:n], window[:n], alu[:n], cpend[:n], mul[:n], bs, bn_mul[:n], bn)
        else:
            if stages[0] != 0:
                _bs_block(block[:n], window[:n], bs, alu[:n], cpend[:n], mul[:n])
            if stages[1] != 0:
                _bn_block(block[:n], bn, bn_alu[:n], bn_mul[:n])
        if lanes_out == computed:
            _table_block(block[:n], flat_tile[:n], lut, other, ew, cvt, flat_below, flat_above)
        else:
            for b in range(count):
                _table_block(block[b * computed:(b + 1) * computed], tile[b, :computed], lut, other, ew, cvt,
                             flat_below, flat_above)
        dp._store_atoms(tile, first, count, width, surfaces, offsets, target)


class _AfterLutValues:
    """``_after_lut`` over ``dense_span`` per (LUT settings and tables, EW settings and operand,
    OUT_CVT settings and type) - as ``dense_values``, without the wait for a second asking."""

    def __init__(self) -> None:
        self._values: dict[bytes, tuple[int, np.ndarray]] = {}

    def get(self, params: np.ndarray, le_table: np.ndarray, lo_table: np.ndarray, other: int, ew: np.ndarray,
            cvt: np.ndarray, dtype: np.dtype) -> tuple[int, np.ndarray]:
        key = b"".join((params.tobytes(), le_table.tobytes(), lo_table.tobytes(), np.int64(other).tobytes(),
                        ew.tobytes(), cvt.tobytes(), dtype.str.encode()))
        known = self._values.get(key)
        if known is not None:
            return known
        return _span_values(self._values, key, params, dtype, lambda xs, values: _after_lut_values(
            xs, le_table, lo_table, params, np.int64(other), ew, cvt, values))


after_lut_values = _AfterLutValues()
