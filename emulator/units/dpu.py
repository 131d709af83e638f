"""DPU + DPU_RDMA: decode the post-processing registers, fetch the main cube (flying mode),
the BS operands (BRDMA) and the EW operand (ERDMA), run BS -> BN -> EW (LUT, then the EW
operation) -> OUT_CVT, and write the result through the WDMA.

Register interpretations and their evidence are in REGISTER_SEMANTICS.md section 3; the
arithmetic of each stage is NUMERICS.md section 4 (``kernels.dpu``, ``kernels.lut``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from npuemu.emulator import kernels
from npuemu.emulator.kernels.dpu import int_stages
from npuemu.emulator.kernels.dpu_pixel import StagePlan, plan_stages, planned_to_atoms
from npuemu.emulator.kernels import (dpu_convert, dpu_fp32, dpu_fp_to_int16, dpu_int32, dpu_interleave,
                                     dpu_reduce, dpu_transpose, dpu_unpool)
from npuemu.emulator.kernels import dpu_bf16, dpu_fp16_pair
from npuemu.emulator.memo import Memo
from npuemu.emulator.memory import TaskDma, Traffic
from npuemu.emulator.numerics import out_cvt_round_mode
from npuemu.emulator.regfile import RegisterView
from npuemu.emulator.units.cna_core import CoreResult
from npuemu.emulator.units.state import (
    ATOM_BYTES, BF16, FP16, FP32, INT4, INT8, INT16, INT32, PRECISION_DTYPES, DpuRdmaState, DpuState, EwState,
    LutState, LutTableState, OutCvtState, XStageState, c2_of, precision_name,
)
from npuemu.isa import weight_layout
from npuemu.isa.errors import EmulationError

#: int4 convs hand the DPU int32 accumulators like int8 (REGISTER_SEMANTICS.md 2.7); int32: the
#: exLSTM's int32 cubes through the same stages (kernels/dpu_int32.py, REGISTER_SEMANTICS.md 38)
INTEGER_PROCESSING = (INT8, INT16, INT4, INT32)
INTEGER_OUTPUTS = (INT8, INT16, INT32)
#: BRDMA_DATA_USE bits of the operands; the blob's groups are isa.weight_layout's BS format
BRDMA_ALU, BRDMA_CPEND, BRDMA_MUL = (bit for bit, _, _ in weight_layout.BS_OPERANDS)
BRDMA_TRT = weight_layout.BS_USE_TRT
#: ERDMA_DATA_SIZE -> element type of the EW operand (rep09/rep12: 1 with int8 tensors; the
#: others follow PPU_RDMA's 0/1/2/3 = 4/8/16/32-bit code [I]).
ERDMA_SIZES = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 3: np.dtype(np.int32)}
ERDMA_PER_PIXEL = 1  # ERDMA_DATA_MODE of a full operand cube (rep09, rep12)
#: ERDMA_DATA_MODE of one operand value per channel, broadcast over H x W: the vendor's SE-gate
#: Mul (rknn-fixtures-ops se_gate_int8 / se_gate_fp16 task 5: ERDMA_CFG 0x4 / 0x8, EW_CFG
#: EW_DATA_MODE 0, the [1, C, 1, 1] gate at EW_BASE_ADDR; REGISTER_SEMANTICS.md 3.4)
ERDMA_PER_CHANNEL = 0
COMB_SPLIT = 5  # DPU_RDMA COMB_USE: MRDMA and ERDMA share the EW operand (rep12, Mesa ConvAdd)
#: DPU_RDMA COMB_USE 3 (with DPU COMB_USE 1): MRDMA and ERDMA share the MAIN fp32 cube, alternate
#: surfaces as COMB_USE 5 [V] (conv_hardswish_fp16 task 2; REGISTER_SEMANTICS 3.5)
COMB_MAIN_PAIR = 3


_PRECISION_OF = {dtype: code for code, dtype in PRECISION_DTYPES.items()}


def _signed16(value: int) -> int:
    return value - (1 << 16) if value & 0x8000 else value


def _signed32(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------
def decode_dpu(dpu: RegisterView, where: str, atom_bytes: int = ATOM_BYTES) -> DpuState:
    """``atom_bytes``: the chip's NC1HWC2 atom, the unit of the strides (default RK3588's; NpuCore passes its chip's)."""
    atom = atom_bytes
    mode = dpu.fields("FEATURE_MODE_CFG")
    fmt = dpu.fields("DATA_FORMAT")
    _reject(dpu, where, ("BS_MUL_CFG", "BS_TRUNCATE_SRC"),
            ("BN_MUL_CFG", "BN_TRUNCATE_SRC"), ("EW_CFG", "EW_EQUAL_EN"), ("LUT_CFG", "LUT_CAL_SEL"),
            ("LUT_CFG", "LUT_EXPAND_EN"))
    if fmt["PROC_PRECISION"] in INTEGER_PROCESSING and fmt["OUT_PRECISION"] != FP16:
        _reject(dpu, where, ("OUT_CVT_SHIFT", "MINUS_EXP"))  # the fp path and the int -> fp16 conversion only
    if (fmt["PROC_PRECISION"] not in (FP32, INT32) or mode["COMB_USE"] != 1) and \
            not dpu_fp16_pair.accepts(fmt, mode):  # int32: the exLSTM's int32 rescale (kernels/dpu_int32.py)
        # 1 only with fp32 (the rescale task) and fp16 (exNorm's fp16 -> int8 edge, kernels/dpu_fp16_pair.py)
        _reject(dpu, where, ("FEATURE_MODE_CFG", "COMB_USE"))
    ow = dpu.fields("BS_OW_CFG")
    if not ow["SIZE_E_0"] == ow["SIZE_E_1"] == ow["SIZE_E_2"]:
        raise EmulationError(f"{where}: {dpu.show('BS_OW_CFG')} has different SIZE_E_0/1/2; only equal "
                             f"values are modelled (every vendor and Mesa stream writes them equal)")
    dst = dpu.raw("DST_BASE_ADDR")
    if dst % ATOM_BYTES:  # the address field is bits 31:4 on every chip, whatever its atom
        raise EmulationError(f"{where}: {dpu.show('DST_BASE_ADDR')} is not 16-byte aligned (rknpu-isa.md 4)")
    cube = (dpu.field("DATA_CUBE_WIDTH", "WIDTH") + 1, dpu.field("DATA_CUBE_HEIGHT", "HEIGHT") + 1,
            dpu.field("DATA_CUBE_CHANNEL", "CHANNEL") + 1)
    # the line notch: atoms past W in each written line (_wdma_rows), or the pixel gap of the
    # interleaved write (kernels/dpu_interleave.py, which _check_dpu then accepts)
    notch = dpu.field("DATA_CUBE_NOTCH_ADDR", "NOTCH_ADDR_0")
    state = DpuState(
        flying=bool(mode["FLYING_MODE"]), to_memory=bool(mode["OUTPUT_MODE"] & 2),
        to_ppu=bool(mode["OUTPUT_MODE"] & 1), conv_mode=mode["CONV_MODE"],
        in_precision=fmt["IN_PRECISION"], proc_precision=fmt["PROC_PRECISION"],
        out_precision=fmt["OUT_PRECISION"], width=cube[0], height=cube[1], channels=cube[2],
        orig_channels=dpu.field("DATA_CUBE_CHANNEL", "ORIG_CHANNEL") + 1,
        dst_address=dst, dst_surface_stride=dpu.field("DST_SURF_STRIDE", "DST_SURF_STRIDE") * atom,
        surface_add=dpu.field("SURFACE_ADD", "SURF_ADD") * atom, size_e=ow["SIZE_E_0"],
        bs=_x_stage(dpu, "BS", fmt, ow), bn=_x_stage(dpu, "BN", fmt, None),
        ew=_ew(dpu, fmt), lut=_lut(dpu), out_cvt=_out_cvt(dpu), atom_bytes=atom, line_notch=notch,
        pixel_step=dpu_interleave.pixel_step(cube, _wdma_sizes(dpu), notch, atom),
        transpose=dpu_transpose.decode_transpose(mode["TP_EN"], ow["TP_ORG_EN"], dpu.fields("WDMA_SIZE_0"),
                                                 dpu.fields("WDMA_SIZE_1"), notch, where))
    minmax, pend = dpu.field("DATA_CUBE_HEIGHT", "MINMAX_CTL"), dpu.field("OFFSET_PEND", "OFFSET_PEND")
    if minmax or pend:  # the channel max, or the padding channels' value (kernels/dpu_reduce.py, REGISTER_SEMANTICS 35)
        state = dataclasses.replace(state, minmax_ctl=minmax, offset_pend=pend)
        (dpu_reduce.check_reduce if minmax else dpu_reduce.check_pending)(state, where)
    if dpu_transpose.pads_lanes(state, _wdma_sizes(dpu), dpu.field("WDMA_SIZE_0", "SIZE_C_WDMA")):
        state = dataclasses.replace(state, pads_lanes=True)
    sub_cube = dpu_transpose.wdma_sub_cube(state, _wdma_sizes(dpu))
    if sub_cube is not None:  # a copy of the WDMA's (and MRDMA's) smaller cube (kernels/dpu_transpose.py)
        state = dataclasses.replace(state, width=sub_cube[0], height=sub_cube[1])
    state = dpu_int32.packed(state, mode, where)  # NONALIGN's packed write (kernels/dpu_int32.py)
    _check_dpu(state, dpu, where)
    return state


