"""Reference PPU pooling on [C][H][W] (NUMERICS.md section 6). The integer pool is the
public testing kit's (``npuemu.tools.testing_reference.ppu_pool``); the fp16 one stays here."""

from __future__ import annotations

import numpy as np

from npuemu.tools.testing_reference import ppu_pool as pool  # noqa: F401 (the kit's int8 PPU reference)


def pool_float(x: np.ndarray, cfg: dict) -> np.ndarray:
    """fp16 average: fp32 sum in window order, times RECIP_W/2^16 then RECIP_H/2^16 in fp32."""
    channels, height, width = x.shape
    out = np.zeros((channels, cfg["out_h"], cfg["out_w"]), np.float32)
    rw, rh = np.float32(cfg["recip_w"] / 65536), np.float32(cfg["recip_h"] / 65536)
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
