"""The DPU LUT on the fp path, written from emulator/NUMERICS.md section 5.1 alone (not from
numerics.py): plain Python control flow on numpy float32 scalars, one rounding per operation.

Also the whole float16 LUT chain the compiler programs (LOWERING.md 4.1): BS bias add, BN
``x * m + (-0.0)``, LUT, EW ``y * t``, fp16 round-to-nearest-even."""

from __future__ import annotations

import math

import numpy as np

from tests.emulator.reference.arithmetic import pick_lo

F32 = np.float32


def _edge(x: np.float32, edge: int, base: int, scale: int, shift: int) -> np.float32:
    if scale == 0:  # 5.1: no slope term when SCALE is 0 (so +-inf reads the end entry)
        return F32(base)
    slope = F32(scale * 2.0 ** -shift)
    return F32(F32(base) + F32(F32(x - F32(edge)) * slope))


def table_value(x: np.float32, table, start: int, end: int, select: int, uflow_scale: int, uflow_shift: int,
                oflow_scale: int, oflow_shift: int) -> tuple[str, np.float32]:
    if x < F32(start):
        return "under", _edge(x, start, int(table[0]), uflow_scale, uflow_shift)
    if x > F32(end):
        return "over", _edge(x, end, int(table[-1]), oflow_scale, oflow_shift)
    position = F32(F32(x - F32(start)) * F32(2.0 ** -select))
    index = math.floor(float(position))
    if index >= len(table) - 1:
        return "hit", F32(int(table[-1]))
    fraction = F32(position - F32(index))
    step = F32(int(table[index + 1]) - int(table[index]))
    return "hit", F32(F32(int(table[index])) + F32(step * fraction))


def lut_float(x, le, lo, cfg: dict) -> np.float32:
    """cfg as tests/emulator/reference/arithmetic.lut: le/lo 7-tuples and the three priorities."""
    x = F32(x)
    if np.isnan(x):
        return x
    le_status, le_value = table_value(x, le, *cfg["le"])
    lo_status, lo_value = table_value(x, lo, *cfg["lo"])
    return lo_value if pick_lo(le_status, lo_status, cfg) else le_value


def program_config(program) -> dict:
    """The LUT registers the compiler writes for a LutProgram (LOWERING.md 4.1: LUT_CFG 0x68)."""
    le = (program.le_start, program.le_end, program.index_select, 0, 0, 0, 0)
    lo = (program.lo_start, program.lo_end, program.index_select, 0, 0, program.lo_oflow_scale,
          program.lo_oflow_shift)
    return {"le": le, "lo": lo, "hybrid_priority": 1, "oflow_priority": 1, "uflow_priority": 0}


def fp16_chain(values: np.ndarray, bn_mul_bits: int, t: float, program, bias: float = 0.0) -> np.ndarray:
    """fp16 inputs (or fp32 conv sums) -> the fp16 outputs of the float16 LUT layer."""
    m = F32(np.array([bn_mul_bits], np.uint16).view(np.float16)[0])
    cfg, le, lo = program_config(program), program.le.tolist(), program.lo.tolist()
    out = np.empty(values.shape, np.float16)
    flat = out.reshape(-1)
    for i, v in enumerate(np.asarray(values, np.float32).reshape(-1)):
        x = F32(F32(v + F32(bias)) * m) + F32(-0.0)
        flat[i] = np.float16(F32(lut_float(x, le, lo, cfg) * F32(t)))  # numpy: round to nearest even
    return out
