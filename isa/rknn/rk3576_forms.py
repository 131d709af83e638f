"""The writes the vendor's rk3588 build makes for the conv a vendor rk3576 task describes.

Field names are rk3588.yaml's; each block's values are read from the decoded vendor task
(``rk3576_layout.VendorTask``). Checked against the vendor's own rk3588 builds of the same ONNX
register for register (tests/isa/test_rk3576_vendor_layout.py); the one register not derived is
CNA.CONV_CON2 (FEATURE_GRAINS: no vendor rk3576 word gives it and the emulator does not read it).
"""

from __future__ import annotations

from functools import cache

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn.rk3576_layout import (
    ALU, CPEND, EW_RELU_BYPASS, FEATURE_ALIGN, INT8, KERNEL_GROUP, MUL, RK3588_DEPTHWISE, VendorTask, activation,
    DENSE_SIZES, KEPT_ROW_ORDER, ew_config, ew_relu, is_depthwise, ow_sizes, relux_bound, retained_rows, round_up,
    sparse_mode, weight_sizes,
)

ATOM_BYTES = 16   # NC1HWC2 atom of RK3588 and RK3576 (platforms/*.yaml)

Spec = tuple[str, str, dict[str, int]]
Cbuf = tuple[int, int]                  # banks, bytes per bank
RK3588_CBUF: Cbuf = (12, 32768)         # platforms/rk3588.yaml and rk3576.yaml


def rk3588_specs(task: VendorTask, precision: int, shift: tuple[int, int], cbuf: Cbuf = RK3588_CBUF,
                 lut: tuple[int, list[Spec]] | None = None) -> list[Spec]:
    """(block, register, fields) of every re-packed register, in the RK3588 form, for a chip
    whose CBUF is ``cbuf`` (banks, bytes per bank); ``lut``: a LUT activation's BN negative shift and
    BN / EW / LUT specs (rk3576_lut.rk3588_lut_specs)."""
    return (_cna(task, precision, cbuf) + _core(task, precision) + _dpu(task, precision, shift, lut)
            + _dpu_rdma(task, precision, lut is not None))


def _channels(task: VendorTask, precision: int) -> tuple[int, int, int, int]:
    """(input channels, padded input channels, output channels, padded output channels) as the
    vendor's rk3588 build writes them [V ORC twins: 24 -> 32, 5 -> 16 int8 / 8 fp16 in; 40 -> 64,
    17 -> 32 int8 / 32 fp16 out]."""
    real_in = task.field("CNA", "DATA_IN_CHANNEL", "DATAIN_CHANNEL") + 1
    real_out = task.field("CORE", "DATAOUT_SIZE_1", "DATAOUT_CHANNEL") + 1
    # an fp16 depthwise conv's output is padded to 32 channels [V ORC dw80 fp16 twin: 80 -> 96]
    # an int8 one's to 64 [V ORC dw, dw80 int8 twins: 32 -> 64, 80 -> 128]
    group = (DEPTHWISE_GROUP if precision != INT8 else 2 * DEPTHWISE_GROUP) if is_depthwise(task) else \
        KERNEL_GROUP[precision]
    return (real_in, round_up(real_in, FEATURE_ALIGN[precision]), real_out, round_up(real_out, group))


DEPTHWISE_GROUP = 32


