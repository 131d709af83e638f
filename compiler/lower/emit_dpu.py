"""Register writes of the DPU and DPU_RDMA blocks, and whole DPU-only (flying mode) tasks.

Order and constant values follow the vendor's listings: a DPU-only task is the 69 writes of
rep09 (two S_POINTER words, then the 67-write DPU/DPU_RDMA body); a convolution task ends
with the same body (rep01 words 59-125). Constants the vendor always writes and that we copy:
burst length 15, OUTPUT_MODE 2 (to memory), DPU_RDMA WEIGHT 0x01010101, CVT scale 1, and
zeros for the LUT, notch and undocumented registers.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa import lut_format
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task

from .descriptions import DpuCube, DpuStages, DpuTask, EwStage, Operand, XStage
from .fields import RegisterBuilder, signed32
from .lut import LutProgram
from .lut_upload import upload_writes
from .placement import ATOM_BYTES

S_POINTER_PP = dict(POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)  # 0xe (rknpu-isa.md 2.5)
BURST_LEN = 15  # DMA bursts of 16 beats (rknpu-isa.md 3; all listings)
OUTPUT_TO_MEMORY = 2  # DPU OUTPUT_MODE (Mesa, all listings)
COMB_USE_RESIDUAL = 5  # DPU_RDMA COMB_USE with an ERDMA operand next to a conv (rep12)
INT_MASK_DPU = 0x300  # DPU group 0/1 interrupts (rknpu-isa.md 2.4; task records)
INT_CLEAR_ALL = 0x1FFFF
ENABLE_DPU_ONLY = 0x18  # DPU + DPU_RDMA (rep09)


def _x_stage_cfg(stage: XStage) -> dict[str, int]:
    return {"ALU_ALGO": stage.alu_algo, "ALU_SRC": int(stage.alu_from_dma), "RELUX_EN": int(stage.relux),
            "RELU_BYPASS": int(not stage.relu), "MUL_PRELU": int(stage.mul_prelu),
            "MUL_BYPASS": int(stage.mul_bypass), "ALU_BYPASS": int(stage.alu_bypass), "BYPASS": int(stage.bypass)}


def _prefixed(prefix: str, fields: dict[str, int]) -> dict[str, int]:
    return {f"{prefix}_{name}": value for name, value in fields.items()}


def _write_x_stage(b: RegisterBuilder, prefix: str, stage: XStage) -> None:
    b.write("DPU", f"{prefix}_CFG", **_prefixed(prefix, _x_stage_cfg(stage)))
    b.write("DPU", f"{prefix}_ALU_CFG", **{f"{prefix}_ALU_OPERAND": stage.alu_operand})
    b.write("DPU", f"{prefix}_MUL_CFG", **{f"{prefix}_MUL_OPERAND": stage.mul_operand & 0xFFFF,
                                          f"{prefix}_MUL_SHIFT_VALUE": stage.mul_shift,
                                          f"{prefix}_TRUNCATE_SRC": 0, f"{prefix}_MUL_SRC": int(stage.mul_from_dma)})
    b.write("DPU", f"{prefix}_RELUX_CMP_VALUE", signed32(stage.relux_value))


def _ew_cfg(ew: EwStage) -> dict[str, int]:
    return dict(EW_CVT_TYPE=int(not ew.cvt_bypass), EW_CVT_ROUND=0, EW_DATA_MODE=ew.data_mode,
                EDATA_SIZE=ew.data_size, EW_ALU_ALGO=ew.alu_algo, EW_RELUX_EN=int(ew.relux),
                EW_RELU_BYPASS=int(not ew.relu), EW_OP_CVT_BYPASS=int(ew.cvt_bypass), EW_LUT_BYPASS=int(not ew.lut),
                EW_OP_SRC=int(ew.op_from_dma), EW_OP_TYPE=ew.op_type, EW_OP_BYPASS=int(ew.op_bypass),
                EW_BYPASS=int(ew.bypass))


@dataclass(frozen=True)
class RdmaSources:
    """What the MRDMA and ERDMA read (addresses in bytes, strides and notches in atoms)."""

    src_address: int = 0
    src_notch: int = 0
    ew_address: int = 0
    ew_surface_stride: int = 0
    ew_notch: int = 0


def flying_sources(source_address: int, source_surface_stride: int, cube: DpuCube, operand: Operand | None) -> RdmaSources:
    """DPU-only task: MRDMA walks the main input's surfaces, ``line x H + SURF_NOTCH`` atoms
    apart (so the notch is the surface padding, 0 in rep09's 56 x 56); the ERDMA operand's
    surfaces are EW_SURF_STRIDE apart (rep09; emulator/REGISTER_SEMANTICS.md 3.4)."""
    return RdmaSources(source_address, source_surface_stride - cube.width * cube.height,
                       operand.address if operand else 0, operand.surface_stride if operand else 0, 0)


def residual_sources(residual: Operand, cube: DpuCube) -> RdmaSources:
    """Conv + residual (COMB_USE 5): the MRDMA reads the first surface of every 32-channel
    pair at SRC_BASE_ADDR, the ERDMA the second at EW_BASE_ADDR = one surface further, both
    stepping ``line x rows + notch`` = two surfaces (rep12: the relocation table points
    SRC_BASE at the residual and EW_BASE 50176 bytes further, notches 3136 = 2 x 3136 - 56 x 56;
    emulator/REGISTER_SEMANTICS.md 3.4)."""
    notch = 2 * residual.surface_stride - cube.width * cube.height
    # 16-byte atoms: SIZE_E 1 with int8 needs 32-kernel passes of 16-channel surfaces; an
    # RK356x pass (16 kernels, 8-byte atoms) writes SIZE_E 0 and reads through the ERDMA alone
    return RdmaSources(residual.address, notch, residual.address + residual.surface_stride * ATOM_BYTES,
                       residual.surface_stride, notch)


def write_dpu_body(b: RegisterBuilder, cube: DpuCube, stages: DpuStages, *, conv_mode: int, flying: bool,
                   sources: RdmaSources = RdmaSources(), bias_address: int = 0, brdma_use: int = 0,
                   erdma: bool = False, residual: bool = False) -> None:
    """The 67 DPU/DPU_RDMA writes from FEATURE_MODE_CFG to EW_SURF_NOTCH (rep01/rep09 order)."""
    bs, bn, ew, out = stages.bs, stages.bn, stages.ew, stages.out_cvt
    b.write("DPU", "FEATURE_MODE_CFG", BURST_LEN=BURST_LEN, CONV_MODE=conv_mode, OUTPUT_MODE=OUTPUT_TO_MEMORY,
            FLYING_MODE=int(flying))
    b.write("DPU", "DATA_FORMAT", OUT_PRECISION=cube.output_precision, IN_PRECISION=cube.precision,
            EW_TRUNCATE_NEG=ew.truncate, BN_MUL_SHIFT_VALUE_NEG=bn.mul_shift,
            BS_MUL_SHIFT_VALUE_NEG=bs.mul_shift, PROC_PRECISION=cube.precision)
    b.write("DPU", "OFFSET_PEND")
    b.write("DPU", "DST_BASE_ADDR", DST_BASE_ADDR=cube.dst_address)
    b.write("DPU", "DST_SURF_STRIDE", DST_SURF_STRIDE=cube.dst_surface_stride)
    b.write("DPU", "DATA_CUBE_WIDTH", WIDTH=cube.width - 1)
    b.write("DPU", "DATA_CUBE_HEIGHT", HEIGHT=cube.height - 1)
    # the interleaved write (REGISTER_SEMANTICS 3.3.1): the vendor's WDMA split, W lines of H x C [V] (52, 53)
    steps = cube.interleave
    b.write("DPU", "DATA_CUBE_NOTCH_ADDR", **({} if steps is None else
                                              dict(NOTCH_ADDR_1=steps[0] - 1, NOTCH_ADDR_0=steps[0] - 1)))
    b.write("DPU", "DATA_CUBE_CHANNEL", ORIG_CHANNEL=cube.orig_channels - 1, CHANNEL=cube.channels - 1)
    _write_x_stage(b, "BS", bs)
    size_e = cube.surfaces_per_pass - 1
    b.write("DPU", "BS_OW_CFG", SIZE_E_2=size_e, SIZE_E_1=size_e, SIZE_E_0=size_e,
            OD_BYPASS=int(not stages.bs_cpend), OW_SRC=int(stages.bs_cpend))
    b.write("DPU", "BS_OW_OP")
    b.write("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=cube.channels * (1 if steps is None else cube.height) - 1)
    b.write("DPU", "WDMA_SIZE_1", **(dict(HEIGHT_WDMA=cube.height - 1, WIDTH_WDMA=cube.width - 1) if steps is None
                                     else dict(HEIGHT_WDMA=cube.width - 1, WIDTH_WDMA=0)))
    _write_x_stage(b, "BN", bn)
    b.write("DPU", "EW_CFG", **_ew_cfg(ew))
    b.write("DPU", "EW_CVT_OFFSET_VALUE", EW_OP_CVT_OFFSET=ew.cvt_offset)
    b.write("DPU", "EW_CVT_SCALE_VALUE", EW_TRUNCATE=ew.truncate, EW_OP_CVT_SHIFT=ew.cvt_shift,
            EW_OP_CVT_SCALE=ew.cvt_scale)
    b.write("DPU", "EW_RELUX_CMP_VALUE", signed32(ew.relux_value))
    b.write("DPU", "OUT_CVT_OFFSET", OUT_CVT_OFFSET=out.offset)
    b.write("DPU", "OUT_CVT_SCALE", FP32TOFP16_EN=int(out.fp32_to_fp16), OUT_CVT_SCALE=out.scale)
    b.write("DPU", "OUT_CVT_SHIFT", OUT_CVT_SHIFT=out.shift, **({"MINUS_EXP": out.minus_exp} if out.minus_exp else {}))
    for index in range(8):
        if b.has("DPU", f"EW_OP_VALUE_{index}"):  # RK3576: EW_OP_VALUE_7's offset holds OUT_CVT_OFFSET
            b.write("DPU", f"EW_OP_VALUE_{index}", **({"V": ew.op_value} if index == 0 else {}))
    b.write("DPU", "SURFACE_ADD", SURF_ADD=cube.surfaces_per_pass * cube.dst_surface_stride if steps is None
            else steps[1])
    b.write("DPU", "UNDOC_40C4")
    _write_lut_registers(b, stages.lut)
    b.write("DPU_RDMA", "DATA_CUBE_WIDTH", WIDTH=cube.width - 1)
    b.write("DPU_RDMA", "DATA_CUBE_HEIGHT", HEIGHT=cube.height - 1)
    b.write("DPU_RDMA", "DATA_CUBE_CHANNEL", CHANNEL=cube.channels - 1)
    b.write("DPU_RDMA", "SRC_BASE_ADDR", SRC_BASE_ADDR=sources.src_address)
    b.write("DPU_RDMA", "BRDMA_CFG", BRDMA_DATA_USE=brdma_use)
    b.write("DPU_RDMA", "BS_BASE_ADDR", BS_BASE_ADDR=bias_address)
    b.write("DPU_RDMA", "NRDMA_CFG")
    b.write("DPU_RDMA", "BN_BASE_ADDR")
    if erdma:
        b.write("DPU_RDMA", "ERDMA_CFG", ERDMA_DATA_MODE=ew.data_mode, ERDMA_DATA_SIZE=ew.data_size)
    else:
        b.write("DPU_RDMA", "ERDMA_CFG", ERDMA_DISABLE=1)
    b.write("DPU_RDMA", "EW_BASE_ADDR", EW_BASE_ADDR=sources.ew_address)
    b.write("DPU_RDMA", "EW_SURF_STRIDE", EW_SURF_STRIDE=sources.ew_surface_stride)
    b.write("DPU_RDMA", "FEATURE_MODE_CFG", IN_PRECISION=cube.precision, BURST_LEN=BURST_LEN,
            COMB_USE=COMB_USE_RESIDUAL if residual else 0, PROC_PRECISION=cube.precision,
            MRDMA_DISABLE=int(not (flying or residual)), CONV_MODE=conv_mode, FLYING_MODE=int(flying))
    b.write("DPU_RDMA", "SRC_DMA_CFG")
    b.write("DPU_RDMA", "SURF_NOTCH", SURF_NOTCH_ADDR=sources.src_notch)
    b.write("DPU_RDMA", "PAD_CFG")
    b.write("DPU_RDMA", "WEIGHT", E_WEIGHT=1, N_WEIGHT=1, B_WEIGHT=1, M_WEIGHT=1)
    b.write("DPU_RDMA", "EW_SURF_NOTCH", EW_SURF_NOTCH=sources.ew_notch)


def _write_lut_registers(b: RegisterBuilder, lut: LutProgram | None) -> None:
    """LUT_ACCESS_CFG .. LUT_LO_SLOPE_SHIFT in the body (zeros without a LUT, as every
    listing; rep10's values with one: priorities, index select, table ranges, flat slopes)."""
    b.write("DPU", "LUT_ACCESS_CFG")
    b.write("DPU", "LUT_ACCESS_DATA")
    if lut is None:
        for register in ("LUT_CFG", "LUT_INFO", "LUT_LE_START", "LUT_LE_END", "LUT_LO_START", "LUT_LO_END",
                         "LUT_LE_SLOPE_SCALE", "LUT_LE_SLOPE_SHIFT", "LUT_LO_SLOPE_SCALE", "LUT_LO_SLOPE_SHIFT"):
            b.write("DPU", register)
        return
    b.write("DPU", "LUT_CFG", **lut_format.LUT_CFG_REP10)
    b.write("DPU", "LUT_INFO", LUT_LO_INDEX_SELECT=lut.index_select, LUT_LE_INDEX_SELECT=lut.index_select)
    b.write("DPU", "LUT_LE_START", V=lut.le_start)
    b.write("DPU", "LUT_LE_END", V=lut.le_end)
    b.write("DPU", "LUT_LO_START", V=lut.lo_start)
    b.write("DPU", "LUT_LO_END", V=lut.lo_end)
    b.write("DPU", "LUT_LE_SLOPE_SCALE")  # LE slopes 0: flat below -X (int8: lut.py; fp16: the vendor's)
    b.write("DPU", "LUT_LE_SLOPE_SHIFT")
    # LO overflow slope: 0 for int8 (flat), a linear tail's for fp16 (lut.lut_fp16_program)
    b.write("DPU", "LUT_LO_SLOPE_SCALE", OFLOW_SCALE=lut.lo_oflow_scale)
    b.write("DPU", "LUT_LO_SLOPE_SHIFT", OFLOW_SHIFT=lut.lo_oflow_shift)


def write_lut_upload(b: RegisterBuilder, lut: LutProgram) -> None:
    """The LUT RAM upload as rep10 does it: LUT_ACCESS_CFG (write access, table, address 0),
    then one LUT_ACCESS_DATA word per entry, LE (table 0) then LO (table 1); packed as one block
    and kept per table contents (lut_upload.py)."""
    b.writes.extend(upload_writes(lut, b.regmap, b.layer))


def write_s_pointers(b: RegisterBuilder) -> None:
    b.write("DPU", "S_POINTER", **S_POINTER_PP)
    b.write("DPU_RDMA", "S_POINTER", **S_POINTER_PP)


def emit_dpu_task(task: DpuTask, regmap: RegisterMap, op_idx: int | None = None) -> Task:
    """A DPU-only task: 69 writes, enable mask 0x18 (rep09)."""
    b = RegisterBuilder(regmap, task.layer)
    write_s_pointers(b)
    sources = flying_sources(task.source_address, task.source_surface_stride, task.cube, task.operand)
    write_dpu_body(b, task.cube, task.stages, conv_mode=0, flying=True, sources=sources,
                   erdma=task.operand is not None)
    if task.lut_upload:
        write_lut_upload(b, task.stages.lut)
    return Task(b.done(), ENABLE_DPU_ONLY, int_mask=INT_MASK_DPU, int_clear=INT_CLEAR_ALL, op_idx=op_idx)
