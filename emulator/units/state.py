"""Decoded register state of the units for one task: what each block was asked to do.

Every field is already in the units the hardware works in (bytes for addresses and strides,
real sizes rather than size - 1); REGISTER_SEMANTICS.md gives the register and the evidence for
each. The dataclasses are frozen: they are the per-task record the timing model and traces
read, and they never change after decoding.
"""

from __future__ import annotations

from typing import Any

from dataclasses import dataclass

import numpy as np

from npuemu.isa import tensor_layout

# Precision codes of CNA/CORE/DPU (rknpu-isa.md 3 "Precision codes", TRM).
INT8, INT16, FP16, BF16, INT32, FP32, INT4 = 0, 1, 2, 3, 4, 5, 6
PRECISION_NAMES = {INT8: "int8", INT16: "int16", FP16: "fp16", BF16: "bf16", INT32: "int32",
                   FP32: "fp32", INT4: "int4"}
#: numpy element type of a precision as stored in memory (fp16 as float16).
PRECISION_DTYPES = {INT8: np.dtype(np.int8), INT16: np.dtype(np.int16), FP16: np.dtype(np.float16),
                    INT32: np.dtype(np.int32), FP32: np.dtype(np.float32)}
ATOM_BYTES = tensor_layout.ATOM_BYTES  # one NC1HWC2 pixel atom on RK3588-class chips; RK356x: 8
def precision_name(code: int) -> str:
    return PRECISION_NAMES.get(code, f"code {code}")


#: C2 of 32-bit elements on every chip: 16-byte pixels even where 8- and 16-bit atoms are 8 bytes
#: (guide table 3-5: RK3566/68 int32/fp32 matmul output [N/4, M, 4]; platforms/rk3568.yaml nc1hwc2).
WIDE_C2 = 4


