"""The vendor's rk3576 int8 Concat copies: DPU-only copies, plain or requantizing through the BS record
(emulator/REGISTER_SEMANTICS.md 49.2).

Evidence [V ORC]: rknn-toolkit2 2.5.0 builds of ``Concat(Conv1x1(x) [16 ch], Conv1x1(z) [32 ch], axis 1)`` int8 on
[1, 16, 12, 20] for rk3576 and rk3588: the convs write their own tensors and one DPU-only task per input copies it into
its channel range of the output. The input already in the output's scale is a plain copy - the bypassed-BS DPU-only
frame of rk3576_dpu (0x4038 0x53, BS_MODE 2, 0x4050 0x20000, no record; twin BS_CFG 0x53); the other requantizes
through 44.1's int8 record frame (0x4038 0x100012, DPU_RDMA 0x501C 0x2: the record's ALU operand; twin BS_CFG 0x20050
with BS_ALU_CFG the operand) and OUT_CVT. Both with the EW stage bypassed (0x407C 0x010041c1, converter words 0 / 1),
the ERDMA off (0x1 plain, 0x41 with the record: bit 6 goes with the record frame), DPU_RDMA FEATURE_MODE_CFG bit 3 set
as in every DPU-only task with the MRDMA on, OUT_CVT_SCALE bit 16 set (twins clear), DPU 0x402C / BS_CHANNEL /
DPU_RDMA 0x5014 the real channels (48.2's rule).

fp16 [V ORC, REGISTER_SEMANTICS.md 58]: rknn-toolkit2 2.5.0 fp16 builds of ``Concat(Reshape(Conv1x1(x_i) [6 ch])
..., axis 2)`` for rk3576 write each Reshape as the same plain-copy frame with only the precision words changed:
DATA_FORMAT 0x40000002 (OUT and PROC precision fp16), DPU_RDMA FEATURE_MODE_CFG 0x10049 (IN / PROC precision fp16,
bit 3, flying), OUT_CVT_SCALE 0x10001 (FP32TOFP16_EN set, as npuemu's fp16 copy has it), and DPU_RDMA 0x5014 the
channels padded to fp16's 8-channel atom (7 for 6 real channels) while DPU 0x402C / BS_CHANNEL hold the real ones
(5). fp16 copies are plain only (no BS record).
"""

from __future__ import annotations

from collections.abc import Mapping

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_dpu import (
    ALL_BYPASSED_BUT_ALU, BS_BYPASSED, BS_MUL_BYPASS, DPU_ONLY_ENABLE, FP32TOFP16, INT8_BS_WORDS, INT8_WORDS, RECORD_ALU,
    RECORD_MUL, bs_record, record_cfg,
)
from npuemu.isa.rknn.rk3576_layout import (
    C2, CLAMPS, EW_BYPASS, FP16, INT8, INT32_MAX, INT32_MIN, Reader, VendorTask, field_reader, round_up,
)
from npuemu.isa.rknn.rk3576_resize import (
    COPY_KEPT, EW_CFG_BYPASSED, INHERITED, LUT_NAMES, UNREAD_ADDRESSES, frame_writes,
)

Spec = tuple[str, str, dict[str, int]]
VendorWrite = tuple[str, str, int]
Values = Mapping[tuple[str, str], int]

ERDMA_OFF, ERDMA_RECORD_BIT = 0x1, 1 << 6
MRDMA_ON_BIT = 1 << 3                  # DPU_RDMA 0x5044 bit 3 [V: every DPU-only task with the MRDMA reading]
#: the plain copy's frame words (the bypassed-BS frame, rk3576_dpu.DPU_ONLY_WORDS) [V]
PLAIN_WORDS = {("DPU", "CFG_4038"): 0x53, ("DPU", "BS_MODE"): 2, ("DPU", "BS_OW_CFG"): 0x20000}
CHANNEL_MODE = 0xF00                   # BS_CHANNEL's low half in DPU-only tasks (SIZE_E 0) [V]
RDMA_IN_PRECISION_SHIFT = 15           # DPU_RDMA FEATURE_MODE_CFG IN_PRECISION [V: fp16 copy 0x10049, both maps]


