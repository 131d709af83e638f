"""The vendor's rk3576 fp16 DPU-only element-wise tasks beyond the Add and Mul of 41: Max and Sub of two whole
operands, channel counts that are not a whole atom, and the standalone LUT task (emulator/REGISTER_SEMANTICS.md 54,
compiler/LOWERING.md 55). The translation of the standalone LUT (:func:`lut_dpu_only_specs`) and the pieces of its
re-pack (rk3576_pack.lut_dpu_vendor_writes) are here; the fp16 Max / Sub words and the twin's channels are in
rk3576_dpu (FP16_EW_WORDS, twin_channels), which this module imports.

Evidence [V ORC]: rknn-toolkit2 2.5.0 fp16 builds (``do_quantization=False``) of ONNX ``Max(x, z)`` and
``Sub(x, z)`` on [1, 16, 12, 20] and ``Max`` / ``Mul`` on [1, 20, 4, 10], each for rk3576 and rk3588; chain 0
read with npuemu's reader. Every task is 41's fp16 DPU-only frame (0x4038 0x53, BS_MODE 2, BS_OW_CFG 0x20000,
0x40C0 0x04440000, ERDMA_CFG 0x40000048, DPU_RDMA 0x5044 0x10049); only 0x407C and the channel words differ:

- 0x407C holds the twin's EW_ALU_ALGO in bits 19:16, as the Add's 0x0002c0c0 (ALU add, 2) does: Max 0x0000c0c0
  for RK3588 EW_CFG 0x108002c0 (ALU max, 0), Sub 0x0004c0c0 for 0x108402c0 (ALU minus, 4), the operand converter
  on with scale 1 in both (0x4084 = 1, as the Add). npuemu writes the same stages with the converter bypassed
  (0x108003c0, 0x108403c0): the emulator's fp16 EW stage does not apply the converter, so both are one stage
  (rk3576_pack._identity_converter_on, as for the Add). The words: rk3576_dpu.FP16_EW_WORDS.
- 20 channels (fp16 pads to 24): DPU 0x402C, 0x4030's high half and DPU_RDMA 0x5014 hold the **real** count - 1
  (19); the twin writes ORIG_CHANNEL 19, CHANNEL 23, DPU_RDMA 23 - the int8 rule of 48.2 with fp16's 8-channel
  atom. The translation gives fp16 DPU-only tasks CHANNEL = 0x5014's count rounded up to 8 (rk3576_dpu.twin_channels),
  the re-pack accepts an fp16 task whose CHANNEL is ORIG_CHANNEL rounded up so (:func:`channels_packable`).
"""

from __future__ import annotations

import numpy as np

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_dpu import FP32TOFP16, Spec, frame_specs, is_dpu_only
from npuemu.isa.rknn.rk3576_concat import MRDMA_ON_BIT
from npuemu.isa.rknn.rk3576_layout import C2, FP16, INT8, LUT_EW_WORD, Reader, VendorTask, round_up
from npuemu.isa.rknn.rk3576_lut import is_vendor_lut, rk3588_lut_specs
from npuemu.isa.rknn.rk3576_lut_fp16 import rk3588_out_specs
from npuemu.isa.words import encode_word


def channels_packable(precision: int, padded: int, real: int) -> bool:
    """A whole operand's DPU-only task whose ``padded`` (CHANNEL + 1) is its ``real`` channels (ORIG_CHANNEL + 1)
    or those rounded up to the precision's atom: the vendor form writes the real count, its translation gives the
    padded one back (rk3576_dpu.twin_channels)."""
    return precision in (INT8, FP16) and padded in (real, round_up(real, C2[precision]))


