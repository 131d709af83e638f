"""The DPU's fp16 -> int16 output (DATA_FORMAT PROC_PRECISION fp16, OUT_PRECISION int16): the vendor's
Cast to int16 and exSoftmax13's exp step (REGISTER_SEMANTICS.md 35).

[V] two rk3588 fp16 builds of one ONNX Cast(to=INT16) on 1x16x4x8 (tests/data/vendor_dpu_modes,
cast_i16_*): one DPU task, BS MUL 1.0 (0x3c00), BN ALU add 0, OUT_CVT 1/0/0 with CVT_ROUND 0 and
FP32TOFP16_EN 1. The vendor simulator's output is the stage result truncated toward zero and
wrapped to 16 bits (33824 -> -31712, -907.5 -> -907): this reading gives it bit for bit on both
(values within +-2 and within +-60000). CVT_ROUND 1 and OUT_CVT other than the identity are not
in any build and are refused.
"""

from __future__ import annotations

import numpy as np

from npuemu.isa.errors import EmulationError


def fp_to_int16(data: np.ndarray, scale: int, shift: int, offset: int, round_bit: int, where: str) -> np.ndarray:
    """fp32 [C][H][W] after BS/BN/EW -> int16: truncated toward zero, wrapped modulo 2^16; NaN gives 0 [C]."""
    if (scale, shift, offset, round_bit) != (1, 0, 0, 0):
        raise EmulationError(f"{where}: DPU OUT_CVT SCALE={scale} SHIFT={shift} OFFSET={offset} CVT_ROUND={round_bit} "
                             f"with PROC_PRECISION fp16 and OUT_PRECISION int16 is not modelled (only 1/0/0, "
                             f"CVT_ROUND 0, the vendor's Cast and exSoftmax13 tasks)")
    values = np.trunc(np.asarray(data, np.float64))
    values = np.where(np.isfinite(values), values, 0.0)
    return np.mod(values, 65536.0).astype(np.int64).astype(np.uint16).view(np.int16)