def _cna(task: VendorTask, precision: int, cbuf: Cbuf) -> list[Spec]:
    f = task.field
    con1 = {name: f("CNA", "CONV_CON1", name) for name in
            ("NONALIGN_DMA", "GROUP_LINE_OFF", "PROC_PRECISION", "IN_PRECISION")}
    con1["CONV_MODE"] = _conv_mode(task)
    con3 = {name: f("CNA", "CONV_CON3", name) for name in
            ("ATROUS_Y_DILATION", "ATROUS_X_DILATION", "CONV_Y_STRIDE", "CONV_X_STRIDE")}
    real_in, channels, _, _ = _channels(task, precision)
    width, rows = f("CNA", "DATA_IN_SIZE", "DATAIN_WIDTH") + 1, f("CNA", "DATA_IN_SIZE", "DATAIN_HEIGHT") + 1
    out_width = f("CNA", "DATA_OUT_WIDTH", "DATAOUT_WIDTH") + 1
    entries = f("CNA", "CBUF_CON1", "DATA_ENTRIES")
    size, per_kernel, kernels = weight_sizes(task)
    return [
        ("CNA", "CONV_CON1", con1),
        ("CNA", "CONV_CON2", {}),
        ("CNA", "CONV_CON3", con3),
        ("CNA", "DATA_SIZE0", {"DATAIN_WIDTH": width, "DATAIN_HEIGHT": rows}),
        ("CNA", "DATA_SIZE1", {"DATAIN_CHANNEL_REAL": (real_in - 1) % 64, "DATAIN_CHANNEL": channels}),
        ("CNA", "DATA_SIZE2", {"DATAOUT_WIDTH": out_width}),
        ("CNA", "DATA_SIZE3", {"DATAOUT_ATOMICS": f("CNA", "DATA_OUT_ATOMICS", "DATAOUT_ATOMICS") + 1}),
        ("CNA", "WEIGHT_SIZE0", {"WEIGHT_BYTES": size}),
        ("CNA", "WEIGHT_SIZE1", {"WEIGHT_BYTES_PER_KERNEL": per_kernel}),
        ("CNA", "WEIGHT_SIZE2", {"WEIGHT_WIDTH": f("CNA", "WEIGHT_KERNELS", "WEIGHT_WIDTH") + 1,
                                 "WEIGHT_HEIGHT": f("CNA", "WEIGHT_KERNELS", "WEIGHT_HEIGHT") + 1,
                                 "WEIGHT_KERNELS": kernels}),
        ("CNA", "CBUF_CON0", _banks(task, entries, rows, cbuf)),
        ("CNA", "CBUF_CON1", {"DATA_ENTRIES": entries}),
        *_cna_convert(task),
        ("CNA", "FC_CON0", {}), ("CNA", "FC_CON1", {}), ("CNA", "FC_CON2", {}),
        ("CNA", "PAD_CON0", {"PAD_TOP": f("CNA", "PAD_CON0", "PAD_TOP"),
                             "PAD_LEFT": f("CNA", "PAD_CON0", "PAD_LEFT")}),
        ("CNA", "DMA_CON0", {"WEIGHT_BURST_LEN": f("CNA", "DMA_CON0", "WEIGHT_BURST_LEN"),
                             "DATA_BURST_LEN": f("CNA", "DMA_CON0", "DATA_BURST_LEN")}),
        *_cna_strides(task, width),
        ("CNA", "FC_DATA_SIZE0", {"DMA_WIDTH": f("CNA", "DMA_SIZE", "DMA_WIDTH") + 1, "DMA_HEIGHT": rows}),
        ("CNA", "FC_DATA_SIZE1", {"DMA_CHANNEL": channels}),
        ("CNA", "FEATURE_DATA_ADDR", {"FEATURE_BASE_ADDR": _window_address(task)}),
        ("CNA", "CLK_GATE", {}),
        ("CNA", "PAD_CON1", {"PAD_VALUE": f("CNA", "PAD_VALUE", "PAD_VALUE")}),
    ]


def _conv_mode(task: VendorTask) -> int:
    """RK3588's CONV_MODE: 0 direct, 3 depthwise where the vendor's rk3576 words write 1 [V ORC dw twins]."""
    return RK3588_DEPTHWISE if is_depthwise(task) else 0


