"""Reference PPU pooling on [C][H][W] (NUMERICS.md section 6). The integer pool is the
public testing kit's (``npuemu.tools.testing_reference.ppu_pool``); the fp16 one stays here."""

from __future__ import annotations

import numpy as np

from npuemu.tools.testing_reference import ppu_pool as pool  # noqa: F401 (the kit's int8 PPU reference)


def fp16_recip(bits: int) -> np.float32:
    """An fp16-mode RECIP field as fp32: the fp16 bits widened to fp32 bits (exponent + 112, mantissa << 13),
    exponent 31 kept as a number; subnormals scaled from the mantissa."""
    sign, exponent, mantissa = bits >> 15, (bits >> 10) & 0x1F, bits & 0x3FF
    if exponent == 0:
        return np.float32((-1.0) ** sign * mantissa / 2.0**24)
    return np.uint32((sign << 31) | ((exponent + 112) << 23) | (mantissa << 13)).view(np.float32)


def pool_float(x: np.ndarray, cfg: dict) -> np.ndarray:
    """fp16 average: fp32 sum in window order, times RECIP_W/2^16 then RECIP_H/2^16 in fp32, the RECIP
    fields fp16 bits whose exponent 31 is a number (2^16 / k; NUMERICS.md 38)."""
    channels, height, width = x.shape
    out = np.zeros((channels, cfg["out_h"], cfg["out_w"]), np.float32)
    rw, rh = fp16_recip(cfg["recip_w"]) / np.float32(65536), fp16_recip(cfg["recip_h"]) / np.float32(65536)
    for c in range(channels):
        for oy in range(cfg["out_h"]):
            for ox in range(cfg["out_w"]):
                total, values = np.float32(0), []
                for ky in range(cfg["kernel_h"]):
                    for kx in range(cfg["kernel_w"]):
                        y = oy * cfg["stride_y"] + ky - cfg["pad_top"]
                        xx = ox * cfg["stride_x"] + kx - cfg["pad_left"]
                        inside = 0 <= y < height and 0 <= xx < width
                        value = np.float32(x[c, y, xx]) if inside else np.float32(cfg["pad_value"])
                        total = np.float32(total + value)
                        if inside:
                            values.append(value)
                if cfg["method"] == 0:
                    out[c, oy, ox] = np.float32(np.float32(total * rw) * rh)
                elif not values:
                    out[c, oy, ox] = cfg["pad_value"]
                else:
                    out[c, oy, ox] = max(values) if cfg["method"] == 1 else min(values)
    return out.astype(np.float16)
