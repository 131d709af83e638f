"""Convolution (and FC) layers -> constant blobs and :class:`ConvTask` descriptions.

``conv_constants`` packs the weights and the BS operand blob (their sizes are needed by the
memory plan before anything has an address); ``lower_conv`` then cuts the layer into tasks
with the CBUF plan (``tiling.py``) and fills each task's geometry, addresses and DPU stages.

Per task (vendor listings rep01-rep06, rep11, rep12; tasks.csv):

- input address: the tensor base + first channel group's surface + first row x line bytes;
  output (and residual) address: + first output row x line bytes (+ the channel group);
  surface strides stay those of the whole tensors;
- depthwise channel groups also offset the weights (stored channels x taps) and the BS blob
  (8 bytes per channel: rep05 DCOMP_ADDR0 576, BS_BASE_ADDR 512);
- a packed first-layer image is read in ARGB mode: ARGB_IN = 7 + C, NONALIGN_DMA,
  GROUP_LINE_OFF, DATAIN_CHANNEL 16 (one int8 atom; 8 on RK356x), LINE_STRIDE = W (rep03).
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError
from npuemu.platforms.model import Platform

from .. import deconv_phases, quant_regs, sparse_weights, weight_pack
from . import interleave_bands, lut
from .conv_geometry import feature_grains, kernels_per_pass, pad_value, surfaces_per_pass
from .descriptions import (
    ALU_ADD, ALU_MAX, CONV_MODE_DEPTHWISE, CONV_MODE_DIRECT, OUT_PRECISION_CODES, PRECISION_CODES, ConvTask, DpuCube, DpuStages, EwStage,
    Operand, OutCvt, XStage,
)
from .layers import FLOAT16, ConvLayer, Quant
from .lookup import check_feature, constant, tensor
from .placement import ELEMENT_BYTES, PLATFORM_DTYPE, ConstPlacement, Placement, TensorPlacement, align
from .multicore import deal_to_cores
from .tiling import CbufRequest, TaskTile, entries_per_row, plan_cbuf

SURF_STRIDE_MASK = (1 << 28) - 1
EW_OP_MUL = 1  # EW_CFG.EW_OP_TYPE: the multiplier (NUMERICS.md 4.4)  # CNA DMA_CON2.SURF_STRIDE: 28 bits, wraps (rep11 writes -3)


@dataclass(frozen=True, eq=False)
class ConvConstants:
    """The two constant blobs of a convolution and (int8) the operands they were made from."""

    weights: bytes
    bias: bytes
    requant: quant_regs.ConvRequant | None
    dpu_channels: int  # channels the BS blob covers (output channels rounded per pass)
    sparse: sparse_weights.SparseStreams | None = None  # ``weights`` holds these streams (LOWERING.md 23)


def conv_constants(layer: ConvLayer, platform: Platform) -> ConvConstants:
    """Packed weights and the BS operand blob of ``layer``."""
    dpu_channels = align(layer.out_channels, kernels_per_pass(layer, platform))
    weights = np.asarray(layer.weights)
    if layer.dtype == FLOAT16:
        bits = weights.astype(np.float16).view(np.uint16)
        packed = (weight_pack.pack_depthwise_weights(bits, weight_pack.FP16_DEPTHWISE) if layer.depthwise
                  else weight_pack.pack_conv_weights(
                      bits, 0, weight_pack.conv_blocking(layer.dtype, kernels_per_pass(layer, platform))))
        bias = weight_pack.float_bias_blob(layer.bias, layer.out_channels, dpu_channels)
        return ConvConstants(packed.astype("<u2").tobytes(), bias, None, dpu_channels)
    zp_w = np.asarray(layer.weight_zero_point, dtype=np.int64)
    # a wide (int32) output is not requantized: OUT_CVT is the identity (conv_stages), so the
    # output scale only has to be valid
    out_q = layer.output_quant or Quant(float(layer.input_quant.scale) * float(np.max(layer.weight_scale)), 0)
    requant = quant_regs.conv_requant(
        input_scale=layer.input_quant.scale, input_zero_point=layer.input_quant.zero_point, weights=weights,
        weight_scale=layer.weight_scale, weight_zero_point=zp_w, bias=layer.bias,
        output_scale=out_q.scale, output_zero_point=out_q.zero_point,
        bias_in_accumulator_units=layer.bias_in_accumulator_units, layer=layer.name,
        scale_max=layer.requant_scale_max)
    if layer.depthwise:
        packed = weight_pack.pack_depthwise_weights(weights, weight_pack.INT8_DEPTHWISE)
    else:
        packed = weight_pack.pack_conv_weights(weights, zp_w.astype(np.int8),
                                               weight_pack.conv_blocking(layer.dtype, kernels_per_pass(layer, platform)))
    bias = weight_pack.bias_blob(requant.alu, requant.cpend, requant.mul, dpu_channels)
    blob = packed.astype(np.int8).tobytes()
    decision = sparse_weights.conv_decision(layer, platform)  # None unless --sparse
    if decision is not None and decision.mode is not None:
        streams = sparse_weights.sparse_streams(blob, layer.out_channels, decision.mode, weights)
        return ConvConstants(streams.data, bias, requant, dpu_channels, streams)
    return ConvConstants(blob, bias, requant, dpu_channels)


# -- DPU stages ------------------------------------------------------------------------------
def activation_x_stage(name: str, act, unit: float, dtype: str) -> XStage:
    """BN stage carrying ReLU / clip / leaky (VC 5 and tasks.csv: ConvRelu BN_CFG 0x12,
    ConvClip 0x92 with RELUX); ``unit`` is the real value of one step of the stage's input."""
    if act.kind == "none":
        return XStage()
    if act.kind == "leaky_relu":
        if dtype == FLOAT16:  # the 16-bit MUL field holds the fp16 bits of alpha [C] (NUMERICS.md 4.6)
            bits = int(np.float16(act.alpha).view(np.uint16))
            return XStage(bypass=False, mul_bypass=False, mul_operand=bits, mul_prelu=True)
        fixed = quant_regs.leaky_multiplier(act.alpha, name)
        return XStage(bypass=False, mul_bypass=False, mul_operand=fixed.scale, mul_shift=fixed.shift, mul_prelu=True)
    low, high = act.bounds
    relu = low == 0.0
    use_max = low is not None and not relu
    return XStage(bypass=False, relu=relu, relux=high is not None,
                  relux_value=quant_regs.activation_threshold(high, unit, dtype) if high is not None else 0,
                  alu_bypass=not use_max, alu_algo=ALU_MAX,
                  alu_operand=quant_regs.activation_threshold(low, unit, dtype) if use_max else 0)


