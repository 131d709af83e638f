"""A conv or DPU-only task's RK3588-position writes re-packed into the vendor's rk3576 layout.

The inverse of ``rk3576_forms``: npuemu's own rk3576 builds emit what the vendor's toolkit
writes for the same conv (``isa/regmaps/rk3576_vendor.yaml``, emulator/REGISTER_SEMANTICS.md
10.3 and 39), word for word in the vendor's order (139 writes, the reserved zero words
included). Every value comes from the RK3588 form of the task (npuemu's ``rk3576`` map, the
register names shared with rk3588.yaml); the few vendor words with no RK3588 counterpart hold
the values every single-task vendor build holds ([I], listed in ``FIXED``).

What the vendor layout is known to express (the classes ``rk3576_forms`` translates): direct
int8 / fp16 convolutions with the BS record, no activation, a Relu or a Relu6 / Clip(0, x), a
residual Add (+ Relu) in the EW stage, dense or sparse weights (4:2 along either axis, 16:4: LOWERING.md
44), the whole window fetched by the task; int8 LUT activations with their BN record (``rk3576_lut``, LOWERING.md
46); fp16 depthwise convs; fp16 DPU-only Adds / Muls and int8 ones with their BS record, an int8 Mul by a
per-channel operand too (``dpu_vendor_writes``, ``dpu_record``; PPU pools: ``rk3576_ppu``).
Anything else raises
:class:`UnsupportedProgramError` naming what, and :func:`check_round_trip` proves that the
vendor words translate back to the same RK3588 registers the emulator reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_layout import (
    ALU, BY_PRECISION, C2, DEPTHWISE_WORDS, EW_BYPASS, EW_CONFIGS, EW_RELU_BYPASS, EW_RELU_CLAMPS, FP16, INT32_MAX,
    BS_CHANNEL_ORDER, LUT_ACT_CFG, LUT_EW_WORD,
    INT32_MIN, INT8, KEPT_ROW_ORDER, KERNEL_MODE, MUL, RELU_CLAMPS, RK3588_DEPTHWISE, SPARSE_CONTROL,
    VENDOR_DEPTHWISE, VENDOR_DEPTHWISE_SIZES, bs_ow_word, read_task, field_reader, round_up,
)
from npuemu.isa.rknn.rk3576_dpu import (
    ALL_BYPASSED_BUT_ALU, BS_MUL_BYPASS, DPU_ONLY_EW, DPU_ONLY_WORDS, INT8_BS_WORDS, INT8_WORDS,
    RECORD_BYTES, minus_as_add, pack_record, record_cfg,
)
from npuemu.isa.rknn.rk3576_layout import CONV_ENABLE
from npuemu.isa.rknn.rk3576_ew import channels_packable, lut_flagged, without_lut_flag
from npuemu.isa.rknn.rk3576_dw8 import to_vendor as dw8_to_vendor
from npuemu.isa.rknn.rk3576_clip import CLIP_RECORD_CFG, as_the_twin_writes_it, npuemu_clip, vendor_clip_words
from npuemu.isa.rknn.rk3576_lut import BN_RECORD_CFG, RK3588_LUT_EW, check_lut, vendor_lut_words
from npuemu.isa.rknn.rk3576_lut_fp16 import vendor_out_cvt
from npuemu.isa.rknn.rk3576_program import translate_task
from npuemu.isa.words import encode_write

Values = Mapping[tuple[str, str], int]        # (block, register) -> raw value, RK3588 names
Field = Callable[[str, str, str], int]
VendorWrite = tuple[str, str, int]

#: Vendor words with no RK3588 equivalent, as every vendor build writes them [V ORC, FIX,
#: REGISTER_SEMANTICS.md 10.3]; CBUF_CON0's data allowance follows the layer's banks (cbuf_banks).
CBUF_BANKS_ENABLE = 0x40000000
FIXED = {("CNA", "CONV_CON2"): 0xFFF, ("CNA", "CBUF_CON0"): 0x10000000, ("DPU", "CFG_40C0"): 0x04440100,
         ("DPU", "CFG_40D0"): 0x0040FFFF}
FORMAT_DENSE, FORMAT_SPARSE = 0x7, 0xE07     # CNA 0x1038 [V ORC; FIX sparse_rk3576_int8]
DW_FLAG = 1 << 3                             # CORE 0x3018 bit 3, depthwise [V ORC]
ACT_NONE, ACT_RELU = 0x903, 0x902            # DPU 0x4060 [V ORC]
TASK_SURFACE_ALIGN = 4                       # CNA 0x1098: W x rows rounded up to 4 [V ORC 11x9: 100]


def vendor_writes(values: Values, source: RegisterMap, *, shift_address: int, where: str,
                  layer_window: int | None = None, lut: tuple[int, tuple[int, int]] | None = None,
                  clip: int | None = None) -> list[VendorWrite]:
    """The vendor-layout writes of the conv task whose RK3588-position writes are ``values``
    (``source``: the map they were packed with). ``shift_address``: where the task's 16-bit BS
    shift word lies (DPU_RDMA 0x5024); ``layer_window``: the largest window (CBUF bytes) of the
    tasks of its layer (None: this task's), which sets the CBUF bank words; ``lut``: a LUT activation's BN
    record address and table ends (rk3576_lut; the upload itself is the caller's to append); ``clip``: a Clip
    with a lower bound's record address (rk3576_clip)."""

    field = field_reader(values, source)
    if lut is not None:   # a DPU LUT activation (rk3576_lut, REGISTER_SEMANTICS.md 46)
        check_lut(values, source, where)
    bounds = npuemu_clip(values) if clip is not None else None
    if clip is not None and bounds is None:
        raise UnsupportedProgramError(f"{where}: a Clip other than npuemu's int8 BN max / ReLU-X has no known vendor "
                                      f"rk3576 form (emulator/REGISTER_SEMANTICS.md 46.5)")
    _check_expressible(values, field, where, lut is not None, bounds is not None)
    geometry = _geometry(field)
    geometry["banks"] = cbuf_banks(window_bytes(values, source) if layer_window is None else layer_window)
    if lut is not None:
        geometry["lut"] = vendor_lut_words(values, source, lut[1])
        geometry["bn_record"] = lut[0]
        if geometry["precision"] == FP16:   # the table-unit factor in OUT_CVT (rk3576_lut_fp16)
            geometry["out_cvt"] = vendor_out_cvt(values, where)
    if bounds is not None:   # the vendor's arrangement of the Clip (rk3576_clip)
        geometry["clip"], geometry["bn_record"], geometry["bn_cfg"] = vendor_clip_words(bounds), clip, CLIP_RECORD_CFG
    writes = (_cna(values, field, geometry) + _core(field, geometry)
              + _dpu(values, field, geometry) + _dpu_rdma(values, field, geometry, shift_address))
    # int8 depthwise: the cube with CPEND, the record without (rk3576_dw8, REGISTER_SEMANTICS.md 45.2)
    return dw8_to_vendor(writes, where) if geometry["depthwise"] and geometry["precision"] == INT8 else writes


def dpu_vendor_writes(values: Values, source: RegisterMap, where: str, record_address: int = 0) -> list[VendorWrite]:
    """The vendor-layout writes of a DPU-only task (rk3576_dpu: an fp16 EW Add or Mul of the MRDMA
    and the ERDMA operand, the BS stage bypassed; or int8, the BS operands in the record at
    ``record_address``, :func:`dpu_record`): the conv task's DPU and DPU_RDMA words, re-marked."""

    values = minus_as_add(values, source)   # an int8 Sub: the vendor's Add of the negated operand
    field = field_reader(values, source)
    precision = field("DPU", "DATA_FORMAT", "PROC_PRECISION")
    real_out = field("DPU", "DATA_CUBE_CHANNEL", "ORIG_CHANNEL") + 1
    # a Mul by a per-channel operand (ERDMA_DATA_MODE 0, EW_DATA_MODE 0: an SE gate): the vendor's 0x407C is
    # the whole-operand Mul's, the ERDMA word says which (REGISTER_SEMANTICS.md 46.3)
    per_channel = per_channel_mul(values, source) and precision in (INT8, FP16)   # [V ORC se, se8; fp16: 50.4]
    ew = _ew_stage({**values, ("DPU", "EW_CFG"): values.get(("DPU", "EW_CFG"), 0) | EW_DATA_MODE_ELEMENT}
                   if per_channel else values, precision, DPU_ONLY_EW_WORDS)
    int8 = precision == INT8 and _int8_bs(values, field) is not None
    padded = field("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    if (not (precision == FP16 or int8) or ew is None or (ew[1] and not int8)
            or (not int8 and values.get(("DPU", "BS_CFG"), 0) != BS_BYPASSED)
            or values.get(("DPU", "BN_CFG"), 0) != BS_BYPASSED or field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE")
            or (field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DATA_MODE") != 1 and not per_channel)
            or field("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE")
            or field("DPU_RDMA", "FEATURE_MODE_CFG", "COMB_USE")
            # channels padded to whole atoms: the vendor's DPU_RDMA word holds the padded count for a per-channel
            # Mul [V ORC se8], the real one for a whole operand's Add / Sub / Mul [V ORC x + z, x - z, x * z on 24
            # channels] (REGISTER_SEMANTICS.md 48.2)
            or (padded != real_out and not (int8 or precision == FP16 and not per_channel))
            or not channels_packable(precision, padded, real_out)   # fp16 too: rk3576_ew, REGISTER_SEMANTICS.md 54
            or padded != field("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") + 1 or values.get(("DPU", "LUT_CFG"), 0)
            or values.get(("DPU", "DATA_CUBE_NOTCH_ADDR"), 0) or values.get(("DPU_RDMA", "NRDMA_CFG"), 0)
            or field("DPU_RDMA", "BRDMA_CFG", "BRDMA_DATA_USE")):
        raise UnsupportedProgramError(f"{where}: a DPU-only task other than an fp16 or int8 Add or Mul of two whole operands "
                                      f"(EW_CFG {values.get(('DPU', 'EW_CFG'), 0):#x}, BS_CFG "
                                      f"{values.get(('DPU', 'BS_CFG'), 0):#x}) has no known form in the vendor rk3576 "
                                      f"layout (emulator/REGISTER_SEMANTICS.md 41)")
    g = {"precision": precision, "real_out": real_out, "depthwise": 0, "order": 0, "dpu_only": 1,
         "dpu_words": DPU_ONLY_WORDS, "ew": ew, "rdma_channels": padded if per_channel else real_out}
    if int8:
        has_mul = _int8_bs(values, field)
        g.update(dpu_words={**INT8_WORDS, **INT8_BS_WORDS[has_mul]}, brdma=record_cfg(has_mul), record=record_address)
    return ([("DPU", "S_POINTER", values[("DPU", "S_POINTER")]),
             ("DPU_RDMA", "S_POINTER", values[("DPU_RDMA", "S_POINTER")])]
            + _dpu(values, field, g) + _dpu_rdma(values, field, g, 0))


def lut_dpu_vendor_writes(values: Values, source: RegisterMap, where: str, lut: tuple[int, tuple[int, int]]
                          ) -> list[VendorWrite]:
    """The vendor-layout writes of npuemu's int8 / fp16 standalone LUT task (a DPU-only task with the LUT stage; ``lut``:
    its BN record's address and the table ends, as for a LUT conv): the DPU-only frame with the LUT conv's words
    (rk3576_ew, REGISTER_SEMANTICS.md 54.2); the upload is the caller's to append."""
    check_lut(values, source, where)
    field = field_reader(values, source)
    real_out = field("DPU", "DATA_CUBE_CHANNEL", "ORIG_CHANNEL") + 1
    precision = field("DPU", "DATA_FORMAT", "PROC_PRECISION")
    if (precision not in (INT8, FP16) or values.get(("DPU", "BS_CFG"), 0) != BS_BYPASSED
            or not field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE") or field("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE")
            or field("DPU_RDMA", "FEATURE_MODE_CFG", "COMB_USE") or values.get(("DPU_RDMA", "BRDMA_CFG"), 0)
            or values.get(("DPU", "DATA_CUBE_NOTCH_ADDR"), 0)
            or not channels_packable(precision, field("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1, real_out)):
        raise UnsupportedProgramError(f"{where}: a DPU-only LUT task other than an int8 / fp16 one of a whole MRDMA operand "
                                      f"(precision {precision}, BS_CFG {values.get(('DPU', 'BS_CFG'), 0):#x}) has no "
                                      f"known form in the vendor rk3576 layout (emulator/REGISTER_SEMANTICS.md 54.2)")
    g = {"precision": precision, "real_out": real_out, "depthwise": 0, "order": 0, "dpu_only": 1,
         "dpu_words": DPU_ONLY_WORDS, "ew": None, "rdma_channels": real_out,
         "lut": vendor_lut_words(values, source, lut[1]), "bn_record": lut[0]}
    if precision == FP16:   # the table-unit factor in OUT_CVT (rk3576_lut_fp16)
        g["out_cvt"] = vendor_out_cvt(values, where)
    return lut_flagged([("DPU", "S_POINTER", values[("DPU", "S_POINTER")]),
                        ("DPU_RDMA", "S_POINTER", values[("DPU_RDMA", "S_POINTER")])]
                       + _dpu(values, field, g) + _dpu_rdma(values, field, g, 0), precision)


BS_BYPASSED = 0x53                           # RK3588 BS_CFG / BN_CFG with every stage bypassed
EW_DATA_MODE_ELEMENT = 1 << 28               # RK3588 EW_CFG.EW_DATA_MODE 1: an operand per element


def per_channel_mul(values: Values, source: RegisterMap) -> bool:
    """An EW Mul whose ERDMA operand holds one value per channel (ERDMA_DATA_MODE 0, EW_DATA_MODE 0)."""
    ew = source.register("DPU", "EW_CFG").unpack(values.get(("DPU", "EW_CFG"), 0))
    return (bool(ew["EW_OP_TYPE"]) and not ew["EW_BYPASS"] and not ew["EW_OP_BYPASS"] and ew["EW_DATA_MODE"] == 0
            and source.register("DPU_RDMA", "ERDMA_CFG").field("ERDMA_DATA_MODE").extract(
                values.get(("DPU_RDMA", "ERDMA_CFG"), 0)) == 0)
#: RK3588 EW_CFG (Relu bit cleared) -> the vendor's 0x407C word, DPU-only tasks only (rk3576_dpu.DPU_ONLY_EW)
DPU_ONLY_EW_WORDS = {(precision, config): word for (precision, word), config in DPU_ONLY_EW.items()}


def _int8_bs(values: Values, field: Field) -> bool | None:
    """An int8 DPU-only task's BS stage as the vendor's record holds it: the ALU add of a register operand,
    then the register multiplier (True) or none (False); None: any other stage [V ORC int8 twins]."""
    config = values.get(("DPU", "BS_CFG"), 0)
    if config not in (ALL_BYPASSED_BUT_ALU, ALL_BYPASSED_BUT_ALU | BS_MUL_BYPASS):
        return None
    has_mul = config == ALL_BYPASSED_BUT_ALU
    if (field("DPU", "BS_MUL_CFG", "BS_MUL_SRC") or field("DPU", "BS_MUL_CFG", "BS_TRUNCATE_SRC")
            or (not has_mul and (values.get(("DPU", "BS_MUL_CFG"), 0)
                                 or field("DPU", "DATA_FORMAT", "BS_MUL_SHIFT_VALUE_NEG")))
            or values.get(("DPU", "BS_OW_CFG"), 0) != BS_OW_BYPASSED or values.get(("DPU", "BS_OW_OP"), 0)
            or values.get(("DPU", "BS_RELUX_CMP_VALUE"), 0)):
        return None
    return has_mul


BS_OW_BYPASSED = 0x2                         # RK3588 BS_OW_CFG.OD_BYPASS alone


def dpu_record(values: Values, source: RegisterMap) -> bytes | None:
    """The BS record an int8 DPU-only task's vendor form points DPU_RDMA 0x5024 at (rk3576_dpu.pack_record);
    None for any other task."""
    field = field_reader(values, source)
    if field("DPU", "DATA_FORMAT", "PROC_PRECISION") != INT8:
        return None
    has_mul = _int8_bs(values, field)
    if has_mul is None:
        return None
    alu = values.get(("DPU", "BS_ALU_CFG"), 0)
    return pack_record(alu - (1 << 32) if alu >> 31 else alu,
                       field("DPU", "BS_MUL_CFG", "BS_MUL_OPERAND") if has_mul else None,
                       field("DPU", "BS_MUL_CFG", "BS_MUL_SHIFT_VALUE"),
                       field("DPU", "DATA_FORMAT", "BS_MUL_SHIFT_VALUE_NEG"))
CBUF_ENTRY_BYTES = 64
BANK_UNIT = 65536          # [I] the unit of CNA 0x1018's bank counts
MIN_BANKS = 4


def window_bytes(values: Values, source: RegisterMap) -> int:
    """CBUF bytes of the task's input window: entries per row x rows x 64."""
    entries = source.register("CNA", "CBUF_CON1").field("DATA_ENTRIES").extract(values.get(("CNA", "CBUF_CON1"), 0))
    rows = source.register("CNA", "DATA_SIZE0").field("DATAIN_HEIGHT").extract(values.get(("CNA", "DATA_SIZE0"), 0))
    return entries * rows * CBUF_ENTRY_BYTES


def cbuf_banks(window: int) -> int:
    """CNA 0x1018's bank count of a layer [I, fitted on the vendor's single-core programs: 4 for
    windows up to 200704 bytes (fixtures' 56 x 56 x 64 int8, every small oracle build), 5 for the
    largest windows of 322560 (fp16 fixture, 45 rows; its 13-row task too) and 327680 (the 3400 x 16
    tall conv, all three tasks): the layer's largest window in 64 KB units, at least 4]."""
    return max(MIN_BANKS, -(-window // BANK_UNIT))


def shift_word(values: Values, source: RegisterMap) -> int:
    """The 16-bit BS shift word of the task [I: low byte BS_MUL_SHIFT_VALUE, high byte
    BS_MUL_SHIFT_VALUE_NEG; both 14 in every vendor build, word 0x0e0e]."""
    low = source.register("DPU", "BS_MUL_CFG").field("BS_MUL_SHIFT_VALUE").extract(values.get(("DPU", "BS_MUL_CFG"), 0))
    high = source.register("DPU", "DATA_FORMAT").field("BS_MUL_SHIFT_VALUE_NEG").extract(
        values.get(("DPU", "DATA_FORMAT"), 0))
    return high << 8 | low


def uses_shift_word(values: Values, source: RegisterMap) -> bool:
    """A BS multiplier reads the shift word; a depthwise conv points at one without it [V ORC fp16
    dw twins: BRDMA_CFG 0x110, the word 0x0000]."""
    use = source.register("DPU_RDMA", "BRDMA_CFG").field("BRDMA_DATA_USE").extract(
        values.get(("DPU_RDMA", "BRDMA_CFG"), 0))
    mode = source.register("CNA", "CONV_CON1").field("CONV_MODE").extract(values.get(("CNA", "CONV_CON1"), 0))
    return bool(use & MUL) or mode == RK3588_DEPTHWISE


# --- what the layout cannot say -------------------------------------------------------------


class ImageInputError(UnsupportedProgramError):
    """A conv reading a packed image (ARGB_IN): the vendor's rk3576 form of it is another input layout
    with the CNA converter on (REGISTER_SEMANTICS.md 45), so builds store that input unpacked instead
    (compiler/LOWERING.md 45)."""


def _check_expressible(values: Values, field: Field, where: str, lut: bool = False, clip: bool = False) -> None:
    def refuse(what: str) -> None:
        raise UnsupportedProgramError(f"{where}: {what} has no known form in the vendor rk3576 layout "
                                      f"(emulator/REGISTER_SEMANTICS.md 39)")

    precision = field("CNA", "CONV_CON1", "PROC_PRECISION")
    if field("CNA", "CONV_CON1", "CONV_MODE") not in (0, RK3588_DEPTHWISE):
        refuse(f"CONV_MODE {field('CNA', 'CONV_CON1', 'CONV_MODE')}")
    if field("CNA", "CONV_CON1", "CONV_MODE") == RK3588_DEPTHWISE and precision not in (FP16, INT8):
        refuse(f"a depthwise conv of precision {precision}")
    if field("CNA", "CONV_CON1", "ARGB_IN") and not field("CNA", "CONV_CON1", "DECONV"):
        raise ImageInputError(f"{where}: an image-input or deconvolution task has no known form in the vendor "
                              f"rk3576 layout (emulator/REGISTER_SEMANTICS.md 39)")   # the text builds held before
    if field("CNA", "CONV_CON1", "ARGB_IN") or field("CNA", "CONV_CON1", "DECONV"):
        refuse("an image-input or deconvolution task")
    if precision not in C2 or field("CNA", "CONV_CON1", "IN_PRECISION") != precision:
        refuse(f"CNA precision {precision} (int8 and fp16 are known)")
    if field("DPU_RDMA", "NRDMA_CFG", "NRDMA_DATA_USE"):
        refuse("a conv reading a BN operand")
    bound = values.get(("DPU", "BN_RELUX_CMP_VALUE"), 0)
    if field("DPU", "BN_CFG", "BN_RELUX_EN") and (not _relu(field) or not 0 <= bound < INT32_MAX) and not clip:
        refuse(f"a ReLU-X (bound {bound:#x}) other than an upper bound after a Relu")
    residual = not field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE")
    if residual != (_ew_stage(values, precision) is not None) or (values.get(("DPU", "LUT_CFG"), 0) and not lut):
        refuse(f"an element-wise stage other than the Add of a residual (EW_CFG "
               f"{values.get(('DPU', 'EW_CFG'), 0):#x}) or a look-up table")
    comb = field("DPU_RDMA", "FEATURE_MODE_CFG", "COMB_USE")
    main = not field("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE")
    if ((comb, main) not in ((0, False), (COMB_SPLIT, True)) or (main and not residual)
            or (residual and field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DATA_MODE") != 1)):
        refuse("a DPU read other than a whole residual cube (ERDMA alone or shared with the MRDMA)")
    if values.get(("DPU", "DATA_CUBE_NOTCH_ADDR"), 0):
        refuse("an interleaved DPU write (DATA_CUBE_NOTCH_ADDR)")
    if field("CNA", "FC_DATA_SIZE0", "DMA_HEIGHT") != field("CNA", "DATA_SIZE0", "DATAIN_HEIGHT"):
        refuse("a window that fetches fewer rows than it holds")
    if field("DPU", "DATA_FORMAT", "IN_PRECISION") != field("DPU", "DATA_FORMAT", "PROC_PRECISION"):
        refuse("a DPU whose input and processing precisions differ")
    if any(field("CNA", f"CVT_CON{i + 1}", f"CVT_OFFSET{i}") for i in range(4)):
        refuse("an input converter with offsets")
    if field("DPU", "BS_CFG", "BS_RELU_BYPASS") != 1 or field("DPU", "BS_CFG", "BS_ALU_BYPASS"):
        refuse("a BS stage other than bias (+ CPEND, MUL) without its own ReLU")
    if field("CNA", "CONV_CON3", "DECONV_X_STRIDE") or field("CNA", "CONV_CON3", "DECONV_Y_STRIDE"):
        refuse("deconvolution strides")


#: RK3588 EW_CFG (its Relu bit cleared) -> the vendor's 0x407C word, by precision (rk3576_layout.EW_CONFIGS)
EW_WORDS = {(precision, config): word for (precision, word), config in EW_CONFIGS.items()}
EW_CFG_BYPASS = 0x383                       # npuemu's and the vendor's rk3588 EW_CFG when bypassed
COMB_SPLIT = 5                              # MRDMA and ERDMA share the residual (rep12, LOWERING.md 6)


def _ew_stage(values: Values, precision: int, extra: Mapping[tuple[int, int], int] | None = None
              ) -> tuple[int, bool] | None:
    """(vendor 0x407C word, Relu after the Add) of the task's EW stage; None when bypassed or not
    one the vendor layout is known to hold (a residual then has no form: _check_expressible)."""
    config = values.get(("DPU", "EW_CFG"), EW_CFG_BYPASS)
    if config == EW_CFG_BYPASS:
        return None
    config = _as_the_vendor_writes_it(values, config)
    word = {**EW_WORDS, **(extra or {})}.get((precision, config | EW_RELU_BYPASS))
    return None if word is None else (word, not config & EW_RELU_BYPASS)


EW_OP_CVT_BYPASS = 1 << 8                   # RK3588 EW_CFG.EW_OP_CVT_BYPASS
IDENTITY_CONVERTER = (0, 1)                 # EW_CVT_OFFSET_VALUE 0, EW_CVT_SCALE_VALUE scale 1 shift 0


EW_OP_MUL = 1 << 2                          # RK3588 EW_CFG.EW_OP_TYPE: multiply
EW_ALU_ALGO = 0xF << 16                     # RK3588 EW_CFG.EW_ALU_ALGO


def _as_the_vendor_writes_it(values: Values, config: int) -> int:
    """An RK3588 EW_CFG as the vendor's rk3588 twin writes the same stage: an Add with its identity
    operand converter on; a Mul with ALU_ALGO 0 (npuemu writes 2: the multiplier does not read it,
    emulator/kernels/dpu.py _ew_fp) and the converter as written (bypassed in both) [V ORC fp16 Mul]."""
    if config & EW_OP_MUL:
        return config & ~EW_ALU_ALGO
    return _identity_converter_on(values, config)


def _identity_converter_on(values: Values, config: int) -> int:
    """An operand converter that is bypassed or the identity is the same stage: npuemu's fp16 Add
    bypasses it (EW_CFG 0x108203c0), the vendor's enables it with scale 1 (0x108202c0, 0x4084 = 1)
    [V ORC add fp16]; the emulated outputs of both are compared in tests."""
    converter = (values.get(("DPU", "EW_CVT_OFFSET_VALUE"), 0), values.get(("DPU", "EW_CVT_SCALE_VALUE"), 1))
    return config & ~EW_OP_CVT_BYPASS if config & EW_OP_CVT_BYPASS and converter == IDENTITY_CONVERTER else config


def _relu(field: Field) -> bool:
    """BN as a bare ReLU (the rk3588 form of the vendor's Relu clamps, rk3576_forms._dpu_bn_ew);
    anything else in BN but full bypass is refused by the round trip."""
    return field("DPU", "BN_CFG", "BN_BYPASS") == 0 and field("DPU", "BN_CFG", "BN_RELU_BYPASS") == 0


# --- geometry -------------------------------------------------------------------------------


def _geometry(field: Field) -> dict[str, int]:
    padded_in = field("CNA", "DATA_SIZE1", "DATAIN_CHANNEL")
    real_in = padded_in - (padded_in - 1 - field("CNA", "DATA_SIZE1", "DATAIN_CHANNEL_REAL")) % 64
    width, rows = field("CNA", "DATA_SIZE0", "DATAIN_WIDTH"), field("CNA", "DATA_SIZE0", "DATAIN_HEIGHT")
    out_width = field("CNA", "DATA_SIZE2", "DATAOUT_WIDTH")
    out_rows = field("CORE", "DATAOUT_SIZE_0", "DATAOUT_HEIGHT") + 1
    kw, kh = field("CNA", "WEIGHT_SIZE2", "WEIGHT_WIDTH"), field("CNA", "WEIGHT_SIZE2", "WEIGHT_HEIGHT")
    stride_x, stride_y = field("CNA", "CONV_CON3", "CONV_X_STRIDE"), field("CNA", "CONV_CON3", "CONV_Y_STRIDE")
    dil_x = field("CNA", "CONV_CON3", "ATROUS_X_DILATION") + 1
    dil_y = field("CNA", "CONV_CON3", "ATROUS_Y_DILATION") + 1
    top, left = field("CNA", "PAD_CON0", "PAD_TOP"), field("CNA", "PAD_CON0", "PAD_LEFT")
    line = field("CNA", "DMA_CON1", "LINE_STRIDE")
    first_line = width if field("CNA", "CONV_CON1", "GROUP_LINE_OFF") else 3 * line // 4 + width
    return {
        "real_in": real_in, "width": width, "rows": rows, "out_width": out_width, "out_rows": out_rows,
        "kw": kw, "kh": kh, "top": top, "left": left, "line": line,
        # the pad the task consumes past its last row / column [V ORC: 10.3's PAD_CON0 row]
        "bottom": max(0, (out_rows - 1) * stride_y + (kh - 1) * dil_y + 1 - top - rows),
        "right": max(0, (out_width - 1) * stride_x + (kw - 1) * dil_x + 1 - left - width),
        "plane": (field("CNA", "DMA_CON2", "SURF_STRIDE") + first_line) % (1 << 28),
        "real_out": field("DPU", "DATA_CUBE_CHANNEL", "ORIG_CHANNEL") + 1,
        "precision": field("CNA", "CONV_CON1", "PROC_PRECISION"),
        "entries": field("CNA", "CBUF_CON1", "DATA_ENTRIES"),
        **_sparse_geometry(field),
    }


#: npuemu's DECOMP_CONTROL (isa/sparse_layout.py) -> the vendor's mode in CORE 0x3018 bits 13:12
SPARSE_MODE_OF_CONTROL = {control: mode for mode, control in SPARSE_CONTROL.items()}


def _sparse_geometry(field: Field) -> dict[str, int]:
    """"sparse": the vendor's mode (0 dense, 1 4:2 along input channels, 2 along output channels, 3
    16:4: rk3576_layout.SPARSE_CONTROL); "order": the DPU reads the CORE in the depthwise order (a
    depthwise conv, or kernels in kept-row order: LOWERING.md 44)."""
    control = field("CNA", "DCOMP_CTRL", "DECOMP_CONTROL")
    if control and control not in SPARSE_MODE_OF_CONTROL:
        raise UnsupportedProgramError(f"DECOMP_CONTROL {control} has no vendor rk3576 form (5, 6 and 7 do)")
    mode = SPARSE_MODE_OF_CONTROL.get(control, 0)
    depthwise = int(field("CNA", "CONV_CON1", "CONV_MODE") == RK3588_DEPTHWISE)
    return {"sparse": mode, "depthwise": depthwise, "order": int(bool(depthwise) or mode in KEPT_ROW_ORDER)}


def _weight_words(field: Field, g: dict[str, int]) -> tuple[int, int, int]:
    """(0x101C, 0x1020, 0x1024's kernel count) from npuemu's form, which holds half the dense sizes and every
    kernel in all sparse modes: the vendor halves the kernels along output channels (0x1020 whole)
    and for 16:4 (0x101C a quarter) [V: LOWERING.md 43; rk3576_layout.weight_sizes is the inverse]."""
    size = field("CNA", "WEIGHT_SIZE0", "WEIGHT_BYTES")
    per_kernel = field("CNA", "WEIGHT_SIZE1", "WEIGHT_BYTES_PER_KERNEL")
    kernels = field("CNA", "WEIGHT_SIZE2", "WEIGHT_KERNELS")
    if g["sparse"] == 2:
        return size, 2 * per_kernel, kernels // 2
    if g["sparse"] == 3:
        return size // 2, per_kernel, kernels // 2
    return size, per_kernel, kernels


def _cna(values: Values, field: Field, g: dict[str, int]) -> list[VendorWrite]:
    fp16 = g["precision"] == FP16
    # FLOAT_EN; CONV_MODE 0 direct, 1 depthwise [V ORC]
    con1 = (values.get(("CNA", "CONV_CON1"), 0) & ~0xF) | (int(fp16) << 21) | g["depthwise"] * VENDOR_DEPTHWISE
    weight_bytes, weight_bytes_per_kernel, count = _weight_words(field, g)
    kernels = (KERNEL_MODE.get(g["sparse"], 0) << 30 | (g["kw"] - 1) << 24 | (g["kh"] - 1) << 16 | count - 1)
    # bit 31 where the RK3588 form keeps the weights of the task before [V: the fp16 fixture's
    # second row task, whose rk3588 twin (own oracle build) sets WEIGHT_REUSE; the tall conv's]
    continued = field("CNA", "CBUF_CON0", "WEIGHT_REUSE")
    form = (FORMAT_SPARSE if g["sparse"] else FORMAT_DENSE) | continued << 31
    banks = g["banks"]
    scales = [field("CNA", f"CVT_CON{i + 1}", f"CVT_SCALE{i}") for i in range(4)]
    head = [("CNA", "S_POINTER", values.get(("CNA", "S_POINTER"), 0xE)),
            ("CORE", "S_POINTER", values.get(("CORE", "S_POINTER"), 0xE)), ("CNA", "FORMAT_CON", form),
            ("DPU", "S_POINTER", values[("DPU", "S_POINTER")]),
            ("DPU_RDMA", "S_POINTER", values[("DPU_RDMA", "S_POINTER")])]
    body = [
        ("CNA", "CONV_CON1", con1), ("CNA", "CONV_CON2", FIXED[("CNA", "CONV_CON2")]),
        ("CNA", "CONV_CON3", values[("CNA", "CONV_CON3")]), ("CNA", "CBUF_BANKS", CBUF_BANKS_ENABLE | banks * 0x101),
        ("CNA", "WEIGHT_BYTES", weight_bytes),
        ("CNA", "WEIGHT_BYTES_PER_KERNEL", weight_bytes_per_kernel), ("CNA", "WEIGHT_KERNELS", kernels),
        ("CNA", "DATA_IN_CHANNEL", g["entries"] * g["rows"] << 16 | g["real_in"] - 1),
        ("CNA", "DATA_IN_SIZE", (g["width"] - 1) << 16 | g["rows"] - 1),
        # [31:16] two per weight element of a kernel (int8 2 x bytes, fp16 1 x bytes; of 0x1020 in every
        # sparse mode [V: LOWERING.md 44]) [V ORC a16, f16relu, f16odd]; a depthwise conv's weight bytes / 16 [V ORC fp16 dw: 576 -> 36, 1440 -> 90, 3136 -> 196]
        ("CNA", "DATA_OUT_WIDTH", (weight_bytes_per_kernel // 16 if g["depthwise"] else
                                   2 * weight_bytes_per_kernel // (1 + fp16)) << 16 | g["out_width"] - 1),
        ("CNA", "DATA_OUT_ATOMICS", field("CNA", "DATA_SIZE3", "DATAOUT_ATOMICS") - 1),
        ("CNA", "FORMAT_CON", form), ("CNA", "CBUF_DATA", g["entries"] << 16),
        # [27:16] 0x400 entries per bank past 4 [I: 0x14000000 with 5 banks, FIX fp16 and tall]
        ("CNA", "CBUF_CON0", FIXED[("CNA", "CBUF_CON0")] | (banks - MIN_BANKS) * 0x400 << 16),
        ("CNA", "CBUF_CON1", g["width"] << 16 | g["entries"]),
        ("CNA", "CVT_CON0", values[("CNA", "CVT_CON0")]),
        ("CNA", "CVT_SCALE01", scales[1] << 16 | scales[0]), ("CNA", "CVT_SCALE23", scales[3] << 16 | scales[2]),
        *_reserved("CNA", (0x1054, 0x1058, 0x105C, 0x1060, 0x1064, 0x1068, 0x106C, 0x1070)),
        ("CNA", "WEIGHT_CPEND", 0),   # 0x1074: a constant CPEND (REGISTER_SEMANTICS.md 56.2)
        ("CNA", "DMA_SIZE", (field("CNA", "FC_DATA_SIZE0", "DMA_WIDTH") - 1) << 16 | g["rows"] - 1),
        ("CNA", "DMA_CHANNEL", g["real_in"] - 1),
        ("CNA", "PAD_CON0", g["right"] << 24 | g["bottom"] << 16 | g["left"] << 8 | g["top"]),
        ("CNA", "PAD_VALUE", values[("CNA", "PAD_CON1")]),
        ("CNA", "FEATURE_DATA_ADDR", values[("CNA", "FEATURE_DATA_ADDR")]),
        ("CNA", "DMA_CON0", values[("CNA", "DMA_CON0")]), ("CNA", "LINE_STRIDE", g["line"]),
        ("CNA", "SURF_STRIDE", g["plane"]),
        ("CNA", "TASK_SURFACE", round_up(g["width"] * g["rows"], TASK_SURFACE_ALIGN)),
        *_reserved("CNA", (0x109C,)),
    ]
    return head + body + _dcomp(values) + [("CNA", "PLANE_WIDTH", (g["width"] - 1) * 0x10001)]


def _dcomp(values: Values) -> list[VendorWrite]:
    """DCOMP at the RK3588 positions, as the vendor writes them: CTRL, REGNUM, ADDR0 (the weight
    address, relocated: 0 in the stored vendor streams) and AMOUNT0/1, further amounts only when
    non-zero [V FIX dense and sparse]."""
    control = values.get(("CNA", "DCOMP_CTRL"), 0)
    if control & 0x7:   # npuemu's 5, 6, 7 name the mode; the vendor writes 5 and the mode elsewhere [V]
        control = (control & ~0x7) | SPARSE_CONTROL[1]
    used = [i for i in range(16) if values.get(("CNA", f"DCOMP_AMOUNT{i}"), 0)]
    count = max([2] + [i + 1 for i in used])   # [V FIX sparse: REGNUM 5, AMOUNT0/1 written]
    return ([("CNA", "DCOMP_CTRL", control),
             ("CNA", "DCOMP_REGNUM", values.get(("CNA", "DCOMP_REGNUM"), 0)),
             ("CNA", "DCOMP_ADDR0", values.get(("CNA", "DCOMP_ADDR0"), 0))]
            + [("CNA", f"DCOMP_AMOUNT{i}", values.get(("CNA", f"DCOMP_AMOUNT{i}"), 0)) for i in range(count)])


def _core(field: Field, g: dict[str, int]) -> list[VendorWrite]:
    # QD_EN as the vendor writes it: int8 1, fp16 0 [V ORC, FIX]; no unit reads it (QD_EN_FREE)
    misc = (1 << 28 | g["sparse"] << 12 | field("CORE", "MISC_CFG", "PROC_PRECISION") << 8
            | g["depthwise"] * DW_FLAG | field("CORE", "MISC_CFG", "DW_EN") << 1 | int(g["precision"] == INT8))
    return [("CORE", "MISC_CFG", misc),
            ("CORE", "DATAOUT_SIZE_0", field("CORE", "DATAOUT_SIZE_0", "DATAOUT_HEIGHT") << 16
             | field("CORE", "DATAOUT_SIZE_0", "DATAOUT_WIDTH")),
            ("CORE", "DATAOUT_SIZE_1", g["real_out"] - 1),
            ("CORE", "CLIP_TRUNCATE", field("CORE", "CLIP_TRUNCATE", "ROUND_TYPE") << 6
             | field("CORE", "CLIP_TRUNCATE", "CLIP_TRUNCATE"))]


def _dpu(values: Values, field: Field, g: dict[str, int]) -> list[VendorWrite]:
    precision, real_out = g["precision"], g["real_out"]
    surface = field("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")
    width, height = field("DPU", "DATA_CUBE_WIDTH", "WIDTH"), field("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    dpu_only = g.get("dpu_only", 0)
    by_precision = g["dpu_words"] if dpu_only else DEPTHWISE_WORDS if g["depthwise"] else BY_PRECISION[precision]
    channel_mode = (DPU_ONLY_WORDS[("DPU", "BS_CHANNEL_MODE")] if dpu_only
                    else BS_CHANNEL_ORDER[bool(g["order"])])
    ew = g["ew"] if dpu_only else _ew_stage(values, precision)
    ew_relu = bool(ew and ew[1])
    out_format = field("DPU", "DATA_FORMAT", "OUT_PRECISION") << 29 | field("DPU", "DATA_FORMAT", "PROC_PRECISION")
    # bit 30 in conv tasks only (the CORE feed [I]; rk3576_dpu)
    mode = ((1 - dpu_only) << 30 | g["order"] * VENDOR_DEPTHWISE << 3
            | field("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE") << 1 | field("DPU", "FEATURE_MODE_CFG", "FLYING_MODE"))
    return [
        ("DPU", "FEATURE_MODE_CFG", mode), ("DPU", "DATA_FORMAT", out_format),
        ("DPU", "OFFSET_PEND", values.get(("DPU", "OFFSET_PEND"), 0)),
        ("DPU", "DST_BASE_ADDR", values[("DPU", "DST_BASE_ADDR")]), ("DPU", "DST_SURF_STRIDE", surface),
        ("DPU", "DATA_CUBE_WIDTH", width), ("DPU", "DATA_CUBE_HEIGHT", height), ("DPU", "DATA_CUBE_NOTCH", 0),
        ("DPU", "DATA_CUBE_CHANNEL", real_out - 1),
        ("DPU", "BS_CHANNEL", (real_out - 1) << 16 | channel_mode),
        ("DPU", "WDMA_SIZE",
         field("DPU", "WDMA_SIZE_1", "HEIGHT_WDMA") << 16 | field("DPU", "WDMA_SIZE_1", "WIDTH_WDMA")),
        ("DPU", "CFG_4038", by_precision[("DPU", "CFG_4038")]), *_reserved("DPU", (0x403C,)),
        ("DPU", "BS_MODE", by_precision[("DPU", "BS_MODE")]),
        *_clamps(("BS_CLAMP0",), False),
        ("DPU", "BS_OW_CFG", by_precision[("DPU", "BS_OW_CFG")] if dpu_only else _ow_word(field, g)),
        *_clamps(("CLAMP1",), False),
        ("DPU", "ACT_CFG", LUT_ACT_CFG if "lut" in g else g["clip"]["ACT_CFG"] if "clip" in g
         else ACT_RELU if _relu(field) else ACT_NONE),
        *(_clamps(("CLAMP2", "CLAMP3"), _relu(field), _relux(values, field)) if "clip" not in g
          else _clamps(("CLAMP2", "CLAMP3"), True, g["clip"]["CLAMP_MAX"])),
        *(_ew_words(values, ew) if "lut" not in g and "clip" not in g else
          [("DPU", "CFG_407C", g["clip"]["CFG_407C"] if "clip" in g else LUT_EW_WORD), ("DPU", "CFG_4080", 0),
                                                         ("DPU", "CFG_4084", 1)]),
        *_clamps(("CLAMP4",), ew_relu), ("DPU", "EW_OP_VALUE_0", g.get("clip", {}).get("EW_OP_VALUE_0", 0)),
        ("DPU", "CFG_4094", 0), ("DPU", "CFG_409C", 0),
        *_clamps(("CLAMP5",), ew_relu),
        ("DPU", "OUT_CVT_OFFSET", values[("DPU", "OUT_CVT_OFFSET")]),
        # bit 16 with an int8 EW Add [V ORC add int8: 0x15770 where the rk3588 build writes 0x5770]
        ("DPU", "OUT_CVT_SCALE", g["out_cvt"]["OUT_CVT_SCALE"] if "out_cvt" in g else
         values[("DPU", "OUT_CVT_SCALE")] | (1 << 16 if ew and precision == INT8 else 0)),
        ("DPU", "OUT_CVT_SHIFT", g["out_cvt"]["OUT_CVT_SHIFT"] if "out_cvt" in g else values[("DPU", "OUT_CVT_SHIFT")]),
        # SURFACE_ADD - W x rows [V ORC]: 2 x the DST surface stride (SIZE_E 1), 4 x depthwise (SIZE_E 3);
        # a sparse conv in kept-row order the depthwise's 4 x where its RK3588 form has 2 x [V: LOWERING.md 44]
        ("DPU", "SURFACE_JUMP", field("DPU", "SURFACE_ADD", "SURF_ADD") * (1 + _sparse_order(g))
         - (width + 1) * (height + 1)),
        ("DPU", "CFG_40BC", 0), ("DPU", "CFG_40C0", by_precision.get(("DPU", "CFG_40C0"), FIXED[("DPU", "CFG_40C0")])),
        *_reserved("DPU", (0x40C8, 0x40CC)), ("DPU", "CFG_40D0", FIXED[("DPU", "CFG_40D0")]),
        *_lut_words(g.get("lut", {})),
    ]


def _ow_word(field: Field, g: dict[str, int]) -> int:
    """DPU 0x4050 from RK3588's BS_OW_CFG (SIZE_E, OW_SRC: CPEND x window sum in the DPU)
    and the output channels (rk3576_layout.bs_ow_word)."""
    sizes = tuple(field("DPU", "BS_OW_CFG", name) for name in ("SIZE_E_2", "SIZE_E_1", "SIZE_E_0"))
    if _sparse_order(g):   # the depthwise order's sizes (rk3576_layout.KEPT_ROW_ORDER)
        sizes = VENDOR_DEPTHWISE_SIZES
    return bs_ow_word(g["precision"], sizes, bool(field("DPU", "BS_OW_CFG", "OW_SRC")), g["real_out"])


def _sparse_order(g: dict[str, int]) -> int:
    """1 for a sparse conv whose kernels come in kept-row order (along output channels, 16:4)."""
    return int(g.get("sparse", 0) in KEPT_ROW_ORDER)


def _ew_words(values: Values, ew: tuple[int, bool] | None) -> list[VendorWrite]:
    """0x407C the EW stage, 0x4080 / 0x4084 its converter (RK3588 EW_CVT_OFFSET / SCALE_VALUE) [V ORC add]."""
    if ew is None:
        return [("DPU", "CFG_407C", EW_BYPASS), ("DPU", "CFG_4080", 0), ("DPU", "CFG_4084", 1)]
    return [("DPU", "CFG_407C", ew[0]), ("DPU", "CFG_4080", values.get(("DPU", "EW_CVT_OFFSET_VALUE"), 0)),
            ("DPU", "CFG_4084", values.get(("DPU", "EW_CVT_SCALE_VALUE"), 0))]


def _clamps(names: Iterable[str], relu: bool, bound: int | None = None) -> list[VendorWrite]:
    """(min, max) int32 pairs: unused (INT32_MIN, INT32_MAX); a Relu sets CLAMP2/CLAMP3's min to
    0, a Relu after the EW Add CLAMP4/CLAMP5's [V ORC relu, add + relu, int8 and fp16]; ``bound``:
    a Relu6 / Clip(0, x)'s upper bound, CLAMP2/CLAMP3's max [V ORC r6, int8 and fp16]."""
    out = []
    for name in names:
        low = 0 if relu and name in RELU_CLAMPS + EW_RELU_CLAMPS else INT32_MIN
        high = bound if bound is not None and name in RELU_CLAMPS else INT32_MAX
        out += [("DPU", f"{name}_MIN", low & 0xFFFFFFFF), ("DPU", f"{name}_MAX", high)]
    return out


def _relux(values: Values, field: Field) -> int | None:
    """BN ReLU-X's bound (BN_CFG.BN_RELUX_EN, BN_RELUX_CMP_VALUE): the vendor's CLAMP2/CLAMP3 max,
    compared after the BS stage alike [V ORC r6: Conv + Clip(0, 6); REGISTER_SEMANTICS.md 41]. fp16:
    the twin's value (fp32 bits); int8: the vendor's own value is looser than its rk3588 twin's
    (42470 for 30962: the int8 output saturates first in both), npuemu writes its RK3588 bound, which
    translates back unchanged."""
    if not field("DPU", "BN_CFG", "BN_RELUX_EN"):
        return None
    return values.get(("DPU", "BN_RELUX_CMP_VALUE"), 0)


def _dpu_rdma(values: Values, field: Field, g: dict[str, int], shift_address: int) -> list[VendorWrite]:
    use = field("DPU_RDMA", "BRDMA_CFG", "BRDMA_DATA_USE")
    dpu_only = g.get("dpu_only", 0)
    if not use & ALU and not dpu_only:
        raise UnsupportedProgramError("a conv task without a BS bias record has no known vendor rk3576 form")
    shift = bool(use & MUL) or bool(g["depthwise"])
    residual = not field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE")
    # the residual: read whole through the ERDMA (MRDMA off, COMB_USE 0, bit 3), ERDMA bit 28 [V ORC add]
    # bit 6 in int8 tasks and with a residual [V ORC: fp16 0x1 plain, 0x48 with the Add], in fp16 LUT convs [V ORC
    # fp16 LUT pairs: 0x41]; a DPU-only task: bit 6, no bit 28, the MRDMA on, bit 3 with the ERDMA operand [V ORC
    # fp16 Add of two inputs]
    erdma = (values.get(("DPU_RDMA", "ERDMA_CFG"), 0)
             | (1 << 6 if g["precision"] == INT8 or residual or g["depthwise"] or "lut" in g else 0)
             | (1 << 28 if residual and not dpu_only else 0))
    mrdma_off = field("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE") if dpu_only else 1
    mode = ((1 - dpu_only) << 30 | field("DPU_RDMA", "FEATURE_MODE_CFG", "IN_PRECISION") << 15
            | field("DPU_RDMA", "FEATURE_MODE_CFG", "PROC_PRECISION") << 5 | mrdma_off << 4 | int(residual) << 3
            | g.get("order", 0) * VENDOR_DEPTHWISE << 1
            | field("DPU_RDMA", "FEATURE_MODE_CFG", "FLYING_MODE"))
    start = (values.get(("DPU_RDMA", "EW_BASE_ADDR"), 0) if dpu_only
             else _residual_start(values, field) if residual else 0)
    source = values.get(("DPU_RDMA", "SRC_BASE_ADDR"), 0) if dpu_only or not residual else start
    keep = [("DPU_RDMA", name, values.get(("DPU_RDMA", name), 0)) for name in ("DATA_CUBE_WIDTH", "DATA_CUBE_HEIGHT")]
    return keep + [
        ("DPU_RDMA", "DATA_CUBE_CHANNEL", g.get("rdma_channels", g["real_out"]) - 1),
        ("DPU_RDMA", "SRC_BASE_ADDR", source),
        # an int8 DPU-only task: the record's operands (rk3576_dpu.record_cfg) at its address
        ("DPU_RDMA", "BRDMA_CFG", g["brdma"] if "brdma" in g else use << 8 | int(shift) << 4),
        ("DPU_RDMA", "BS_BASE_ADDR", values.get(("DPU_RDMA", "BS_BASE_ADDR"), 0)),
        ("DPU_RDMA", "BS_CFG_ADDR", g["record"] if "brdma" in g else shift_address if shift else 0),
        # a LUT task's BN operands: the record at 0x5030 (rk3576_lut)
        ("DPU_RDMA", "NRDMA_CFG", g.get("bn_cfg", BN_RECORD_CFG) if "bn_record" in g else 0),
        ("DPU_RDMA", "BN_BASE_ADDR", 0), ("DPU_RDMA", "ADDR_5030", g.get("bn_record", 0)),
        ("DPU_RDMA", "ERDMA_CFG", erdma), ("DPU_RDMA", "EW_BASE_ADDR", start),
        # surface steps in atoms from bit 0 (RK3588: bits 31:4) [V ORC add: 0xf0 / 0xf00]
        ("DPU_RDMA", "EW_SURF_STRIDE", field("DPU_RDMA", "EW_SURF_STRIDE", "EW_SURF_STRIDE")),
        ("DPU_RDMA", "FEATURE_MODE_CFG", mode),
        ("DPU_RDMA", "SRC_DMA_CFG", values.get(("DPU_RDMA", "SRC_DMA_CFG"), 0)),
        ("DPU_RDMA", "SURF_NOTCH", field("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR")),
        ("DPU_RDMA", "PAD_CFG", values.get(("DPU_RDMA", "PAD_CFG"), 0)),
        ("DPU_RDMA", "EW_SURF_NOTCH", field("DPU_RDMA", "EW_SURF_NOTCH", "EW_SURF_NOTCH")),
        ("DPU_RDMA", "LINE_NOTCH", 0), *_reserved("DPU_RDMA", (0x507C,)),   # the line notch (REGISTER_SEMANTICS.md 56.2)
    ]


def _residual_start(values: Values, field: Field) -> int:
    """The residual cube's first byte: SRC_BASE_ADDR when the MRDMA shares it (COMB_USE 5: the
    ERDMA starts one surface further), else EW_BASE_ADDR."""
    if field("DPU_RDMA", "FEATURE_MODE_CFG", "COMB_USE") == COMB_SPLIT:
        return values.get(("DPU_RDMA", "SRC_BASE_ADDR"), 0)
    return values.get(("DPU_RDMA", "EW_BASE_ADDR"), 0)


def _reserved(block: str, offsets: Iterable[int]) -> list[VendorWrite]:
    return [(block, f"RSV_{offset:04X}", 0) for offset in offsets]


# --- the round trip -------------------------------------------------------------------------

#: RK3588 registers the translation does not give back as written, and why the emulator's
#: result does not depend on them: FEATURE_GRAINS is not read (REGISTER_SEMANTICS.md 2.6); the
#: CBUF bank split and WEIGHT_REUSE are the translation's own allocation (10.3: the fewest banks
#: that hold the window) - the data is the same, only when weights are fetched differs;
#: CNA/CORE S_POINTER are the driver's; CLK_GATE 0 either way; DPU_RDMA WEIGHT is the
#: translation's constant 0x01010101.
NOT_ROUND_TRIPPED = {("CNA", "CONV_CON2"), ("CNA", "CBUF_CON0"), ("CNA", "S_POINTER"), ("CORE", "S_POINTER"),
                     ("CNA", "CLK_GATE"), ("DPU_RDMA", "WEIGHT")}

#: Bits of a register no emulator unit reads, which the vendor form writes as the vendor does:
#: CORE MISC_CFG.QD_EN (npuemu's RK3588 form sets it for fp16 too); DPU_RDMA FEATURE_MODE_CFG's
#: MRDMA_FP16TOFP32_EN (read only with COMB_USE 3, emulator/kernels/dpu_fp16_pair.py, which no
#: vendor-layout task has: the vendor's fp16 DPU-only Add sets it, npuemu's does not).
FREE_BITS = {("CORE", "MISC_CFG"): 0x1, ("DPU_RDMA", "FEATURE_MODE_CFG"): 0x8}


def check_round_trip(values: Values, source: RegisterMap, vendor: RegisterMap, writes: list[VendorWrite],
                     shift: int, where: str, enable: int = CONV_ENABLE, record: bytes | Mapping[int, bytes] = b"") -> None:
    """Raise :class:`UnsupportedProgramError` unless the vendor ``writes`` (of a task with op-enable
    ``enable``; ``record``: an int8 DPU-only task's BS record in memory, or the records by address - a
    DataConvert's two, rk3576_convert) translate back (``rk3576_program.translate_task``) to ``values`` on
    every register the emulator reads."""
    words = [encode_write(vendor, block, name, value) for block, name, value in writes]
    word = shift.to_bytes(2, "little")   # the 2-byte reads: the shift word; 64-byte reads: the record

    def read(address: int, size: int) -> bytes:
        if isinstance(record, Mapping):
            return record[address][:size]
        return (record if size == RECORD_BYTES and record else word)[:size]
    back = {(block, name): value for block, name, value in
            translate_task(read_task(without_lut_flag(words, vendor), vendor, where, enable), source, read,
                           own_build=True)}
    values = as_the_twin_writes_it(_bn_alu_as_the_record_holds_it(_as_read_by_the_erdma_alone(values, source)), source)
    if enable != CONV_ENABLE:   # an int8 DPU-only Sub is written as the vendor's Add (rk3576_dpu.minus_as_add)
        values = minus_as_add(values, source)
    for key in (set(values) | set(back)) - NOT_ROUND_TRIPPED - _unread(values, source):
        free = FREE_BITS.get(key, 0)
        if values.get(key, 0) & ~free != back.get(key, 0) & ~free:
            raise UnsupportedProgramError(
                f"{where}: {key[0]}.{key[1]} = {values.get(key, 0):#x} comes back from the vendor rk3576 layout as "
                f"{back.get(key, 0):#x}; the task has no vendor form (emulator/REGISTER_SEMANTICS.md 39)")


def _unread(values: Values, source: RegisterMap) -> set[tuple[str, str]]:
    """Registers no unit reads in this task: the MRDMA's SRC_BASE_ADDR with the MRDMA off (the
    vendor writes the ERDMA operand's start there [V ORC add], npuemu 0; emulator/units/dpu.py only
    checks its alignment, which both values meet)."""
    mode = source.register("DPU_RDMA", "FEATURE_MODE_CFG").unpack(values.get(("DPU_RDMA", "FEATURE_MODE_CFG"), 0))
    return {("DPU_RDMA", "SRC_BASE_ADDR")} if mode["MRDMA_DISABLE"] else set()


#: Register map families whose own builds are emitted in a vendor layout (LOWERING.md 39).
VENDOR_LAYOUT_OF = {"rk3576": "rk3576_vendor"}


def _as_read_by_the_erdma_alone(values: Values, source: RegisterMap) -> Values:
    """A residual the MRDMA and ERDMA share (COMB_USE 5, alternate surfaces) read whole by the
    ERDMA instead, as the vendor's rk3576 form does: the same operand cube, so the same result
    (REGISTER_SEMANTICS.md 3.4); an identity operand converter switched on. The emulated outputs
    of both forms are compared in tests."""
    mode = source.register("DPU_RDMA", "FEATURE_MODE_CFG")
    fields = mode.unpack(values.get(("DPU_RDMA", "FEATURE_MODE_CFG"), 0))
    ew = values.get(("DPU", "EW_CFG"), EW_CFG_BYPASS)
    if ew not in (EW_CFG_BYPASS, RK3588_LUT_EW):   # the LUT's EW_CFG is the twin's as written (rk3576_lut)
        values = {**values, ("DPU", "EW_CFG"): _as_the_vendor_writes_it(values, ew)}
    if fields["COMB_USE"] != COMB_SPLIT:
        return values
    start = values.get(("DPU_RDMA", "SRC_BASE_ADDR"), 0)
    return {**values, ("DPU_RDMA", "FEATURE_MODE_CFG"): mode.pack({**fields, "COMB_USE": 0, "MRDMA_DISABLE": 1}),
            ("DPU_RDMA", "EW_BASE_ADDR"): start}


#: the DPU's LUT words in the vendor's order (0x4100-0x4194; rk3576_lut) and the reserved ones among them
LUT_WORDS = ("LUT_ACCESS_CFG", "LUT_ACCESS_DATA", "LUT_CFG", "LUT_INFO", "LUT_LE_START", "LUT_LE_END",
             "LUT_LO_START", "LUT_LO_END", "LUT_LE_SLOPE_SCALE", "RSV_4130", "LUTV_END0", "LUTV_END1", "LUTV_END2",
             "LUTV_END3", "RSV_4150", "RSV_4154", "RSV_4160", "LUTV_OFLOW_SCALE01", "LUTV_OFLOW_SCALE23",
             "LUTV_OFLOW_SHIFT", "LUTV_UFLOW_VALUE01", "LUTV_UFLOW_VALUE23", "LUTV_OFLOW_VALUE01", "LUTV_OFLOW_VALUE23")


def _lut_words(lut: Mapping[str, int]) -> list[VendorWrite]:
    """0 without a LUT [V ORC every conv task]; with one, rk3576_lut.vendor_lut_words."""
    return [("DPU", name, lut.get(name, 0)) for name in LUT_WORDS]


BN_ALU_BYPASS = 1 << 1                      # RK3588 BN_CFG.BN_ALU_BYPASS


def _bn_alu_as_the_record_holds_it(values: Values) -> Values:
    """A LUT task's BN stage: npuemu bypasses the ALU (BN_CFG 0x20042), the vendor's twin adds the record's
    operand 0 (0x20040) [V ORC LUT twins]; adding 0 is the bypass (the emulated outputs of both layouts
    are compared in tests/compiler/test_rk3576_vendor_lut.py)."""
    config = values.get(("DPU", "BN_CFG"), 0)
    if values.get(("DPU", "EW_CFG")) == RK3588_LUT_EW and config & BN_ALU_BYPASS and not values.get(
            ("DPU", "BN_ALU_CFG"), 0):
        return {**values, ("DPU", "BN_CFG"): config & ~BN_ALU_BYPASS}
    return values