def _reject(view: RegisterView, where: str, *items: tuple[str, str]) -> None:
    for register, name in items:
        if view.field(register, name):
            raise EmulationError(f"{where}: {view.show(register, name)} is not modelled (expected 0)")


def _x_stage(dpu: RegisterView, stage: str, fmt: dict[str, int], ow: dict[str, int] | None) -> XStageState:
    cfg = dpu.fields(f"{stage}_CFG")
    mul = dpu.fields(f"{stage}_MUL_CFG")
    extra = {}
    if ow is not None:
        extra = {"cpend_bypass": bool(ow["OD_BYPASS"]), "cpend_from_dma": bool(ow["OW_SRC"]),
                 "cpend_operand": _signed16(dpu.field("BS_OW_OP", "OW_OP"))}
    return XStageState(
        bypass=bool(cfg[f"{stage}_BYPASS"]), alu_bypass=bool(cfg[f"{stage}_ALU_BYPASS"]),
        alu_algo=cfg[f"{stage}_ALU_ALGO"], alu_from_dma=bool(cfg[f"{stage}_ALU_SRC"]),
        alu_operand=dpu.field(f"{stage}_ALU_CFG", f"{stage}_ALU_OPERAND"),
        mul_bypass=bool(cfg[f"{stage}_MUL_BYPASS"]), mul_from_dma=bool(mul[f"{stage}_MUL_SRC"]),
        mul_operand=_signed16(mul[f"{stage}_MUL_OPERAND"]),
        shift_positive=mul[f"{stage}_MUL_SHIFT_VALUE"],
        shift_negative=fmt[f"{stage}_MUL_SHIFT_VALUE_NEG"], prelu=bool(cfg[f"{stage}_MUL_PRELU"]),
        relu_bypass=bool(cfg[f"{stage}_RELU_BYPASS"]), relux=bool(cfg[f"{stage}_RELUX_EN"]),
        relux_value=_signed32(dpu.raw(f"{stage}_RELUX_CMP_VALUE")), **extra)


def _ew(dpu: RegisterView, fmt: dict[str, int]) -> EwState:
    cfg = dpu.fields("EW_CFG")
    scale = dpu.fields("EW_CVT_SCALE_VALUE")
    return EwState(
        bypass=bool(cfg["EW_BYPASS"]), op_bypass=bool(cfg["EW_OP_BYPASS"]),
        op_from_dma=bool(cfg["EW_OP_SRC"]), op_type=cfg["EW_OP_TYPE"], alu_algo=cfg["EW_ALU_ALGO"],
        op_value=_signed32(dpu.raw("EW_OP_VALUE_0")),
        cvt_bypass=bool(cfg["EW_OP_CVT_BYPASS"]),
        cvt_offset=dpu.field("EW_CVT_OFFSET_VALUE", "EW_OP_CVT_OFFSET"),
        cvt_scale=_signed16(scale["EW_OP_CVT_SCALE"]), cvt_shift=scale["EW_OP_CVT_SHIFT"],
        cvt_round=cfg["EW_CVT_ROUND"], truncate_positive=scale["EW_TRUNCATE"],
        truncate_negative=fmt["EW_TRUNCATE_NEG"], prelu=bool(cfg["EW_MUL_PRELU"]),
        relu_bypass=bool(cfg["EW_RELU_BYPASS"]), relux=bool(cfg["EW_RELUX_EN"]),
        relux_value=_signed32(dpu.raw("EW_RELUX_CMP_VALUE")), lut_bypass=bool(cfg["EW_LUT_BYPASS"]))


def _lut(dpu: RegisterView) -> LutState:
    cfg, info = dpu.fields("LUT_CFG"), dpu.fields("LUT_INFO")

    def table(name: str) -> LutTableState:
        scale, shift = dpu.fields(f"LUT_{name}_SLOPE_SCALE"), dpu.fields(f"LUT_{name}_SLOPE_SHIFT")
        return LutTableState(
            start=dpu.field(f"LUT_{name}_START", "V"), end=dpu.field(f"LUT_{name}_END", "V"),
            index_select=info[f"LUT_{name}_INDEX_SELECT"],
            uflow_scale=_signed16(scale["UFLOW_SCALE"]), uflow_shift=shift["UFLOW_SHIFT"],
            oflow_scale=_signed16(scale["OFLOW_SCALE"]), oflow_shift=shift["OFLOW_SHIFT"])

    return LutState(le=table("LE"), lo=table("LO"), hybrid_priority=cfg["LUT_HYBRID_PRIORITY"],
                    uflow_priority=cfg["LUT_UFLOW_PRIORITY"], oflow_priority=cfg["LUT_OFLOW_PRIORITY"])


def _out_cvt(dpu: RegisterView) -> OutCvtState:
    scale, shift = dpu.fields("OUT_CVT_SCALE"), dpu.fields("OUT_CVT_SHIFT")
    return OutCvtState(scale=_signed16(scale["OUT_CVT_SCALE"]), shift=shift["OUT_CVT_SHIFT"],
                       offset=dpu.field("OUT_CVT_OFFSET", "OUT_CVT_OFFSET"),
                       round_bit=shift["CVT_ROUND"], fp32_to_fp16=bool(scale["FP32TOFP16_EN"]),
                       minus_exp=shift.get("MINUS_EXP", 0))


def _wdma_sizes(dpu: RegisterView) -> tuple[int, int, int]:
    return (dpu.field("WDMA_SIZE_1", "WIDTH_WDMA") + 1, dpu.field("WDMA_SIZE_1", "HEIGHT_WDMA") + 1,
            dpu.field("WDMA_SIZE_0", "CHANNEL_WDMA") + 1)


