"""The DPU look-up tables of 1/sqrt (LOWERING.md 24): the ``rsqrt`` LUT kind of the composite op
``Rsqrt`` (passes/lower_rsqrt.py).

Its function, with ONNX-style attributes ``alpha`` (a floor) and ``beta`` (0, or the top of a
piece):

    beta == 0:  f(x) = max(x, alpha) ** -1/2                     (1/sqrt, floored at alpha)
    beta > 0:   f(x) = sqrt(beta / clamp(x, alpha, beta))        (a piece: 1 above beta,
                                                                   sqrt(beta/alpha) below alpha)

int8 (one LUT layer on 256 input codes): the table spans [-X, X] with X = 256 input steps, so
every input code lands on a knot (the BN factor is exactly 64 = 2 knots a code) and no entry
is interpolated; the rest is lut.lut_program's (clip to 4 output ranges, one rounding).

float16 (one piece per layer): both tables hold one 1025-knot table over [0, X], X = the
piece's top (beta, or 16 alpha for beta == 0): LE [0, 8192] and LO [8192, 16384] with index
select 4 (16 LUT inputs a knot), BN multiplying by fp16(16384 / X). Under the rep10 priorities
the emitter writes (LUT_CFG 0x68: both hit -> LO, both over -> LO, both under -> LE) x = 8192
reads LO[0] = LE[512], x > 16384 LO's flat end f(X), x < 0 LE[0]. Linear interpolation of
x ** -1/2 with knot step h is within 3/32 (h / x)^2 of it (relative): a piece is used from
X / 16 up (h = X / 1024: 2.3e-5).
"""

from __future__ import annotations

import numpy as np

from npuemu.isa.errors import CompileError

#: the default floor (attribute ``alpha`` absent): far below every fp16 / int8 step
RSQRT_FLOOR = 2.0 ** -100
#: int8: the table's half-width in input steps (a code every 2 knots, module docstring)
INT8_SPAN_CODES = 256
#: float16: knots of a piece's table (LE 0..512 + LO 512..1024), LUT inputs a knot (2^4)
FP16_KNOTS = 1024
FP16_INDEX_SELECT = 4
FP16_LUT_TOP = 16384
#: float16: a whole 1/sqrt (beta 0) tabulates [0, 16 alpha]: accurate from alpha up
FP16_WHOLE_SPAN = 16.0
#: float16: the lowest floor a whole 1/sqrt (beta 0) may have in one table: [2^12, 2^16) holds
#: every fp16 above it (passes/lower_rsqrt.py's top piece)
FP16_ONE_TABLE_FLOOR = 2.0 ** 12
TABLE_MAX = 32767


def attributes(alpha: float | None, beta: float | None) -> tuple[float, float]:
    """(alpha, beta) with the defaults filled in and checked."""
    alpha = RSQRT_FLOOR if alpha is None else float(alpha)
    beta = 0.0 if beta is None else float(beta)
    if not (alpha > 0 and np.isfinite(alpha)) or not (beta == 0 or beta > alpha) or not np.isfinite(beta):
        raise CompileError(f"Rsqrt: alpha must be a positive floor and beta 0 or above it, got {alpha}, {beta}")
    return alpha, beta


def rsqrt_function(alpha: float | None = None, beta: float | None = None):
    """The float64 function of Rsqrt(alpha, beta) (module docstring)."""
    low, top = attributes(alpha, beta)
    if top == 0:
        return lambda x: np.maximum(np.asarray(x, np.float64), low) ** -0.5
    return lambda x: np.sqrt(top / np.clip(np.asarray(x, np.float64), low, top))


def int8_domain(input_unit: float) -> float:
    """X of the int8 table: 256 input steps, a code on every second knot."""
    return INT8_SPAN_CODES * input_unit


def fp16_span(alpha: float | None, beta: float | None) -> float:
    """X: the top of a float16 piece's table."""
    low, top = attributes(alpha, beta)
    return top if top > 0 else FP16_WHOLE_SPAN * low


def fp16_tables(alpha: float | None, beta: float | None, layer: str = "?") -> dict:
    """The float16 program's parts: tables, registers, the BN multiplier's fp16 bits and the
    table unit (peak / 32767, scaled back by the EW multiplier as every fp16 LUT layer)."""
    low, top = attributes(alpha, beta)
    if top == 0 and low < FP16_ONE_TABLE_FLOOR:
        raise CompileError(f"layer {layer}: a float16 1/sqrt floored at {low:.3g} spans more octaves than one LUT "
                           f"(from {FP16_ONE_TABLE_FLOOR:g} up): float16 builds make it a product of pieces "
                           "(passes/lower_rsqrt.py: the float16 graph pass, or build stage 5 for a hybrid's float16 layer; "
                           "this one was not expanded) (LOWERING.md 24)")
    span = fp16_span(alpha, beta)
    with np.errstate(over="ignore"):
        multiplier = np.float16(FP16_LUT_TOP / span)
    if not (np.isfinite(multiplier) and abs(float(multiplier)) >= 2.0 ** -14):
        raise CompileError(f"layer {layer}: Rsqrt piece up to {span:.6g}: its LUT input factor {FP16_LUT_TOP}/{span:.6g} "
                           "is not a normal fp16 number (pieces span 0.5 .. 2^28; lower_rsqrt scales smaller inputs)")
    knots = np.arange(FP16_KNOTS + 1, dtype=np.float64) * (span / FP16_KNOTS)
    values = rsqrt_function(alpha, beta)(knots)
    unit = float(values.max()) / TABLE_MAX
    table = np.clip(np.rint(values / unit), -TABLE_MAX - 1, TABLE_MAX).astype(np.int16)
    half = FP16_KNOTS // 2
    return dict(le=table[:half + 1].copy(), lo=table[half:].copy(), domain=span, unit=unit,
                bn_mul_bits=int(multiplier.view(np.uint16)), le_start=0, le_end=FP16_LUT_TOP // 2,
                lo_start=FP16_LUT_TOP // 2, lo_end=FP16_LUT_TOP, index_select=FP16_INDEX_SELECT)


__all__ = ["RSQRT_FLOOR", "attributes", "fp16_span", "fp16_tables", "int8_domain", "rsqrt_function"]
