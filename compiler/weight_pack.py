"""Constant blobs the CNA and the BRDMA read: packed weights and the per-channel BS operands.

The layouts themselves - block geometry, byte order, native shapes, the BS operand groups -
are stated once in ``npuemu.isa.weight_layout`` (with their sources), which the emulator
reads back with; this module is the compiler's side: which layout a layer gets, its input
checks (CompileError), and the operand values' placement.

**Blocking**: the vendor's where its streams show it - float16 direct convs store a partial
input group as 1, 2 or 4 atoms and an unpadded kernel tail on 16-kernel chips (LOWERING.md 34);
int8 as before (already the vendor's); depthwise tails unchanged (LOWERING.md 34, not landed).

**Padding values** (compiler choices): padded input channels of a conv hold the output
channel's weight zero point (so the MAC and CPEND terms cancel there, NUMERICS.md 3.1),
padded kernels and depthwise channels 0.

**BS operand blob** ("bias", VC 5): ``int32 ALU[8]``, ``int16 CPEND[8]``, ``int16 MUL[8]``
per 8 output channels, covering the channels the DPU writes (OC rounded up to 32, depthwise to
64: 256 bytes for 32 channels, 8192 for 1000). For float16 layers [C]: the fp32 bias bits in
the ALU slot alone, 32 bytes a group (MUL and CPEND are bypassed on the fp16 path,
BRDMA_DATA_USE 1).
"""

from __future__ import annotations

import numpy as np

from npuemu.isa import weight_layout as layout
from npuemu.isa.errors import CompileError
from npuemu.isa.weight_layout import (
    BS_GROUP_BYTES,
    BS_GROUP_CHANNELS,
    FP16_CONV,
    FP16_DEPTHWISE,
    INT4_CONV,
    INT8_CONV,
    INT8_DEPTHWISE,
    conv_native_shapes,
    depthwise_native_shapes,
)
from npuemu.isa.weight_layout import ConvWeightLayout as ConvBlocking
from npuemu.isa.weight_layout import DepthwiseWeightLayout as DepthwiseBlocking

__all__ = [
    "BS_GROUP_BYTES", "BS_GROUP_CHANNELS", "ConvBlocking", "DepthwiseBlocking", "FLOAT_BS_CHANNEL_BYTES",
    "FP16_CONV", "FP16_DEPTHWISE", "INT4_CONV", "INT8_CONV", "INT8_DEPTHWISE", "bias_blob", "conv_blocking",
    "conv_native_shapes", "depthwise_blocking", "depthwise_native_shapes", "float_bias_blob",
    "pack_conv_weights", "pack_depthwise_weights", "unpack_bias_blob",
]

#: fp16 layers fetch one fp32 ALU operand per channel
FLOAT_BS_CHANNEL_BYTES = layout.bs_group_dtype(layout.BS_USE_ALU).itemsize // BS_GROUP_CHANNELS


def conv_blocking(dtype: str, kernels_per_pass: int | None = None) -> ConvBlocking:
    """The weight blocking of a direct conv. ``kernels_per_pass``: the chip's MAC-array kernel
    group (Platform.atom_k) when it differs from RK3588's (32 int8, 16 fp16); see
    ConvWeightLayout.with_kernel_group."""
    base = FP16_CONV if dtype == "float16" else INT8_CONV
    return base.with_kernel_group(kernels_per_pass)


def depthwise_blocking(dtype: str) -> DepthwiseBlocking:
    return FP16_DEPTHWISE if dtype == "float16" else INT8_DEPTHWISE


def pack_conv_weights(weights: np.ndarray, input_fill: np.ndarray | int = 0,
                      blocking: ConvBlocking = INT8_CONV) -> np.ndarray:
    """[OC][IC][KH][KW] -> the flat blob (same dtype); padded input channels hold
    ``input_fill`` (per output channel: the weight zero points), padded kernels 0."""
    weights = np.asarray(weights)
    if weights.ndim != 4:
        raise CompileError(f"conv weights must be [OC][IC][KH][KW], got shape {weights.shape}")
    return layout.pack_conv_weights(weights, blocking, input_fill)


def pack_depthwise_weights(weights: np.ndarray, blocking: DepthwiseBlocking = INT8_DEPTHWISE) -> np.ndarray:
    """[C][1][KH][KW] -> the flat depthwise blob; padded channels 0."""
    weights = np.asarray(weights)
    if weights.ndim != 4 or weights.shape[1] != 1:
        raise CompileError(f"depthwise weights must be [C][1][KH][KW], got shape {weights.shape}")
    return layout.pack_depthwise_weights(weights, blocking)


def _check_room(channels: int, count: int) -> None:
    if channels < count:
        raise CompileError(f"bias blob for {channels} channels cannot hold {count} operands")


def bias_blob(alu: np.ndarray, cpend: np.ndarray, mul: np.ndarray, channels: int) -> bytes:
    """The BS operand blob for ``channels`` DPU channels (>= len(alu); padding channels 0)."""
    count = np.asarray(alu).size
    _check_room(channels, count)
    groups = layout.bs_groups(channels)
    operands = np.zeros(groups, dtype=layout.bs_group_dtype(layout.BS_USE_ALL))
    for name, values in (("ALU", alu), ("CPEND", cpend), ("MUL", mul)):
        flat = np.zeros(groups * BS_GROUP_CHANNELS, dtype=operands.dtype[name].base)
        flat[:count] = np.asarray(values).reshape(-1)
        operands[name] = flat.reshape(groups, BS_GROUP_CHANNELS)
    return operands.tobytes()


def float_bias_blob(bias: np.ndarray | None, out_channels: int, channels: int) -> bytes:
    """float16 layers: only the ALU operand is fetched (BRDMA_DATA_USE 1), so each 8-channel group
    holds 8 fp32 bias bit patterns, 32 bytes [C] (the emulator reads the groups BRDMA_DATA_USE
    selects, REGISTER_SEMANTICS; NUMERICS.md 4.6)."""
    values = np.zeros(out_channels, dtype=np.float32) if bias is None else np.asarray(bias, dtype=np.float32)
    _check_room(channels, values.size)
    padded = np.zeros(layout.bs_groups(channels) * BS_GROUP_CHANNELS, "<f4")
    padded[:values.size] = values.reshape(-1)
    return padded.tobytes()


def unpack_bias_blob(blob: bytes, channels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ALU, CPEND, MUL) of the first ``channels`` channels (tests, reports)."""
    operands = np.frombuffer(blob, dtype=layout.bs_group_dtype(layout.BS_USE_ALL), count=layout.bs_groups(channels))
    return tuple(operands[name].reshape(-1)[:channels].copy() for name in ("ALU", "CPEND", "MUL"))  # type: ignore[return-value]