def _residual_stage(layer: ConvLayer, requant: quant_regs.ConvRequant | None, after: bool) -> EwStage:
    residual = layer.residual
    relu = relux = False
    relux_value = 0
    if after and layer.activation.kind != "none":
        low, high = layer.activation.bounds
        if layer.activation.kind == "leaky_relu" or (low is not None and low != 0.0):
            raise CompileError(
                f"layer {layer.name}: after a residual add only relu/relu6/clip(0, hi) are fused "
                f"(the EW ALU does the add), got {layer.activation.kind} {layer.activation.bounds}"
            )
        relu, relux = True, high is not None
        unit = requant.acc_scale if requant else 1.0
        relux_value = quant_regs.activation_threshold(high, unit, layer.dtype) if high is not None else 0
    if layer.dtype == FLOAT16:
        return EwStage(bypass=False, op_bypass=False, op_from_dma=True, alu_algo=ALU_ADD, data_mode=1,
                       data_size=2, relu=relu, relux=relux, relux_value=relux_value)
    convert = quant_regs.residual_convert(residual.quant.scale, residual.quant.zero_point, requant.acc_scale,
                                          layer.name)
    return EwStage(bypass=False, op_bypass=False, op_from_dma=True, alu_algo=ALU_ADD, cvt_bypass=False,
                   cvt_offset=convert.offset, cvt_scale=convert.scale, cvt_shift=convert.shift, data_mode=1,
                   data_size=1, relu=relu, relux=relux, relux_value=relux_value)