# --- the standalone LUT: a DPU-only task with the LUT stage (REGISTER_SEMANTICS.md 54.2) -------------------------
#
# [V ORC: HardSwish, Tanh, Sigmoid of a graph input [1, 16, 12, 20], int8 and fp16, rk3576 and rk3588]: two
# DPU-only tasks, the table upload of 46.2 and the LUT task - the LUT conv's words (46.1 int8, 50.1 fp16: ACT_CFG
# 0x20, 0x407C 0x01004140, LUT_CFG 0x02000006, the starts / ends / overflow lanes, the BN record at 0x5030 with
# NRDMA_CFG 0x1a, ERDMA_CFG 0x41, fp16: the table-unit factor in OUT_CVT) in 41's DPU-only frame, and more words:
# DPU 0x40CC = 0x10 (0 in every conv task, its role unknown [I: the LUT fed by the MRDMA]; no RK3588 register holds
# it, the twin has none), DPU_RDMA 0x5044 bit 3 (the MRDMA reading, as in every DPU-only task: 0x10049 / 0x9) and,
# int8, OUT_CVT_SCALE bit 16 (as the vendor's int8 EW tasks).

LUT_FLAG_OFFSET, LUT_FLAG = 0x40CC, 0x10
LUT_EW_OFFSET = 0x407C                     # where a LUT task's rk3576_layout.LUT_EW_WORD lies


def lut_flagged(writes: list[tuple[str, str, int]], precision: int) -> list[tuple[str, str, int]]:
    """The vendor writes of a standalone LUT task built from the DPU-only frame (rk3576_pack): 0x40CC = 0x10,
    DPU_RDMA 0x5044 bit 3 and, int8, OUT_CVT_SCALE bit 16 set, as the vendor writes them [V ORC hsw16 int8, fp16]."""
    out = []
    for block, name, value in writes:
        if (block, name) == ("DPU", f"RSV_{LUT_FLAG_OFFSET:04X}"):
            value = LUT_FLAG
        elif (block, name) == ("DPU_RDMA", "FEATURE_MODE_CFG"):
            value |= MRDMA_ON_BIT
        elif (block, name) == ("DPU", "OUT_CVT_SCALE") and precision == INT8:
            value |= FP32TOFP16
        out.append((block, name, value))
    return out


def without_lut_flag(words, regmap: RegisterMap):
    """``words`` (a vendor task block) with the standalone LUT task's 0x40CC = 0x10 word zeroed - no RK3588 register
    holds it (above) - when the block is a DPU-only LUT task (0x407C the LUT word, no CNA write); any other block
    unchanged, whose non-zero reserved words ``read_task`` then refuses as before."""
    dpu, cna = regmap.block("DPU").target, regmap.block("CNA").target
    array = np.asarray(words, dtype=np.uint64)
    flag = np.uint64(encode_word(dpu, LUT_FLAG, LUT_FLAG_OFFSET))
    if not (array == flag).any() or not (array == np.uint64(encode_word(dpu, LUT_EW_WORD, LUT_EW_OFFSET))).any() or (
            (array >> np.uint64(48)) == np.uint64(cna)).any():
        return words
    kept = list(words) if isinstance(words, list) else words.copy()   # a list or a numpy array
    for index in np.flatnonzero(array == flag):
        kept[index] = 0
    return kept


#: the standalone LUT task's frame as the vendor writes it [V ORC hsw16, sig16 fp16]: 41's fp16 DPU-only words,
#: ERDMA off, no BS record
LUT_FRAME = {("DPU", "CFG_4038"): 0x53, ("DPU", "BS_MODE"): 2, ("DPU", "BS_OW_CFG"): 0x20000,
             ("DPU", "CFG_40C0"): 0x04440000, ("DPU_RDMA", "BRDMA_CFG"): 0}


def is_lut_dpu_only(task: VendorTask) -> bool:
    return is_dpu_only(task.enable) and is_vendor_lut(task)


