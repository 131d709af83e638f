"""DPU look-up-table programs for non-ReLU activations (Sigmoid, Tanh, HardSigmoid, HardSwish,
SiLU, Elu, Gelu, Softplus) in int8 layers.

The table layout is the vendor's (rep10), stated in ``npuemu.isa.lut_format``: two 513-entry
int16 tables, LE over LUT inputs [-16384, 0] and LO over [0, 16384], index select 5. What the
table holds and how the values get there are our choices
(documented in compiler/LOWERING.md "LUT activations"):

- The DPU stage before the LUT (BN for a conv or a standalone activation) scales the values
  so that one LUT input step is ``X / 16384`` in real units, where ``[-X, X]`` is the part of
  the activation's input range whose output is not saturated by the int8 output
  quantization (found numerically on a fine grid, so every function is handled alike).
  Inputs beyond ``[-X, X]`` read the end entries (slopes 0): the output there is saturated,
  or within 1/64 of an output step of the end value.
- The table holds ``clip(f(x), -4R, 4R) / t`` with ``R = max(|lo|, |hi|)`` over the output's
  representable real range ``[lo, hi]`` and ``t = 4R / 32767`` (so every entry fits int16,
  and one table unit is below 1/64 of an output step); OUT_CVT maps a table unit to output
  steps, ``t / s_out``, and adds the zero point. The clip changes nothing the output could
  show (it saturates at ``lo``/``hi`` first). Clipping at ``[lo, hi]`` itself would put the
  clip's corner between two entries, where the interpolation cuts it by up to an output step
  or two when the entries are far apart (measured: Elu with s_out 0.002, 2 LSB).
- Entries are rounded half away from zero (NUMERICS.md's rounding for compiler constants).

The vendor's own sigmoid table (rep10) uses a fixed 2^15 output scale and a slightly
different input span; these tables are not meant to reproduce its bytes, only its layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError
from npuemu.isa.lut_format import LUT_ENTRIES, LUT_INDEX_SELECT, LUT_SPAN

from .. import op_table, quant_regs
from . import lut_rsqrt
from ..rounding import round_half_away

LUT_KINDS = ("sigmoid", "tanh", "hard_sigmoid", "hard_swish", "silu", "elu", "gelu", "softplus", "rsqrt")
#: ONNX op type (or the compiler's composite op) of each LUT activation: the op table's rows
ONNX_LUT_KINDS = op_table.onnx_lut_kinds()

TABLE_MAX = 32767
BN_SHIFT_MAX = 63  # DPU BN_MUL_CFG.BN_MUL_SHIFT_VALUE[13:8]

_GRID_POINTS = 1 << 17
_TABLE_HEADROOM = 4.0  # table range / output range (module docstring)
_FLAT_FRACTION = 1.0 / 64  # of an output step: what counts as "flat" at the ends of the domain


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def lut_function(kind: str, alpha: float | None = None, beta: float | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """The float64 function of a LUT activation with ONNX's attribute defaults."""
    if kind == "sigmoid":
        return lambda x: 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free logistic
    if kind == "tanh":
        return np.tanh
    if kind == "hard_sigmoid":
        a = 0.2 if alpha is None else float(alpha)
        b = 0.5 if beta is None else float(beta)
        return lambda x: np.clip(a * x + b, 0.0, 1.0)
    if kind == "hard_swish":
        return lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)
    if kind == "silu":
        return lambda x: x * 0.5 * (1.0 + np.tanh(0.5 * x))
    if kind == "elu":
        a = 1.0 if alpha is None else float(alpha)
        return lambda x: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0.0)))
    if kind == "gelu":
        return lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if kind == "softplus":
        return lambda x: np.logaddexp(0.0, x)
    if kind == "rsqrt":  # 1/sqrt and its pieces (lut_rsqrt.py, LOWERING.md 24)
        return lut_rsqrt.rsqrt_function(alpha, beta)
    raise CompileError(f"unknown LUT activation {kind!r}; expected one of {', '.join(LUT_KINDS)}")


@dataclass(frozen=True, eq=False)
class LutProgram:
    """Everything the DPU needs for one LUT activation: tables, registers, and the units on
    both sides (``input_unit``: real value of one LUT input step; ``output_unit``: of one
    table unit)."""

    le: np.ndarray  # int16 [513]
    lo: np.ndarray  # int16 [513]
    domain: float  # X: the LE table starts at -X, the LO table ends at +X (real units)
    input_unit: float
    output_unit: float

    le_start: int = -LUT_SPAN
    le_end: int = 0
    lo_start: int = 0
    lo_end: int = LUT_SPAN
    index_select: int = LUT_INDEX_SELECT
    # LO overflow slope (LUT_LO_SLOPE_SCALE.OFLOW_SCALE / 2^OFLOW_SHIFT): 0 for every int8
    # table (they end where the output is flat); float16 tables with a linear tail use it
    lo_oflow_scale: int = 0
    lo_oflow_shift: int = 0


