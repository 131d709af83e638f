"""Reference per-element arithmetic (NUMERICS.md sections 1, 2, 4, 5, 6), on Python integers.

The rounding shift, clamp and PPU average live in the public testing kit's references
(``npuemu.tools.testing_reference``), which users test their own layers with; they are
imported here so the project's kernel tests and the kit share one reference.
"""

from __future__ import annotations

from npuemu.tools.testing_reference import clamp, pool_average, round_shift  # noqa: F401 (re-exported)

INT8 = (-128, 127)
INT16 = (-32768, 32767)
INT32 = (-(2**31), 2**31 - 1)
ACC34 = (-(2**33), 2**33 - 1)


def core(exact_sum: int, truncate: int, mode: str) -> int:
    return clamp(round_shift(clamp(exact_sum, ACC34), truncate, mode), INT32)


def alu(algo: int, data: int, operand: int) -> int:
    if algo == 0:
        return max(data, operand)
    if algo == 1:
        return min(data, operand)
    if algo == 2:
        return data + operand
    if algo == 3:
        if operand == 0:
            return INT32[1] if data > 0 else INT32[0] if data < 0 else 0
        quotient = abs(data) // abs(operand)
        return quotient if (data >= 0) == (operand > 0) else -quotient
    if algo == 4:
        return data - operand
    if algo == 5:
        return abs(data)
    if algo == 6:
        return -data
    return data  # floor / ceil of an integer


def relu(value: int, relu_on: bool, relux_on: bool, relux_value: int) -> int:
    if relu_on:
        value = max(value, 0)
    if relux_on:
        value = min(value, relux_value)
    return value


def multiply_shift(product: int, shift_positive: int, shift_negative: int) -> int:
    return round_shift(product, shift_positive if product >= 0 else shift_negative, "half_away")


def bs(data, window_sum, alu_operand, cpend, mul, cfg: dict) -> int:
    value = data
    if cfg["cpend_enable"]:
        value = value + cpend * window_sum
    if cfg["alu_enable"]:
        value = alu(cfg["alu_algo"], value, alu_operand)
    if cfg["mul_enable"] and not (cfg["prelu"] and value >= 0):
        value = multiply_shift(value * mul, cfg["shift_positive"], cfg["shift_negative"])
    return relu(clamp(value, INT32), cfg["relu"], cfg["relux"], cfg["relux_value"])


def bn(data, alu_operand, mul, cfg: dict) -> int:
    value = data
    scaled = cfg["mul_enable"] and not (cfg["prelu"] and data >= 0)
    if scaled:
        value = value * mul
    if cfg["alu_enable"]:
        value = alu(cfg["alu_algo"], value, alu_operand)
    if scaled:
        value = multiply_shift(value, cfg["shift_positive"], cfg["shift_negative"])
    return relu(clamp(value, INT32), cfg["relu"], cfg["relux"], cfg["relux_value"])


def ew(data, operand, cfg: dict) -> int:
    if cfg["cvt_enable"]:
        operand = clamp(round_shift((operand + cfg["cvt_offset"]) * cfg["cvt_scale"],
                                    cfg["cvt_shift"], cfg["cvt_round"]), INT32)
    value = data
    if cfg["op_enable"]:
        if cfg["op_type"] == 0:
            value = alu(cfg["alu_algo"], value, operand)
        elif not (cfg["prelu"] and value >= 0):
            value = multiply_shift(value * operand, cfg["truncate_positive"],
                                   cfg["truncate_negative"])
    return relu(clamp(value, INT32), cfg["relu"], cfg["relux"], cfg["relux_value"])


def out_cvt(data, scale, shift, offset, mode, bounds) -> int:
    return clamp(round_shift(data * scale, shift, mode) + offset, bounds)


def lut_table(x, table, start, end, select, uscale, ushift, oscale, oshift):
    """(status, value) with status 'hit', 'under' or 'over' (NUMERICS.md 5)."""
    table = [int(t) for t in table]
    if x < start:
        return "under", table[0] + round_shift((x - start) * uscale, ushift, "half_away")
    if x > end:
        return "over", table[-1] + round_shift((x - end) * oscale, oshift, "half_away")
    index, fraction = divmod(x - start, 2**select)
    if index >= len(table) - 1:
        return "hit", table[-1]
    step = table[index + 1] - table[index]
    return "hit", table[index] + round_shift(step * fraction, select, "half_away")


def lut(x, le, lo, cfg: dict) -> int:
    le_status, le_value = lut_table(x, le, *cfg["le"])
    lo_status, lo_value = lut_table(x, lo, *cfg["lo"])
    return clamp(lo_value if pick_lo(le_status, lo_status, cfg) else le_value, INT32)


def pick_lo(le_status: str, lo_status: str, cfg: dict) -> bool:
    """Which table's value the LUT gives: a single hit wins, else the LUT_CFG priority bits."""
    if (le_status == "hit") != (lo_status == "hit"):
        return lo_status == "hit"
    if le_status == lo_status == "under":
        return cfg["uflow_priority"] == 1
    if le_status == lo_status == "over":
        return cfg["oflow_priority"] == 1
    return cfg["hybrid_priority"] == 1