def _check_dpu(state: DpuState, dpu: RegisterView, where: str) -> None:
    wdma = _wdma_sizes(dpu)
    if state.transpose is not None:  # its own WDMA sizes (kernels/dpu_transpose.py)
        dpu_transpose.check_transpose(state, where)
    elif wdma != (state.width, state.height, state.channels) and not dpu_interleave.is_interleaved(state) and \
            not state.pads_lanes and not dpu_transpose.relines(state, wdma):
        raise EmulationError(
            f"{where}: DPU sizes disagree: DATA_CUBE_WIDTH/HEIGHT/CHANNEL give {state.width}x"
            f"{state.height}x{state.channels} but WDMA_SIZE_0/1 give {wdma[0]}x{wdma[1]}x{wdma[2]}")
    if state.orig_channels > state.channels:
        raise EmulationError(f"{where}: {dpu.show('DATA_CUBE_CHANNEL')}: ORIG_CHANNEL above CHANNEL")
    if not state.to_memory or state.to_ppu:
        raise EmulationError(f"{where}: {dpu.show('FEATURE_MODE_CFG', 'OUTPUT_MODE')}: only the write "
                             f"to memory (2) is modelled; the DPU -> PPU path is not")
    if dpu_bf16.involves_bf16(state):  # 16-bit floats with bf16 (kernels/dpu_bf16.py, REGISTER_SEMANTICS 37)
        dpu_bf16.check_precisions(state, where)
        return
    integer = state.proc_precision in INTEGER_PROCESSING
    if state.proc_precision == INT32:  # the exLSTM's forms only (kernels/dpu_int32.py)
        dpu_int32.check_int32_processing(state, where)
    if not integer and state.proc_precision not in (FP16, FP32):
        raise EmulationError(f"{where}: {dpu.show('DATA_FORMAT', 'PROC_PRECISION')} "
                             f"({precision_name(state.proc_precision)}) is not modelled (int8, int16, int4, fp16, "
                             f"fp32 with COMB_USE)")
    if state.proc_precision == FP32 and not dpu.field("FEATURE_MODE_CFG", "COMB_USE"):
        dpu_fp32.check_fp32_processing(state, where)  # the exGRU's fp32 adds (kernels/dpu_fp32.py)
    # int -> fp16 and fp16 -> int8: the DataConvert tasks (kernels/dpu_convert.py, REGISTER_SEMANTICS 26)
    # fp16 -> int16: exSoftmax13's exp, whose int16 the next task reads as fp16 bits (REGISTER_SEMANTICS 35)
    allowed = (*INTEGER_OUTPUTS, FP16) if integer else (FP16, FP32, INT8, INT16) if state.proc_precision == FP16 \
        else (FP16, FP32)
    if state.out_precision not in allowed:
        raise EmulationError(f"{where}: {dpu.show('DATA_FORMAT', 'OUT_PRECISION')} "
                             f"({precision_name(state.out_precision)}) with PROC_PRECISION "
                             f"{precision_name(state.proc_precision)} is not modelled")


def decode_dpu_rdma(rdma: RegisterView, where: str, atom_bytes: int = ATOM_BYTES) -> DpuRdmaState:
    atom = atom_bytes
    mode = rdma.fields("FEATURE_MODE_CFG")
    src_dma = rdma.fields("SRC_DMA_CFG")
    unpool = dpu_unpool.decode_unpool(src_dma, where)  # None unless UNPOOLING_EN
    if (unpool is None and any(v for k, v in src_dma.items() if k != "LINE_NOTCH_ADDR")) or \
            rdma.field("PAD_CFG", "PAD_TOP") or rdma.field("PAD_CFG", "PAD_LEFT"):
        raise EmulationError(f"{where}: MRDMA pooling/padding ({rdma.show('SRC_DMA_CFG')}, "
                             f"{rdma.show('PAD_CFG')}) is not modelled (expected 0)")
    width = rdma.field("DATA_CUBE_WIDTH", "WIDTH") + 1
    height = rdma.field("DATA_CUBE_HEIGHT", "HEIGHT") + 1
    line = width + src_dma["LINE_NOTCH_ADDR"]
    ew_line = width + rdma.field("DATA_CUBE_HEIGHT", "EW_LINE_NOTCH_ADDR")
    erdma = rdma.fields("ERDMA_CFG")
    for register in ("SRC_BASE_ADDR", "EW_BASE_ADDR"):
        if rdma.raw(register) % ATOM_BYTES:
            raise EmulationError(f"{where}: {rdma.show(register)} is not 16-byte aligned")
    return DpuRdmaState(
        width=width, height=height, channels=rdma.field("DATA_CUBE_CHANNEL", "CHANNEL") + 1,
        main_enabled=not mode["MRDMA_DISABLE"], flying=bool(mode["FLYING_MODE"]),
        comb_use=mode["COMB_USE"], in_precision=mode["IN_PRECISION"],
        src_address=rdma.raw("SRC_BASE_ADDR"), line_stride=line * atom,
        # the notch counts from the end of the last line's pixels, not of its line notch
        # (REGISTER_SEMANTICS.md 31: equal readings with LINE_NOTCH_ADDR 0, as in 3.4's evidence)
        surface_stride=(line * height - src_dma["LINE_NOTCH_ADDR"]
                        + rdma.field("SURF_NOTCH", "SURF_NOTCH_ADDR")) * atom,
        brdma_use=rdma.field("BRDMA_CFG", "BRDMA_DATA_USE"), bs_address=rdma.raw("BS_BASE_ADDR"),
        nrdma_use=rdma.field("NRDMA_CFG", "NRDMA_DATA_USE"), bn_address=rdma.raw("BN_BASE_ADDR"),
        erdma_enabled=not erdma["ERDMA_DISABLE"], erdma_mode=erdma["ERDMA_DATA_MODE"],
        erdma_size=erdma["ERDMA_DATA_SIZE"], ew_address=rdma.raw("EW_BASE_ADDR"),
        ew_line_stride=ew_line * atom,
        ew_surface_stride=rdma.field("EW_SURF_STRIDE", "EW_SURF_STRIDE") * atom,
        ew_notch_stride=(ew_line * height + rdma.field("EW_SURF_NOTCH", "EW_SURF_NOTCH")) * atom,
        atom_bytes=atom, unpool=unpool)


def check_rdma_matches(state: DpuState, rdma: DpuRdmaState, views: tuple[RegisterView, RegisterView],
                       where: str) -> None:
    """The DPU and its RDMA must describe the same cube (the hardware streams one into the other)."""
    dpu_view, rdma_view = views
    if state.proc_precision in (FP32, INT32):  # the rescale's COMB_USE pair or plain (kernels/dpu_fp32.py)
        dpu_fp32.check_comb_use(dpu_view.field("FEATURE_MODE_CFG", "COMB_USE"), rdma.comb_use, where)
    if state.proc_precision == FP16:  # COMB_USE 1 goes with 3 (kernels/dpu_fp16_pair.py)
        dpu_fp16_pair.check_comb_use(dpu_view.field("FEATURE_MODE_CFG", "COMB_USE"), rdma.comb_use, where)
    if rdma.unpool is not None:
        dpu_unpool.check_unpool(state, rdma, where)
        return
    if (rdma.width, rdma.height, rdma.channels) != (state.width, state.height, state.channels):
        raise EmulationError(
            f"{where}: DPU and DPU_RDMA sizes disagree: {dpu_view.block.name} cube {state.width}x"
            f"{state.height}x{state.channels}, DPU_RDMA cube {rdma.width}x{rdma.height}x{rdma.channels} "
            f"(DATA_CUBE_WIDTH/HEIGHT/CHANNEL)")
    if rdma.flying != state.flying:
        raise EmulationError(f"{where}: {dpu_view.show('FEATURE_MODE_CFG', 'FLYING_MODE')} but "
                             f"{rdma_view.show('FEATURE_MODE_CFG', 'FLYING_MODE')}")


