"""The vendor's rk3576 DataConvert tasks: int8 -> fp16 and fp16 -> int8 DPU-only copies (emulator/REGISTER_SEMANTICS.md 55).

Evidence [V ORC]: rknn-toolkit2 2.5.0 hybrid builds of x -> Conv1x1 a (int8) -> Conv1x1 b (float16, ``custom_hybrid``
[a, b]) -> Conv1x1 y (int8) on [1, 32, 4, 20] for rk3576 and rk3588: both targets write one DPU-only task
``exDataConvert`` per direction (``a__cvt_int8_float16``, ``b__cvt_float16_int8``). The rk3576 task is the DPU-only
frame (rk3576_resize.FRAME, 89 words) with the twin's BS / BN operands in records (44.1's layout: present entries in
order, 16 bytes each - ALU twice, multiplier, shift word):

| | int8 -> fp16 | fp16 -> int8 |
|---|---|---|
| DPU 0x4038 / BS_MODE / 0x4050 | 0x53 / 2 / 0x20000 + 41's SIZE_E word (SIZE_E 1: 0x21111) | 0x52 / 2 / 0 |
| BS record (0x501C, 0x5024) | none (0) | 0x8: the fp16 multiplier at byte 0 (twin BS_CFG 0x42, BS_MUL_CFG) |
| BN record (0x5028, 0x5030) | 0x2: [-zp, -zp] int32 (twin BN_CFG 0x20050, BN_ALU_CFG) | 0x2: [zp, zp] as fp32 bits |
| ACT_CFG, ERDMA_CFG | 0x920 (the BN stage on), 0x41 (bit 6 with a record) | the same |
| DPU_RDMA 0x5044 | 0x9 (int8) | 0x10149: COMB_USE 1 - the twin's COMB_USE 3 (two fp32 halves, the ERDMA the second, DPU COMB_USE 1) |
| BS_CHANNEL low half, 0x40B8 | 0x700 (SIZE_E 1), SURFACE_ADD - W H | 0xf00, the same |

DPU 0x402C / BS_CHANNEL / DPU_RDMA 0x5014 hold the real channels - 1 (the twin's CHANNEL is the fp16 side's 8-channel
multiple); OUT_CVT as the twin's but for the int8 -> fp16 split of one scale (rk3576 SHIFT 6 / MINUS_EXP 14, the twin
7 / 13). npuemu's own converts (compiler/lower/lower_convert.py) differ in two choices and are written in the same frame:
SIZE_E 0 for int8 -> fp16 (packed as the vendor's SIZE_E 1, the same addresses: :func:`as_the_vendor_groups_it`), and two
fp16 multipliers for fp16 -> int8 - the second in the BN record with the ALU operand (0x5028 0x1a, [zp, zp, b, 0], as the
vendor's fp16 LUT conv's BN record, REGISTER_SEMANTICS.md 50.1), the fp16 surfaces read whole (COMB_USE 0, ERDMA off).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_concat import MRDMA_ON_BIT
from npuemu.isa.rknn.rk3576_dpu import (
    DPU_ONLY_ENABLE, RECORD_ALU, RECORD_BYTES, RECORD_MUL, pack_record, record_cfg,
)
from npuemu.isa.rknn.rk3576_layout import (
    C2, CLAMPS, EW_BYPASS, FP16, INT8, INT32_MAX, INT32_MIN, Reader, VendorTask, field_reader, round_up,
)
from npuemu.isa.rknn.rk3576_resize import (
    COPY_KEPT, EW_CFG_BYPASSED, INHERITED, LUT_NAMES, OW_BYPASSED, channel_mode, frame_writes,
)

Spec = tuple[str, str, dict[str, int]]
VendorWrite = tuple[str, str, int]
Values = Mapping[tuple[str, str], int]

TO_FP16, TO_INT8 = (INT8, FP16), (FP16, INT8)          # (processing precision, output precision)
#: the words each direction's frame holds [V ORC h32 pair]
DIRECTION_WORDS = {TO_FP16: {("DPU", "CFG_4038"): 0x53, ("DPU", "BS_MODE"): 2},
                   TO_INT8: {("DPU", "CFG_4038"): 0x52, ("DPU", "BS_MODE"): 2, ("DPU", "BS_OW_CFG"): 0}}
SIZE_E = {TO_FP16: 1, TO_INT8: 0}       # the vendor's (and its twin's) output groups: an int8 atom is two fp16 ones
ACT_BN = 0x920                          # ACT_CFG with the BN stage on, no Relu [V ORC: both directions, 46.5]
ERDMA_RECORD = 0x41                     # ERDMA off, bit 6 with a record [V ORC]
ERDMA_SPLIT = 0x40000048                # the vendor's fp16 -> int8: the ERDMA reads the second fp32 half [V ORC]
CFG_40C0 = 0x04440000
RECORD_SHIFT = 1 << 4                   # 0x5028 / 0x501C bit 4: the shift entry (with an int8 / fp16 BN multiplier)
BN_RECORDS = (RECORD_ALU, RECORD_ALU | RECORD_MUL | RECORD_SHIFT)   # 0x2 [V h32], 0x1a [V fp16 LUT conv, 50.1]
VENDOR_SPLIT, TWIN_SPLIT = 1, 3         # DPU_RDMA COMB_USE: the vendor's fp16 read as two fp32 halves, its twin's
# RK3588 BS_CFG / BN_CFG words (ALU add, ReLU bypassed; MUL from the register or bypassed)
BS_MUL_ONLY, BS_OFF, BN_ALU_MUL, BN_ALU_ONLY = 0x42, 0x53, 0x20040, 0x20050


def _precisions(field: Callable[[str, str, str], int]) -> tuple[int, int]:
    return field("DPU", "DATA_FORMAT", "PROC_PRECISION"), field("DPU", "DATA_FORMAT", "OUT_PRECISION")


# --- vendor -> RK3588 ------------------------------------------------------------------------------------------


def is_vendor_convert(task: VendorTask) -> bool:
    """A DPU-only task with the EW stage bypassed whose output precision is not its processing precision (int8 /
    fp16): a DataConvert."""
    return (task.enable == DPU_ONLY_ENABLE and ("DPU", "DATA_FORMAT") in task.values
            and task.values.get(("DPU", "CFG_407C")) == EW_BYPASS and _precisions(task.field) in (TO_FP16, TO_INT8))


def _record(task: VendorTask, read: Reader, register: str, uses: int) -> tuple[int, int, int]:
    """(ALU operand, multiplier, shift word) of the record ``register`` points at, its entries those ``uses``
    names in order (ALU twice, multiplier, shift; 16 bytes each); 0 for an entry it does not hold."""
    data = read(task.raw("DPU_RDMA", register), RECORD_BYTES)
    entries = [name for name, bit in (("alu", RECORD_ALU), ("alu", RECORD_ALU), ("mul", RECORD_MUL),
                                      ("shift", RECORD_SHIFT)) if uses & bit]
    found: dict[str, list[int]] = {"alu": [], "mul": [0], "shift": [0]}
    for index, name in enumerate(entries):
        found.setdefault(name, []).append(int.from_bytes(data[16 * index:16 * index + 4], "little"))
    alu = found["alu"] or [0]
    if len(set(alu)) > 1 or found["mul"][-1] >> 16 or found["shift"][-1]:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DataConvert record at {register} [{data[:64].hex()}] "
                                      f"is not one any decoded build holds (ALU entries equal, a 16-bit fp16 "
                                      f"multiplier, no shift; emulator/REGISTER_SEMANTICS.md 55)")
    return alu[0], found["mul"][-1], found["shift"][-1]


def _check(task: VendorTask, direction: tuple[int, int]) -> None:
    f, raw = task.field, task.raw
    expected = {**DIRECTION_WORDS[direction], ("DPU", "ACT_CFG"): ACT_BN, ("DPU", "CFG_40C0"): CFG_40C0,
                ("DPU", "CFG_407C"): EW_BYPASS, ("DPU", "CFG_4080"): 0, ("DPU", "CFG_4084"): 1,
                **{key: value for key, value in INHERITED.items()
                   if key[0] == "DPU" and not key[1].startswith("RSV_") and key[1] not in ("ACT_CFG", "OUT_CVT_OFFSET")}}
    odd = [f"{block}.{name} {raw(block, name):#x}" for (block, name), value in expected.items() if raw(block, name) != value]
    odd += [f"DPU.{name}_MIN/MAX" for name in CLAMPS
            if (task.signed("DPU", f"{name}_MIN"), raw("DPU", f"{name}_MAX")) != (INT32_MIN, INT32_MAX)]
    odd += [f"DPU.{name}" for name in LUT_NAMES if task.values.get(("DPU", name), 0)]
    size_e = SIZE_E[direction] if direction == TO_INT8 else raw("DPU", "BS_OW_CFG") & 0xF
    if direction == TO_FP16 and raw("DPU", "BS_OW_CFG") != _ow_word(size_e, _channels(task)):
        odd.append(f"DPU.BS_OW_CFG {raw('DPU', 'BS_OW_CFG'):#x}")
    if raw("DPU", "BS_CHANNEL") & 0xFFFF != channel_mode(size_e) or raw("DPU", "DATA_CUBE_NOTCH"):
        odd.append(f"DPU.BS_CHANNEL {raw('DPU', 'BS_CHANNEL'):#x}")
    bs = (RECORD_MUL,) if direction == TO_INT8 else (0,)
    comb = f("DPU_RDMA", "FEATURE_MODE_CFG", "COMB_USE")
    if (raw("DPU_RDMA", "BRDMA_CFG") not in bs or raw("DPU_RDMA", "NRDMA_CFG") not in BN_RECORDS
            or raw("DPU_RDMA", "ERDMA_CFG") != (ERDMA_SPLIT if comb else ERDMA_RECORD)
            or comb not in ((0, VENDOR_SPLIT) if direction == TO_INT8 else (0,))
            or raw("DPU_RDMA", "FEATURE_MODE_CFG") & ~0x3FFFF or f("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE")
            or f("DPU_RDMA", "FEATURE_MODE_CFG", "CONV_MODE") or not f("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_FP16TOFP32_EN")
            or f("DPU_RDMA", "FEATURE_MODE_CFG", "PROC_PRECISION") != direction[0]
            or f("DPU_RDMA", "FEATURE_MODE_CFG", "IN_PRECISION") != direction[0]
            or f("DPU", "FEATURE_MODE_CFG", "ENABLE") or f("DPU", "FEATURE_MODE_CFG", "CONV_MODE")):
        odd += [f"DPU_RDMA.{name} {raw('DPU_RDMA', name):#x}" for name in ("BRDMA_CFG", "NRDMA_CFG", "ERDMA_CFG",
                                                                           "FEATURE_MODE_CFG")]
    if odd:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DataConvert with {', '.join(odd)}; only the forms of "
                                      f"emulator/REGISTER_SEMANTICS.md 55 are decoded")


def _channels(task: VendorTask) -> int:
    """The channels the task processes: DPU_RDMA 0x5014's count (the twin's CHANNEL; the DPU's 0x402C holds its
    ORIG_CHANNEL) [V ORC h24: 24 channels, int8 -> fp16 0x402C 23 / 0x5014 31, twin ORIG 23 / CHANNEL 31]."""
    return task.field("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") + 1


def _ow_word(size_e: int, channels: int) -> int:
    """Vendor 0x4050 of an int8 -> fp16 convert: 41's word with the fp16 output's surfaces [V 0x21111: 32 channels,
    and 24 channels processed as 32 (h24)]."""
    last = (-(-channels // C2[FP16]) - 1) % (size_e + 1)
    return OW_BYPASSED | size_e << 12 | last << 8 | size_e << 4 | size_e


def convert_specs(task: VendorTask, read: Reader | None) -> list[Spec]:
    """The RK3588 writes of the task's twin (the vendor's and npuemu's forms alike; ``read`` reads the records)."""
    f = task.field
    direction = _precisions(f)
    _check(task, direction)
    if read is None:
        raise UnsupportedProgramError(f"{task.where}: a DataConvert needs its records read from memory")
    real, channels = f("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1, _channels(task)
    if channels < real or channels % C2[FP16]:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DataConvert of {real} channels processing {channels}")
    width, height = f("DPU", "DATA_CUBE_WIDTH", "WIDTH"), f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    size_e = SIZE_E[direction] if direction == TO_INT8 else task.raw("DPU", "BS_OW_CFG") & 0xF
    split = f("DPU_RDMA", "FEATURE_MODE_CFG", "COMB_USE") == VENDOR_SPLIT
    return [
        ("DPU", "FEATURE_MODE_CFG", {"COMB_USE": int(split), "BURST_LEN": 15,
                                     "OUTPUT_MODE": f("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE"),
                                     "FLYING_MODE": f("DPU", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU", "DATA_FORMAT", {"OUT_PRECISION": direction[1], "IN_PRECISION": direction[0],
                                "PROC_PRECISION": direction[0]}),
        ("DPU", "OFFSET_PEND", {}), ("DPU", "DST_BASE_ADDR", {"raw": task.raw("DPU", "DST_BASE_ADDR")}),
        ("DPU", "DST_SURF_STRIDE", {"DST_SURF_STRIDE": f("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")}),
        ("DPU", "DATA_CUBE_WIDTH", {"WIDTH": width}), ("DPU", "DATA_CUBE_HEIGHT", {"HEIGHT": height}),
        ("DPU", "DATA_CUBE_NOTCH_ADDR", {}),
        ("DPU", "DATA_CUBE_CHANNEL", {"ORIG_CHANNEL": real - 1, "CHANNEL": channels - 1}),
        *_stage_specs(task, read, direction),
        ("DPU", "BS_RELUX_CMP_VALUE", {}), ("DPU", "BS_OW_OP", {}),
        ("DPU", "BS_OW_CFG", {"SIZE_E_2": size_e, "SIZE_E_1": size_e, "SIZE_E_0": size_e, "OD_BYPASS": 1}),
        ("DPU", "WDMA_SIZE_0", {"CHANNEL_WDMA": channels - 1}),
        ("DPU", "WDMA_SIZE_1", {"HEIGHT_WDMA": f("DPU", "WDMA_SIZE", "HEIGHT_WDMA"),
                                "WIDTH_WDMA": f("DPU", "WDMA_SIZE", "WIDTH_WDMA")}),
        ("DPU", "BN_RELUX_CMP_VALUE", {}), ("DPU", "EW_CFG", {"raw": EW_CFG_BYPASSED}),
        ("DPU", "EW_CVT_OFFSET_VALUE", {}), ("DPU", "EW_CVT_SCALE_VALUE", {"raw": 1}), ("DPU", "EW_RELUX_CMP_VALUE", {}),
        *[("DPU", f"EW_OP_VALUE_{index}", {}) for index in range(8)],
        *[("DPU", name, {"raw": task.raw("DPU", name)}) for name in ("OUT_CVT_OFFSET", "OUT_CVT_SCALE", "OUT_CVT_SHIFT")],
        ("DPU", "SURFACE_ADD", {"SURF_ADD": task.signed("DPU", "SURFACE_JUMP") + (width + 1) * (height + 1)}),
        ("DPU", "UNDOC_40C4", {}),
        *_rdma_specs(task, channels, direction, split),
    ]


def _stage_specs(task: VendorTask, read: Reader, direction: tuple[int, int]) -> list[Spec]:
    """BS (bypassed, or the record's fp16 multiplier) and BN (the record's ALU add, and its multiplier if any)."""
    bn_uses = task.raw("DPU_RDMA", "NRDMA_CFG")
    alu, bn_mul, _ = _record(task, read, "ADDR_5030", bn_uses)
    bs = [("DPU", "BS_CFG", {"raw": BS_OFF}), ("DPU", "BS_ALU_CFG", {}), ("DPU", "BS_MUL_CFG", {})]
    if direction == TO_INT8:
        _, bs_mul, _ = _record(task, read, "BS_CFG_ADDR", RECORD_MUL)
        bs = [("DPU", "BS_CFG", {"raw": BS_MUL_ONLY}), ("DPU", "BS_ALU_CFG", {}),
              ("DPU", "BS_MUL_CFG", {"BS_MUL_OPERAND": bs_mul})]
    has_mul = bool(bn_uses & RECORD_MUL)
    return bs + [("DPU", "BN_CFG", {"raw": BN_ALU_MUL if has_mul else BN_ALU_ONLY}),
                 ("DPU", "BN_ALU_CFG", {"raw": alu}),
                 ("DPU", "BN_MUL_CFG", {"BN_MUL_OPERAND": bn_mul} if has_mul else {})]


def _rdma_specs(task: VendorTask, channels: int, direction: tuple[int, int], split: bool) -> list[Spec]:
    """The MRDMA reads the input whole, or (the vendor's fp16 -> int8) as two fp32 halves with the ERDMA (REGISTER_
    SEMANTICS.md 26: the twin's COMB_USE 3 with MRDMA_FP16TOFP32_EN)."""
    f = task.field
    erdma = ({"ERDMA_DATA_MODE": f("DPU_RDMA", "ERDMA_CFG", "ERDMA_DATA_MODE"),
              "ERDMA_DATA_SIZE": f("DPU_RDMA", "ERDMA_CFG", "ERDMA_DATA_SIZE")} if split else {"ERDMA_DISABLE": 1})
    return [
        ("DPU_RDMA", "DATA_CUBE_CHANNEL", {"CHANNEL": channels - 1}), ("DPU_RDMA", "BRDMA_CFG", {}),
        ("DPU_RDMA", "NRDMA_CFG", {}), ("DPU_RDMA", "ERDMA_CFG", erdma),
        ("DPU_RDMA", "FEATURE_MODE_CFG", {"IN_PRECISION": direction[0], "BURST_LEN": 15, "PROC_PRECISION": direction[0],
                                          "COMB_USE": TWIN_SPLIT if split else 0, "MRDMA_FP16TOFP32_EN": int(split),
                                          "FLYING_MODE": f("DPU_RDMA", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU_RDMA", "WEIGHT", {"E_WEIGHT": 1, "N_WEIGHT": 1, "B_WEIGHT": 1, "M_WEIGHT": 1}),
        ("DPU_RDMA", "EW_SURF_STRIDE", {"EW_SURF_STRIDE": f("DPU_RDMA", "EW_SURF_STRIDE", "EW_SURF_STRIDE")}),
        ("DPU_RDMA", "SURF_NOTCH", {"SURF_NOTCH_ADDR": f("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR")}),
        ("DPU_RDMA", "EW_SURF_NOTCH", {"EW_SURF_NOTCH": f("DPU_RDMA", "EW_SURF_NOTCH", "EW_SURF_NOTCH")}),
    ]


# --- RK3588 -> vendor (npuemu's own builds) --------------------------------------------------------------------


def is_convert_values(values: Values, source: RegisterMap) -> bool:
    """npuemu's RK3588-position DPU-only task converts int8 <-> fp16 (compiler/lower/lower_convert.py): no EW
    operand, the output precision the other one."""
    field = field_reader(values, source)
    return (values.get(("DPU", "EW_CFG"), 0) == EW_CFG_BYPASSED and field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE") == 1
            and _precisions(field) in (TO_FP16, TO_INT8))


def as_the_vendor_groups_it(values: Values, source: RegisterMap) -> Values:
    """npuemu's int8 -> fp16 convert writes one fp16 surface a group (SIZE_E 0, SURFACE_ADD one surface); the vendor
    two (SIZE_E 1, SURFACE_ADD two surfaces) [V ORC h32 pair, both targets]: the same addresses. Other tasks as given."""
    field = field_reader(values, source)
    stride = field("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")
    if (_precisions(field) != TO_FP16 or field("DPU", "BS_OW_CFG", "SIZE_E_0")
            or field("DPU", "SURFACE_ADD", "SURF_ADD") != stride):
        return values
    ow = source.register("DPU", "BS_OW_CFG")
    return {**values, ("DPU", "BS_OW_CFG"): ow.pack({**ow.unpack(values.get(("DPU", "BS_OW_CFG"), 0)),
                                                     "SIZE_E_0": 1, "SIZE_E_1": 1, "SIZE_E_2": 1}),
            ("DPU", "SURFACE_ADD"): source.register("DPU", "SURFACE_ADD").pack({"SURF_ADD": 2 * stride})}


def convert_records(values: Values, source: RegisterMap) -> tuple[bytes | None, bytes]:
    """(the BS record or None, the BN record) of npuemu's convert in the vendor form (module docstring)."""
    field = field_reader(values, source)
    alu = values.get(("DPU", "BN_ALU_CFG"), 0)
    bn = pack_record(alu - (1 << 32) if alu >> 31 else alu,
                     field("DPU", "BN_MUL_CFG", "BN_MUL_OPERAND") if _bn_has_mul(values) else None, 0, 0)
    if _precisions(field) == TO_FP16:
        return None, bn
    return field("DPU", "BS_MUL_CFG", "BS_MUL_OPERAND").to_bytes(2, "little") + bytes(RECORD_BYTES - 2), bn


def _bn_has_mul(values: Values) -> bool:
    return values.get(("DPU", "BN_CFG"), 0) == BN_ALU_MUL


def convert_vendor_writes(values: Values, source: RegisterMap, where: str,
                          addresses: tuple[int, int]) -> list[VendorWrite]:
    """The vendor frame (89 words) of npuemu's convert (``values`` after :func:`as_the_vendor_groups_it`);
    ``addresses``: where its BS and BN records (:func:`convert_records`) lie."""
    field = field_reader(values, source)
    direction = _precisions(field)
    real = field("DPU", "DATA_CUBE_CHANNEL", "ORIG_CHANNEL") + 1
    channels = field("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    size_e = field("DPU", "BS_OW_CFG", "SIZE_E_0")
    bs = {TO_FP16: BS_OFF, TO_INT8: BS_MUL_ONLY}[direction]
    sizes = {field("DPU", "BS_OW_CFG", name) for name in ("SIZE_E_0", "SIZE_E_1", "SIZE_E_2")}
    rdma = source.register("DPU_RDMA", "FEATURE_MODE_CFG").unpack(values.get(("DPU_RDMA", "FEATURE_MODE_CFG"), 0))
    if (direction not in (TO_FP16, TO_INT8) or channels != round_up(real, C2[FP16]) or len(sizes) > 1
            or size_e != SIZE_E[direction] or field("DPU", "DATA_FORMAT", "IN_PRECISION") != direction[0]
            or channels != field("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
            or rdma["IN_PRECISION"] != direction[0] or rdma["PROC_PRECISION"] != direction[0] or rdma["COMB_USE"]
            or rdma["MRDMA_DISABLE"] or not field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE")
            or values.get(("DPU", "BS_CFG"), 0) != bs or values.get(("DPU", "BS_ALU_CFG"), 0)
            or (direction == TO_FP16 and values.get(("DPU", "BS_MUL_CFG"), 0))
            or field("DPU", "BS_MUL_CFG", "BS_MUL_SHIFT_VALUE") or field("DPU", "BS_MUL_CFG", "BS_MUL_SRC")
            or values.get(("DPU", "BN_CFG"), 0) not in (BN_ALU_ONLY, BN_ALU_MUL)
            or (values.get(("DPU", "BN_CFG"), 0) == BN_ALU_ONLY and values.get(("DPU", "BN_MUL_CFG"), 0))
            or field("DPU", "BN_MUL_CFG", "BN_MUL_SHIFT_VALUE") or field("DPU", "BN_MUL_CFG", "BN_MUL_SRC")
            or values.get(("DPU", "EW_CFG"), 0) != EW_CFG_BYPASSED or values.get(("DPU", "LUT_CFG"), 0)
            or values.get(("DPU", "DATA_CUBE_NOTCH_ADDR"), 0) or values.get(("DPU_RDMA", "BRDMA_CFG"), 0)
            or values.get(("DPU_RDMA", "NRDMA_CFG"), 0) or any(values.get(("DPU", name), 0) for name in (
                "BS_RELUX_CMP_VALUE", "BN_RELUX_CMP_VALUE", "BS_OW_OP"))):
        raise UnsupportedProgramError(f"{where}: a DataConvert other than lower_convert's (BS_CFG "
                                      f"{values.get(('DPU', 'BS_CFG'), 0):#x}, BN_CFG {values.get(('DPU', 'BN_CFG'), 0):#x}) "
                                      f"has no known vendor rk3576 form (emulator/REGISTER_SEMANTICS.md 55)")
    width, height = field("DPU", "DATA_CUBE_WIDTH", "WIDTH"), field("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    frame = {
        ("DPU", "FEATURE_MODE_CFG"): field("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE") << 1
        | field("DPU", "FEATURE_MODE_CFG", "FLYING_MODE"),
        ("DPU", "DATA_FORMAT"): direction[1] << 29 | direction[0],
        ("DPU", "DST_BASE_ADDR"): values.get(("DPU", "DST_BASE_ADDR"), 0),
        ("DPU", "DST_SURF_STRIDE"): field("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE"),
        ("DPU", "DATA_CUBE_WIDTH"): width, ("DPU", "DATA_CUBE_HEIGHT"): height,
        ("DPU", "DATA_CUBE_CHANNEL"): real - 1, ("DPU", "BS_CHANNEL"): (real - 1) << 16 | channel_mode(size_e),
        ("DPU", "WDMA_SIZE"): field("DPU", "WDMA_SIZE_1", "HEIGHT_WDMA") << 16 | field("DPU", "WDMA_SIZE_1", "WIDTH_WDMA"),
        ("DPU", "BS_OW_CFG"): _ow_word(size_e, channels) if direction == TO_FP16 else 0,
        ("DPU", "ACT_CFG"): ACT_BN, ("DPU", "CFG_40C0"): CFG_40C0,
        **{("DPU", name): values.get(("DPU", name), 0) for name in ("OUT_CVT_OFFSET", "OUT_CVT_SCALE", "OUT_CVT_SHIFT")},
        ("DPU", "SURFACE_JUMP"): (field("DPU", "SURFACE_ADD", "SURF_ADD") - (width + 1) * (height + 1)) & 0xFFFFFFFF,
        ("DPU_RDMA", "DATA_CUBE_CHANNEL"): channels - 1,
        ("DPU_RDMA", "BRDMA_CFG"): RECORD_MUL if direction == TO_INT8 else 0,
        ("DPU_RDMA", "BS_CFG_ADDR"): addresses[0] if direction == TO_INT8 else 0,
        ("DPU_RDMA", "NRDMA_CFG"): record_cfg(True) if _bn_has_mul(values) else RECORD_ALU,
        ("DPU_RDMA", "ADDR_5030"): addresses[1], ("DPU_RDMA", "ERDMA_CFG"): ERDMA_RECORD,
        ("DPU_RDMA", "FEATURE_MODE_CFG"): direction[0] << 15 | direction[0] << 5 | MRDMA_ON_BIT | rdma["FLYING_MODE"],
        ("DPU_RDMA", "SURF_NOTCH"): field("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR"),
        **DIRECTION_WORDS[direction],
    }
    return frame_writes(values, frame, COPY_KEPT | {("DPU_RDMA", "PAD_CFG")})