def c2_of(code: int, atom_bytes: int = ATOM_BYTES) -> int:
    """Channels per pixel for a precision: atom bytes / element size, at least WIDE_C2."""
    if code == INT4:  # two elements per byte: C2 = 32 in a 16-byte atom (rknpu-isa.md 4)
        return max(2 * atom_bytes, WIDE_C2)
    return max(atom_bytes // PRECISION_DTYPES[code].itemsize, WIDE_C2)


@dataclass(frozen=True)
class ConvState:
    """CNA + CORE: one convolution task (input cube, weights, geometry, CORE output)."""

    depthwise: bool
    precision: int  # CNA IN_PRECISION = PROC_PRECISION = CORE PROC_PRECISION
    argb_channels: int  # 0: NC1HWC2 input; 1..4: packed image pixels (ARGB_IN 8..11)
    in_width: int
    in_height: int
    in_channels: int  # DATAIN_CHANNEL (aligned)
    real_channels: int  # from DATAIN_CHANNEL_REAL (REGISTER_SEMANTICS 2.2)
    feature_address: int
    line_stride: int  # bytes between input rows
    surface_stride: int  # bytes between input surfaces (mod 2**32)
    pad_top: int
    pad_left: int
    pad_value: int | float
    stride_x: int
    stride_y: int
    dilation_x: int
    dilation_y: int
    kernel_w: int
    kernel_h: int
    kernels: int  # WEIGHT_KERNELS
    weight_address: int
    weight_bytes: int
    weight_bytes_per_kernel: int
    data_bank: int
    weight_bank: int
    data_reuse: bool
    weight_reuse: bool
    out_width: int
    out_height: int
    out_channels: int  # CORE DATAOUT_CHANNEL + 1
    clip_truncate: int
    round_type: int
    #: Kernels the chip's MAC array produces per pass at this precision (NpuCore's kernel_atoms).
    kernel_group: int = 32
    atom_bytes: int = ATOM_BYTES  # the chip's NC1HWC2 atom (8 on RK356x)
    #: CNA IN_PRECISION (features) and PROC_PRECISION (weights) where they differ from the MAC
    #: precision above (int8 x int4, fp16 x int8/int4; REGISTER_SEMANTICS.md 2.7); None: the same
    feature_precision: int | None = None
    weight_precision: int | None = None
    #: RK3576 sparse weights (DCOMP_CTRL.DECOMP_CONTROL != 0, REGISTER_SEMANTICS.md 2.8): the
    #: decompressor's setting (kernels.weights_sparse.Decompression); weight_bytes and
    #: weight_bytes_per_kernel then hold the dense sizes (twice WEIGHT_SIZE0/1). None: dense
    decompress: Any = None
    #: CNA input converter (CVT_CON0..5, REGISTER_SEMANTICS.md 36): kernels.cna_convert.InputConvert
    #: applied to the int8 features on their way into the CBUF; None: CVT_BYPASS
    input_convert: Any = None
    #: CONV_CON1.DECONV = 1: (stride_y, stride_x) the CNA spreads the input by before the
    #: convolution (kernels/cna_deconv.py, REGISTER_SEMANTICS.md 40); None: a plain convolution
    deconv_stride: tuple[int, int] | None = None

    @property
    def feature_type(self) -> int:
        return self.precision if self.feature_precision is None else self.feature_precision

    @property
    def weight_type(self) -> int:
        return self.precision if self.weight_precision is None else self.weight_precision

    @property
    def c2(self) -> int:
        return c2_of(self.feature_type, self.atom_bytes)

    @property
    def surfaces(self) -> int:
        """Input surfaces the feature DMA reads (1 in image mode)."""
        return 1 if self.argb_channels else -(-self.in_channels // self.c2)

    @property
    def pixel_bytes(self) -> int:
        return self.argb_channels if self.argb_channels else self.atom_bytes

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the real work (for reports; not a cycle count)."""
        taps = self.kernel_h * self.kernel_w * self.out_height * self.out_width
        return taps * (self.in_channels if self.depthwise else self.in_channels * self.kernels)


@dataclass(frozen=True)
class XStageState:
    """BS or BN (BS_CFG/BN_CFG, *_ALU_CFG, *_MUL_CFG, *_RELUX_CMP_VALUE, DATA_FORMAT shifts)."""

    bypass: bool
    alu_bypass: bool
    alu_algo: int
    alu_from_dma: bool
    alu_operand: int
    mul_bypass: bool
    mul_from_dma: bool
    mul_operand: int  # signed 16-bit
    shift_positive: int
    shift_negative: int
    prelu: bool
    relu_bypass: bool
    relux: bool
    relux_value: int
    cpend_bypass: bool = True  # BS only: BS_OW_CFG.OD_BYPASS
    cpend_from_dma: bool = False  # BS only: BS_OW_CFG.OW_SRC
    cpend_operand: int = 0  # BS only: BS_OW_OP (signed 16-bit)


@dataclass(frozen=True)
class EwState:
    """EW stage (EW_CFG, EW_CVT_*, EW_RELUX_CMP_VALUE, EW_OP_VALUE_0, DATA_FORMAT.EW_TRUNCATE_NEG)."""

    bypass: bool
    op_bypass: bool
    op_from_dma: bool
    op_type: int
    alu_algo: int
    op_value: int
    cvt_bypass: bool
    cvt_offset: int
    cvt_scale: int
    cvt_shift: int
    cvt_round: int
    truncate_positive: int
    truncate_negative: int
    prelu: bool
    relu_bypass: bool
    relux: bool
    relux_value: int
    lut_bypass: bool


@dataclass(frozen=True)
class LutTableState:
    start: int
    end: int
    index_select: int
    uflow_scale: int
    uflow_shift: int
    oflow_scale: int
    oflow_shift: int


@dataclass(frozen=True)
class LutState:
    le: LutTableState
    lo: LutTableState
    hybrid_priority: int
    uflow_priority: int
    oflow_priority: int


@dataclass(frozen=True)
class OutCvtState:
    scale: int  # signed 16-bit
    shift: int
    offset: int
    round_bit: int
    fp32_to_fp16: bool
    minus_exp: int = 0  # OUT_CVT_SHIFT.MINUS_EXP: fp path only, y * 2^-MINUS_EXP (NUMERICS 4.6)


@dataclass(frozen=True)
class DpuState:
    """DPU: main cube, stages and the write DMA."""

    flying: bool  # FEATURE_MODE_CFG.FLYING_MODE: main data from MRDMA, not the CORE
    to_memory: bool  # OUTPUT_MODE bit 1
    to_ppu: bool  # OUTPUT_MODE bit 0
    conv_mode: int
    in_precision: int
    proc_precision: int
    out_precision: int
    width: int
    height: int
    channels: int  # DATA_CUBE_CHANNEL.CHANNEL + 1 (padded)
    orig_channels: int  # DATA_CUBE_CHANNEL.ORIG_CHANNEL + 1 (real)
    dst_address: int
    dst_surface_stride: int  # bytes
    surface_add: int  # bytes from one SIZE_E group of surfaces to the next
    size_e: int  # surfaces per group - 1
    bs: XStageState
    bn: XStageState
    ew: EwState
    lut: LutState
    out_cvt: OutCvtState
    atom_bytes: int = ATOM_BYTES  # the chip's NC1HWC2 atom: the unit of lines written
    #: DATA_CUBE_NOTCH_ADDR.NOTCH_ADDR_0, atoms added to each written line: read by the unpooling
    #: write only (kernels/dpu_unpool.py); the other paths keep lines W atoms apart
    line_notch: int = 0
    #: bytes between written pixels, (NOTCH_ADDR_0 + 1) atoms, when the WDMA sizes give the
    #: interleaved write (kernels/dpu_interleave.py); 0: the plain write
    pixel_step: int = 0
    #: TP_EN / TP_ORG_EN: the transpose write (kernels/dpu_transpose.py); None: not transposing
    transpose: Transpose | None = None
    #: WDMA_SIZE_0 rounds CHANNEL up to whole atoms: the lane-clearing copy (kernels/dpu_transpose.py)
    pads_lanes: bool = False
    #: DATA_CUBE_HEIGHT.MINMAX_CTL and OFFSET_PEND (its start value): the channel max (kernels/dpu_reduce.py)
    minmax_ctl: int = 0
    offset_pend: int = 0


@dataclass(frozen=True)
class Transpose:
    """The DPU's transpose write, decoded (kernels/dpu_transpose.py, REGISTER_SEMANTICS.md 31)."""

    mode: int            # 1: FEATURE_MODE_CFG.TP_EN (atom transpose), 2: BS_OW_CFG.TP_ORG_EN (rows to lanes)
    element_bytes: int   # WDMA_SIZE_0.TP_PRECISION: 0 -> 1 byte, 1 -> 2 bytes
    wdma_width: int      # WDMA_SIZE_1 / WDMA_SIZE_0 fields + 1: checked against the vendor's form
    wdma_height: int
    wdma_channels: int
    wdma_atoms: int      # WDMA_SIZE_0.SIZE_C_WDMA + 1
    block_atoms: int     # DATA_CUBE_NOTCH_ADDR.NOTCH_ADDR_0 + 1: TP_ORG_EN's step between row blocks


@dataclass(frozen=True)
class Unpool:
    """DPU_RDMA SRC_DMA_CFG's unpooling kernel and stride, decoded (field + 1; kernels/dpu_unpool.py)."""

    kernel_w: int
    kernel_h: int
    stride_w: int
    stride_h: int


@dataclass(frozen=True)
class DpuRdmaState:
    """DPU_RDMA: MRDMA (main cube in flying mode), BRDMA, NRDMA, ERDMA."""

    width: int
    height: int
    channels: int
    main_enabled: bool  # not FEATURE_MODE_CFG.MRDMA_DISABLE
    flying: bool
    comb_use: int
    in_precision: int
    src_address: int
    line_stride: int  # bytes (width + LINE_NOTCH) * 16
    surface_stride: int  # bytes (line * height + SURF_NOTCH) * 16
    brdma_use: int  # BRDMA_DATA_USE bits: 1 ALU, 2 CPEND, 4 MUL, 8 TRT
    bs_address: int
    nrdma_use: int
    bn_address: int
    erdma_enabled: bool
    erdma_mode: int
    erdma_size: int
    ew_address: int
    ew_line_stride: int  # bytes
    ew_surface_stride: int  # bytes, from EW_SURF_STRIDE
    ew_notch_stride: int  # bytes, (line * height + EW_SURF_NOTCH) * 16: the stride with COMB_USE = 5
    atom_bytes: int = ATOM_BYTES  # the chip's NC1HWC2 atom (strides above count it)
    unpool: Unpool | None = None  # SRC_DMA_CFG.UNPOOLING_EN: the MRDMA feeds the unpooling unit


@dataclass(frozen=True)
class PpuState:
    """PPU: pooling geometry and the output write."""

    flying: bool  # OPERATION_MODE_CFG.FLYING_MODE: source is PPU_RDMA
    dpu_flyin: bool  # DATA_FORMAT.DPU_FLYIN
    method: int
    proc_precision: int
    in_width: int
    in_height: int
    in_channels: int
    out_width: int
    out_height: int
    out_channels: int
    kernel_w: int
    kernel_h: int
    stride_x: int
    stride_y: int
    pad_top: int
    pad_bottom: int
    pad_left: int
    pad_right: int
    pad_value: int
    recip_kernel_w: int
    recip_kernel_h: int
    dst_address: int
    dst_surface_stride: int  # bytes
    atom_bytes: int = ATOM_BYTES  # the chip's NC1HWC2 atom: the unit of lines written


@dataclass(frozen=True)
class PpuRdmaState:
    width: int
    height: int
    channels: int
    src_address: int
    line_stride: int  # bytes
    surface_stride: int  # bytes
    element_bits: int  # IN_PRECISION 0/1/2/3 = 4/8/16/32-bit
    atom_bytes: int = ATOM_BYTES  # the chip's NC1HWC2 atom (strides above count it)