def _window_address(task: VendorTask) -> int:
    """The feature address of the task's whole window: a task keeping rows in the CBUF points
    at its first fetched row; the RK3588 form re-fetches the kept rows from DDR (one row =
    LINE_STRIDE / 4 atoms, or LINE_STRIDE with GROUP_LINE_OFF; 16-byte atoms)."""
    line = task.field("CNA", "LINE_STRIDE", "LINE_STRIDE")
    row_bytes = (line if task.field("CNA", "CONV_CON1", "GROUP_LINE_OFF") else line // 4) * ATOM_BYTES
    return (task.raw("CNA", "FEATURE_DATA_ADDR") - retained_rows(task) * row_bytes) % (1 << 32)


CBUF_ENTRY_BYTES = 64


def _banks(task: VendorTask, entries: int, rows: int, cbuf: Cbuf) -> dict[str, int]:
    """RK3588 banks for the task's window, as the vendor's rk3588 build allocates them: the
    fewest that hold its rows, the rest for weights [V ORC: 56 x 56 x 64 int8 -> 7 + 5; small
    inputs 1 + 11]. The vendor's own rk3576 bank words (CBUF_BANKS, CBUF_DATA, CBUF_CON0) have
    no RK3588 equivalent [I]."""
    banks, bank_bytes = cbuf
    data = max(1, -(-entries * rows * CBUF_ENTRY_BYTES // bank_bytes))
    if data >= banks:
        raise UnsupportedProgramError(f"{task.where}: a {rows}-row window of {entries} CBUF entries per row needs "
                                      f"{data} banks of {bank_bytes} bytes; the CBUF has {banks}, one at least "
                                      f"for weights")
    return {"DATA_BANK": data, "WEIGHT_BANK": banks - data}


def _cna_convert(task: VendorTask) -> list[Spec]:
    f = task.field
    con0 = {name: f("CNA", "CVT_CON0", name) for name in
            ("CVT_TRUNCATE_3", "CVT_TRUNCATE_2", "CVT_TRUNCATE_1", "CVT_TRUNCATE_0", "DATA_SIGN", "ROUND_TYPE",
             "CVT_TYPE", "CVT_BYPASS")}
    scales = (f("CNA", "CVT_SCALE01", "CVT_SCALE0"), f("CNA", "CVT_SCALE01", "CVT_SCALE1"),
              f("CNA", "CVT_SCALE23", "CVT_SCALE2"), f("CNA", "CVT_SCALE23", "CVT_SCALE3"))
    specs: list[Spec] = [("CNA", "CVT_CON0", con0)]
    for index, scale in enumerate(scales):   # offsets 0: the converter is bypassed (checked)
        specs.append(("CNA", f"CVT_CON{index + 1}", {f"CVT_SCALE{index}": scale}))
    return specs + [("CNA", "CVT_CON5", {})]


def _cna_strides(task: VendorTask, width: int) -> list[Spec]:
    """LINE_STRIDE as written; RK3588's SURF_STRIDE counts from the end of the surface's first
    DMA line (REGISTER_SEMANTICS.md 2.3), the vendor's rk3576 word is the whole plane [V ORC:
    rk3588 2912 = 3136 - 224 for 56 x 56, 480 = 600 - 120 for 30 x 20]."""
    line = task.field("CNA", "LINE_STRIDE", "LINE_STRIDE")
    plane = task.field("CNA", "SURF_STRIDE", "SURF_STRIDE")
    first_line = width if task.field("CNA", "CONV_CON1", "GROUP_LINE_OFF") else 3 * line // 4 + width
    return [("CNA", "DMA_CON1", {"LINE_STRIDE": line}),
            ("CNA", "DMA_CON2", {"SURF_STRIDE": (plane - first_line) % (1 << 28)})]


def _core(task: VendorTask, precision: int) -> list[Spec]:
    f = task.field
    _, _, _, channels = _channels(task, precision)
    return [
        ("CORE", "MISC_CFG", {"QD_EN": f("CORE", "MISC_CFG", "QD_EN"), "DW_EN": f("CORE", "MISC_CFG", "DW_EN"),
                              "PROC_PRECISION": f("CORE", "MISC_CFG", "PROC_PRECISION")}),
        ("CORE", "DATAOUT_SIZE_0", {"DATAOUT_HEIGHT": f("CORE", "DATAOUT_SIZE_0", "DATAOUT_HEIGHT"),
                                    "DATAOUT_WIDTH": f("CORE", "DATAOUT_SIZE_0", "DATAOUT_WIDTH")}),
        ("CORE", "DATAOUT_SIZE_1", {"DATAOUT_CHANNEL": channels - 1}),
        ("CORE", "CLIP_TRUNCATE", {"ROUND_TYPE": f("CORE", "CLIP_TRUNCATE", "ROUND_TYPE"),
                                   "CLIP_TRUNCATE": f("CORE", "CLIP_TRUNCATE", "CLIP_TRUNCATE")}),
        ("CORE", "UNDOC_3030", {}),
    ]


def _dpu(task: VendorTask, precision: int, shift: tuple[int, int], lut: tuple[int, list[Spec]] | None) -> list[Spec]:
    f = task.field
    _, _, real_out, channels = _channels(task, precision)
    surface = f("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")
    data_format = {"OUT_PRECISION": f("DPU", "DATA_FORMAT", "OUT_PRECISION"),
                   "IN_PRECISION": f("DPU", "DATA_FORMAT", "PROC_PRECISION"),   # [V ORC twins: IN = PROC]
                   "PROC_PRECISION": f("DPU", "DATA_FORMAT", "PROC_PRECISION"),
                   "BS_MUL_SHIFT_VALUE_NEG": shift[1], "BN_MUL_SHIFT_VALUE_NEG": lut[0] if lut else 0}
    return [
        ("DPU", "FEATURE_MODE_CFG", {"BURST_LEN": 15, "OUTPUT_MODE": f("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE"),
                                     "CONV_MODE": _conv_mode(task),
                                     "FLYING_MODE": f("DPU", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU", "DATA_FORMAT", data_format),
        ("DPU", "OFFSET_PEND", {"OFFSET_PEND": f("DPU", "OFFSET_PEND", "OFFSET_PEND")}),
        ("DPU", "DST_BASE_ADDR", {"DST_BASE_ADDR": task.raw("DPU", "DST_BASE_ADDR")}),
        ("DPU", "DST_SURF_STRIDE", {"DST_SURF_STRIDE": surface}),
        ("DPU", "DATA_CUBE_WIDTH", {"WIDTH": f("DPU", "DATA_CUBE_WIDTH", "WIDTH")}),
        ("DPU", "DATA_CUBE_HEIGHT", {"HEIGHT": f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")}),
        ("DPU", "DATA_CUBE_NOTCH_ADDR", {}),
        ("DPU", "DATA_CUBE_CHANNEL", {"ORIG_CHANNEL": real_out - 1, "CHANNEL": channels - 1}),
        *_dpu_bs(task, shift),
        ("DPU", "WDMA_SIZE_0", {"CHANNEL_WDMA": channels - 1}),
        ("DPU", "WDMA_SIZE_1", {"HEIGHT_WDMA": f("DPU", "WDMA_SIZE", "HEIGHT_WDMA"),
                                "WIDTH_WDMA": f("DPU", "WDMA_SIZE", "WIDTH_WDMA")}),
        *(lut[1] if lut else _dpu_bn_ew(task)),
        ("DPU", "OUT_CVT_OFFSET", {"OUT_CVT_OFFSET": f("DPU", "OUT_CVT_OFFSET", "OUT_CVT_OFFSET")}),
        ("DPU", "OUT_CVT_SCALE", {"OUT_CVT_SCALE": f("DPU", "OUT_CVT_SCALE", "OUT_CVT_SCALE"),
                                  "FP32TOFP16_EN": _fp32_to_fp16(task, precision)}),
        ("DPU", "OUT_CVT_SHIFT", {name: f("DPU", "OUT_CVT_SHIFT", name)
                                  for name in ("CVT_TYPE", "CVT_ROUND", "MINUS_EXP", "OUT_CVT_SHIFT")}),
        ("DPU", "SURFACE_ADD", {"SURF_ADD": _surface_add(task)}),
        ("DPU", "UNDOC_40C4", {}),
    ]


def _surface_add(task: VendorTask) -> int:
    """The vendor's 0x40B8 is SURF_ADD - W x H (2 x the surface stride with SIZE_E 1, 4 x with the
    depthwise's SIZE_E 3) [V ORC twins]; a sparse conv in kept-row order writes the depthwise's 4 x,
    its RK3588 form (the dense conv's order) 2 x [V: sparse vs dense builds, LOWERING.md 44]."""
    f = task.field
    surface = task.raw("DPU", "SURFACE_JUMP") + (f("DPU", "DATA_CUBE_WIDTH", "WIDTH") + 1) * (
        f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT") + 1)
    return surface // 2 if sparse_mode(task) in KEPT_ROW_ORDER else surface


def _dpu_bs(task: VendorTask, shift: tuple[int, int]) -> list[Spec]:
    """BS from the record's operands: ALU add (bias), CPEND x window sum, MUL with the shift word,
    as the vendor's rk3588 build programs them [V ORC: int8 0x20140 / 0xe01 / 0x125 with ALU +
    CPEND + MUL; fp16 0x20150 / 0 / 0x126 with ALU only]."""
    uses = task.field("DPU_RDMA", "BRDMA_CFG", "BRDMA_DATA_USE")
    if not uses & ALU:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 BS record without a bias "
                                      f"(DPU_RDMA.BRDMA_CFG {task.raw('DPU_RDMA', 'BRDMA_CFG'):#x}); not decoded")
    mul = bool(uses & MUL)
    cpend = bool(uses & CPEND)
    # SIZE_E 1 direct, 3 depthwise [V ORC twins]; a sparse conv in kept-row order: the dense conv's
    sizes = DENSE_SIZES if sparse_mode(task) in KEPT_ROW_ORDER else ow_sizes(task)
    return [
        ("DPU", "BS_CFG", {"BS_ALU_ALGO": 2, "BS_ALU_SRC": 1, "BS_RELU_BYPASS": 1, "BS_MUL_BYPASS": int(not mul)}),
        ("DPU", "BS_ALU_CFG", {}),
        ("DPU", "BS_MUL_CFG", {"BS_MUL_SHIFT_VALUE": shift[0], "BS_MUL_SRC": 1} if mul else {}),
        ("DPU", "BS_RELUX_CMP_VALUE", {}),
        ("DPU", "BS_OW_CFG", {"SIZE_E_2": sizes[0], "SIZE_E_1": sizes[1], "SIZE_E_0": sizes[2],
                              "OD_BYPASS": int(not cpend), "OW_SRC": int(cpend)}),
        ("DPU", "BS_OW_OP", {}),
    ]


def _fp32_to_fp16(task: VendorTask, precision: int) -> int:
    """OUT_CVT_SCALE bit 16: FP32TOFP16_EN, except in an int8 task with an EW Add, where the vendor
    sets it and its rk3588 build does not [V ORC: Conv + Add int8, with and without Relu] [I: role]."""
    bit = task.field("DPU", "OUT_CVT_SCALE", "FP32TOFP16_EN")
    return 0 if precision == INT8 and ew_config(task) is not None else bit


def _dpu_bn_ew(task: VendorTask) -> list[Spec]:
    """BN and EW bypassed, or the Relu in BN as the rk3588 build puts it [V ORC relu twin:
    BN_CFG 0x12; r6 twin: 0x92 with RELUX_EN and the bound in BN_RELUX_CMP_VALUE]; EW_OP_VALUE_7 is
    absent from rk3576.yaml (its offset holds OUT_CVT_OFFSET)."""
    act = activation(task)
    relux = act == "relux"
    bn = ({"BN_RELUX_EN": int(relux), "BN_MUL_BYPASS": 1, "BN_ALU_BYPASS": 1} if act != "none" else
          {"BN_RELU_BYPASS": 1, "BN_MUL_BYPASS": 1, "BN_ALU_BYPASS": 1, "BN_BYPASS": 1})
    bound = {"BN_RELUX_CMP_DAT": relux_bound(task)} if relux else {}
    config = ew_config(task)
    if config is None:
        ew = {"EW_RELU_BYPASS": 1, "EW_OP_CVT_BYPASS": 1, "EW_LUT_BYPASS": 1, "EW_OP_BYPASS": 1, "EW_BYPASS": 1}
        converter = ({}, {"EW_OP_CVT_SCALE": 1})
    else:   # the Add of the ERDMA operand, its converter words as written [V ORC add twins]
        ew = _rk3588_fields("EW_CFG", config & ~(EW_RELU_BYPASS if ew_relu(task) else 0))
        converter = (_rk3588_fields("EW_CVT_OFFSET_VALUE", task.raw("DPU", "CFG_4080")),
                     _rk3588_fields("EW_CVT_SCALE_VALUE", task.raw("DPU", "CFG_4084")))
    specs: list[Spec] = [("DPU", "BN_CFG", bn), ("DPU", "BN_ALU_CFG", {}), ("DPU", "BN_MUL_CFG", {}),
                         ("DPU", "BN_RELUX_CMP_VALUE", bound), ("DPU", "EW_CFG", ew),
                         ("DPU", "EW_CVT_OFFSET_VALUE", converter[0]), ("DPU", "EW_CVT_SCALE_VALUE", converter[1]),
                         ("DPU", "EW_RELUX_CMP_VALUE", {})]
    return specs + [("DPU", f"EW_OP_VALUE_{index}", {}) for index in range(8)]


def _dpu_rdma(task: VendorTask, precision: int, bn_record: bool = False) -> list[Spec]:
    f = task.field
    _, _, _, channels = _channels(task, precision)
    erdma = {name: f("DPU_RDMA", "ERDMA_CFG", name) for name in
             ("ERDMA_DATA_MODE", "ERDMA_SURF_MODE", "ERDMA_NONALIGN", "ERDMA_DATA_SIZE", "OV4K_BYPASS",
              "ERDMA_DISABLE")}
    mode = {name: f("DPU_RDMA", "FEATURE_MODE_CFG", name) for name in
            ("IN_PRECISION", "COMB_USE", "PROC_PRECISION", "MRDMA_DISABLE", "MRDMA_FP16TOFP32_EN", "CONV_MODE",
             "FLYING_MODE")}
    residual = ew_config(task) is not None
    if ((task.raw("DPU_RDMA", "NRDMA_CFG") and not bn_record) or erdma["ERDMA_DISABLE"] == residual or not mode["MRDMA_DISABLE"]
            or mode["COMB_USE"] or (residual and erdma["ERDMA_DATA_MODE"] != 1)):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU_RDMA reads a BN or main operand, or an EW "
                                      f"operand other than a whole cube added by the EW stage (NRDMA_CFG, "
                                      f"ERDMA_CFG, FEATURE_MODE_CFG); not decoded")
    # with the EW Add the vendor reads the whole residual through the ERDMA (COMB_USE 0, MRDMA off),
    # sets ERDMA bit 28 and FEATURE_MODE_CFG bit 3, which its rk3588 builds do not [V ORC add]:
    # the RK3588 form reads it the same way (REGISTER_SEMANTICS.md 3.4, ERDMA alone)
    erdma["ERDMA_NONALIGN"] = 0
    mode["MRDMA_FP16TOFP32_EN"] = 0 if residual else mode["MRDMA_FP16TOFP32_EN"]
    return [
        ("DPU_RDMA", "DATA_CUBE_CHANNEL", {"CHANNEL": channels - 1}),
        ("DPU_RDMA", "BRDMA_CFG", {"BRDMA_DATA_USE": f("DPU_RDMA", "BRDMA_CFG", "BRDMA_DATA_USE")}),
        ("DPU_RDMA", "NRDMA_CFG", {}),
        ("DPU_RDMA", "ERDMA_CFG", erdma),
        ("DPU_RDMA", "FEATURE_MODE_CFG", {**mode, "CONV_MODE": _conv_mode(task), "BURST_LEN": 15}),
        ("DPU_RDMA", "WEIGHT", {"E_WEIGHT": 1, "N_WEIGHT": 1, "B_WEIGHT": 1, "M_WEIGHT": 1}),
        # surface steps in atoms from bit 0 on rk3576, bits 31:4 on RK3588 [V ORC add]
        ("DPU_RDMA", "EW_SURF_STRIDE", {"EW_SURF_STRIDE": f("DPU_RDMA", "EW_SURF_STRIDE", "EW_SURF_STRIDE")}),
        ("DPU_RDMA", "SURF_NOTCH", {"SURF_NOTCH_ADDR": f("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR")}),
        ("DPU_RDMA", "EW_SURF_NOTCH", {"EW_SURF_NOTCH": f("DPU_RDMA", "EW_SURF_NOTCH", "EW_SURF_NOTCH")}),
    ]


@cache
def _rk3588_map():
    return load_regmap("rk3588")


def _rk3588_fields(register: str, raw: int) -> dict[str, int]:
    """A raw DPU word as RK3588 field values (packed back by the translation's own map)."""
    return _rk3588_map().register("DPU", register).unpack(raw)