def lut_dpu_only_specs(task: VendorTask, read: Reader) -> list[Spec]:
    """The twin's RK3588 specs of a vendor fp16 standalone LUT task: the DPU-only frame (rk3576_dpu.frame_specs),
    the BN / EW / LUT registers of the record and LUT words (rk3576_lut.rk3588_lut_specs), the table-unit factor
    from OUT_CVT (rk3576_lut_fp16.rk3588_out_specs); refused by name: int8, an ERDMA operand, another frame."""
    f = task.field
    odd = [f"{block}.{name} {task.raw(block, name):#x}" for (block, name), value in LUT_FRAME.items()
           if task.raw(block, name) != value]
    precision = f("DPU", "DATA_FORMAT", "PROC_PRECISION")
    if (precision not in (INT8, FP16) or not f("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE")
            or f("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE") or f("DPU", "FEATURE_MODE_CFG", "CONV_MODE") or odd):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU-only LUT task other than the int8 / fp16 one "
                                      f"of emulator/REGISTER_SEMANTICS.md 54.2 (precision {precision}, ERDMA_CFG "
                                      f"{task.raw('DPU_RDMA', 'ERDMA_CFG'):#x}{'; ' if odd else ''}{', '.join(odd)})")
    negative, lut = rk3588_lut_specs(task, read)
    lut = [(block, name, {"raw": twin_alu(fields, lut, task.where)} if (block, name) == ("DPU", "BN_ALU_CFG")
            and precision == INT8 else fields) for block, name, fields in lut]
    if precision == FP16:   # the table-unit factor in OUT_CVT (rk3576_lut_fp16)
        return rk3588_out_specs(task, frame_specs(task, negative) + lut)
    # int8: OUT_CVT_SCALE bit 16 set by the vendor, not by the twin, as in its int8 EW tasks [V ORC hsw16 int8]
    return [(block, name, {"raw": fields["raw"] & ~FP32TOFP16} if (block, name) == ("DPU", "OUT_CVT_SCALE") else fields)
            for block, name, fields in frame_specs(task, negative) + lut]


# The int8 record's ALU operand is in the input's units: the vendor's (x + a') x m, RK3588's BN x x m + a (MUL, then
# ALU, then the shift: emulator/NUMERICS.md 4.2), a = a' x m [V ORC hsw16 int8: the record [12, 12, 18118, 0x0707]
# (12 = -zp of the input), the twin's BN_ALU_CFG 217416 = 12 x 18118, BN_MUL 18118 >> 7]. The same integers.
INT32 = (-(1 << 31), (1 << 31) - 1)


def twin_alu(alu_fields: dict, lut: list[Spec], where: str) -> int:
    """The twin's BN_ALU_CFG of an int8 standalone LUT from the record's ALU operand (``alu_fields``) and multiplier."""
    record = alu_fields["raw"] - ((alu_fields["raw"] & 1 << 31) << 1)
    mul = next(fields["BN_MUL_OPERAND"] for block, name, fields in lut if (block, name) == ("DPU", "BN_MUL_CFG"))
    alu = record * mul
    if not INT32[0] <= alu <= INT32[1]:
        raise UnsupportedProgramError(f"{where}: vendor rk3576 int8 LUT record ALU {record} x multiplier {mul} "
                                      f"passes int32 (emulator/REGISTER_SEMANTICS.md 54.2)")
    return alu & 0xFFFFFFFF


def as_the_record_holds_it(values, source: RegisterMap, where: str):
    """npuemu's standalone LUT's RK3588 values with BN_ALU_CFG in the record's units (the inverse of twin_alu):
    int8 a / m, refused by name unless exact; fp16: only a zero operand (+-0.0, npuemu's -0.0) is known."""
    alu = values.get(("DPU", "BN_ALU_CFG"), 0)
    precision = source.register("DPU", "DATA_FORMAT").field("PROC_PRECISION").extract(
        values.get(("DPU", "DATA_FORMAT"), 0))
    if precision != INT8:
        if alu & 0x7FFFFFFF:
            raise UnsupportedProgramError(f"{where}: an fp16 standalone LUT with a BN ALU operand {alu:#x} other than "
                                          f"0 has no known vendor rk3576 form (REGISTER_SEMANTICS.md 54.2)")
        return values
    mul = source.register("DPU", "BN_MUL_CFG").field("BN_MUL_OPERAND").extract(values.get(("DPU", "BN_MUL_CFG"), 0))
    signed = alu - ((alu & 1 << 31) << 1)
    if signed and (not mul or signed % mul):
        raise UnsupportedProgramError(f"{where}: an int8 standalone LUT whose BN ALU operand {signed} is not a "
                                      f"multiple of its multiplier {mul} has no vendor rk3576 record (the record holds "
                                      f"it in input units: REGISTER_SEMANTICS.md 54.2)")
    return {**values, ("DPU", "BN_ALU_CFG"): (signed // mul if signed else 0) & 0xFFFFFFFF}
