"""int16 x int16 convolution: the exLSTM's "Rubik" convs (REGISTER_SEMANTICS.md 38, NUMERICS.md 28).

[V: lstm_int8 / lstm_fp16 blocks 60.. (CNA CONV_CON1 IN = PROC = 1, CORE MISC_CFG PROC_PRECISION 1)]:
a 1 x 1 int16 cube of 8 channels (two int32 values split in halves, one 16-byte atom) times 16 one-hot
int16 kernels (RubikConvWeight, 256 bytes), plus an int32 bias (RubikConvBias_*) through BS, written as
16 int16: register words assembled for later blocks of the regcmd buffer.
[I] The MAC multiplies exact integers and sums them in int32 accumulators, as the int8 MAC (NUMERICS 3):
the products of two int16 fit 31 bits; the sum over the channels is taken exact here and wrapped to
32 bits. The feature atom holds 8 int16 lanes, the weights are fp16's blocking (2-byte elements,
isa/weight_layout FP16_CONV_RK3588: [K/16][C/8 atoms][kh][kw][16][8]), kernel group 16 as fp16 [I].
Only the forms seen run: 1 x 1 kernels, stride 1, no padding, not depthwise; the rest is refused by name.
"""

from __future__ import annotations

import numpy as np

from npuemu.isa.errors import EmulationError

#: kernels per MAC pass (2-byte elements, as fp16's) [I]
KERNEL_GROUP = 16


def check_int16_conv(kernel: tuple[int, int], stride: tuple[int, int], pads: tuple[int, int],
                     depthwise: bool, where: str) -> None:
    """Refuse the int16 forms no vendor stream shows."""
    if kernel != (1, 1) or stride != (1, 1) or any(pads) or depthwise:
        raise EmulationError(f"{where}: int16 x int16 convolution is modelled only as the exLSTM's 1 x 1, stride 1, "
                             f"unpadded, non-depthwise form; got kernel {kernel[0]}x{kernel[1]}, stride "
                             f"{stride[0]}x{stride[1]}, pad top/left {pads[0]}/{pads[1]}, depthwise {depthwise}")


def conv1x1_int16(feature: np.ndarray, in_channels: int, weights: np.ndarray,
                  out_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """feature [C1][H][W][C2] int16, weights [K][C][1][1] int16 -> (int32 accumulators [OC][H][W], the
    window sums int64 [1][H][W]: the input summed over its channels, for BS's CPEND term)."""
    c1, height, width, c2 = feature.shape
    planes = feature.transpose(0, 3, 1, 2).reshape(c1 * c2, height * width)[:in_channels].astype(np.int64)
    kernels = weights.reshape(weights.shape[0], -1)[:, :in_channels].astype(np.int64)
    acc = kernels @ planes                                        # exact: |sum| < 2^31 * channels
    wrapped = ((acc + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
    data = np.zeros((out_channels, height, width), np.int32)
    data[:wrapped.shape[0]] = wrapped.reshape(-1, height, width)[:out_channels]
    sums = planes.sum(axis=0).reshape(1, height, width)
    return data, sums