def conv_stages(layer: ConvLayer, constants: ConvConstants) -> DpuStages:
    """BS (bias + per-channel requant), BN (activation), EW (residual), OUT_CVT."""
    requant = constants.requant
    activation_after_add = layer.residual is not None and not layer.residual.after_activation
    if layer.dtype == FLOAT16:
        bs = XStage(bypass=False, alu_bypass=False, alu_algo=ALU_ADD, alu_from_dma=True)
        out = OutCvt(scale=1, shift=0, offset=0, fp32_to_fp16=not layer.wide_output)
        unit = 1.0
    elif layer.wide_output:
        # int32 output: accumulator + bias + CPEND (the weight zero point's term), no BS MUL and
        # an identity OUT_CVT, so C is the exact sum in units of s_in * s_w[c] (LOWERING.md 12)
        bs = XStage(bypass=False, alu_bypass=False, alu_algo=ALU_ADD, alu_from_dma=True)
        out = OutCvt(scale=1, shift=0, offset=0)
        unit = requant.acc_scale
    else:
        bs = XStage(bypass=False, alu_bypass=False, alu_algo=ALU_ADD, alu_from_dma=True, mul_bypass=False,
                    mul_from_dma=True, mul_shift=requant.mul_shift)
        out = OutCvt(scale=requant.out_cvt.scale, shift=requant.out_cvt.shift, offset=requant.out_offset)
        unit = requant.acc_scale
    if layer.activation.uses_lut:
        return _lut_stages(layer, bs, unit)
    bn = XStage() if activation_after_add else activation_x_stage(layer.name, layer.activation, unit, layer.dtype)
    ew = _residual_stage(layer, requant, activation_after_add) if layer.residual else EwStage()
    return DpuStages(bs=bs, bn=bn, ew=ew, out_cvt=out, bs_cpend=layer.dtype != FLOAT16)


def lut_stages(layer_name: str, activation, unit: float, output_quant, bs: XStage, bn_alu: float = 0.0,
               residual=None, **stage_options) -> DpuStages:
    """BN maps the values (``unit`` each, after ``bs``) onto the LUT's inputs, the EW stage runs
    the LUT (then adds ``residual``, a Residual after the activation, if given), OUT_CVT maps
    table units to the int8 output (lut.py). ``bn_alu`` (in ``unit``s) is added before the
    scaling: a standalone activation's -zp_in."""
    value_range = None
    if residual is not None:  # act = out - residual: its range follows from the two int8 ranges
        out_q, res_q = output_quant, residual.quant
        value_range = (out_q.scale * (-128 - out_q.zero_point) - res_q.scale * (127 - res_q.zero_point),
                       out_q.scale * (127 - out_q.zero_point) - res_q.scale * (-128 - res_q.zero_point))
    program, to_lut, out_cvt = lut.lut_program(
        activation.kind, input_unit=unit, output_scale=output_quant.scale,
        output_zero_point=output_quant.zero_point, alpha=activation.alpha, beta=activation.beta,
        value_range=value_range, layer=layer_name)
    # BN: MUL first, then the ALU, then the shift (NUMERICS.md 4.2, rep10): the ALU operand is
    # in units of 2^-shift of the product, as rep10's -50550 = -zp_in * 25275.
    alu = int(round(bn_alu * to_lut.scale))
    bn = XStage(bypass=False, mul_bypass=False, mul_operand=to_lut.scale, mul_shift=to_lut.shift,
                alu_bypass=alu == 0, alu_algo=ALU_ADD, alu_operand=alu)
    ew = EwStage(bypass=False, op_bypass=True, lut=True)
    if residual is not None:  # the EW converter brings the residual into table units (as rep12 into BS units)
        convert = quant_regs.operand_convert(residual.quant.scale / program.output_unit, residual.quant.zero_point,
                                             f"layer {layer_name}: residual scale ratio s_r / LUT output unit")
        ew = EwStage(bypass=False, op_bypass=False, op_from_dma=True, alu_algo=ALU_ADD, cvt_bypass=False,
                     cvt_offset=convert.offset, cvt_scale=convert.scale, cvt_shift=convert.shift, data_mode=1,
                     data_size=1, lut=True)
    out = OutCvt(scale=out_cvt.scale, shift=out_cvt.shift, offset=output_quant.zero_point)
    return DpuStages(bs=bs, bn=bn, ew=ew, out_cvt=out, lut=program, **stage_options)


