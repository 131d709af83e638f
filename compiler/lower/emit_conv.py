"""Register writes of one convolution task (CNA -> CORE -> DPU), in the vendor's order.

Every task writes the full set: the 126 writes of rep01 task 0, including the vendor's
repeated CBUF_CON0, CONV_CON1, DCOMP_CTRL and DCOMP_REGNUM writes. RKNN writes only changed
registers in later tasks of a split layer, but "changed" there is relative to the task two
before (the ping-pong register groups, rknpu-isa.md 2.5 - rep05's alternating channel
groups show it), so full sets are simpler and safe (LOWERING.md).

Constants copied from the listings: CVT_CON0 = 0xb (input converter bypassed, signed data),
CVT scales 1, DMA burst lengths 15, decompression off (DCOMP_* 0; RK3576 sparse weights set
DCOMP_CTRL/REGNUM/AMOUNTn, LOWERING.md 23), CORE QD_EN = 1, BS
operands from the BRDMA blob (BRDMA_DATA_USE = 7: ALU, CPEND, MUL).
"""

from __future__ import annotations

from npuemu.isa import weight_layout
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task

from .descriptions import CONV_MODE_DEPTHWISE, ConvTask
from .emit_dpu import (
    BURST_LEN, INT_CLEAR_ALL, INT_MASK_DPU, RdmaSources, residual_sources, write_dpu_body, write_lut_upload,
    write_s_pointers,
)
from .fields import RegisterBuilder, signed32

ENABLE_CONV = 0x1D  # CNA, CORE, DPU, DPU_RDMA (rep01; rknpu-isa.md 2.1)
DCOMP_AMOUNTS = 16
PRECISION_INT8, PRECISION_INT4 = 0, 6  # CNA/CORE precision codes (rknpu-isa.md 3)


def _cbuf_con0(b: RegisterBuilder, task: ConvTask) -> None:
    b.write("CNA", "CBUF_CON0", WEIGHT_REUSE=int(task.weight_reuse), DATA_REUSE=0, FC_DATA_BANK=0,
            WEIGHT_BANK=task.weight_bank, DATA_BANK=task.data_bank)


def _conv_con1(b: RegisterBuilder, task: ConvTask, weight_precision: int) -> None:
    packed = int(task.argb_in > 0)
    b.write("CNA", "CONV_CON1", NONALIGN_DMA=packed, GROUP_LINE_OFF=packed or int(task.single_rows), ARGB_IN=task.argb_in,
            PROC_PRECISION=weight_precision, IN_PRECISION=task.precision, CONV_MODE=task.conv_mode)


