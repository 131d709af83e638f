"""The CNA's bf16 convolution (CNA IN_PRECISION = PROC_PRECISION = CORE PROC_PRECISION = 3;
REGISTER_SEMANTICS.md 37, NUMERICS.md 27).

The vendor's exNorm sums the squared deviations with a 1x1 bf16 conv of one kernel of 1.0 (0x3f80)
over 120 channels [V: rknn-fixtures-ops layernorm_fp16 task 9 / layernorm_int8 task 10, weights
``rm_bf16_weight`` bfloat16 [1,120,1,1], native [1,4,1,1,1,32], 256 bytes]. Its memory forms are
fp16's: 2-byte elements, C2 8, the same weight blocking (the fp16 twin ``rm_fp16_weight`` has the
same native shape and size) - so the CNA decodes a bf16 conv as an fp16 one whose 16-bit words are
bf16 (``Bf16ConvState``, a distinct type: never equal to an fp16 state of the same fields), and only
the MAC reads them differently: bf16 x bf16 products are exact in fp32 (8 x 8 significant bits) and
are summed in fp32, as fp16's (NUMERICS.md 3.3) [C: no stream shows the adder's order]; a NaN sum is the
canonical NaN, as on the fp16 paths (``canonical_nan``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from npuemu.emulator.kernels.canonical_nan import canonical_rows
from npuemu.emulator.kernels.dpu_bf16 import bf16_bits_to_fp32
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.units.state import BF16, FP16, ConvState
from npuemu.isa.errors import EmulationError


@dataclasses.dataclass(frozen=True)
class Bf16ConvState(ConvState):
    """A ConvState whose fp16-laid-out features and weights hold bf16 words."""


def is_bf16_pair(feature: int, weight: int, core_precision: int) -> bool:
    return feature == weight == core_precision == BF16


def carrier_precisions() -> tuple[int, int, int]:
    """(MAC, feature, weight) precisions the bf16 conv is decoded with: fp16's memory forms."""
    return FP16, FP16, FP16


def mark(state: ConvState, where: str) -> Bf16ConvState:
    """The decoded fp16-form state as a bf16 conv; refuses what no bf16 stream shows."""
    if state.depthwise or state.pad_top or state.pad_left or state.pad_value or state.input_convert is not None \
            or state.argb_channels or state.decompress is not None:
        raise EmulationError(f"{where}: a bf16 convolution with depthwise mode, padding, a pad value, the input "
                             f"converter, image input or sparse weights is not modelled (the vendor's bf16 conv is "
                             f"a plain 1x1 conv)")
    return Bf16ConvState(**{field.name: getattr(state, field.name) for field in dataclasses.fields(ConvState)})


def is_bf16(state: ConvState) -> bool:
    return type(state) is Bf16ConvState


def conv2d_bf16(feature: np.ndarray, channels: int, weights: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
    """bf16 x bf16 convolution, fp32 sums -> float32 [OC][OH][OW]. ``feature``: [C1][H][W][C2] and
    ``weights``: [OC][IC][KH][KW], both 2-byte words (read as float16 by the fp16 forms) holding bf16.
    Direct form, no padding (``mark`` refuses it): out[o, y, x] = sum over c, ky, kx of
    x[c, y*sy + ky*dy, x*sx + kx*dx] * w[o, c, ky, kx], each product exact, summed tap by tap in fp32."""
    words = np.ascontiguousarray(feature).view(np.uint16)
    planes = bf16_bits_to_fp32(words.transpose(0, 3, 1, 2).reshape(-1, words.shape[1], words.shape[2])[:channels])
    kernel = bf16_bits_to_fp32(np.ascontiguousarray(weights).view(np.uint16))
    g = geometry
    if g.groups != 1:
        raise EmulationError(f"a grouped bf16 convolution ({g.groups} groups) is not modelled")
    out = np.zeros((kernel.shape[0], g.out_h, g.out_w), np.float32)
    for ky in range(g.kernel_h):
        for kx in range(g.kernel_w):
            y0, x0 = ky * g.dilation_y, kx * g.dilation_x
            window = planes[:, y0:y0 + (g.out_h - 1) * g.stride_y + 1:g.stride_y,
                            x0:x0 + (g.out_w - 1) * g.stride_x + 1:g.stride_x]
            if window.shape[1:] != (g.out_h, g.out_w):
                raise EmulationError(f"the bf16 convolution's output {g.out_w}x{g.out_h} reaches past its input")
            out += np.tensordot(kernel[:, :, ky, kx], window, axes=(1, 0)).astype(np.float32)
    canonical_rows(out.reshape(out.shape[0], -1))  # a NaN sum as the canonical NaN (NUMERICS.md 3.3)
    return out
