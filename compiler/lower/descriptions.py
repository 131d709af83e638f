"""Typed task descriptions: what one hardware task does, in register units but not yet words.

Lowering (``lower_conv``, ``lower_eltwise``, ``lower_pool``) produces these small frozen
records; emission (``emit_*``) turns each into the register writes of one
:class:`npuemu.isa.task.Task`. Values are the hardware's: sizes are real counts (emission
writes the "minus one" fields), addresses are absolute 32-bit NPU addresses, strides are in
the units their registers use (documented per field).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .lut import LutProgram

# Precision codes: CNA/CORE and DPU/RDMA (rknpu-isa.md 3, TRM): 0 int8, 2 fp16 in both tables;
# DPU/RDMA only: 4 int32, 5 fp32 (the wide outputs, DATA_FORMAT OUT_PRECISION).
PRECISION_CODES = {"int8": 0, "float16": 2}
OUT_PRECISION_CODES = PRECISION_CODES | {"int32": 4, "float32": 5}
# PPU_RDMA DATA_FORMAT.IN_PRECISION: 0/1/2/3 = 4/8/16/32-bit (rknpu-isa.md 3).
PPU_IN_PRECISION = {"int8": 1, "float16": 2}

CONV_MODE_DIRECT = 0
CONV_MODE_DEPTHWISE = 3  # CNA CONV_MODE, DPU/RDMA CONV_MODE (VC 4.3)

ALU_MAX, ALU_MIN, ALU_ADD, ALU_MINUS = 0, 1, 2, 4  # *_ALU_ALGO (rknpu-isa.md 3)


@dataclass(frozen=True)
class XStage:
    """The BS or BN stage. ``bypass`` skips the whole stage."""

    bypass: bool = True
    alu_bypass: bool = True
    alu_algo: int = 0
    alu_from_dma: bool = False
    alu_operand: int = 0
    mul_bypass: bool = True
    mul_from_dma: bool = False
    mul_operand: int = 0
    mul_shift: int = 0
    mul_prelu: bool = False
    relu: bool = False
    relux: bool = False
    relux_value: int = 0


@dataclass(frozen=True)
class EwStage:
    """The EW stage with its operand converter; ``bypass`` skips it."""

    bypass: bool = True
    op_bypass: bool = True
    op_from_dma: bool = False
    op_type: int = 0  # 0 ALU, 1 MUL
    alu_algo: int = 0
    cvt_bypass: bool = True
    cvt_offset: int = 0
    cvt_scale: int = 1
    cvt_shift: int = 0
    truncate: int = 0
    relu: bool = False
    relux: bool = False
    relux_value: int = 0
    data_mode: int = 0  # EW_DATA_MODE / ERDMA_DATA_MODE: 1 = per-pixel operand (rep09, rep12)
    data_size: int = 0  # EDATA_SIZE / ERDMA_DATA_SIZE: 1 for the int8 operands of rep09/rep12
    lut: bool = False  # not EW_LUT_BYPASS: the LUT runs first in this stage (rep10)
    op_value: int = 0  # EW_OP_VALUE_0 (raw 32 bits): the register operand (fp16 LUT: fp32 bits of t)


@dataclass(frozen=True)
class OutCvt:
    scale: int = 1
    shift: int = 0
    offset: int = 0
    fp32_to_fp16: bool = False
    minus_exp: int = 0  # OUT_CVT_SHIFT.MINUS_EXP: x 2^-MINUS_EXP before the fp16 rounding (LOWERING.md 26)


@dataclass(frozen=True)
class DpuStages:
    bs: XStage = field(default_factory=XStage)
    bn: XStage = field(default_factory=XStage)
    ew: EwStage = field(default_factory=EwStage)
    out_cvt: OutCvt = field(default_factory=OutCvt)
    bs_cpend: bool = False  # BS_OW_CFG: CPEND operand from the BRDMA blob (not OD_BYPASS)
    lut: LutProgram | None = None  # LUT registers (tables are uploaded by the task marked lut_upload)


@dataclass(frozen=True)
class DpuCube:
    """What the DPU processes and where WDMA writes it."""

    width: int
    height: int
    channels: int  # channels processed/written (padded: conv 32, depthwise 64 multiples)
    orig_channels: int  # real channels
    dst_address: int
    dst_surface_stride: int  # in the chip's atoms
    surfaces_per_pass: int  # SIZE_E + 1; SURFACE_ADD = this x dst_surface_stride
    precision: int  # DPU precision code of in/proc (and out unless out_precision says otherwise)
    out_precision: int | None = None  # DATA_FORMAT OUT_PRECISION when wider (int32 4, fp32 5)
    # (pixel step, line step) in atoms of the interleaved write (emulator/REGISTER_SEMANTICS.md
    # 3.3.1: NOTCH_ADDR_0 = pixel step - 1, SURFACE_ADD = line step); None: lines W atoms apart
    interleave: tuple[int, int] | None = None

    @property
    def output_precision(self) -> int:
        return self.precision if self.out_precision is None else self.out_precision


@dataclass(frozen=True)
class Operand:
    """A tensor the DPU reads besides the main data (ERDMA: residual or second input)."""

    address: int
    surface_stride: int  # the chip's atoms


@dataclass(frozen=True)
class ConvTask:
    """One CNA -> CORE -> DPU task of a convolution (enable mask 0x1d)."""

    layer: str
    conv_mode: int
    precision: int
    argb_in: int  # 0, or 7 + channels for a packed first-layer image (8..11)
    # CNA input fetch
    in_width: int
    in_height: int  # rows of this task
    in_channels: int  # DATAIN_CHANNEL (aligned)
    in_channels_real: int  # this task's real channels
    feature_address: int
    line_stride: int  # DMA_CON1 (W x 4 for 16-byte atoms, W for a packed image)
    surface_stride: int  # DMA_CON2, 28 bits
    data_entries: int  # CBUF_CON1 raw value (DATA_ENTRIES; a packed image writes rows x align(W, 16))
    feature_grains: int
    pad_top: int
    pad_left: int
    pad_value: int
    stride: tuple[int, int]  # (x, y)
    dilation: tuple[int, int]  # (x, y)
    # weights and CBUF
    kernel: tuple[int, int]  # (width, height)
    kernels: int  # WEIGHT_KERNELS
    weight_bytes: int
    weight_bytes_per_kernel: int
    weight_address: int
    data_bank: int
    weight_bank: int
    weight_reuse: bool
    # output
    out_width: int
    out_height: int
    cube: DpuCube
    stages: DpuStages
    bias_address: int
    residual: Operand | None = None
    lut_upload: bool = False  # this task writes stages.lut's tables into the LUT RAM first
    core: int = 0  # which NPU core runs it (multicore.py); not a register
    # CONV_CON1.GROUP_LINE_OFF without a packed image: a DMA line is one row, so a window of the
    # row's columns can be read (a column chunk, LOWERING.md 28; REGISTER_SEMANTICS 2.3)
    single_rows: bool = False
    # sparse weights (RK3576, LOWERING.md 23): (DCOMP_CTRL.DECOMP_CONTROL, DCOMP_AMOUNTn per stream)
    decompress: tuple[int, tuple[int, ...]] | None = None


@dataclass(frozen=True)
class DpuTask:
    """A DPU-only task in flying mode (enable mask 0x18): main data from MRDMA, the second
    operand through ERDMA (element-wise layers, rep09)."""

    layer: str
    source_address: int
    source_surface_stride: int  # the chip's atoms (SURF_NOTCH carries the padding past W x H)
    cube: DpuCube
    stages: DpuStages
    operand: Operand | None = None
    lut_upload: bool = False


@dataclass(frozen=True)
class PpuTask:
    """A PPU pooling task (enable mask 0x60, rep07/rep08)."""

    layer: str
    method: int  # POOLING_METHOD: 0 average, 1 max
    in_width: int
    in_height: int
    channels: int
    out_width: int
    out_height: int
    kernel: tuple[int, int]  # (width, height)
    stride: tuple[int, int]  # (x, y)
    pads: tuple[int, int, int, int]  # (top, left, bottom, right)
    pad_value: int
    recip: tuple[int, int]  # (width, height): 2^16 / k for average, 0 for max
    source_address: int
    source_line_stride: int  # the chip's atoms
    source_surface_stride: int  # the chip's atoms
    dst_address: int
    dst_surface_stride: int  # the chip's atoms
    precision: int  # PPU PROC_PRECISION (DPU code)
    in_precision: int  # PPU_RDMA IN_PRECISION (bit-width code)


TaskDescription = ConvTask | DpuTask | PpuTask
