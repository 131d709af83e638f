"""Element-wise layers -> one DPU-only task in flying mode (rep09).

The first input streams through MRDMA into BS, which removes its zero point and scales it
(ALU -zp_a, MUL 16384, shift 0); the second arrives per pixel through ERDMA and the EW
operand converter brings it into the same unit; the EW ALU combines them (add 2, minus 4,
max 0, min 1; ``mul`` uses the EW multiplier, OP_TYPE 1 [I]); OUT_CVT requantizes
(``quant_regs.eltwise_requant``). ReLU / clip(0, hi) follow in the EW stage [I] (the vendor's
DPU-only Relu layer uses BS ReLU; here BS must stay linear because EW comes after it).

float16 [I]: BS bypassed, EW operand converter bypassed, OUT_CVT converts fp32 -> fp16.

A second input of shape (1, H, W) broadcast over the channels is first replicated across the
lanes of one surface by a conv task (broadcast_lanes.py, LOWERING.md 16). A second input of
shape (C, 1, 1) - the SE block's gate - is read by the ERDMA's per-channel mode: ERDMA_DATA_MODE
and EW_DATA_MODE 0, EW_SURF_STRIDE = the gate's surface stride, one task (the vendor's se_gate
Mul, rknn-fixtures-ops se_gate_int8/se_gate_fp16 task 5; LOWERING.md 17). Sub with the gate
first (gate - map) keeps that form and negates the map in BS instead: EW ALU add, BS MUL the
negated int8 multiplier or fp16 -1.0 (LOWERING.md 33.2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from npuemu.isa.errors import CompileError
from npuemu.platforms.model import Platform

from .. import quant_regs
from .broadcast_lanes import replicate_tasks
from .descriptions import (
    ALU_ADD, ALU_MAX, ALU_MIN, ALU_MINUS, PRECISION_CODES, ConvTask, DpuCube, DpuStages, DpuTask, EwStage, Operand, OutCvt,
    XStage,
)
from .layers import FLOAT16, ActivationLayer, ConcatLayer, EltwiseLayer, SliceLayer
from .lower_conv import activation_x_stage, lut_stages, lut_stages_fp16
from .lookup import check_feature, joined_placements, tensor, unpacked_pair
from .placement import Placement, align

EW_ALU = {"add": ALU_ADD, "sub": ALU_MINUS, "max": ALU_MAX, "min": ALU_MIN, "mul": ALU_ADD}
EW_OP_MUL = 1
#: fp16 bits of -1.0: the BS multiplier that negates the map of a gate-first Sub (NUMERICS.md 4.6)
FP16_MINUS_ONE = 0xBC00
#: EW_DATA_MODE / ERDMA_DATA_MODE: 1 a per-pixel operand cube (rep09, rep12), 0 one operand per
#: channel (se_gate_int8 task 5: EW_CFG 0x804002c4, ERDMA_CFG 0x4; se_gate_fp16: 0x008003c4, 0x8)
PER_PIXEL, PER_CHANNEL = 1, 0


def _activation(layer: EltwiseLayer, unit: float) -> dict:
    kind = layer.activation.kind
    if kind == "none":
        return {}
    low, high = layer.activation.bounds
    if kind == "leaky_relu" or low != 0.0:
        raise CompileError(f"layer {layer.name}: element-wise layers fuse only relu/relu6/clip(0, hi), got {kind}")
    return dict(relu=True, relux=high is not None,
                relux_value=quant_regs.activation_threshold(high, unit, layer.dtype) if high is not None else 0)


def eltwise_stages(layer: EltwiseLayer) -> DpuStages:
    """``gate_first`` (gate - map): the map -(a) from BS, the gate added by the EW ALU. [V] the
    vendor's own Sub negates an operand by a signed scale and adds (EW_OP_CVT_SCALE -16384 with
    EW ALU add, rk3588 int8 Sub built with rknn-toolkit2 2.5.0); the ERDMA's per-channel gate
    cannot be the negated one, so the BS multiplier carries the sign [I] (LOWERING.md 33.2)."""
    op_type = EW_OP_MUL if layer.op == "mul" else 0
    mode = PER_CHANNEL if layer.channel_gate else PER_PIXEL
    alu = ALU_ADD if layer.gate_first else EW_ALU[layer.op]
    if layer.dtype == FLOAT16:
        ew = EwStage(bypass=False, op_bypass=False, op_from_dma=True, op_type=op_type, alu_algo=alu,
                     data_mode=mode, data_size=2, **_activation(layer, 1.0))
        bs = XStage(bypass=False, mul_bypass=False, mul_operand=FP16_MINUS_ONE) if layer.gate_first else XStage()
        return DpuStages(bs=bs, ew=ew, out_cvt=OutCvt(fp32_to_fp16=True))
    (a, b), out = layer.input_quants, layer.output_quant
    requant = quant_regs.eltwise_requant(layer.op, a.scale, a.zero_point, b.scale, b.zero_point, out.scale,
                                         out.zero_point, layer.name)
    bs_mul = -requant.bs_mul if layer.gate_first else requant.bs_mul  # |mul| < 2^15: its negation fits the field
    bs = XStage(bypass=False, alu_bypass=False, alu_algo=ALU_ADD, alu_operand=requant.bs_alu,
                mul_bypass=False, mul_operand=bs_mul, mul_shift=requant.bs_mul_shift)
    ew = EwStage(bypass=False, op_bypass=False, op_from_dma=True, op_type=op_type, alu_algo=alu,
                 cvt_bypass=False, cvt_offset=requant.ew.offset, cvt_scale=requant.ew.scale,
                 cvt_shift=requant.ew.shift, data_mode=mode, data_size=1, **_activation(layer, requant.acc_scale))
    out_cvt = OutCvt(scale=requant.out_cvt.scale, shift=requant.out_cvt.shift, offset=requant.out_offset)
    return DpuStages(bs=bs, ew=ew, out_cvt=out_cvt)


def _written_cube(shape: tuple[int, int, int], out, dtype: str, dst_address: int | None = None) -> DpuCube:
    """The cube a DPU-only task processes and writes: ``shape`` (C, H, W) into ``out``'s surfaces
    (channels padded to its C2, one surface per pass)."""
    channels, height, width = shape
    return DpuCube(width=width, height=height, channels=align(channels, out.c2), orig_channels=channels,
                   dst_address=out.address if dst_address is None else dst_address,
                   dst_surface_stride=out.surface_stride_atoms, surfaces_per_pass=1, precision=PRECISION_CODES[dtype])


def lower_eltwise(layer: EltwiseLayer, placements: Mapping[str, Placement],
                  platform: Platform) -> tuple[ConvTask | DpuTask, ...]:
    """One DPU-only task; with a broadcast second input, the lane-replicating conv before it
    (broadcast_lanes.py) and the operand's one surface read for every surface (EW_SURF_STRIDE 0);
    a (C, 1, 1) gate is read as it is stored, its 1-atom surfaces EW_SURF_STRIDE apart."""
    names = (*layer.inputs, layer.output)
    first, second, out = (tensor(placements, name, layer.name) for name in names)
    for what, name, placement in zip(("first input", "second input", "output"), names, (first, second, out)):
        check_feature(placement, layer.shapes[name], layer.dtype, what, layer.name)
    if first.packed or second.packed or out.packed:
        raise CompileError(f"layer {layer.name}: element-wise layers need NC1HWC2 tensors, not packed images")
    cube = _written_cube(layer.shape, out, layer.dtype)
    if layer.broadcast is None:
        helpers, operand = (), Operand(second.address, second.surface_stride_atoms)
    else:
        helpers = replicate_tasks(layer, placements, platform)
        operand = Operand(tensor(placements, layer.broadcast.tensor, layer.name).address, 0)
    return (*helpers, DpuTask(layer.name, first.address, first.surface_stride_atoms, cube, eltwise_stages(layer),
                              operand))


def lower_activation(layer: ActivationLayer, placements: Mapping[str, Placement], platform: Platform) -> tuple[DpuTask, ...]:
    """A standalone LUT activation: one DPU-only task that uploads its LUT and runs BN (remove the
    input zero point, scale onto the LUT inputs) -> LUT -> OUT_CVT, as rep10 (which uploads in a
    task of its own; here the upload words precede the op in the same task, LOWERING.md)."""
    source = tensor(placements, layer.input, layer.name)
    out = tensor(placements, layer.output, layer.name)
    for what, placement in (("input", source), ("output", out)):
        check_feature(placement, layer.shape, layer.dtype, what, layer.name)
        if placement.packed:
            raise CompileError(f"layer {layer.name}: a LUT activation needs NC1HWC2 tensors, not packed images")
    cube = _written_cube(layer.shape, out, layer.dtype)
    return (DpuTask(layer.name, source.address, source.surface_stride_atoms, cube, activation_stages(layer),
                    lut_upload=layer.activation.uses_lut),)


def activation_stages(layer: ActivationLayer) -> DpuStages:
    """The DPU stages of a standalone activation: a LUT, or plain ReLU/Clip/LeakyRelu."""
    if layer.activation.uses_lut and layer.dtype == FLOAT16:  # BS bypassed: fp16 values go straight to BN
        return lut_stages_fp16(layer.name, layer.activation, XStage())
    if layer.activation.uses_lut:
        return lut_stages(layer.name, layer.activation, layer.input_quant.scale, layer.output_quant, XStage(),
                          bn_alu=-layer.input_quant.zero_point)
    return _plain_activation_stages(layer)


def _plain_activation_stages(layer: ActivationLayer) -> DpuStages:
    """ReLU / clip / LeakyRelu alone: the requantizing copy of concat_stages (BS removes the zero
    point in units s_in / 2^14), with the activation in the BN stage in those units (as a conv's
    BN stage does, lower_conv.activation_x_stage). float16: BS bypassed, the BN stage of a float16
    conv (fp32 bounds, LeakyRelu's fp16 slope), OUT_CVT rounding to fp16 once (LOWERING.md 28)."""
    if layer.dtype == FLOAT16:
        return DpuStages(bs=XStage(), bn=activation_x_stage(layer.name, layer.activation, 1.0, FLOAT16),
                         out_cvt=OutCvt(fp32_to_fp16=True))
    unit = layer.input_quant.scale / quant_regs.BS_MUL_ONE  # eltwise_requant's BS unit (s_b = s_a)
    stages = concat_stages(layer.input_quant, layer.output_quant, layer.name)
    return dataclasses.replace(stages, bn=activation_x_stage(layer.name, layer.activation, unit, "int8"))


def concat_stages(input_quant, output_quant, layer: str) -> DpuStages:
    """Requantizing copy: BS removes the zero point in units s_in / 2^14 (as rep09's first
    operand), OUT_CVT scales to the output."""
    requant = quant_regs.eltwise_requant("add", input_quant.scale, input_quant.zero_point, input_quant.scale,
                                         input_quant.zero_point, output_quant.scale, output_quant.zero_point, layer)
    bs = XStage(bypass=False, alu_bypass=False, alu_algo=ALU_ADD, alu_operand=requant.bs_alu,
                mul_bypass=False, mul_operand=requant.bs_mul, mul_shift=requant.bs_mul_shift)
    out_cvt = OutCvt(scale=requant.out_cvt.scale, shift=requant.out_cvt.shift, offset=requant.out_offset)
    return DpuStages(bs=bs, out_cvt=out_cvt)


def lower_concat(layer: ConcatLayer, placements: Mapping[str, Placement], platform: Platform) -> tuple[DpuTask, ...]:
    """One DPU-only task per input, writing its channels at the output's surface for its first
    channel (the vendor lists Concat among the DPU-only layers; vendor-corpus README 4)."""
    out, sources = joined_placements(layer, placements, "concat")
    tasks, start = [], 0
    for index, (source, shape, quant) in enumerate(sources):
        if start % out.c2:
            raise CompileError(f"layer {layer.name}: input {index} starts at channel {start}, not on a {out.c2}-channel "
                               f"surface of the output; only the last input may end part-way through a surface")
        cube = _written_cube(shape, out, layer.dtype, out.address + (start // out.c2) * out.surface_bytes)
        tasks.append(DpuTask(layer.name, source.address, source.surface_stride_atoms, cube,
                             copy_stages(quant, layer.output_quant, layer.name, layer.dtype)))
        start += shape[0]
    return tuple(tasks)


def lower_slice(layer: SliceLayer, placements: Mapping[str, Placement], platform: Platform) -> tuple[DpuTask, ...]:
    """One DPU-only task reading the input's surfaces from the slice's first channel group (the
    slice must start on a C2 surface) and writing them, requantized, to the output."""
    source, out = unpacked_pair(layer, placements, "a channel slice")
    if layer.start % source.c2:
        raise CompileError(f"layer {layer.name}: the slice starts at channel {layer.start}, not on a "
                           f"{source.c2}-channel surface of the input")
    cube = _written_cube(layer.output_shape, out, layer.dtype)
    address = source.address + (layer.start // source.c2) * source.surface_bytes
    stages = copy_stages(layer.input_quant, layer.output_quant, layer.name, layer.dtype)
    return (DpuTask(layer.name, address, source.surface_stride_atoms, cube, stages),)


def copy_stages(input_quant, output_quant, layer: str, dtype: str) -> DpuStages:
    """A Concat input's or Split output's copy: float16 a plain copy (fp16 -> fp32 -> fp16 is
    exact), int8 the requantizing copy of concat_stages."""
    if dtype == FLOAT16:
        return DpuStages(out_cvt=OutCvt(fp32_to_fp16=True))
    return concat_stages(input_quant, output_quant, layer)