# --- vendor -> RK3588 ------------------------------------------------------------------------------------------


def is_vendor_copy(task: VendorTask) -> bool:
    """A DPU-only task with the ERDMA off, the EW stage bypassed and no unpooling: a Concat's copy."""
    values = task.values
    return (task.enable == DPU_ONLY_ENABLE and values.get(("DPU", "CFG_407C")) == EW_BYPASS
            and values.get(("DPU_RDMA", "ERDMA_CFG"), 0) & 1 == 1
            and not values.get(("DPU_RDMA", "SRC_DMA_CFG"), 0) and not values.get(("DPU", "LUT_CFG"), 0))


def is_padded_fp16_copy(task: VendorTask) -> bool:
    """An fp16 copy whose DPU_RDMA 0x5014 reads the whole last atom where DPU 0x402C writes fewer real channels: the
    vendor's fp16 Concat / Reshape copy (REGISTER_SEMANTICS.md 58), not a bilinear edge copy (0x5014 the real
    channels, 56.2), which it otherwise resembles."""
    f = task.field
    return (is_vendor_copy(task) and f("DPU", "DATA_FORMAT", "PROC_PRECISION") == FP16
            and f("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") > f("DPU", "DATA_CUBE_CHANNEL", "CHANNEL"))


def _frame_words(record: int | None) -> dict[tuple[str, str], int]:
    """The words a copy's frame holds: the plain copy's, or the record frame's (``record``: its 0x501C)."""
    if record is None:
        return {**PLAIN_WORDS, ("DPU_RDMA", "BRDMA_CFG"): 0, ("DPU_RDMA", "ERDMA_CFG"): ERDMA_OFF}
    has_mul = bool(record & RECORD_MUL)
    return {**{key: value for key, value in INT8_WORDS.items() if key != ("DPU", "BS_CHANNEL_MODE")},
            **INT8_BS_WORDS[has_mul], ("DPU_RDMA", "BRDMA_CFG"): record_cfg(has_mul),
            ("DPU_RDMA", "ERDMA_CFG"): ERDMA_OFF | ERDMA_RECORD_BIT}


def _check_copy(task: VendorTask) -> bool:
    """True for the record frame, False for the plain copy; refuses every other word by name."""
    f, raw = task.field, task.raw
    brdma = raw("DPU_RDMA", "BRDMA_CFG")
    record = brdma if brdma else None
    expected = {**_frame_words(record), ("DPU", "CFG_40C0"): 0x04440000,
                **{key: value for key, value in INHERITED.items()
                   if not key[1].startswith("RSV_") and key[1] not in UNREAD_ADDRESSES
                   and key not in (("DPU_RDMA", "BRDMA_CFG"), ("DPU_RDMA", "ERDMA_CFG"), ("DPU", "OUT_CVT_OFFSET"))}}
    odd = [f"{block}.{name} {raw(block, name):#x}" for (block, name), value in expected.items() if raw(block, name) != value]
    odd += [f"DPU.{name}_MIN/MAX" for name in CLAMPS
            if (task.signed("DPU", f"{name}_MIN"), raw("DPU", f"{name}_MAX")) != (INT32_MIN, INT32_MAX)]
    odd += [f"DPU.{name}" for name in LUT_NAMES if task.values.get(("DPU", name), 0)]
    if raw("DPU", "BS_CHANNEL") & 0xFFFF != CHANNEL_MODE or raw("DPU", "DATA_CUBE_NOTCH"):
        odd.append(f"DPU.BS_CHANNEL {raw('DPU', 'BS_CHANNEL'):#x} / DATA_CUBE_NOTCH {raw('DPU', 'DATA_CUBE_NOTCH'):#x}")
    precision = f("DPU", "DATA_FORMAT", "PROC_PRECISION")
    if (precision not in (INT8, FP16) or (precision == FP16 and record is not None)
            or f("DPU_RDMA", "FEATURE_MODE_CFG", "PROC_PRECISION") != precision
            or f("DPU_RDMA", "FEATURE_MODE_CFG", "IN_PRECISION") != precision or f("DPU", "FEATURE_MODE_CFG", "ENABLE")
            or f("DPU", "FEATURE_MODE_CFG", "CONV_MODE") or raw("DPU_RDMA", "FEATURE_MODE_CFG") & ~0x3FFFF
            or f("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE") or f("DPU_RDMA", "FEATURE_MODE_CFG", "COMB_USE")
            or not f("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_FP16TOFP32_EN")):
        odd.append(f"precision {f('DPU', 'DATA_FORMAT', 'PROC_PRECISION')}, DPU_RDMA FEATURE_MODE_CFG "
                   f"{raw('DPU_RDMA', 'FEATURE_MODE_CFG'):#x}")
    if record is not None and record not in (RECORD_ALU, record_cfg(True)):
        odd.append(f"DPU_RDMA.BRDMA_CFG {brdma:#x}")
    if odd:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU-only copy with {', '.join(odd)}; only the int8 "
                                      f"plain and requantizing copies and the fp16 plain one are decoded "
                                      f"(emulator/REGISTER_SEMANTICS.md 49.2, 58)")
    return record is not None