FP32_NEGATIVE_ZERO = -(1 << 31)  # 0x80000000 in the signed field: the vendor's fp16 LUT BN ALU operand, x + (-0.0) = x


def lut_stages_fp16(layer_name: str, activation, bs: XStage, **stage_options) -> DpuStages:
    """float16: BN multiplies the fp32 values by fp16(16384 / X) onto the LUT inputs and adds
    -0.0 (the vendor's BN_CFG 0x20040, BN_ALU_CFG 0x80000000, BN_MUL_CFG fp16 bits: fixtures'
    task 1), the EW stage runs the LUT, then its multiplier scales table units back to values
    by the fp32 EW_OP_VALUE t, OUT_CVT rounds to fp16. The vendor writes fp32 table units and
    rescales them in a second DPU task (two fp16 multipliers sqrt(t)); one task is our choice
    (LOWERING.md 4.1)."""
    program = lut.lut_fp16_program(activation.kind, activation.alpha, activation.beta, layer=layer_name)
    bn = XStage(bypass=False, mul_bypass=False, mul_operand=program.bn_mul_bits, alu_bypass=False,
                alu_algo=ALU_ADD, alu_operand=FP32_NEGATIVE_ZERO)
    t_bits = int(np.float32(program.output_unit).view(np.uint32))
    ew = EwStage(bypass=False, op_bypass=False, op_type=EW_OP_MUL, lut=True, op_value=t_bits)
    return DpuStages(bs=bs, bn=bn, ew=ew, out_cvt=OutCvt(fp32_to_fp16=True), lut=program.program, **stage_options)


def _lut_stages(layer: ConvLayer, bs: XStage, unit: float) -> DpuStages:
    if layer.dtype == FLOAT16:
        if layer.residual is not None or layer.wide_output:
            raise CompileError(f"layer {layer.name}: a float16 {layer.activation.kind} with a fused residual Add or "
                               "an fp32 output is not lowered (the EW multiplier scales the LUT's result; "
                               "build_adapt.split_lut_activation makes the Add a layer of its own)")
        return lut_stages_fp16(layer.name, layer.activation, bs)
    if layer.residual is not None and not layer.residual.after_activation:
        raise CompileError(f"layer {layer.name}: a LUT activation ({layer.activation.kind}) after a fused "
                           "residual Add is not lowered in one task (the LUT runs before the EW add)")
    return lut_stages(layer.name, layer.activation, unit, layer.output_quant, bs, residual=layer.residual,
                      bs_cpend=True)


# -- tasks -----------------------------------------------------------------------------------
def packed_image(inp: TensorPlacement) -> bool:
    """A 1-4 channel int8 image stored with C2 = C (read in ARGB mode): pixels narrower than the
    chip's atom (TensorPlacement.packed; RK3566/68's 8-byte int8 pixels are ordinary)."""
    return inp.packed and inp.dtype == "int8" and inp.c1 == 1 and inp.c2 == inp.channels <= 4


