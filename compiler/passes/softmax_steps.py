"""The pairwise channel steps both float16 softmax chains share (lower_softmax.py, LOWERING.md
22.2; softmax_wide.py, 25): at step k (w = 2^k) channel i combines itself with channel i + w, so
after ceil(log2 C) steps channel 0 holds the reduction over all C channels."""

from __future__ import annotations

import math

import numpy as np

from ..ir import QuantParams

NO_PARTNER_BIAS = -1.0e4  # relu(-1e4) = 0; softplus(-1e4) reads its LUT's end entry: (almost) no change
FLOAT16 = QuantParams("float16", 1.0, 0)


def steps(channels: int) -> int:
    """The pairwise steps that reduce ``channels`` channels into channel 0."""
    return max(0, math.ceil(math.log2(channels))) if channels > 1 else 0


def step_weights(channels: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(weights [C, C, 1, 1], bias [C]) of step ``width``: t_i = L_{i+width} - L_i, or the
    no-partner bias where i + width >= C."""
    weights = np.zeros((channels, channels, 1, 1), np.float32)
    bias = np.zeros(channels, np.float32)
    for i in range(channels):
        if i + width < channels:
            weights[i, i + width, 0, 0], weights[i, i, 0, 0] = 1.0, -1.0
        else:
            bias[i] = NO_PARTNER_BIAS
    return weights, bias


__all__ = ["FLOAT16", "NO_PARTNER_BIAS", "step_weights", "steps"]