# ---------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------
def run_dpu(state: DpuState, rdma: DpuRdmaState | None, source: CoreResult | None, dma: TaskDma,
            lut_tables: np.ndarray, where: str) -> None:
    """Run the DPU for one task and write its output through the WDMA."""
    if rdma is not None and rdma.unpool is not None:
        dpu_unpool.run_unpool(state, rdma, dma)
        return
    if state.minmax_ctl:
        dpu_reduce.run_reduce(state, rdma, dma, where)
        return
    if state.transpose is not None:
        dpu_transpose.run_transpose(state, rdma, dma, where)
        return
    if state.pads_lanes or dpu_transpose.is_notched_copy(state, rdma):
        dpu_transpose.run_pad_lanes(state, rdma, dma, where)
        return
    if state.proc_precision in INTEGER_PROCESSING:
        _run_integer(state, rdma, source, dma, lut_tables, where)
        if state.offset_pend:  # the padding channels' value (kernels/dpu_reduce.py)
            dpu_reduce.fill_pending(state, dma)
        elif dpu_int32.pads_past_orig(state):  # the exLSTM's counters (kernels/dpu_int32.py)
            dpu_int32.zero_past_orig(state, dma)
        return
    data = _main_input(state, rdma, source, dma, where)
    data = _float_stages(state, rdma, data, dma, lut_tables, where)
    out, c2 = float_output(state, data, where)
    # lanes past the channel count are written as 0 [C]
    _write(state, out, c2, dma)


def float_output(state: DpuState, data: np.ndarray, where: str) -> tuple[np.ndarray, int]:
    """The fp path's OUT_CVT: the float32 [C][H][W] stage results as the output elements, and the
    lanes of the WDMA's atoms (shared with the task programs' fp16 step, units/dpu_plan_fp.py)."""
    if state.out_cvt.minus_exp:  # the exponent lowered by MINUS_EXP: an exact power-of-two scale [I]
        data = data * np.float32(2.0 ** -state.out_cvt.minus_exp)
    if state.out_precision == INT8:  # the fp16 -> int8 conversion (kernels/dpu_convert.py)
        cvt = state.out_cvt
        out = dpu_convert.fp_to_int(data, cvt.scale, cvt.shift, cvt.offset, cvt.round_bit, np.int8, where)
    elif state.out_precision == INT16:  # truncated and wrapped (kernels/dpu_fp_to_int16.py)
        cvt = state.out_cvt
        out = dpu_fp_to_int16.fp_to_int16(data, cvt.scale, cvt.shift, cvt.offset, cvt.round_bit, where)
    elif state.out_precision == BF16:  # rounded to bf16, 2-byte lanes (kernels/dpu_bf16.py)
        out = dpu_bf16.fp32_to_bf16_bits(data).view(np.int16)
    else:
        out = kernels.out_cvt_fp16(data) if state.out_precision == FP16 else data.astype(np.float32)
    return out, c2_of(dpu_bf16.carrier(state.out_precision), state.atom_bytes)


def _run_integer(state: DpuState, rdma: DpuRdmaState | None, source: CoreResult | None, dma: TaskDma,
                 lut_tables: np.ndarray, where: str) -> None:
    """The integer stages, pixel-major, stored straight into the WDMA's atoms; with the LUT on
    (or rows the WDMA would write over each other) through a [C][H][W] cube and ``_write``."""
    fixed = _fixed_settings(state, where)
    blocks, window_sums = _main_blocks(state, rdma, source, dma, where)
    stages, tail = _integer_settings(state, fixed, rdma, window_sums, dma, where)
    converting = state.out_precision == FP16  # the int -> fp16 conversion (kernels/dpu_convert.py)
    if not fixed.lut and not converting and not dpu_interleave.is_interleaved(state) and \
            not isinstance(state, dpu_int32.PackedDpuState):
        # the kernel stores whole 8-byte words (every chip's atom is 8 or 16 bytes)
        claimed = None if fixed.c2 * fixed.out_dtype.itemsize % 8 else \
            dma.claim_rows(Traffic.DPU_WRITE, fixed.starts, fixed.line, np.uint64, fixed.what)
        if claimed is not None:
            words, offsets = claimed
            planned_to_atoms(_stage_plan(state, rdma, blocks, stages, tail), blocks, state.width, words, offsets,
                             fixed.c2, fixed.surfaces, stages.get("window_sum"), tail.get("ew_operand"))
            return
    shape = (state.channels, state.height, state.width)
    data = blocks_to_cube(blocks, shape)
    if "ew_operand" in tail:
        operand = tail["ew_operand"]
        if operand.shape != (1, 1, 1):  # a per-channel ([S][1][L]) or per-pixel channel-block cube
            tail["ew_operand"] = blocks_to_cube(operand, shape if operand.shape[1] > 1 else (shape[0], 1, 1))
    if fixed.lut:
        # The LUT runs before the EW operation [I]: rep10 (Sigmoid) keeps EW max(v, 0)
        # enabled with its LUT, which only computes a sigmoid if the max clamps the LUT's
        # output (REGISTER_SEMANTICS 3.5).
        data = kernels.lut_stage(int_stages(data, **stages), _lut_config(state.lut),
                                 lut_tables[0], lut_tables[1])
        stages = {}
    if converting:
        cvt = state.out_cvt
        out = dpu_convert.int_to_fp16(int_stages(data, **stages, **{k: v for k, v in tail.items() if k != "cvt"}),
                                      cvt.scale, cvt.shift, cvt.round_bit, cvt.minus_exp)
    else:
        out = int_stages(data, **stages, **tail, out_dtype=fixed.out_dtype)
    if isinstance(state, dpu_int32.PackedDpuState):  # NONALIGN (kernels/dpu_int32.py)
        dpu_int32.write_packed(state, out, dma)
        return
    planes = dpu_interleave.as_pixel_rows(state, out[:fixed.surfaces * fixed.c2])
    dma.write_planes(Traffic.DPU_WRITE, fixed.starts, planes, fixed.c2, fixed.what)


@dataclasses.dataclass(frozen=True)
class _FixedSettings:
    """What an integer task's DPU settings alone decide: the stage configs and the WDMA rows."""

    bs: kernels.XStageConfig | None
    bn: kernels.XStageConfig | None
    ew: kernels.EwConfig | None
    cvt: kernels.OutCvtConfig
    out_dtype: np.dtype
    lut: bool
    c2: int
    surfaces: int
    starts: np.ndarray  # never written
    line: int
    what: str


#: Built once per decoded DpuState (the core keeps those, so a network's tasks reuse theirs).
_FIXED: Memo[_FixedSettings] = Memo(identity=1)


def _fixed_settings(state: DpuState, where: str) -> _FixedSettings:
    fixed = _FIXED.get(state)
    if fixed is not None:
        return fixed
    bs, bn, ew, cvt = state.bs, state.bn, state.ew, state.out_cvt
    if not bn.bypass and (bn.alu_from_dma and state.proc_precision != INT32 or bn.mul_from_dma):
        raise EmulationError(f"{where}: BN operands from the NRDMA (DPU.BN_CFG.BN_ALU_SRC / "
                             f"BN_MUL_CFG.BN_MUL_SRC) are not modelled: no stream shows their layout")
    out_dtype = PRECISION_DTYPES[state.out_precision]
    c2 = c2_of(state.out_precision, state.atom_bytes)
    wdma = _WDMA(state, c2, out_dtype.itemsize)
    fixed = _FixedSettings(
        bs=None if bs.bypass else _x_config(bs, cpend=not bs.cpend_bypass),
        bn=None if bn.bypass else _x_config(bn), ew=None if ew.bypass else _ew_config(ew),
        cvt=kernels.OutCvtConfig(cvt.scale, cvt.shift, cvt.offset, out_cvt_round_mode(cvt.round_bit)),
        out_dtype=out_dtype, lut=not ew.bypass and not ew.lut_bypass, c2=c2, surfaces=wdma.surfaces,
        starts=wdma.starts, line=wdma.line, what=wdma.what)
    return _FIXED.put(fixed, state)


