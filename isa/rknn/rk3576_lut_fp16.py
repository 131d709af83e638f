"""An fp16 conv task with a DPU LUT activation in the vendor's rk3576 layout: the output factor in OUT_CVT, both
ways (emulator/REGISTER_SEMANTICS.md 50, compiler/LOWERING.md 51).

Evidence [V ORC]: rknn-toolkit2 2.5.0 fp16 builds (``do_quantization=False``) of Conv 3x3 16 -> 16 on 12 x 12
followed by Sigmoid, Tanh, HardSigmoid, HardSwish and x * Sigmoid(x), each for rk3576 and rk3588. Apart from the
int8 form's words (``rk3576_lut``: ACT_CFG 0x20, 0x407C 0x01004140, LUT_CFG 0x02000006, the one-range LUT words,
the BN record at DPU_RDMA 0x5030 - here fp32 -0.0 as the ALU operand and the fp16 bits of 16384 / X as the
multiplier) the vendor's fp16 LUT conv writes the factor from table units back to values in OUT_CVT:

| activation | vendor rk3576 OUT_CVT_SCALE / SHIFT (MINUS_EXP) | its rk3588 twin |
|---|---|---|
| Sigmoid, Tanh, HardSigmoid | 0x14000 (16384) / 0xf00e (14, 15) | one task: EW_CFG 0x302, OUT_CVT 0x10001 / 0xf000 |
| HardSwish | 0x16001 (24577) / 0xf00d (13, 15) | two tasks: fp32 table units out, then a DPU-only rescale |
| x * Sigmoid(x) | 0x15c86 (23686) / 0xf00c (12, 15) | the same two tasks |

so factor = SCALE x 2^-SHIFT x 2^-MINUS_EXP: 1 x 2^-15 for the three flat ones (their tables are in 2^-15
units, Sigmoid's LO[512] 32708), 3.00012 x 2^-15 and 5.7827 x 2^-15 for the other two (tables in f(X) / 32767
units, X = 3 and 5.8, as rknn-fixtures-ops' fp16 HardSwish / SiLU: SCALE is f(X) / 32767 x 2^15 rounded to 15
bits). Read [I] (checked on the simulator's outputs, REGISTER_SEMANTICS.md 50.2): the fp32 LUT result times the
fp32 value SCALE x 2^-SHIFT, then the exponent decrement MINUS_EXP, then the fp16 rounding. In RK3588 words that is
npuemu's own fp16 LUT stage (LOWERING.md 4.1): the EW multiplier by EW_OP_VALUE_0 (EW_CFG 0x304) and
OUT_CVT_SHIFT.MINUS_EXP (NUMERICS.md 4.6); a factor 2^-15 is the twin's 0x302 with MINUS_EXP 15.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_dpu import FP32TOFP16   # OUT_CVT_SCALE.FP32TOFP16_EN
from npuemu.isa.rknn.rk3576_layout import FP16, VendorTask

Values = Mapping[tuple[str, str], int]
Spec = tuple[str, str, dict[str, int]]

MINUS_EXP = 15                 # OUT_CVT_SHIFT.MINUS_EXP of every vendor fp16 LUT conv [V ORC five pairs]
SCALE_LOW, SCALE_HIGH = 1 << 14, 1 << 15   # OUT_CVT_SCALE, 15 significant bits [V ORC 16384, 24577, 23686]
SHIFT_MAX = 0xFFF              # OUT_CVT_SHIFT.OUT_CVT_SHIFT (bits 11:0)
TWIN_EW = 0x302                # the twin's EW_CFG: the LUT, no EW operation [V ORC]
EW_MUL = 0x304                 # ... then the EW multiplier by the register operand (npuemu's fp16 LUT, LOWERING 4.1)


def is_fp16(precision: int) -> bool:
    return precision == FP16


def _fp32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def scale_words(factor: float, where: str = "?") -> tuple[int, int]:
    """(SCALE, SHIFT) with SCALE x 2^-SHIFT the fp32 ``factor`` x 2^MINUS_EXP to 15 significant bits, rounded to
    nearest (the vendor's HardSwish: 3 / 32767 x 2^28 = 24576.75 -> 24577); SCALE in [2^14, 2^15)."""
    value = factor * (1 << MINUS_EXP)
    if not (math.isfinite(value) and value > 0.0):
        raise UnsupportedProgramError(f"{where}: an fp16 LUT output factor {factor!r} has no vendor rk3576 OUT_CVT "
                                      f"form (a positive finite factor is known)")
    shift = 14 - math.floor(math.log2(value))
    scale = round(value * 2.0 ** shift)
    if scale >= SCALE_HIGH:   # rounded up to 2^15
        scale, shift = scale // 2, shift - 1
    if not 0 <= shift <= SHIFT_MAX:
        raise UnsupportedProgramError(f"{where}: an fp16 LUT output factor {factor!r} needs OUT_CVT_SHIFT {shift}, "
                                      f"outside 0..{SHIFT_MAX} with MINUS_EXP {MINUS_EXP} (the vendor's)")
    return scale, shift


def factor_of(scale: int, shift: int) -> float:
    """SCALE x 2^-SHIFT as the fp32 EW operand of the RK3588 form (exact: 15 bits)."""
    return scale * 2.0 ** -shift


# --- npuemu's RK3588 form -> vendor (own builds) ------------------------------------------------


def check_own(values: Values, source: RegisterMap) -> list[str]:
    """What in npuemu's fp16 LUT conv (``values``) has no vendor form: the EW multiplier by the register
    operand, an identity OUT_CVT and MINUS_EXP 0 are known (LOWERING.md 4.1's one-task form)."""
    odd = []
    if values.get(("DPU", "EW_CFG"), 0) != EW_MUL:
        odd.append(f"fp16 EW_CFG {values.get(('DPU', 'EW_CFG'), 0):#x} (npuemu's {EW_MUL:#x} is known)")
    shift = source.register("DPU", "OUT_CVT_SHIFT")
    if (values.get(("DPU", "OUT_CVT_SCALE"), 0) & ~FP32TOFP16) != 1 or shift.field("MINUS_EXP").extract(
            values.get(("DPU", "OUT_CVT_SHIFT"), 0)) or shift.field("OUT_CVT_SHIFT").extract(
            values.get(("DPU", "OUT_CVT_SHIFT"), 0)):
        odd.append("an fp16 OUT_CVT other than npuemu's identity")
    return odd


def vendor_out_cvt(values: Values, where: str) -> dict[str, int]:
    """The vendor's OUT_CVT_SCALE / SHIFT words for npuemu's fp16 LUT conv: its EW factor t (EW_OP_VALUE_0, fp32)
    to 15 bits with MINUS_EXP 15 (LOWERING.md 51.1: the one numerical change)."""
    scale, shift = scale_words(_fp32(values.get(("DPU", "EW_OP_VALUE_0"), 0)), where)
    return {"OUT_CVT_SCALE": FP32TOFP16 | scale, "OUT_CVT_SHIFT": MINUS_EXP << 12 | shift}


def as_the_vendor_scales_it(values: Values, where: str) -> Values:
    """npuemu's fp16 LUT conv with its factor t as the vendor words hold it, in RK3588 words (the round trip's
    expectation): EW multiplier by SCALE x 2^-SHIFT and MINUS_EXP 15 - or, for a factor of exactly 2^-15, the
    twin's EW_CFG 0x302 with no operand."""
    words = vendor_out_cvt(values, where)
    return {**values, **_rk3588_words(words["OUT_CVT_SCALE"] & 0xFFFF, words["OUT_CVT_SHIFT"] & SHIFT_MAX)}


def _rk3588_words(scale: int, shift: int) -> dict[tuple[str, str], int]:
    unit = scale == 1 << shift
    return {("DPU", "EW_CFG"): TWIN_EW if unit else EW_MUL,
            ("DPU", "EW_OP_VALUE_0"): 0 if unit else _bits(factor_of(scale, shift)),
            ("DPU", "OUT_CVT_SCALE"): FP32TOFP16 | 1, ("DPU", "OUT_CVT_SHIFT"): MINUS_EXP << 12}


# --- vendor -> RK3588 form (the translation) ----------------------------------------------------


def _vendor_scale(task: VendorTask) -> tuple[int, int]:
    scale, shift = task.field("DPU", "OUT_CVT_SCALE", "OUT_CVT_SCALE"), task.field("DPU", "OUT_CVT_SHIFT",
                                                                                  "OUT_CVT_SHIFT")
    if (task.field("DPU", "OUT_CVT_SHIFT", "MINUS_EXP") != MINUS_EXP or not SCALE_LOW <= scale < SCALE_HIGH
            or task.field("DPU", "OUT_CVT_SCALE", "FP32TOFP16_EN") != 1 or task.field("DPU", "OUT_CVT_SHIFT",
                                                                                     "CVT_TYPE")):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 fp16 LUT task with OUT_CVT_SCALE "
                                      f"{task.raw('DPU', 'OUT_CVT_SCALE'):#x}, OUT_CVT_SHIFT "
                                      f"{task.raw('DPU', 'OUT_CVT_SHIFT'):#x}: only MINUS_EXP {MINUS_EXP} with a "
                                      f"15-bit scale is decoded (emulator/REGISTER_SEMANTICS.md 50)")
    return scale, shift


def rk3588_out_specs(task: VendorTask, specs: list[Spec]) -> list[Spec]:
    """``specs`` (rk3576_forms.rk3588_specs of a vendor fp16 LUT conv) with its EW stage and OUT_CVT in RK3588
    words: the factor SCALE x 2^-SHIFT as the EW multiplier (none when 1) and MINUS_EXP kept (module doc)."""
    words = _rk3588_words(*_vendor_scale(task))
    replaced = {name: {"raw": value} for (_, name), value in words.items()}
    return [(block, name, replaced[name]) if block == "DPU" and name in replaced else (block, name, fields)
            for block, name, fields in specs]
