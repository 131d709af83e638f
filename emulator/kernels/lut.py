"""The DPU lookup table (LUT) stage: two 513-entry int16 tables, LE and LO (isa.lut_format).

Each table covers [START, END] with a step of 2**INDEX_SELECT, interpolates linearly between
entries, and extends past its ends with the under/overflow slopes; when both tables (or
neither) cover a value the priority bits of LUT_CFG choose (NUMERICS.md section 5). On the fp
path (PROC_PRECISION fp16) the same tables are read with fp32 arithmetic (section 5.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
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


@njit(cache=True)
def _lut(data, le_table, lo_table, params, out):
    if data.shape[0] == 0:
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
    return _apply(_lut, np.int32, data, config, le_table, lo_table)


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