@dataclass(frozen=True)
class _ConvContext:
    layer: ConvLayer
    inp: TensorPlacement
    out: TensorPlacement
    residual: TensorPlacement | None
    weights: ConstPlacement
    bias: ConstPlacement
    constants: ConvConstants
    stages: DpuStages
    kernels_per_pass: int
    surfaces_per_pass: int


def _input_fields(ctx: _ConvContext, tile: TaskTile) -> dict:
    layer, inp = ctx.layer, ctx.inp
    rows, group = tile.rows, tile.channels
    element = ELEMENT_BYTES[layer.dtype]
    if packed_image(inp):
        line_stride, surface = inp.width, inp.surface_stride  # pixels (rep03)
        entries = rows.in_rows * align(inp.width, 16)
        in_channels = inp.atom_bytes  # one int8 atom: 16 (rep03); 8 on RK356x [C]
        grains = feature_grains(rows.in_rows, rows.pad_top, layer.effective_kernel[0], layer.stride[1], 0, True)
    else:
        # the chip's atoms; a DMA line spans 4 rows (GROUP_LINE_OFF 0)
        line_stride, surface = 4 * inp.line_stride_atoms, inp.surface_stride_atoms
        entries = entries_per_row(inp.width, group.count * element)
        in_channels = align(group.count, inp.c2)
        grains = feature_grains(rows.in_rows, rows.pad_top, layer.effective_kernel[0], layer.stride[1], entries, False)
    address = inp.address + (group.start // inp.c2) * inp.surface_bytes + rows.in_start * inp.line_bytes
    fields = dict(in_width=inp.width, in_height=rows.in_rows, in_channels=in_channels, in_channels_real=group.count,
                  feature_address=address, line_stride=line_stride,
                  surface_stride=(surface - line_stride) & SURF_STRIDE_MASK, data_entries=entries,
                  feature_grains=grains)
    window = deconv_phases.input_window(layer.interleave)
    return fields if window is None else _window_fields(ctx, tile, fields, window)


def _window_fields(ctx: _ConvContext, tile: TaskTile, fields: dict, window: tuple[int, int, int]) -> dict:
    """A column chunk's input (LOWERING.md 28): columns [first, first + width) of each row, read one
    row a DMA line (GROUP_LINE_OFF 1: LINE_STRIDE the row in atoms, SURF_STRIDE the surface less
    DATAIN_WIDTH), the form of the vendor's cropped-window 1x1 convs in its resnet18 build [V]
    (emulator/REGISTER_SEMANTICS.md 2.3: DATAIN_WIDTH 55 of 56, LINE_STRIDE 56, SURF_STRIDE 3081)."""
    inp, layer = ctx.inp, ctx.layer
    first, width, _ = window
    entries = entries_per_row(width, tile.channels.count * ELEMENT_BYTES[layer.dtype])
    grains = feature_grains(tile.rows.in_rows, tile.rows.pad_top, layer.effective_kernel[0], layer.stride[1],
                            entries, False)
    return dict(fields, in_width=width, feature_address=fields["feature_address"] + first * inp.pixel_bytes,
                line_stride=inp.line_stride_atoms,
                surface_stride=(inp.surface_stride_atoms - width) & SURF_STRIDE_MASK, data_entries=entries,
                feature_grains=grains, single_rows=True)


def _weight_fields(ctx: _ConvContext, tile: TaskTile) -> dict:
    layer = ctx.layer
    kernel_h, kernel_w = layer.kernel
    taps, element = kernel_h * kernel_w, ELEMENT_BYTES[layer.dtype]
    if layer.depthwise:
        blocking = weight_pack.depthwise_blocking(layer.dtype)
        stored = blocking.stored_channels(tile.channels.start + tile.channels.count) - tile.channels.start
        size = stored * taps * element
        return dict(kernels=1, weight_bytes=size, weight_bytes_per_kernel=size,
                    weight_address=ctx.weights.address + tile.channels.start * taps * element)
    blocking = weight_pack.conv_blocking(layer.dtype, ctx.kernels_per_pass)
    per_kernel = blocking.stored_channels(layer.in_channels) * taps * element
    sparse = ctx.constants.sparse
    if sparse is not None:  # the sizes count the kept half, as the vendor's (LOWERING.md 23)
        return dict(kernels=blocking.stored_kernels(layer.out_channels), weight_bytes=sparse.dense_bytes // 2,
                    weight_bytes_per_kernel=per_kernel // 2, weight_address=ctx.weights.address,
                    decompress=(sparse.control, sparse.amounts))
    return dict(kernels=blocking.stored_kernels(layer.out_channels), weight_bytes=len(ctx.constants.weights),
                weight_bytes_per_kernel=per_kernel, weight_address=ctx.weights.address)


def _output_fields(ctx: _ConvContext, tile: TaskTile) -> dict:
    layer, out = ctx.layer, ctx.out
    rows, group = tile.rows, tile.channels
    out_channels = group.count if layer.depthwise else layer.out_channels
    out_start = group.start if layer.depthwise else 0
    offset = (out_start // out.c2) * out.surface_bytes + rows.out_start * out.line_bytes
    width, per_pass, steps = out.width, ctx.surfaces_per_pass, None
    if layer.interleave and layer.interleave[0] == 1:  # stride 1: a window of rows, a plain write (LOWERING.md 41)
        offset += _row_window(layer, out) * out.line_bytes
    elif layer.interleave:  # phase (ry, rx) of s x s: every s-th pixel of every s-th row (LOWERING.md 13)
        width, per_pass, phase_offset, steps = deconv_phases.interleaved_write(
            layer.interleave, out.width, out.c2, min(out_channels, align(out_channels, ctx.kernels_per_pass)),
            per_pass, layer.name, residual=ctx.residual is not None)
        out_start += deconv_phases.first_channel(layer.interleave)  # a channel group (LOWERING.md 28)
        offset = (out_start // out.c2) * out.surface_bytes + rows.out_start * steps[1] * out.atom_bytes \
            + phase_offset * out.atom_bytes
    cube = DpuCube(width=width, height=rows.out_rows, channels=align(out_channels, ctx.kernels_per_pass),
                   orig_channels=out_channels, dst_address=out.address + offset,
                   dst_surface_stride=out.surface_stride_atoms, surfaces_per_pass=per_pass,
                   precision=PRECISION_CODES[layer.dtype],
                   out_precision=OUT_PRECISION_CODES[layer.output_dtype] if layer.wide_output else None,
                   interleave=steps)
    residual = None
    if ctx.residual is not None:
        res = ctx.residual
        res_offset = (out_start // res.c2) * res.surface_bytes + rows.out_start * res.line_bytes
        residual = Operand(res.address + res_offset, res.surface_stride_atoms)
    return dict(out_width=width, out_height=rows.out_rows, cube=cube, residual=residual,
                bias_address=ctx.bias.address + group.start * (
                    weight_pack.FLOAT_BS_CHANNEL_BYTES if layer.dtype == FLOAT16
                    else weight_pack.BS_GROUP_BYTES // weight_pack.BS_GROUP_CHANNELS))


def _row_window(layer: ConvLayer, out: TensorPlacement) -> int:
    """The first output row of a stride-1 "phase" (1, ry, 0, out_h, out_w) (deconv_phases.CROPPED
    with s = 1): the conv's rows land at rows ry.. of a taller output of its own width. A plain
    write at + ry lines with the whole tensor's surface stride places them, and unlike the
    interleaved write it takes a residual: lines are W atoms apart and no register holds an output
    line stride (REGISTER_SEMANTICS 3.3), so the widths must agree (ActMatMul's heads, LOWERING.md 41)."""
    _, ry, rx = layer.interleave[:3]
    rows, cols = layer.output_shape[1:]
    if len(layer.interleave) != deconv_phases.CROPPED or rx or cols != out.width or ry + rows > out.height:
        raise CompileError(f"layer {layer.name}: a stride-1 write window {list(layer.interleave)} must be rows "
                           f"(1, first row, 0, height, width) of an output as wide as the conv ({rows} x {cols} "
                           f"into {out.height} x {out.width})")
    return ry


def _conv_task(ctx: _ConvContext, tile: TaskTile, data_bank: int, weight_bank: int) -> ConvTask:
    layer = ctx.layer
    zero_point = layer.input_quant.zero_point if layer.input_quant else 0
    kernel_h, kernel_w = layer.kernel
    packed_channels = ctx.inp.channels if packed_image(ctx.inp) else 0
    return ConvTask(
        layer=layer.name, conv_mode=CONV_MODE_DEPTHWISE if layer.depthwise else CONV_MODE_DIRECT,
        precision=PRECISION_CODES[layer.dtype], argb_in=7 + packed_channels if packed_channels else 0,
        pad_top=tile.rows.pad_top, pad_left=layer.pads[1], pad_value=pad_value(zero_point, layer.depthwise),
        stride=(layer.stride[1], layer.stride[0]), dilation=(layer.dilation[1], layer.dilation[0]),
        kernel=(kernel_w, kernel_h), data_bank=data_bank, weight_bank=weight_bank,
        weight_reuse=tile.weight_reuse, stages=ctx.stages,
        **_input_fields(ctx, tile), **_weight_fields(ctx, tile), **_output_fields(ctx, tile),
    )


def _context(layer: ConvLayer, placements: Mapping[str, Placement], platform: Platform,
             constants: ConvConstants) -> _ConvContext:
    inp = tensor(placements, layer.input, layer.name)
    out = tensor(placements, layer.output, layer.name)
    check_feature(inp, deconv_phases.read_shape(layer.input_shape, layer.interleave), layer.dtype, "input", layer.name)
    check_feature(out, deconv_phases.written_shape(layer.output_shape, layer.interleave), layer.output_dtype,
                  "output", layer.name)
    per_pass = kernels_per_pass(layer, platform)
    if out.c1 * out.c2 < align(layer.out_channels, per_pass) + deconv_phases.first_channel(layer.interleave):
        raise CompileError(
            f"layer {layer.name}: output {out.name} holds {out.c1 * out.c2} channels but the DPU writes "
            f"{align(layer.out_channels, per_pass)} (output channels rounded up to {per_pass}); allocate it "
            f"with channel_align={per_pass}"
        )
    if packed_image(inp) and (layer.depthwise or layer.dtype == FLOAT16):
        raise CompileError(f"layer {layer.name}: a packed (ARGB) input needs an int8 direct convolution")
    residual = None
    if layer.residual is not None:
        residual = tensor(placements, layer.residual.tensor, layer.name)
        check_feature(residual, layer.output_shape, layer.dtype, "residual", layer.name)
        if residual.c1 * residual.c2 < align(layer.out_channels, per_pass):
            # the MRDMA/ERDMA pair reads whole 32-channel pairs of surfaces (COMB_USE 5)
            raise CompileError(
                f"layer {layer.name}: residual {residual.name} holds {residual.c1 * residual.c2} channels but "
                f"the residual read covers {align(layer.out_channels, per_pass)}; allocate it with "
                f"channel_align={per_pass}")
    return _ConvContext(
        layer, inp, out, residual,
        _weight_placement(layer, placements, platform, constants),
        constant(placements, layer.bias_tensor, len(constants.bias), layer.name),
        constants, conv_stages(layer, constants), per_pass, surfaces_per_pass(layer, platform))


def _weight_placement(layer: ConvLayer, placements: Mapping[str, Placement], platform: Platform,
                      constants: ConvConstants) -> ConstPlacement:
    """The weight blob: a constant, or (``weight_source``) the first pixels (in raster order: a
    surface's rows are contiguous) of a one-surface [C <= 8, H, W] feature map of H W >= kernels
    pixels an earlier task wrote: its float16 NC1HWC2 bytes are the blob of W[o][c] = map[c][o]
    (LOWERING.md 22.3)."""
    if not layer.weight_source:
        return constant(placements, layer.weight_tensor, len(constants.weights), layer.name)
    source = tensor(placements, layer.weight_source, layer.name)
    needed = len(constants.weights)
    blocking = weight_pack.conv_blocking(layer.dtype, kernels_per_pass(layer, platform))
    one_surface = source.dtype == FLOAT16 and source.channels == layer.in_channels and source.c2 == 8
    if blocking.ic_align != 8 or blocking.ic_block < 8 or not one_surface \
            or source.height * source.width * source.pixel_bytes < needed:
        raise CompileError(f"layer {layer.name}: feature map {source.name} ({source.dtype} {list(source.shape)}) is not "
                           f"the {needed}-byte weight blob of {layer.out_channels} kernels x {layer.in_channels} channels")
    return ConstPlacement(layer.weight_tensor, source.address, needed)


def cbuf_request(layer: ConvLayer, inp: TensorPlacement, platform: Platform, weight_bytes: int) -> CbufRequest:
    # depthwise channel groups start on a weight block (64 int8 / 32 fp16 channels): a group
    # address is the block's, so RK356x's 32-channel int8 alignment is not a split point
    group = max(platform.alignment(PLATFORM_DTYPE[layer.dtype]).depthwise,
                weight_pack.depthwise_blocking(layer.dtype).channel_block)
    return CbufRequest(
        layer=layer.name, height=inp.height, width=layer.input_shape[2], channels=inp.channels,
        element_bytes=ELEMENT_BYTES[layer.dtype], kernel_h=layer.effective_kernel[0], stride_y=layer.stride[0],
        pad_top=layer.pads[0], out_height=layer.output_shape[1], weight_bytes=weight_bytes,
        depthwise=layer.depthwise, depthwise_group=group,
        packed_channels=inp.channels if packed_image(inp) else 0, banks=platform.cbuf.banks,
        bank_bytes=platform.cbuf.bank_bytes)


def lower_conv(layer: ConvLayer, placements: Mapping[str, Placement], platform: Platform,
               constants: ConvConstants | None = None, cores: int = 1) -> tuple[ConvTask, ...]:
    """The task descriptions of one convolution (constants are recomputed when not given),
    dealt to ``cores`` cores (multicore.py; each task's ``core``)."""
    constants = constants or conv_constants(layer, platform)
    ctx = _context(layer, placements, platform, constants)
    # sparse weights are decompressed into the CBUF [I]: it holds the dense bytes either way
    dense = constants.sparse.dense_bytes if constants.sparse is not None else len(constants.weights)
    request = cbuf_request(layer, ctx.inp, platform, dense)
    plan = plan_cbuf(request)
    if layer.interleave and layer.interleave[0] > 1:  # the vendor's WDMA split: rows x channels (LOWERING.md 54)
        widest = max(group.count for group in plan.channel_groups) if layer.depthwise else layer.out_channels
        plan = interleave_bands.cap_rows(plan, request, align(widest, ctx.kernels_per_pass))  # _output_fields' cube
    tiles, assignment = deal_to_cores(plan, request, cores)
    tasks = []
    for index, (tile, core) in enumerate(zip(tiles, assignment)):
        task = dataclasses.replace(_conv_task(ctx, tile, plan.data_bank, plan.weight_bank), core=core)
        first_on_core = index == 0 or assignment[index - 1] != core
        if ctx.stages.lut is not None and first_on_core:  # each core's LUT RAM gets the table (rep10: before the op)
            task = dataclasses.replace(task, lut_upload=True)
        tasks.append(task)
    return tuple(tasks)
