"""DataConvert -> one DPU-only task converting between int8 and fp16 storage (LOWERING.md 26).

The vendor programs both directions as a flying-mode DPU task whose processing precision is
the input's and whose output precision is the other (rknn-fixtures-ops layernorm_int8):

- **int8 -> fp16** [V] task 6: PROC/IN int8, OUT fp16; BS bypassed, BN ALU add -zp, OUT_CVT
  scale s_in x 2^(SHIFT + MINUS_EXP) with FP32TOFP16_EN. Ours: the same BN, OUT_CVT SCALE M
  (15 bits, 16384 <= M < 32768), SHIFT 0, MINUS_EXP E with M x 2^-E ~ s. SHIFT 0 keeps the
  integer stage exact (|q - zp| x M < 2^23), so the only rounding is the one to fp16 (the vendor
  splits the exponent 6 + 14, which under an integer-shift reading rounds twice) [C].
- **fp16 -> int8** [V] task 23: PROC/IN fp16, OUT int8; BS MUL fp16(1/s), BN ALU add zp, OUT_CVT
  identity. Ours splits 1/s over the two 16-bit fp16 multipliers (BS MUL a, BN MUL b, the pair
  of fp16 values whose product is closest to 1/s), so 1/s is carried to ~21 bits instead of 11:
  the vendor's one fp16 factor moves x / s by up to |x / s| 2^-12, i.e. a value within 0.03 of a
  rounding tie near +-127 by one LSB [C]. The fp32 result is rounded half to even
  (CVT_ROUND 0) and saturated (emulator/kernels/dpu_convert.py).

Channels: the cube is the fp16 side's C2 multiple (8 on RK3588), so neither side's surfaces are
read or written past the tensor's own (an int8 tensor's 16-lane surfaces hold both).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError
from npuemu.platforms.model import Platform

from .descriptions import ALU_ADD, OUT_PRECISION_CODES, PRECISION_CODES, DpuCube, DpuStages, DpuTask, OutCvt, XStage
from .layers import FLOAT16, INT8, Quant, SameShape
from .lookup import unpacked_pair
from .placement import Placement, align

#: OUT_CVT_SHIFT.MINUS_EXP is bits 19:12 (isa/regmaps/rk3588.yaml)
MINUS_EXP_MAX = 255
SCALE_BITS = 15  # OUT_CVT_SCALE is signed 16-bit: M < 2^15


@dataclass(frozen=True)
class ConvertLayer(SameShape):
    """int8 <-> float16 storage of one tensor: ``to`` the output's dtype, ``quant`` the int8 side's."""

    name: str
    input: str
    output: str
    shape: tuple[int, int, int]
    quant: Quant
    to: str  # "float16" (dequantize) or "int8" (quantize)

    def __post_init__(self) -> None:
        if self.to not in (INT8, FLOAT16):
            raise CompileError(f"layer {self.name}: DataConvert to {self.to!r}; expected int8 or float16")

    @property
    def source_dtype(self) -> str:
        return INT8 if self.to == FLOAT16 else FLOAT16


def dequantize_scale(scale: float, layer: str = "?") -> tuple[int, int]:
    """(M, E): M x 2^-E = ``scale`` to 15 bits, 2^14 <= M < 2^15, 0 <= E <= MINUS_EXP_MAX."""
    exponent = SCALE_BITS - 1 - math.floor(math.log2(scale))
    mantissa = math.floor(scale * 2.0 ** exponent + 0.5)
    if mantissa >= 1 << SCALE_BITS:
        mantissa, exponent = mantissa // 2, exponent - 1
    if not 0 <= exponent <= MINUS_EXP_MAX:
        raise CompileError(f"layer {layer}: int8 scale {scale} needs OUT_CVT MINUS_EXP {exponent}, outside "
                           f"0..{MINUS_EXP_MAX}")
    return mantissa, exponent


def quantize_factors(scale: float) -> tuple[np.float16, np.float16]:
    """(a, b): two fp16 factors whose product is 1 / ``scale`` to ~21 bits: a runs over the 1024
    fp16 values of [1, 2), b = fp16(1 / (scale a)), and the pair closest to 1 / scale wins (one
    fp16 factor alone carries 11 bits; a near-1 second factor would add one)."""
    inverse = 1.0 / scale
    firsts = (1.0 + np.arange(1024) / 1024.0).astype(np.float16)
    seconds = (inverse / firsts.astype(np.float64)).astype(np.float16)
    usable = np.isfinite(seconds) & (np.abs(seconds) >= np.float16(2.0 ** -14))
    if not usable.any():
        raise CompileError(f"int8 scale {scale}: 1/scale is outside the fp16 multipliers' range")
    error = np.abs(firsts.astype(np.float64) * seconds.astype(np.float64) - inverse)
    best = int(np.argmin(np.where(usable, error, np.inf)))
    return firsts[best], seconds[best]


def _fp16_bits(value: np.float16) -> int:
    return int(np.asarray(value, np.float16).view(np.uint16))


def _fp32_bits(value: float) -> int:
    """fp32 bits as the signed 32-bit operand field holds them (NUMERICS.md 4.6)."""
    return int(np.float32(value).view(np.int32))


def convert_stages(layer: ConvertLayer) -> DpuStages:
    if layer.to == FLOAT16:
        mantissa, exponent = dequantize_scale(layer.quant.scale, layer.name)
        bn = XStage(bypass=False, alu_bypass=False, alu_algo=ALU_ADD, alu_operand=-int(layer.quant.zero_point))
        return DpuStages(bn=bn, out_cvt=OutCvt(scale=mantissa, fp32_to_fp16=True, minus_exp=exponent))
    first, second = quantize_factors(layer.quant.scale)
    bs = XStage(bypass=False, mul_bypass=False, mul_operand=_fp16_bits(first))
    bn = XStage(bypass=False, mul_bypass=False, mul_operand=_fp16_bits(second), alu_bypass=False,
                alu_algo=ALU_ADD, alu_operand=_fp32_bits(float(layer.quant.zero_point)))
    return DpuStages(bs=bs, bn=bn, out_cvt=OutCvt())


def lower_convert(layer: ConvertLayer, placements: Mapping[str, Placement], platform: Platform) -> tuple[DpuTask, ...]:
    source, out = unpacked_pair(layer, placements, "a DataConvert", (layer.source_dtype, layer.to))
    half = out if layer.to == FLOAT16 else source
    channels, height, width = layer.shape
    cube = DpuCube(width=width, height=height, channels=align(channels, half.c2), orig_channels=channels,
                   dst_address=out.address, dst_surface_stride=out.surface_stride_atoms, surfaces_per_pass=1,
                   precision=PRECISION_CODES[layer.source_dtype], out_precision=OUT_PRECISION_CODES[layer.to])
    return (DpuTask(layer.name, source.address, source.surface_stride_atoms, cube, convert_stages(layer)),)
