"""DPU look-up-table programs for non-ReLU activations (Sigmoid, Tanh, HardSigmoid, HardSwish,
SiLU, Elu, Gelu, Softplus) in int8 layers.

The table layout is the vendor's (rep10, vendor-corpus regcmd/rep10_sigmoid_64_56.txt): two
513-entry int16 tables, LE over LUT inputs [-16384, 0] and LO over [0, 16384], index select 5
(a step of 32 inputs between entries), LUT_CFG with HYBRID and OFLOW priority LO, UFLOW priority
LE, LO_LE_MUX 2. What the table holds and how the values get there are our choices
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

from .. import quant_regs

LUT_KINDS = ("sigmoid", "tanh", "hard_sigmoid", "hard_swish", "silu", "elu", "gelu", "softplus")
#: ONNX op type (or the compiler's composite op) of each LUT activation
ONNX_LUT_KINDS = {"Sigmoid": "sigmoid", "Tanh": "tanh", "HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish",
                  "Silu": "silu", "Elu": "elu", "Gelu": "gelu", "Softplus": "softplus"}

LUT_ENTRIES = 513  # rep10: 513 LUT_ACCESS_DATA words per table
LUT_SPAN = 16384  # rep10: LE [-16384, 0], LO [0, 16384]
LUT_INDEX_SELECT = 5  # rep10 LUT_INFO: 16384 / 2^5 = 512 intervals per table
LUT_CFG_REP10 = dict(LUT_HYBRID_PRIORITY=1, LUT_OFLOW_PRIORITY=1, LUT_UFLOW_PRIORITY=0, LUT_LO_LE_MUX=2)
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
    # at least one input step of the stage per LUT input step, so the map factor is <= 1
    domain = max(domain, input_unit)
    to_lut = quant_regs.fixed_point(input_unit * LUT_SPAN / domain, max_shift=BN_SHIFT_MAX,
                                    what=f"layer {layer}: LUT input factor")
    cap = _TABLE_HEADROOM * max(abs(low), abs(high))
    output_unit = cap / TABLE_MAX
    knots = np.arange(LUT_ENTRIES, dtype=np.float64) * (domain / (LUT_ENTRIES - 1))

    def table(xs: np.ndarray) -> np.ndarray:
        values = quant_regs.round_half_away(np.clip(function(xs), -cap, cap) / output_unit)
        return np.clip(values, -TABLE_MAX - 1, TABLE_MAX).astype(np.int16)

    program = LutProgram(le=table(knots - domain), lo=table(knots), domain=domain,
                         input_unit=domain / LUT_SPAN, output_unit=output_unit)
    out_cvt = quant_regs.fixed_point(output_unit / output_scale, what=f"layer {layer}: LUT output factor")
    return program, to_lut, out_cvt
