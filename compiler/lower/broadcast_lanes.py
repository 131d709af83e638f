"""Element-wise layers with a (1, H, W) operand broadcast over C channels: lane replication.

The DPU has no channel broadcast: the ERDMA delivers the EW operand per pixel in NC1HWC2 atoms,
one value per lane (ERDMA_DATA_MODE 1; mode 0 gives one value per channel, the SE gate's broadcast,
LOWERING.md 17). So the layer takes
two tasks (LOWERING.md 16):

1. a 1x1 convolution 1 -> C2 kernels (C2 = the chip's lanes per atom for the dtype) with unit
   weights writes the operand into every lane of ONE surface, (C2, H, W) = ``broadcast.tensor``;
   its registers are an exact identity, built here as integers, not from float scales: int8 BS
   ALU 0, CPEND 0, MUL 1 with shift 0, OUT_CVT scale 1, shift 0, offset 0, so out = the stored
   input byte; float16 weights 1.0 and a 0.0 bias (x * 1 + 0 in fp32 is x, back to fp16 exactly);
2. the element-wise task of a same-shape layer (lower_eltwise), its ERDMA reading that surface
   for every output surface: EW_SURF_STRIDE = 0 (the emulator's read_surfaces re-reads, and
   counts, it per surface).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from npuemu.platforms.model import Platform

from .. import quant_regs, weight_pack
from .conv_geometry import kernels_per_pass, output_channel_align
from .descriptions import ConvTask
from .layers import FLOAT16, ConvLayer, EltwiseLayer, LaneBroadcast
from .lower_conv import ConvConstants, conv_constants, lower_conv
from .placement import PLATFORM_DTYPE, Placement, align


def lane_broadcast(output: str, dtype: str, platform: Platform) -> LaneBroadcast:
    """The lanes tensor of a broadcasting element-wise layer writing ``output``."""
    return LaneBroadcast(f"{output}_lanes", platform.c2(PLATFORM_DTYPE[dtype]))


def replicate_conv(layer: EltwiseLayer) -> ConvLayer:
    """The 1x1 conv 1 -> C2 of task 1 (its geometry; identity_constants gives its registers).
    It reads the layer's second input and writes the lanes tensor; tasks carry the layer's name."""
    broadcast = layer.broadcast
    _, height, width = layer.shape
    names = dict(weight_tensor=f"{layer.name}:lanes_weights", bias_tensor=f"{layer.name}:lanes_bias")
    if layer.dtype == FLOAT16:
        return ConvLayer(layer.name, layer.inputs[1], broadcast.tensor, (1, height, width),
                         np.ones((broadcast.lanes, 1, 1, 1), np.float16), bias=np.zeros(broadcast.lanes),
                         dtype=FLOAT16, **names)
    quant = layer.input_quants[1]  # the lanes hold the operand's own bytes: same quantization
    return ConvLayer(layer.name, layer.inputs[1], broadcast.tensor, (1, height, width),
                     np.ones((broadcast.lanes, 1, 1, 1), np.int8), weight_scale=np.ones(broadcast.lanes),
                     weight_zero_point=np.zeros(broadcast.lanes, np.int64), input_quant=quant, output_quant=quant,
                     **names)


def identity_constants(conv: ConvLayer, platform: Platform) -> ConvConstants:
    """The weight and BS blobs of the replicating conv, with identity requantization registers."""
    if conv.dtype == FLOAT16:
        return conv_constants(conv, platform)  # fp16 1.0 weights and a 0.0 bias: no quantization involved
    per_pass = kernels_per_pass(conv, platform)
    lanes = conv.out_channels
    weights = weight_pack.pack_conv_weights(np.asarray(conv.weights), 0, weight_pack.conv_blocking(conv.dtype, per_pass))
    requant = quant_regs.ConvRequant(
        alu=np.zeros(lanes, np.int32), cpend=np.zeros(lanes, np.int16), mul=np.ones(lanes, np.int16),
        out_cvt=quant_regs.FixedPoint(1, 0), out_offset=0, acc_scale=float(conv.input_quant.scale), mul_shift=0)
    channels = align(lanes, per_pass)
    bias = weight_pack.bias_blob(requant.alu, requant.cpend, requant.mul, channels)
    return ConvConstants(weights.astype(np.int8).tobytes(), bias, requant, channels)


def lanes_constants(layer, platform: Platform) -> dict[str, bytes]:
    """The replicating conv's blobs by name ({} for any other layer)."""
    if not isinstance(layer, EltwiseLayer) or layer.broadcast is None:
        return {}
    conv = replicate_conv(layer)
    constants = identity_constants(conv, platform)
    return {conv.weight_tensor: constants.weights, conv.bias_tensor: constants.bias}


def lanes_aligns(layers: Iterable, platform: Platform) -> dict[str, int]:
    """Channel multiple of each lanes tensor's allocation: the conv writes its kernels rounded up
    to a MAC pass (32 int8 kernels on RK3588: two surfaces allocated, one written)."""
    return {layer.broadcast.tensor: output_channel_align(replicate_conv(layer), platform)
            for layer in layers if isinstance(layer, EltwiseLayer) and layer.broadcast is not None}


def replicate_tasks(layer: EltwiseLayer, placements: Mapping[str, Placement], platform: Platform) -> tuple[ConvTask, ...]:
    """Task 1: the replicating conv, on one core."""
    conv = replicate_conv(layer)
    return lower_conv(conv, placements, platform, identity_constants(conv, platform))
