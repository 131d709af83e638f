"""Reference PPU pooling on [C][H][W] (NUMERICS.md section 6)."""

from __future__ import annotations

import numpy as np

from tests.emulator.reference.arithmetic import clamp, pool_average


def pool(x: np.ndarray, cfg: dict, bounds) -> np.ndarray:
    channels, height, width = x.shape
    out = np.zeros((channels, cfg["out_h"], cfg["out_w"]), np.int64)
    for c in range(channels):
        for oy in range(cfg["out_h"]):
            for ox in range(cfg["out_w"]):
                inside, padding = [], 0
                for ky in range(cfg["kernel_h"]):
                    for kx in range(cfg["kernel_w"]):
                        y = oy * cfg["stride_y"] + ky - cfg["pad_top"]
                        xx = ox * cfg["stride_x"] + kx - cfg["pad_left"]
                        if 0 <= y < height and 0 <= xx < width:
                            inside.append(int(x[c, y, xx]))
                        else:
                            padding += 1
                if cfg["method"] == 0:
                    total = sum(inside) + padding * cfg["pad_value"]
                    out[c, oy, ox] = pool_average(total, cfg["recip_w"], cfg["recip_h"], bounds)
                elif not inside:
                    out[c, oy, ox] = clamp(cfg["pad_value"], bounds)
                else:
                    out[c, oy, ox] = max(inside) if cfg["method"] == 1 else min(inside)
    return out


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
