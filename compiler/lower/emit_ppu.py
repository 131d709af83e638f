"""Register writes of one PPU pooling task: the 26 writes of rep07/rep08, enable mask 0x60.

Constants copied from the listings: PPU FLYING_MODE = 1 (source from PPU_RDMA), MISC_CTRL
BURST_LEN = 3, PADDING_VALUE_2 = 0, INDEX_ADD = the output surface stride.
"""

from __future__ import annotations

from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task

from .descriptions import PpuTask
from .emit_dpu import INT_CLEAR_ALL, S_POINTER_PP
from .fields import RegisterBuilder

ENABLE_PPU = 0x60  # PPU + PPU_RDMA (rep07)
INT_MASK_PPU = 0xC00  # PPU group 0/1 interrupts (task records)
PPU_BURST_LEN = 3


def ppu_writes(task: PpuTask, regmap: RegisterMap):
    b = RegisterBuilder(regmap, task.layer)
    (kernel_w, kernel_h), (stride_x, stride_y) = task.kernel, task.stride
    top, left, bottom, right = task.pads
    b.write("PPU", "S_POINTER", **S_POINTER_PP)
    b.write("PPU_RDMA", "S_POINTER", **S_POINTER_PP)
    b.write("PPU", "DATA_CUBE_IN_WIDTH", CUBE_IN_WIDTH=task.in_width - 1)
    b.write("PPU", "DATA_CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=task.in_height - 1)
    b.write("PPU", "DATA_CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=task.channels - 1)
    b.write("PPU", "DATA_CUBE_OUT_WIDTH", CUBE_OUT_WIDTH=task.out_width - 1)
    b.write("PPU", "DATA_CUBE_OUT_HEIGHT", CUBE_OUT_HEIGHT=task.out_height - 1)
    b.write("PPU", "DATA_CUBE_OUT_CHANNEL", CUBE_OUT_CHANNEL=task.channels - 1)
    b.write("PPU", "OPERATION_MODE_CFG", FLYING_MODE=1, POOLING_METHOD=task.method)
    b.write("PPU", "POOLING_KERNEL_CFG", KERNEL_STRIDE_HEIGHT=stride_y - 1, KERNEL_STRIDE_WIDTH=stride_x - 1,
            KERNEL_HEIGHT=kernel_h - 1, KERNEL_WIDTH=kernel_w - 1)
    b.write("PPU", "RECIP_KERNEL_WIDTH", RECIP_KERNEL_WIDTH=task.recip[0])
    b.write("PPU", "RECIP_KERNEL_HEIGHT", RECIP_KERNEL_HEIGHT=task.recip[1])
    b.write("PPU", "POOLING_PADDING_CFG", PAD_BOTTOM=bottom, PAD_RIGHT=right, PAD_TOP=top, PAD_LEFT=left)
    b.write("PPU", "PADDING_VALUE_1_CFG", PAD_VALUE_0=task.pad_value)
    b.write("PPU", "PADDING_VALUE_2_CFG")
    b.write("PPU", "DST_BASE_ADDR", DST_BASE_ADDR=task.dst_address >> 4)
    b.write("PPU", "DST_SURF_STRIDE", DST_SURF_STRIDE=task.dst_surface_stride)
    b.write("PPU", "DATA_FORMAT", INDEX_ADD=task.dst_surface_stride, PROC_PRECISION=task.precision)
    b.write("PPU", "MISC_CTRL", BURST_LEN=PPU_BURST_LEN)
    b.write("PPU_RDMA", "CUBE_IN_WIDTH", CUBE_IN_WIDTH=task.in_width - 1)
    b.write("PPU_RDMA", "CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=task.in_height - 1)
    b.write("PPU_RDMA", "CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=task.channels - 1)
    b.write("PPU_RDMA", "SRC_BASE_ADDR", SRC_BASE_ADDR=task.source_address)
    b.write("PPU_RDMA", "SRC_LINE_STRIDE", SRC_LINE_STRIDE=task.source_line_stride)
    b.write("PPU_RDMA", "SRC_SURF_STRIDE", SRC_SURF_STRIDE=task.source_surface_stride)
    b.write("PPU_RDMA", "DATA_FORMAT", IN_PRECISION=task.in_precision)
    return b.done()


def emit_ppu_task(task: PpuTask, regmap: RegisterMap, op_idx: int | None = None) -> Task:
    return Task(ppu_writes(task, regmap), ENABLE_PPU, int_mask=INT_MASK_PPU, int_clear=INT_CLEAR_ALL, op_idx=op_idx)