def unsaturated_domain(function: Callable[[np.ndarray], np.ndarray], low: float, high: float, flat: float,
                       reach: float) -> float:
    """Half-width X of the input interval outside which ``clip(f, low, high)`` stays within
    ``flat`` of its value at the ends of ``[-reach, reach]``."""
    xs = np.linspace(-reach, reach, _GRID_POINTS)
    ys = np.clip(function(xs), low, high)
    moving_left = np.nonzero(np.abs(ys - ys[0]) > flat)[0]
    moving_right = np.nonzero(np.abs(ys - ys[-1]) > flat)[0]
    if moving_left.size == 0 or moving_right.size == 0:
        return 0.0
    step = xs[1] - xs[0]
    first, last = xs[moving_left[0]] - step, xs[moving_right[-1]] + step
    return float(max(abs(first), abs(last)))


def lut_program(kind: str, *, input_unit: float, output_scale: float, output_zero_point: int,
                alpha: float | None = None, beta: float | None = None, value_range: tuple[float, float] | None = None,
                layer: str = "?") -> tuple[LutProgram, quant_regs.FixedPoint, quant_regs.FixedPoint]:
    """(the LUT program, the factor that maps the stage's values (``input_unit`` each) onto LUT
    inputs, the OUT_CVT factor from table units to output steps) of an int8 activation.

    ``value_range`` replaces the output's representable range as the clip range of the table
    when something follows the LUT (a residual add: the activation's values can exceed the
    output's range before the add brings them back)."""
    function = lut_function(kind, alpha, beta)
    low = output_scale * (-128 - output_zero_point)
    high = output_scale * (127 - output_zero_point)
    if value_range is not None:
        low, high = min(value_range), max(value_range)
    reach = 64.0 + 4.0 * max(abs(low), abs(high))
    if kind == "hard_sigmoid":
        reach += 2.0 / max(abs(0.2 if alpha is None else float(alpha)), 1e-6)
    domain = unsaturated_domain(function, low, high, _FLAT_FRACTION * output_scale, reach)
    if kind == "rsqrt":  # every input code on a knot (lut_rsqrt.py): 1/sqrt is steep near 0
        domain = lut_rsqrt.int8_domain(input_unit)
    # at least one input step of the stage per LUT input step, so the map factor is <= 1
    domain = max(domain, input_unit)
    to_lut = quant_regs.fixed_point(input_unit * LUT_SPAN / domain, max_shift=BN_SHIFT_MAX,
                                    what=f"layer {layer}: LUT input factor")
    cap = _TABLE_HEADROOM * max(abs(low), abs(high))
    output_unit = cap / TABLE_MAX
    knots = np.arange(LUT_ENTRIES, dtype=np.float64) * (domain / (LUT_ENTRIES - 1))

    def table(xs: np.ndarray) -> np.ndarray:
        values = round_half_away(np.clip(function(xs), -cap, cap) / output_unit)
        return np.clip(values, -TABLE_MAX - 1, TABLE_MAX).astype(np.int16)

    program = LutProgram(le=table(knots - domain), lo=table(knots), domain=domain,
                         input_unit=domain / LUT_SPAN, output_unit=output_unit)
    out_cvt = quant_regs.fixed_point(output_unit / output_scale, what=f"layer {layer}: LUT output factor")
    return program, to_lut, out_cvt


# -- float16 (the fp16 DPU path, NUMERICS.md 5.1) ---------------------------------------------
#
# The vendor's fp16 ConvHardSwish / ConvExSwish / ConvExGelu (rknn-fixtures-ops
# conv_hardswish_fp16, conv_silu_add_fp16, gelu_fp16, regcmd.txt task 1) program: BN MUL =
# fp16(16384 / X) (0x6d55 = 5460 for HardSwish, X = 3; 0x6984 = 2824 for SiLU, X = 5.8; 0x6da8 =
# 5792 for Gelu, X = 2 sqrt 2), the same LUT registers as int8 (LUT_CFG 0x68, LUT_INFO 0x50500,
# LE [-16384, 0], LO [0, 16384]), and tables round(f(x_i) * 32767 / f(X)) at the 513 knots of
# [-X, 0] and [0, X] (reproduced: 1025 of the 1026 words of each fixture, lut_fp16_program's
# test; the two others: HardSwish LO[422] 24634 where f/t = 24633.498, Gelu LE[0] -1 where
# f/t = -76.8). Linear tails continue through the LO overflow slope with shift 13 (HardSwish 16384, Gelu 16422: LUT_LO_SLOPE_SCALE 0x40000000 / 0x40260000,
# LUT_LO_SLOPE_SHIFT 0x1a0; SiLU 16434, 0x40320000), i.e. 2^13 * 2^15 X / (16384 f(X)) rounded;
# one table unit is t = f(X) / 32767 in real units.

