"""One DPU-only data move: every stage bypassed, OUT_CVT the identity, one precision - the task
every Transpose lowering is made of (LOWERING.md 35, 36; emulator/REGISTER_SEMANTICS.md 31).

A move reads a flying MRDMA cube (W x H pixels of ``channels`` elements, lines W + LINE_NOTCH
atoms apart, surfaces ``H x W + (H - 1) x LINE_NOTCH + SURF_NOTCH`` atoms apart) and writes it
plainly, with the TP_EN atom transpose (DPU FEATURE_MODE_CFG bit 30) or with the TP_ORG_EN element
transpose (BS_OW_CFG bit 27). The registers are the 69 writes of ``emit_dpu.write_dpu_body`` (the
vendor's order) with the move's geometry written over eight of them in place.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task

from .descriptions import DpuCube, DpuStages
from .emit_dpu import (BURST_LEN, ENABLE_DPU_ONLY, INT_CLEAR_ALL, INT_MASK_DPU, OUTPUT_TO_MEMORY, RdmaSources,
                       write_dpu_body, write_s_pointers)
from .fields import RegisterBuilder

FP16_CODE = 2  # DPU precision code of float16
SURF_NOTCH_MASK = (1 << 28) - 1  # SURF_NOTCH_ADDR bits 31:4, two's complement in atoms


@dataclass(frozen=True)
class TransposeTask:
    """One DPU-only move (addresses in bytes, strides and notches in 16-byte atoms).

    ``channels`` counts elements of ``precision`` (DPU code: 0 int8, 1 int16, 2 fp16);
    ``wdma`` = (CHANNEL_WDMA + 1, SIZE_C_WDMA + 1, WIDTH_WDMA + 1, HEIGHT_WDMA + 1)."""

    layer: str
    source_address: int
    dst_address: int
    width: int
    height: int
    channels: int
    precision: int
    dst_surface_stride: int
    surface_add: int
    wdma: tuple[int, int, int, int]
    line_notch: int = 0        # DPU_RDMA SRC_DMA_CFG.LINE_NOTCH_ADDR
    surf_notch: int = 0        # DPU_RDMA SURF_NOTCH (signed)
    notch: int = 0             # DPU DATA_CUBE_NOTCH_ADDR_0 and _1
    size_e: int = 0            # BS_OW_CFG SIZE_E_0/1/2
    tp_en: bool = False        # FEATURE_MODE_CFG.TP_EN: the atom transpose
    tp_org: bool = False       # BS_OW_CFG.TP_ORG_EN: the element transpose
    tp_precision: int = 0      # WDMA_SIZE_0.TP_PRECISION: TP_ORG_EN's element (0 a byte, 1 two bytes)
    surf_len: int = 0          # FEATURE_MODE_CFG.SURF_LEN (the vendor's TP_ORG_EN tasks: the cube's atoms)


def _replace(b: RegisterBuilder, block: str, register: str, **fields: int) -> None:
    """Rewrite one of the body's writes in place (the order stays the vendor's)."""
    scratch = RegisterBuilder(b.regmap, b.layer)
    scratch.write(block, register, **fields)
    index = next(i for i, w in enumerate(b.writes) if (w.block, w.register) == (block, register))
    b.writes[index] = scratch.writes[0]


def emit_move(task: TransposeTask, regmap: RegisterMap, op_idx: int | None = None) -> Task:
    """The 69 writes of a DPU-only task with the move's read and write geometry."""
    b = RegisterBuilder(regmap, task.layer)
    write_s_pointers(b)
    cube = DpuCube(width=task.width, height=task.height, channels=task.channels, orig_channels=task.channels,
                   dst_address=task.dst_address, dst_surface_stride=task.dst_surface_stride, surfaces_per_pass=1,
                   precision=task.precision)
    write_dpu_body(b, cube, DpuStages(), conv_mode=0, flying=True,
                   sources=RdmaSources(src_address=task.source_address,
                                       src_notch=task.surf_notch & SURF_NOTCH_MASK))
    _replace(b, "DPU", "FEATURE_MODE_CFG", TP_EN=int(task.tp_en), SURF_LEN=task.surf_len, BURST_LEN=BURST_LEN,
             CONV_MODE=0, OUTPUT_MODE=OUTPUT_TO_MEMORY, FLYING_MODE=1)
    _replace(b, "DPU", "DATA_CUBE_NOTCH_ADDR", NOTCH_ADDR_1=task.notch, NOTCH_ADDR_0=task.notch)
    _replace(b, "DPU", "BS_OW_CFG", TP_ORG_EN=int(task.tp_org), SIZE_E_2=task.size_e, SIZE_E_1=task.size_e,
             SIZE_E_0=task.size_e, OD_BYPASS=1)
    channels, atoms, width, height = task.wdma
    _replace(b, "DPU", "WDMA_SIZE_0", TP_PRECISION=task.tp_precision, SIZE_C_WDMA=atoms - 1,
             CHANNEL_WDMA=channels - 1)
    _replace(b, "DPU", "WDMA_SIZE_1", HEIGHT_WDMA=height - 1, WIDTH_WDMA=width - 1)
    _replace(b, "DPU", "SURFACE_ADD", SURF_ADD=task.surface_add)
    _replace(b, "DPU_RDMA", "SRC_DMA_CFG", LINE_NOTCH_ADDR=task.line_notch)
    if task.precision == FP16_CODE:  # [V] every fp16 copy of the nhwc/nwch builds sets both conversions
        _replace(b, "DPU", "OUT_CVT_SCALE", FP32TOFP16_EN=1, OUT_CVT_SCALE=1)
        _replace(b, "DPU_RDMA", "FEATURE_MODE_CFG", IN_PRECISION=FP16_CODE, BURST_LEN=BURST_LEN,
                 PROC_PRECISION=FP16_CODE, MRDMA_FP16TOFP32_EN=1, FLYING_MODE=1)
    return Task(b.done(), ENABLE_DPU_ONLY, int_mask=INT_MASK_DPU, int_clear=INT_CLEAR_ALL, op_idx=op_idx)


__all__ = ["TransposeTask", "emit_move"]