def copy_specs(task: VendorTask, read: Reader | None) -> list[Spec]:
    """The RK3588 writes of the twin's copy (npuemu's DPU-only copy) for a vendor copy; ``read`` reads the record."""
    has_record = _check_copy(task)
    f = task.field
    precision = f("DPU", "DATA_FORMAT", "PROC_PRECISION")
    real = f("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    channels = round_up(f("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") + 1, C2[precision])
    width, height = f("DPU", "DATA_CUBE_WIDTH", "WIDTH"), f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    if has_record and read is None:
        raise UnsupportedProgramError(f"{task.where}: a requantizing copy needs its BS record read from memory")
    alu, mul, shift, negative = bs_record(task, read) if has_record else (0, 0, 0, 0)
    has_mul = has_record and bool(task.raw("DPU_RDMA", "BRDMA_CFG") & RECORD_MUL)
    bs_cfg = BS_BYPASSED if not has_record else ALL_BYPASSED_BUT_ALU | (0 if has_mul else BS_MUL_BYPASS)
    return [
        ("DPU", "FEATURE_MODE_CFG", {"BURST_LEN": 15, "OUTPUT_MODE": f("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE"),
                                     "FLYING_MODE": f("DPU", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU", "DATA_FORMAT", {"OUT_PRECISION": f("DPU", "DATA_FORMAT", "OUT_PRECISION"), "IN_PRECISION": precision,
                                "PROC_PRECISION": precision, "BS_MUL_SHIFT_VALUE_NEG": negative}),
        ("DPU", "OFFSET_PEND", {}), ("DPU", "DST_BASE_ADDR", {"raw": task.raw("DPU", "DST_BASE_ADDR")}),
        ("DPU", "DST_SURF_STRIDE", {"DST_SURF_STRIDE": f("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")}),
        ("DPU", "DATA_CUBE_WIDTH", {"WIDTH": width}), ("DPU", "DATA_CUBE_HEIGHT", {"HEIGHT": height}),
        ("DPU", "DATA_CUBE_NOTCH_ADDR", {}),
        ("DPU", "DATA_CUBE_CHANNEL", {"ORIG_CHANNEL": real - 1, "CHANNEL": channels - 1}),
        ("DPU", "BS_CFG", {"raw": bs_cfg}), ("DPU", "BS_ALU_CFG", {"raw": alu & 0xFFFFFFFF}),
        ("DPU", "BS_MUL_CFG", {"BS_MUL_OPERAND": mul, "BS_MUL_SHIFT_VALUE": shift} if has_mul else {}),
        ("DPU", "BS_RELUX_CMP_VALUE", {}), ("DPU", "BS_OW_CFG", {"OD_BYPASS": 1}), ("DPU", "BS_OW_OP", {}),
        ("DPU", "WDMA_SIZE_0", {"CHANNEL_WDMA": channels - 1}),
        ("DPU", "WDMA_SIZE_1", {"HEIGHT_WDMA": f("DPU", "WDMA_SIZE", "HEIGHT_WDMA"),
                                "WIDTH_WDMA": f("DPU", "WDMA_SIZE", "WIDTH_WDMA")}),
        ("DPU", "BN_CFG", {"raw": BS_BYPASSED}), ("DPU", "BN_ALU_CFG", {}), ("DPU", "BN_MUL_CFG", {}),
        ("DPU", "BN_RELUX_CMP_VALUE", {}), ("DPU", "EW_CFG", {"raw": EW_CFG_BYPASSED}),
        ("DPU", "EW_CVT_OFFSET_VALUE", {}), ("DPU", "EW_CVT_SCALE_VALUE", {"raw": 1}), ("DPU", "EW_RELUX_CMP_VALUE", {}),
        *[("DPU", f"EW_OP_VALUE_{index}", {}) for index in range(8)],
        ("DPU", "OUT_CVT_OFFSET", {"raw": task.raw("DPU", "OUT_CVT_OFFSET")}),
        # FP32TOFP16_EN: the int8 twin clears it, npuemu's fp16 copy keeps it [V 49.2, 58]
        ("DPU", "OUT_CVT_SCALE", {"raw": task.raw("DPU", "OUT_CVT_SCALE") & ~(FP32TOFP16 if precision == INT8 else 0)}),
        ("DPU", "OUT_CVT_SHIFT", {"raw": task.raw("DPU", "OUT_CVT_SHIFT")}),
        ("DPU", "SURFACE_ADD", {"SURF_ADD": task.signed("DPU", "SURFACE_JUMP") + (width + 1) * (height + 1)}),
        ("DPU", "UNDOC_40C4", {}),
        ("DPU_RDMA", "DATA_CUBE_CHANNEL", {"CHANNEL": channels - 1}), ("DPU_RDMA", "BRDMA_CFG", {}),
        ("DPU_RDMA", "NRDMA_CFG", {}), ("DPU_RDMA", "ERDMA_CFG", {"ERDMA_DISABLE": 1}),
        ("DPU_RDMA", "FEATURE_MODE_CFG", {"IN_PRECISION": precision, "BURST_LEN": 15, "PROC_PRECISION": precision,
                                          "FLYING_MODE": f("DPU_RDMA", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU_RDMA", "WEIGHT", {"E_WEIGHT": 1, "N_WEIGHT": 1, "B_WEIGHT": 1, "M_WEIGHT": 1}),
        ("DPU_RDMA", "EW_SURF_STRIDE", {}),
        ("DPU_RDMA", "SURF_NOTCH", {"SURF_NOTCH_ADDR": f("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR")}),
        ("DPU_RDMA", "EW_SURF_NOTCH", {}),
    ]


# --- RK3588 -> vendor (npuemu's own builds) --------------------------------------------------------------------


def is_copy_values(values: Values, source: RegisterMap) -> bool:
    """npuemu's RK3588-position DPU-only task is a copy: the EW stage bypassed, the ERDMA off, no unpooling."""
    field = field_reader(values, source)
    return (values.get(("DPU", "EW_CFG"), 0) == EW_CFG_BYPASSED and field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE") == 1
            and not field("DPU_RDMA", "SRC_DMA_CFG", "UNPOOLING_EN"))


def copy_vendor_writes(values: Values, source: RegisterMap, where: str, record: bytes | None,
                       record_address: int = 0) -> list[VendorWrite]:
    """The vendor's copy frame (89 words, rk3576_resize.FRAME) for npuemu's int8 or fp16 DPU-only copy; ``record``:
    its BS record
    (rk3576_pack.dpu_record: the requantizing copy), None for a plain copy (BS bypassed)."""
    field = field_reader(values, source)
    real = field("DPU", "DATA_CUBE_CHANNEL", "ORIG_CHANNEL") + 1
    padded = field("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    plain = values.get(("DPU", "BS_CFG"), 0) == BS_BYPASSED
    precision = field("DPU", "DATA_FORMAT", "PROC_PRECISION")
    if (precision not in (INT8, FP16) or (precision == FP16 and not plain)
            or field("DPU", "DATA_FORMAT", "IN_PRECISION") != precision
            or padded != round_up(real, C2[precision])
            or padded != field("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
            or field("DPU_RDMA", "FEATURE_MODE_CFG", "IN_PRECISION") != precision
            or field("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE") or field("DPU_RDMA", "FEATURE_MODE_CFG", "COMB_USE")
            or values.get(("DPU", "BN_CFG"), 0) != BS_BYPASSED or values.get(("DPU", "DATA_CUBE_NOTCH_ADDR"), 0)
            or values.get(("DPU", "LUT_CFG"), 0) or values.get(("DPU_RDMA", "NRDMA_CFG"), 0)
            or values.get(("DPU_RDMA", "BRDMA_CFG"), 0) or (plain == (record is not None))
            or (plain and (values.get(("DPU", "BS_OW_CFG"), 0) != 0x2 or values.get(("DPU", "BS_ALU_CFG"), 0)
                           or values.get(("DPU", "BS_MUL_CFG"), 0)))):
        raise UnsupportedProgramError(f"{where}: a DPU-only copy other than an int8 plain or requantizing one or an fp16 "
                                      f"plain one (BS_CFG "
                                      f"{values.get(('DPU', 'BS_CFG'), 0):#x}) has no known vendor rk3576 form "
                                      f"(emulator/REGISTER_SEMANTICS.md 49.2)")
    has_mul = values.get(("DPU", "BS_CFG"), 0) == ALL_BYPASSED_BUT_ALU   # the multiplier not bypassed
    words = _frame_words(None if plain else record_cfg(has_mul))
    width, height = field("DPU", "DATA_CUBE_WIDTH", "WIDTH"), field("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    frame = {
        ("DPU", "FEATURE_MODE_CFG"): field("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE") << 1
        | field("DPU", "FEATURE_MODE_CFG", "FLYING_MODE"),
        ("DPU", "DATA_FORMAT"): field("DPU", "DATA_FORMAT", "OUT_PRECISION") << 29 | precision,
        ("DPU", "DST_BASE_ADDR"): values.get(("DPU", "DST_BASE_ADDR"), 0),
        ("DPU", "DST_SURF_STRIDE"): field("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE"),
        ("DPU", "DATA_CUBE_WIDTH"): width, ("DPU", "DATA_CUBE_HEIGHT"): height,
        ("DPU", "DATA_CUBE_CHANNEL"): real - 1, ("DPU", "BS_CHANNEL"): (real - 1) << 16 | CHANNEL_MODE,
        ("DPU", "WDMA_SIZE"): field("DPU", "WDMA_SIZE_1", "HEIGHT_WDMA") << 16 | field("DPU", "WDMA_SIZE_1", "WIDTH_WDMA"),
        ("DPU", "OUT_CVT_OFFSET"): values.get(("DPU", "OUT_CVT_OFFSET"), 0),
        ("DPU", "OUT_CVT_SCALE"): values.get(("DPU", "OUT_CVT_SCALE"), 0) | FP32TOFP16,
        ("DPU", "OUT_CVT_SHIFT"): values.get(("DPU", "OUT_CVT_SHIFT"), 0),
        ("DPU", "SURFACE_JUMP"): (field("DPU", "SURFACE_ADD", "SURF_ADD") - (width + 1) * (height + 1)) & 0xFFFFFFFF,
        ("DPU", "CFG_40C0"): 0x04440000,
        ("DPU_RDMA", "DATA_CUBE_CHANNEL"): (real if precision == INT8 else padded) - 1,   # fp16: padded [V] 58
        ("DPU_RDMA", "BS_CFG_ADDR"): 0 if plain else record_address,
        ("DPU_RDMA", "FEATURE_MODE_CFG"): precision << RDMA_IN_PRECISION_SHIFT | precision << 5 | MRDMA_ON_BIT
        | field("DPU_RDMA", "FEATURE_MODE_CFG", "FLYING_MODE"),
        ("DPU_RDMA", "SURF_NOTCH"): field("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR"),
        **words,
    }
    return frame_writes(values, frame, COPY_KEPT | {("DPU_RDMA", "PAD_CFG")})
