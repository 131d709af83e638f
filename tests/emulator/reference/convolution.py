"""Reference convolution and window sums on NCHW (NUMERICS.md section 3), in int64 / float64."""

from __future__ import annotations

import numpy as np


def padded_input(x: np.ndarray, pad_top: int, pad_left: int, padded_h: int, padded_w: int,
                 pad_value, dtype=np.int64) -> np.ndarray:
    """Pad value everywhere, then the input copied in at (pad_top, pad_left), cropped."""
    channels, height, width = x.shape
    padded = np.full((channels, padded_h, padded_w), pad_value, dtype)
    rows = max(0, min(height, padded_h - pad_top))
    cols = max(0, min(width, padded_w - pad_left))
    padded[:, pad_top:pad_top + rows, pad_left:pad_left + cols] = x[:, :rows, :cols]
    return padded


def window(padded: np.ndarray, ky: int, kx: int, g: dict) -> np.ndarray:
    """All channels of `padded` at kernel tap (ky, kx) for every output pixel."""
    y0, x0 = ky * g["dilation_y"], kx * g["dilation_x"]
    return padded[:, y0:y0 + (g["out_h"] - 1) * g["stride_y"] + 1:g["stride_y"],
                  x0:x0 + (g["out_w"] - 1) * g["stride_x"] + 1:g["stride_x"]]


def conv(padded: np.ndarray, w: np.ndarray, g: dict, dtype=np.int64) -> np.ndarray:
    """out[o] = sum over the group's channels and taps of w * input, one tap at a time."""
    out_channels, group_inputs, kh, kw = w.shape
    per_group = out_channels // g["groups"]
    out = np.zeros((out_channels, g["out_h"], g["out_w"]), dtype)
    for o in range(out_channels):
        first = (o // per_group) * group_inputs
        for ky in range(kh):
            for kx in range(kw):
                taps = window(padded[first:first + group_inputs], ky, kx, g).astype(dtype)
                out[o] += np.tensordot(w[o, :, ky, kx].astype(dtype), taps, axes=(0, 0))
    return out


def window_sums(padded: np.ndarray, g: dict) -> np.ndarray:
    channels = padded.shape[0]
    per_group = channels // g["groups"]
    sums = np.zeros((g["groups"], g["out_h"], g["out_w"]), np.int64)
    for group in range(g["groups"]):
        part = padded[group * per_group:(group + 1) * per_group].astype(np.int64)
        for ky in range(g["kernel_h"]):
            for kx in range(g["kernel_w"]):
                sums[group] += window(part, ky, kx, g).sum(axis=0)
    return sums