def _write_cna(b: RegisterBuilder, task: ConvTask, weight_precision: int) -> None:
    (stride_x, stride_y), (dil_x, dil_y) = task.stride, task.dilation
    _conv_con1(b, task, weight_precision)
    b.write("CNA", "CONV_CON2", KERNEL_GROUP=0, FEATURE_GRAINS=task.feature_grains)
    b.write("CNA", "CONV_CON3", ATROUS_Y_DILATION=dil_y - 1, ATROUS_X_DILATION=dil_x - 1,
            CONV_Y_STRIDE=stride_y, CONV_X_STRIDE=stride_x)
    b.write("CNA", "DATA_SIZE0", DATAIN_WIDTH=task.in_width, DATAIN_HEIGHT=task.in_height)
    b.write("CNA", "DATA_SIZE1", DATAIN_CHANNEL_REAL=(task.in_channels_real - 1) % 64,
            DATAIN_CHANNEL=task.in_channels)
    b.write("CNA", "DATA_SIZE2", DATAOUT_WIDTH=task.out_width)
    b.write("CNA", "DATA_SIZE3", DATAOUT_ATOMICS=task.out_width * task.out_height)
    b.write("CNA", "WEIGHT_SIZE0", WEIGHT_BYTES=task.weight_bytes)
    b.write("CNA", "WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=task.weight_bytes_per_kernel)
    b.write("CNA", "WEIGHT_SIZE2", WEIGHT_WIDTH=task.kernel[0], WEIGHT_HEIGHT=task.kernel[1],
            WEIGHT_KERNELS=task.kernels)
    _cbuf_con0(b, task)
    _write_cbuf_con1(b, task)
    b.write("CNA", "CVT_CON0", DATA_SIGN=1, CVT_TYPE=1, CVT_BYPASS=1)
    for index in range(4):
        b.write("CNA", f"CVT_CON{index + 1}", **{f"CVT_SCALE{index}": 1, f"CVT_OFFSET{index}": 0})
    b.write("CNA", "FC_CON0")
    b.write("CNA", "FC_CON1")
    b.write("CNA", "PAD_CON0", PAD_LEFT=task.pad_left, PAD_TOP=task.pad_top)
    b.write("CNA", "FEATURE_DATA_ADDR", FEATURE_BASE_ADDR=task.feature_address)
    b.write("CNA", "FC_CON2")
    b.write("CNA", "DMA_CON0", WEIGHT_BURST_LEN=BURST_LEN, DATA_BURST_LEN=BURST_LEN)
    b.write("CNA", "DMA_CON1", LINE_STRIDE=task.line_stride)
    b.write("CNA", "DMA_CON2", SURF_STRIDE=task.surface_stride)
    b.write("CNA", "FC_DATA_SIZE0", DMA_WIDTH=task.in_width, DMA_HEIGHT=task.in_height)
    if b.has("CNA", "FC_DATA_SIZE1"):
        # RK3576 keeps its feature address at this offset and has no known place for the DMA
        # channel count: left unwritten there (REGISTERS.md, RK3576 deviations)
        b.write("CNA", "FC_DATA_SIZE1", DMA_CHANNEL=task.in_channels)
    _write_dcomp_mode(b, task)
    b.write("CNA", "DCOMP_ADDR0", DECOMPRESS_ADDR0=task.weight_address)
    amounts = task.decompress[1] if task.decompress else ()
    for index in range(DCOMP_AMOUNTS):
        b.write("CNA", f"DCOMP_AMOUNT{index}", amounts[index] if index < len(amounts) else 0)
    b.write("CNA", "CVT_CON5")
    b.write("CNA", "PAD_CON1", signed32(task.pad_value))


def _write_dcomp_mode(b: RegisterBuilder, task: ConvTask) -> None:
    # sparse weights (LOWERING.md 23): the stream format and how many streams; 0 = dense
    control, amounts = task.decompress or (0, ())
    b.write("CNA", "DCOMP_CTRL", DECOMP_CONTROL=control)
    b.write("CNA", "DCOMP_REGNUM", DCOMP_REGNUM=len(amounts))


def _write_cbuf_con1(b: RegisterBuilder, task: ConvTask) -> None:
    if task.argb_in:
        # a packed image: RKNN writes rows x align(W, 16), which overflows the 14-bit field into
        # bit 14 (rep03: 22400 = 0x5780, printed as DATA_ENTRIES=6016 rsv=0x4000); copied raw
        b.write("CNA", "CBUF_CON1", task.data_entries)
    else:
        b.write("CNA", "CBUF_CON1", DATA_ENTRIES=task.data_entries)


def _write_core(b: RegisterBuilder, task: ConvTask, weight_precision: int) -> None:
    b.write("CORE", "MISC_CFG", PROC_PRECISION=weight_precision, DW_EN=int(task.conv_mode == 3), QD_EN=1)
    b.write("CORE", "DATAOUT_SIZE_0", DATAOUT_HEIGHT=task.out_height - 1, DATAOUT_WIDTH=task.out_width - 1)
    b.write("CORE", "DATAOUT_SIZE_1", DATAOUT_CHANNEL=task.cube.channels - 1)
    b.write("CORE", "CLIP_TRUNCATE", ROUND_TYPE=0, CLIP_TRUNCATE=0)
    b.write("CORE", "UNDOC_3030")


def conv_writes(task: ConvTask, regmap: RegisterMap, weight_precision: int | None = None):
    """The 126 register writes of one convolution task. ``weight_precision``: CNA/CORE
    PROC_PRECISION when the weights are narrower than the features (the Matmul API's int8 x
    int4, REGISTER_SEMANTICS.md 2.7); None: the task's precision."""
    weight = task.precision if weight_precision is None else weight_precision
    b = RegisterBuilder(regmap, task.layer)
    _cbuf_con0(b, task)
    control, amounts = task.decompress or (0, ())
    b.write("CNA", "DCOMP_REGNUM", DCOMP_REGNUM=len(amounts))
    b.write("CNA", "DCOMP_CTRL", DECOMP_CONTROL=control)
    _conv_con1(b, task, weight)
    write_s_pointers(b)
    _write_cna(b, task, weight)
    _write_core(b, task, weight)
    # integer paths (int8, int4) take ALU, CPEND and MUL from the BRDMA; fp16 the ALU only,
    # unless its BS MUL reads per-channel operands (the Matmul API's mixed fp16 x int path)
    full = task.precision in (PRECISION_INT8, PRECISION_INT4) or task.stages.bs.mul_from_dma
    brdma = weight_layout.BS_USE_ALL if full else weight_layout.BS_USE_ALU  # VC 5: BRDMA_CFG = 0xe
    # A direct conv reads its residual as rep12 does (COMB_USE 5: MRDMA and ERDMA take alternate
    # surfaces). A depthwise conv writes 4 surfaces per pass (SIZE_E 3), for which no stream
    # shows the split; it reads the whole residual through the ERDMA alone, as an element-wise
    # layer reads its second operand (rep09) - our choice, LOWERING.md 6. So does a direct conv
    # on a chip whose MAC pass writes one surface (SIZE_E 0: RK3562's 16 int8 kernels).
    split = (task.residual is not None and task.conv_mode != CONV_MODE_DEPTHWISE
             and task.cube.surfaces_per_pass == 2)
    if split:
        sources = residual_sources(task.residual, task.cube)
    elif task.residual is not None:
        sources = RdmaSources(ew_address=task.residual.address, ew_surface_stride=task.residual.surface_stride)
    else:
        sources = RdmaSources()
    write_dpu_body(b, task.cube, task.stages, conv_mode=task.conv_mode, flying=False, sources=sources,
                   bias_address=task.bias_address, brdma_use=brdma, erdma=task.residual is not None,
                   residual=split)
    if task.lut_upload:
        write_lut_upload(b, task.stages.lut)
    return b.done()


def emit_conv_task(task: ConvTask, regmap: RegisterMap, op_idx: int | None = None,
                   weight_precision: int | None = None) -> Task:
    return Task(conv_writes(task, regmap, weight_precision), ENABLE_CONV, int_mask=INT_MASK_DPU, int_clear=INT_CLEAR_ALL,
                op_idx=op_idx)