#: X (the table's half-width) per kind. HardSwish, SiLU, Gelu: the vendor's values (above);
#: the others are our choice, where the function is within about an fp16 step of its asymptote
#: (Sigmoid 1 - s(8) = 3.4e-4, Tanh 1 - tanh(4.5) = 2.5e-4, Elu alpha e^-8, Softplus
#: log1p(e^-8) = 3.4e-4); HardSigmoid's is where it saturates.
FP16_DOMAIN = {"hard_swish": 3.0, "silu": 5.8, "gelu": 2.0 * math.sqrt(2.0), "sigmoid": 8.0, "tanh": 4.5,
               "elu": 8.0, "softplus": 8.0}
#: kinds whose output continues as y = x past +X (LO overflow slope); the rest are flat there
FP16_LINEAR_TAIL = ("hard_swish", "silu", "gelu", "elu", "softplus")
FP16_SLOPE_SHIFT = 13  # the vendor's LUT_LO_SLOPE_SHIFT.OFLOW_SHIFT (fixtures above)


@dataclass(frozen=True, eq=False)
class Fp16Lut:
    """A float16 LUT activation: the program, the fp16 bits of BN's MUL (values -> LUT
    inputs) and the fp32 factor from table units back to values (the EW multiplier)."""

    program: LutProgram
    bn_mul_bits: int
    output_unit: float


def fp16_domain(kind: str, alpha: float | None = None, beta: float | None = None) -> float:
    if kind == "hard_sigmoid":
        a = 0.2 if alpha is None else float(alpha)
        b = 0.5 if beta is None else float(beta)
        if a == 0.0:
            return 1.0  # constant: any span
        return max(abs(b / a), abs((1.0 - b) / a))
    if kind not in FP16_DOMAIN:
        raise CompileError(f"unknown LUT activation {kind!r}; expected one of {', '.join(LUT_KINDS)}")
    return FP16_DOMAIN[kind]


def lut_fp16_program(kind: str, alpha: float | None = None, beta: float | None = None,
                     layer: str = "?") -> Fp16Lut:
    """The float16 program of an activation, tables as the vendor computes them (above)."""
    if kind == "rsqrt":  # a piece of 1/sqrt (lut_rsqrt.py, LOWERING.md 24)
        return _rsqrt_fp16_program(alpha, beta, layer)
    function = lut_function(kind, alpha, beta)
    domain = fp16_domain(kind, alpha, beta)
    knots = np.arange(LUT_ENTRIES, dtype=np.float64) * (domain / (LUT_ENTRIES - 1))
    le_values, lo_values = function(knots - domain), function(knots)
    peak = float(max(np.max(np.abs(le_values)), np.max(np.abs(lo_values))))
    if not peak > 0.0:
        raise CompileError(f"layer {layer}: {kind} is 0 on its LUT span; nothing to tabulate")
    unit = peak / TABLE_MAX  # the vendor's f(X) / 32767 (f(X) is the peak for its three)

    def table(values: np.ndarray) -> np.ndarray:
        # np.rint: the vendor's words admit half-even or half-away (no entry of the fixtures ties)
        return np.clip(np.rint(values / unit), -TABLE_MAX - 1, TABLE_MAX).astype(np.int16)

    scale = 0
    if kind in FP16_LINEAR_TAIL:  # dy/dx = 1 in table units per LUT input step, with the
        # vendor's 2^15 (not 32767) per f(X): this gives all three fixtures' words
        scale = int(round(domain * (TABLE_MAX + 1) / (LUT_SPAN * peak) * (1 << FP16_SLOPE_SHIFT)))
    program = LutProgram(le=table(le_values), lo=table(lo_values), domain=domain, input_unit=domain / LUT_SPAN,
                         output_unit=unit, lo_oflow_scale=scale,
                         lo_oflow_shift=FP16_SLOPE_SHIFT if scale else 0)
    bits = int(np.float16(LUT_SPAN / domain).view(np.uint16))
    if not np.isfinite(np.float16(LUT_SPAN / domain)):
        raise CompileError(f"layer {layer}: LUT input factor 16384 / {domain} overflows fp16")
    return Fp16Lut(program, bits, unit)


def _rsqrt_fp16_program(alpha: float | None, beta: float | None, layer: str) -> Fp16Lut:
    parts = lut_rsqrt.fp16_tables(alpha, beta, layer)
    program = LutProgram(le=parts["le"], lo=parts["lo"], domain=parts["domain"],
                         input_unit=parts["domain"] / lut_rsqrt.FP16_LUT_TOP, output_unit=parts["unit"],
                         le_start=parts["le_start"], le_end=parts["le_end"], lo_start=parts["lo_start"],
                         lo_end=parts["lo_end"], index_select=parts["index_select"])
    return Fp16Lut(program, parts["bn_mul_bits"], parts["unit"])