def blocks_to_cube(blocks: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """A channel-block cube [S][H*W][L] (``kernels.dpu_pixel``) -> [C][H][W]."""
    surfaces, pixels, lanes = blocks.shape
    planes = blocks.transpose(0, 2, 1).reshape(surfaces * lanes, pixels)[:shape[0]]
    return np.ascontiguousarray(planes).reshape(shape)


def _main_input(state: DpuState, rdma: DpuRdmaState | None, source: CoreResult | None,
                dma: TaskDma, where: str) -> np.ndarray:
    """The main cube as [C][H][W] float32 (the fp path: no window sums)."""
    if dpu_bf16.reads_other_float(state, rdma):  # a bf16 cube, or fp16 under a bf16 DPU (REGISTER_SEMANTICS 37)
        return dpu_bf16.main_cube(state, rdma, dma, where, read_surfaces)
    if dpu_fp16_pair.applies(state, rdma):  # an fp16 cube in MRDMA / ERDMA halves (REGISTER_SEMANTICS 37)
        return dpu_fp16_pair.main_cube(state, rdma, dma, where, read_surfaces)
    blocks, _ = _main_blocks(state, rdma, source, dma, where)
    shape = (state.channels, state.height, state.width)
    if blocks.dtype == np.float16:  # widened while it moves, one pass (kernels/dpu_convert.py, issue 20)
        return dpu_convert.fp16_blocks_to_cube(blocks, shape)
    return blocks_to_cube(blocks, shape).astype(np.float32, copy=False)


def _main_blocks(state: DpuState, rdma: DpuRdmaState | None, source: CoreResult | None,
                 dma: TaskDma, where: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The main cube as a channel-block cube [S][H*W][L] (``kernels.dpu_pixel``; int32 on the
    integer path) without moving it: the CORE's [H*W][C] or [C][H][W] result, or the MRDMA's
    NC1HWC2 surfaces as read; and the window sums (None in flying mode)."""
    channels, pixels = state.channels, state.height * state.width
    integer = state.proc_precision in INTEGER_PROCESSING
    if not state.flying:
        assert source is not None
        data = source.data
        hwc = source.layout == "hwc"
        if data.shape != ((pixels, channels) if hwc else (channels, state.height, state.width)):
            delivered = (f"{data.shape[1]} channels of {data.shape[0]} pixels" if hwc and data.ndim == 2
                         else f"a {'x'.join(map(str, data.shape[::-1]))} cube")
            raise EmulationError(
                f"{where}: the CORE delivers {delivered} (CORE DATAOUT_SIZE_0/1) but the DPU expects "
                f"{state.width}x{state.height}x{state.channels} (DPU DATA_CUBE_WIDTH/HEIGHT/CHANNEL)")
        if integer:
            data = data.astype(np.int32, copy=False)
        return (data.reshape(1, pixels, channels) if hwc else data.reshape(channels, pixels, 1)), \
            source.window_sums
    assert rdma is not None
    if rdma.in_precision != state.in_precision:
        raise EmulationError(f"{where}: DPU IN_PRECISION {precision_name(state.in_precision)} but "
                             f"DPU_RDMA IN_PRECISION {precision_name(rdma.in_precision)}")
    if rdma.in_precision not in PRECISION_DTYPES:
        raise EmulationError(f"{where}: MRDMA input precision {precision_name(rdma.in_precision)} "
                             f"is not modelled")
    dtype = PRECISION_DTYPES[rdma.in_precision]
    surfaces = -(-channels // c2_of(rdma.in_precision, rdma.atom_bytes))
    if (rdma.comb_use == COMB_MAIN_PAIR) != (state.proc_precision == FP32) and \
            not dpu_fp32.plain_fp32_read(state, rdma) and not dpu_int32.paired_read(state, rdma):
        raise EmulationError(f"{where}: DPU_RDMA.FEATURE_MODE_CFG.COMB_USE={rdma.comb_use} with PROC_PRECISION "
                             f"{precision_name(state.proc_precision)} is not modelled (COMB_USE 3 with fp32 only)")
    if rdma.comb_use == COMB_MAIN_PAIR:
        if not (rdma.erdma_enabled and rdma.erdma_mode == ERDMA_PER_PIXEL and ERDMA_SIZES.get(rdma.erdma_size)
                == np.dtype(np.int32)):   # the vendor's ERDMA_CFG 0x4000000c: per pixel, 32-bit elements
            raise EmulationError(f"{where}: DPU_RDMA.FEATURE_MODE_CFG.COMB_USE=3 reads half the fp32 cube through "
                                 f"the ERDMA, which must be enabled per pixel with 32-bit elements (ERDMA_CFG "
                                 f"ERDMA_DATA_MODE=1 ERDMA_DATA_SIZE=3)")
        atoms = _split_operand(state, rdma, dtype, dma)
    else:
        atoms = read_surfaces(dma, Traffic.MAIN_READ, rdma.src_address, rdma.surface_stride, rdma.line_stride,
                              surfaces, state.height, state.width, dtype,
                              f"DPU_RDMA main cube (SRC_BASE_ADDR={rdma.src_address:#x})", rdma.atom_bytes)
    blocks = atoms.reshape(surfaces, pixels, -1)
    if integer and dtype.kind != "i":
        blocks = blocks.astype(np.int32)
    return blocks, None


def read_surfaces(dma: TaskDma, stream: Traffic, address: int, surface_stride: int, line_stride: int,
                  surfaces: int, height: int, width: int, dtype: np.dtype, what: str,
                  atom_bytes: int) -> np.ndarray:
    """Read ``surfaces`` NC1HWC2 surfaces (C2 = state.c2_of: atom bytes / element): [S][H][W][C2]."""
    c2 = c2_of(_PRECISION_OF[dtype], atom_bytes)
    starts = _SURFACE_ROWS(address, surface_stride, line_stride, surfaces, height)
    raw = dma.read_rows(stream, starts, width * c2 * dtype.itemsize, what)
    return raw.view(dtype).reshape(surfaces, height, width, c2)


def _surface_rows(address: int, surface_stride: int, line_stride: int, surfaces: int,
                  height: int) -> np.ndarray:
    """The row addresses of ``read_surfaces``, read-only (so the DMA locates them once)."""
    starts = (address + np.arange(surfaces, dtype=np.int64)[:, None] * surface_stride
              + np.arange(height, dtype=np.int64)[None, :] * line_stride).reshape(-1)
    starts.flags.writeable = False
    return starts


#: a pure function of the five figures: built once, the same array every run
_SURFACE_ROWS: Memo[np.ndarray] = Memo(_surface_rows)


def _integer_settings(state: DpuState, fixed: _FixedSettings, rdma: DpuRdmaState | None,
                      window_sums: np.ndarray | None, dma: TaskDma, where: str) -> tuple[dict, dict]:
    """``int_stages`` keywords: the stages before the LUT (BS, BN) and after it (EW, OUT_CVT;
    the EW operand as a channel-block cube, ``_ew_operand``), without the output type."""
    stages: dict = {}
    if fixed.bs is not None:
        alu, cpend, mul = _bs_operands(state, rdma, dma, where)
        if fixed.bs.cpend_enable and window_sums is None:
            raise EmulationError(f"{where}: DPU.BS_OW_CFG.OD_BYPASS=0 asks for the CPEND term, which "
                                 f"needs the CNA's window sums; a flying-mode task has none")
        stages = {"bs": fixed.bs, "bs_alu": alu, "bs_mul": mul, "bs_cpend": cpend, "window_sum": window_sums}
    if fixed.bn is not None:
        bn_alu = dpu_int32.nrdma_bn_alu(state, rdma, dma, where) if state.bn.alu_from_dma and not \
            state.bn.alu_bypass else state.bn.alu_operand  # the NRDMA's int32 (kernels/dpu_int32.py)
        stages.update(bn=fixed.bn, bn_alu=bn_alu, bn_mul=state.bn.mul_operand)
    tail: dict = {"cvt": fixed.cvt}
    if fixed.ew is not None:
        ew = state.ew
        operand = _ew_operand(state, rdma, dma, where) if not ew.op_bypass and ew.op_from_dma \
            else np.array(ew.op_value, np.int32).reshape(1, 1, 1)
        tail["ew"], tail["ew_operand"] = fixed.ew, operand
    return stages, tail


class _PairFacts:
    """What the integer path works out once per (DpuState, DpuRdmaState) objects, filled in on first use.

    ``brdma_needed``: ``_brdma_needed`` (a pure function of the two states; None until asked).
    ``plan``: the stage plan and what it was made from besides them (the per-channel operands by
    identity - BRDMA blobs come from the memory's derived cache, a new object when their bytes
    change - and the element types), or None."""

    __slots__ = ("brdma_needed", "plan")

    def __init__(self, state: DpuState, rdma: DpuRdmaState | None) -> None:
        self.brdma_needed: bool | None = None
        self.plan: tuple[tuple, StagePlan] | None = None


_PAIRS: Memo[_PairFacts] = Memo(_PairFacts, identity=2)


def _stage_plan(state: DpuState, rdma: DpuRdmaState | None, blocks: np.ndarray, stages: dict,
                tail: dict) -> StagePlan:
    """``plan_stages`` for this task's settings, made once while its operands stay the same."""
    operand = tail.get("ew_operand")
    made_of = (stages.get("bs_alu"), stages.get("bs_cpend"), stages.get("bs_mul"), blocks.dtype,
               None if operand is None else operand.dtype)
    facts = _PAIRS(state, rdma)
    known = facts.plan
    if known is not None:  # (unrolled: this runs every task)
        was = known[0]
        if was[0] is made_of[0] and was[1] is made_of[1] and was[2] is made_of[2] and was[3:] == made_of[3:]:
            return known[1]
    plan = plan_stages(state.channels, PRECISION_DTYPES[state.out_precision], blocks.dtype,
                       made_of[4], **{k: v for k, v in stages.items() if k != "window_sum"},
                       **{k: v for k, v in tail.items() if k != "ew_operand"})
    if any(isinstance(part, np.ndarray) and part.flags.writeable for part in made_of[:3]):
        return plan  # an operand that may change in place: not kept
    facts.plan = (made_of, plan)
    return plan


def _x_config(stage: XStageState, cpend: bool = False) -> kernels.XStageConfig:
    return kernels.XStageConfig(
        alu_enable=not stage.alu_bypass, alu_algo=stage.alu_algo, mul_enable=not stage.mul_bypass,
        shift_positive=stage.shift_positive, shift_negative=stage.shift_negative, prelu=stage.prelu,
        relu=not stage.relu_bypass, relux=stage.relux, relux_value=stage.relux_value,
        cpend_enable=cpend)


def _bs_operands(state: DpuState, rdma: DpuRdmaState | None, dma: TaskDma,
                 where: str) -> tuple[np.ndarray | int, np.ndarray | int, np.ndarray | int]:
    bs = state.bs
    facts = _PAIRS(state, rdma)
    needed = facts.brdma_needed
    if needed is None:  # (raises where the two states disagree)
        needed = facts.brdma_needed = _brdma_needed(state, rdma, where)
    blob = read_bias_blob(dma, rdma, state.channels, where) if needed else {}
    # (an operand whose sub-unit is bypassed is never used: its source bit alone fetches nothing)
    return (blob["ALU"] if bs.alu_from_dma and not bs.alu_bypass else bs.alu_operand,
            blob["CPEND"] if bs.cpend_from_dma and not bs.cpend_bypass else bs.cpend_operand,
            blob["MUL"] if bs.mul_from_dma and not bs.mul_bypass else bs.mul_operand)


def _brdma_needed(state: DpuState, rdma: DpuRdmaState | None, where: str, cpend: bool = True) -> bool:
    """Whether the BS stage takes an operand from the BRDMA (checked to be fetched); ``cpend``
    False: the fp path, which has no CPEND term."""
    bs = state.bs
    needed = ((bs.alu_from_dma and not bs.alu_bypass, BRDMA_ALU, "DPU.BS_CFG.BS_ALU_SRC=1"),
              (cpend and bs.cpend_from_dma and not bs.cpend_bypass, BRDMA_CPEND, "DPU.BS_OW_CFG.OW_SRC=1"),
              (bs.mul_from_dma and not bs.mul_bypass, BRDMA_MUL, "DPU.BS_MUL_CFG.BS_MUL_SRC=1"))
    used = any(use for use, _, _ in needed)
    if used:
        if rdma is None:
            raise EmulationError(f"{where}: the BS stage takes operands from the BRDMA but DPU_RDMA is "
                                 f"not enabled in the op-enable word: the DPU would wait forever")
        for use, bit, register in needed:
            if use and not rdma.brdma_use & bit:
                raise EmulationError(f"{where}: {register} but DPU_RDMA.BRDMA_CFG.BRDMA_DATA_USE="
                                     f"{rdma.brdma_use} does not fetch that operand")
    return used


def read_bias_blob(dma: TaskDma, rdma: DpuRdmaState, channels: int, where: str) -> dict[str, np.ndarray]:
    """Per-channel BS operands from the BRDMA blob: 8-channel groups, each holding the operands
    BRDMA_DATA_USE selects in the order ALU (int32), CPEND (int16), MUL (int16)."""
    blob = _BLOBS.get(rdma, channels)
    if blob is None:
        blob = _BLOBS.put(_BiasBlob.build(rdma, channels, where), rdma, channels)
    located = dma.memory.locate_fixed(blob.address, blob.nbytes, lambda: f"{dma.where}: {blob.what} read")
    # decoded once per blob contents (a network runs the same blobs every inference)
    return dma.derived_from_located(Traffic.BIAS_READ, located.region, int(located.starts[0]), blob.nbytes,
                                    blob.key, blob.split)


@dataclasses.dataclass(frozen=True)
class _BiasBlob:
    """What a DpuRdmaState and channel count alone say about the BRDMA blob (worked out once)."""

    address: np.ndarray  # [1], read-only (Memory.locate_fixed)
    nbytes: int
    what: str
    key: tuple  # the derived-value key: what ``split`` depends on besides the bytes
    split: Callable[[np.ndarray], dict[str, np.ndarray]]

    @classmethod
    def build(cls, rdma: DpuRdmaState, channels: int, where: str) -> _BiasBlob:
        if rdma.brdma_use & BRDMA_TRT:
            raise EmulationError(f"{where}: DPU_RDMA.BRDMA_CFG.BRDMA_DATA_USE={rdma.brdma_use} fetches TRT "
                                 f"(per-channel truncation), which is not modelled")
        group = weight_layout.bs_group_dtype(rdma.brdma_use)
        group_bytes, groups = group.itemsize, weight_layout.bs_groups(channels)

        def split(raw: np.ndarray) -> dict[str, np.ndarray]:
            operands = np.ascontiguousarray(raw).reshape(-1).view(group)
            out = {}
            for name in group.names:
                out[name] = operands[name].reshape(-1)[:channels].astype(np.int32)
                out[name].flags.writeable = False  # shared by every task reading this blob
            return out

        address = np.array([rdma.bs_address], np.int64)
        address.flags.writeable = False
        return cls(address, groups * group_bytes,
                   f"BRDMA bias blob (BS_BASE_ADDR={rdma.bs_address:#x}, {groups} groups of {group_bytes} B)",
                   ("brdma", rdma.brdma_use, channels), split)


#: per (DpuRdmaState object, channels)
_BLOBS: Memo[_BiasBlob] = Memo(identity=1)


def _build_lut_config(lut: LutState) -> kernels.LutConfig:
    return kernels.LutConfig(
        le=kernels.LutTableConfig(**vars(lut.le)), lo=kernels.LutTableConfig(**vars(lut.lo)),
        hybrid_priority=lut.hybrid_priority, uflow_priority=lut.uflow_priority,
        oflow_priority=lut.oflow_priority)


#: Built once per decoded LutState (part of the DpuState the core keeps), for both data paths.
_lut_config: Memo[kernels.LutConfig] = Memo(_build_lut_config, identity=1)


def _ew_config(ew: EwState) -> kernels.EwConfig:
    return kernels.EwConfig(
        cvt_enable=not ew.cvt_bypass, cvt_offset=ew.cvt_offset, cvt_scale=ew.cvt_scale,
        cvt_shift=ew.cvt_shift, cvt_round=out_cvt_round_mode(ew.cvt_round),
        op_enable=not ew.op_bypass, op_type=ew.op_type, alu_algo=ew.alu_algo,
        truncate_positive=ew.truncate_positive, truncate_negative=ew.truncate_negative,
        prelu=ew.prelu, relu=not ew.relu_bypass, relux=ew.relux, relux_value=ew.relux_value)


def _ew_operand(state: DpuState, rdma: DpuRdmaState | None, dma: TaskDma, where: str,
                floating: bool = False) -> np.ndarray:
    """The ERDMA operand as a channel-block cube [S][H*W or 1][L] (integer path) or [C][H or 1][W or 1]
    float32 (fp path): per pixel (mode 1) or one value per channel (mode 0)."""
    if rdma is None or not rdma.erdma_enabled:
        raise EmulationError(
            f"{where}: DPU.EW_CFG.EW_OP_SRC=1 takes the EW operand from the ERDMA, but "
            f"{'DPU_RDMA is not enabled' if rdma is None else 'DPU_RDMA.ERDMA_CFG.ERDMA_DISABLE=1'}: "
            f"the DPU would wait forever")
    if rdma.erdma_mode not in (ERDMA_PER_PIXEL, ERDMA_PER_CHANNEL) or rdma.erdma_size not in ERDMA_SIZES:
        raise EmulationError(f"{where}: ERDMA_CFG ERDMA_DATA_MODE={rdma.erdma_mode} ERDMA_DATA_SIZE="
                             f"{rdma.erdma_size} is not modelled (modes 0 and 1 with sizes 1..3)")
    dtype = np.dtype(np.float16) if floating and rdma.erdma_size == 2 else ERDMA_SIZES[rdma.erdma_size]
    if floating and state.proc_precision == FP32:  # fp32 bits (kernels/dpu_fp32.py)
        dtype = dpu_fp32.ew_operand_dtype(rdma, where)
    if floating and dtype not in (np.float16, np.float32):
        raise EmulationError(f"{where}: an fp16 EW operation takes an fp16 operand (ERDMA_DATA_SIZE 2), "
                             f"got ERDMA_DATA_SIZE={rdma.erdma_size}")
    if rdma.erdma_mode == ERDMA_PER_CHANNEL:
        blocks = _channel_operand(state, rdma, dtype, dma, where)
        shape = (state.channels, 1, 1)
    else:
        blocks = _pixel_operand(state, rdma, dtype, dma, where)
        shape = (state.channels, state.height, state.width)
    if floating and blocks.dtype == np.float16 and state.in_precision != BF16:  # fp16: one pass (kernels/dpu_convert.py)
        return dpu_convert.fp16_blocks_to_cube(blocks, shape)
    return dpu_bf16.float_operand(blocks_to_cube(blocks, shape), state) if floating else blocks  # fp16 or bf16


def _pixel_operand(state: DpuState, rdma: DpuRdmaState, dtype: np.dtype, dma: TaskDma, where: str) -> np.ndarray:
    """ERDMA mode 1: a full operand cube, [S][H*W][C2] (REGISTER_SEMANTICS 3.4)."""
    surfaces = -(-state.channels // c2_of(_PRECISION_OF[dtype], rdma.atom_bytes))
    if rdma.comb_use == 0:
        atoms = read_surfaces(dma, Traffic.EW_READ, rdma.ew_address, rdma.ew_surface_stride,
                              rdma.ew_line_stride, surfaces, state.height, state.width, dtype,
                              f"ERDMA operand (EW_BASE_ADDR={rdma.ew_address:#x})", rdma.atom_bytes)
    elif rdma.comb_use == COMB_SPLIT and not state.flying and state.size_e == 1 and rdma.main_enabled:
        atoms = _split_operand(state, rdma, dtype, dma)
    else:
        raise EmulationError(
            f"{where}: DPU_RDMA.FEATURE_MODE_CFG.COMB_USE={rdma.comb_use} with MRDMA "
            f"{'enabled' if rdma.main_enabled else 'disabled'} and SIZE_E={state.size_e} is not modelled "
            f"(only COMB_USE=5 with the MRDMA enabled and SIZE_E=1, as in rep12 and Mesa's ConvAdd)")
    return atoms.reshape(surfaces, state.height * state.width, -1)


def _channel_operand(state: DpuState, rdma: DpuRdmaState, dtype: np.dtype, dma: TaskDma, where: str) -> np.ndarray:
    """ERDMA mode 0: one value per channel, [S][1][C2]: surface s is ONE atom at EW_BASE_ADDR +
    s x EW_SURF_STRIDE, its lanes the channels s x C2 .. s x C2 + C2 - 1 - a [1, C, 1, 1]
    NC1HWC2 tensor as the conv before it writes it [I] (se_gate_int8 task 4 writes the gate with
    DST_SURF_STRIDE 1, task 5 reads it with EW_SURF_STRIDE 1; REGISTER_SEMANTICS 3.4). Fetched
    once per task (the DMA counts those bytes once)."""
    if rdma.comb_use != 0:
        raise EmulationError(f"{where}: ERDMA_DATA_MODE=0 (per-channel operand) with DPU_RDMA.FEATURE_MODE_CFG."
                             f"COMB_USE={rdma.comb_use} is not modelled (only COMB_USE=0, as se_gate)")
    surfaces = -(-state.channels // c2_of(_PRECISION_OF[dtype], rdma.atom_bytes))
    atoms = read_surfaces(dma, Traffic.EW_READ, rdma.ew_address, rdma.ew_surface_stride, rdma.atom_bytes,
                          surfaces, 1, 1, dtype, f"ERDMA per-channel operand (EW_BASE_ADDR={rdma.ew_address:#x})",
                          rdma.atom_bytes)
    return atoms.reshape(surfaces, 1, -1)


def _split_operand(state: DpuState, rdma: DpuRdmaState, dtype: np.dtype, dma: TaskDma) -> np.ndarray:
    """The EW operand's [S][H][W][C2] atoms with COMB_USE = 5: the MRDMA reads the first surface
    of each 2-surface group from SRC_BASE_ADDR, the ERDMA the second from EW_BASE_ADDR, both
    stepping (line * height + notch) atoms (REGISTER_SEMANTICS 3.4: rep12 relocates both to the
    residual, EW one surface further)."""
    surfaces = -(-state.channels // c2_of(_PRECISION_OF[dtype], rdma.atom_bytes))
    first = read_surfaces(dma, Traffic.MAIN_READ, rdma.src_address, rdma.surface_stride, rdma.line_stride,
                          -(-surfaces // 2), state.height, state.width, dtype,
                          f"MRDMA surfaces (SRC_BASE_ADDR={rdma.src_address:#x}, COMB_USE={rdma.comb_use})",
                          rdma.atom_bytes)
    second = read_surfaces(dma, Traffic.EW_READ, rdma.ew_address, rdma.ew_notch_stride, rdma.ew_line_stride,
                           surfaces // 2, state.height, state.width, dtype,
                           f"ERDMA surfaces (EW_BASE_ADDR={rdma.ew_address:#x}, COMB_USE={rdma.comb_use})",
                           rdma.atom_bytes)
    atoms = np.empty((surfaces,) + first.shape[1:], dtype)
    atoms[0::2] = first
    atoms[1::2] = second
    return atoms


def _fp32(raw) -> np.ndarray:
    """Register or blob operands of the fp path, read as fp32 bit patterns [C] (NUMERICS.md 4.6:
    the compiler writes fp32 bits into the 32-bit ALU / RELUX / EW operand fields and the BRDMA
    blob's ALU slot)."""
    return np.asarray(raw, np.int64).astype(np.uint32).view(np.float32)


def _float_stages(state: DpuState, rdma: DpuRdmaState | None, data: np.ndarray, dma: TaskDma,
                  lut_tables: np.ndarray, where: str) -> np.ndarray:
    from npuemu.emulator.kernels import dpu_fp_chain  # float tasks only (issue 20: int8 first call)

    chain = dpu_fp_chain.FloatChain(data)  # the stages run in one pass at the end (kernels/dpu_fp_chain.py)
    for arguments in float_x_stages(state, rdma, dma, where):
        chain.x_stage(*arguments)
    lut = None
    if not state.ew.bypass:
        ew = state.ew
        if not ew.lut_bypass:  # fp32 LUT, before the EW operation as on the integer path (NUMERICS.md 5.1, 37)
            lut = (_lut_config(state.lut), lut_tables[0], lut_tables[1])
        operand = np.array(_fp32(ew.op_value), np.float32).reshape(1, 1, 1)
        if not ew.op_bypass and ew.op_from_dma:
            operand = _ew_operand(state, rdma, dma, where, floating=True)
        chain.ew(float_ew_config(ew), operand)
    return chain.result(lut)


def float_ew_config(ew: EwState) -> kernels.EwConfig:
    """The fp path's EW stage settings (the ReLUX value as fp32 bits, NUMERICS.md 4.6)."""
    return kernels.EwConfig(op_enable=not ew.op_bypass, op_type=ew.op_type, alu_algo=ew.alu_algo,
                            prelu=ew.prelu, relu=not ew.relu_bypass, relux=ew.relux,
                            relux_value=float(_fp32(ew.relux_value)))


def float_x_stages(state: DpuState, rdma: DpuRdmaState | None, dma: TaskDma, where: str) -> list[tuple]:
    """``FloatChain.x_stage`` arguments (config, ALU, MUL, MUL first) of the fp path's BS and BN, their
    operands read (the BRDMA blob, the NRDMA's) through ``dma``."""
    stages = []
    for name, stage in (("BS", state.bs), ("BN", state.bn)):
        if stage.bypass:
            continue
        blob = None
        if name == "BS" and _brdma_needed(state, rdma, where, cpend=False):
            blob = read_bias_blob(dma, rdma, state.channels, where)
        elif name == "BN" and stage.mul_from_dma and not stage.mul_bypass:  # the NRDMA (kernels/dpu_fp32.py)
            blob = dpu_fp32.read_nrdma_mul(dma, rdma, state.channels, where)
        mul = None
        if not stage.mul_bypass:
            if stage.mul_from_dma and blob is None:
                raise EmulationError(f"{where}: fp16 {name} MUL operands from DMA are not modelled")
            # the 16-bit MUL operand field (and the BRDMA blob's 16-bit MUL slot, per channel:
            # the mixed fp16 x int path's B scales, REGISTER_SEMANTICS 2.7) holds fp16 bits on the
            # fp path [C] (NUMERICS.md 4.6)
            bits = blob["MUL"] if stage.mul_from_dma else stage.mul_operand
            mul = dpu_bf16.mul_operand(bits, state.proc_precision)  # bf16 bits under PROC bf16 (REGISTER_SEMANTICS 37)
        alu = None
        if not stage.alu_bypass:
            if name == "BS" and state.bs.alu_from_dma:
                alu = _fp32(blob["ALU"])
            elif stage.alu_from_dma:
                alu = dpu_bf16.nrdma_alu(state, rdma, dma, where)  # fp32 per channel (kernels/dpu_bf16.py)
            else:
                alu = _fp32(stage.alu_operand)
        config = dataclasses.replace(_x_config(stage), relux_value=float(_fp32(stage.relux_value)))
        stages.append((config, alu, mul, name == "BN"))  # BS: ALU then MUL; BN: MUL then ALU
    return stages


def _wdma_rows(state: DpuState, c2: int, itemsize: int) -> tuple[int, np.ndarray, int]:
    """WDMA: surfaces of C2 channels, SIZE_E + 1 of them DST_SURF_STRIDE apart per group,
    groups SURFACE_ADD apart, lines W + NOTCH_ADDR_0 atoms apart (REGISTER_SEMANTICS 3.3, 9, 34). Returns the
    surfaces written, each row's address ([S][H], surface-major) and the row bytes."""
    if dpu_interleave.is_interleaved(state):  # one atom a row, pixels apart (kernels/dpu_interleave.py)
        return dpu_interleave.wdma_pixels(state, c2)
    # only the surfaces that hold real channels (below ORIG_CHANNEL + 1) are written: a surface of
    # padding channels alone is not (REGISTER_SEMANTICS 3.3; inferred from calibration.md A5)
    surfaces = -(-min(state.channels, state.orig_channels) // c2)
    per_group = state.size_e + 1
    surface = np.arange(surfaces, dtype=np.int64)
    surface_start = (state.dst_address + (surface // per_group) * state.surface_add
                     + (surface % per_group) * state.dst_surface_stride)
    line = state.width * c2 * itemsize  # 16 bytes for 32-bit elements on every chip
    # lines W + NOTCH_ADDR_0 atoms apart, as the plain copies' (REGISTER_SEMANTICS 31, 34) [V:
    # matmul_rows_fp16's transposing convs, 1 x 15 cubes with NOTCH 39 into 40-atom lines: the
    # whole stream bit-identical to the simulator; with lines W apart it was 4.9 off]
    step = (state.width + state.line_notch) * c2 * itemsize
    starts = surface_start[:, None] + np.arange(state.height, dtype=np.int64)[None, :] * step
    return surfaces, starts.reshape(-1), line


@dataclasses.dataclass(frozen=True)
class _WdmaRows:
    """``_wdma_rows`` of one DpuState and element size, with the write's name."""

    surfaces: int
    starts: np.ndarray  # read-only: lets the DMA locate the rows once (Memory.locate_fixed)
    line: int
    what: str

    @classmethod
    def build(cls, state: DpuState, c2: int, itemsize: int) -> _WdmaRows:
        surfaces, starts, line = _wdma_rows(state, c2, itemsize)
        starts.flags.writeable = False
        what = (f"DPU WDMA (DST_BASE_ADDR={state.dst_address:#x}, DST_SURF_STRIDE="
                f"{state.dst_surface_stride} B, SURFACE_ADD={state.surface_add} B, SIZE_E={state.size_e})")
        return cls(surfaces, starts, line, what)


#: per (DpuState object, C2, element bytes): built once, for both data paths
_WDMA: Memo[_WdmaRows] = Memo(_WdmaRows.build, identity=1)


def _write(state: DpuState, out: np.ndarray, c2: int, dma: TaskDma) -> None:
    """The WDMA write of the output [C][H][W] as NC1HWC2 atoms of ``c2`` lanes (lanes past C: 0)."""
    wdma = _WDMA(state, c2, out.dtype.itemsize)
    planes = dpu_interleave.as_pixel_rows(state, out[:wdma.surfaces * c2])
    dma.write_planes(Traffic.DPU_WRITE, wdma.starts, planes, c2, wdma.what)
