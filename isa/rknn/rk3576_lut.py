"""A conv task with a DPU LUT activation (Sigmoid, Tanh, HardSwish, SiLU, HardSigmoid ...) in the vendor's
rk3576 layout, both ways (emulator/REGISTER_SEMANTICS.md 46, compiler/LOWERING.md 46).

Evidence [V ORC]: rknn-toolkit2 2.5.0 builds of Conv 3x3 16 -> 16 on 12 x 12 followed by Sigmoid, Tanh,
HardSwish, x * Sigmoid(x) and HardSigmoid, int8, each for rk3576 and for rk3588 (and Sigmoid fp16), read
with npuemu's reader. In every pair the LUT table uploaded is the same 2 x 513 entries through the same
LUT port, the conv task's CNA / CORE / BS words follow the plain conv's rules, and these words differ:

| vendor rk3576 | rk3588 twin |
|---|---|
| DPU 0x4060 ACT_CFG 0x20, every clamp unused | BN / EW without Relu |
| DPU 0x407C 0x01004140 | EW_CFG 0x302 (EW_LUT_BYPASS and EW_BYPASS 0: the LUT) |
| DPU_RDMA NRDMA_CFG 0x1a, 0x5030 -> 64-byte record [alu, alu, mul, shift word] (BN_BASE_ADDR 0x502C unused) | BN_CFG 0x20040, BN_ALU_CFG, BN_MUL_CFG, DATA_FORMAT.BN_MUL_SHIFT_VALUE_NEG |
| LUT_CFG 0x02000006 | LUT_CFG 0x68 (LO_LE_MUX 2, hybrid / overflow -> LO, underflow -> LE) |
| 0x4110-0x411C: the LE start four times; 0x4140-0x414C: the LO end four times | LE [start, mid], LO [mid, end] |
| 0x4170 / 0x4174: the LO overflow slope scale in all four 16-bit lanes; 0x4184 its shift in four bytes | LUT_LO_SLOPE_SCALE / SHIFT overflow fields |
| 0x4188 / 0x418C: LE[0] in lanes 1-3 (lane 0 is 0); 0x4190 / 0x4194: LO[512] likewise | - (RK3588 takes the ends from the table) |

The BN record is rk3576_dpu's 44.4 record (the same layout: ALU operand at bytes 0 and 16, multiplier at 32,
the shift word at 48). Read [I]: one table over [LE start, LO end], its two halves the RK3588 LE and LO
tables; the out-of-range values as words of their own. Only this shape is known: a LUT whose LE and LO
halves meet and are equally wide, no LE slopes, no LO underflow slope; int8, or fp16 with the table-unit factor
in OUT_CVT (rk3576_lut_fp16, REGISTER_SEMANTICS.md 50).
"""

from __future__ import annotations

from collections.abc import Mapping

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_dpu import RECORD_BYTES, pack_record
from npuemu.isa.rknn.rk3576_layout import FP16, INT8, LUT_ACT_CFG, LUT_EW_WORD, Reader, VendorTask
from npuemu.isa.rknn.rk3576_lut_fp16 import check_own, is_fp16

Values = Mapping[tuple[str, str], int]
VendorWrite = tuple[str, str, int]

RK3588_LUT_EW = 0x302              # ... its rk3588 twin's EW_CFG [V ORC]
VENDOR_LUT_CFG = 0x02000006        # DPU 0x4108 [V ORC]
RK3588_LUT_CFG = 0x68              # the twin's (and npuemu's, lut_format.LUT_CFG_REP10)
BN_RECORD_CFG = 0x1A               # DPU_RDMA 0x5028: ALU and MUL from the record, the shift word [V ORC]
RK3588_BN_CFG = 0x20040            # BN: ALU add (operand 0), then the multiplier, registers [V ORC twins]
BN_ALU_BYPASS = 1 << 1
LANES = 4
STARTS = ("LUT_LE_START", "LUT_LE_END", "LUT_LO_START", "LUT_LO_END")   # vendor 0x4110-0x411C: four starts
ENDS = tuple(f"LUTV_END{lane}" for lane in range(LANES))
LUT_CONFIG = ("LUT_CFG", "LUT_INFO", "LUT_LE_START", "LUT_LE_END", "LUT_LO_START", "LUT_LO_END",
              "LUT_LE_SLOPE_SCALE", "LUT_LE_SLOPE_SHIFT", "LUT_LO_SLOPE_SCALE", "LUT_LO_SLOPE_SHIFT")
TABLE = 513                        # entries per RK3588 table (isa/lut_format.py)


def _signed(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >> 31 else value


def _lanes(value: int, lane0: bool = True) -> tuple[int, int]:
    """A 16-bit value in the four lanes of two words (lane 0: the low half of the first)."""
    value &= 0xFFFF
    return (value << 16 | (value if lane0 else 0)), (value << 16 | value)


# --- RK3588 form -> vendor (npuemu's own builds) -----------------------------------------------


def is_lut_conv(values: Values, source: RegisterMap) -> bool:
    """npuemu's RK3588-position conv task uses the DPU LUT (EW_CFG's LUT stage on)."""
    return bool(values.get(("DPU", "LUT_CFG"), 0)) or not source.register("DPU", "EW_CFG").field(
        "EW_LUT_BYPASS").extract(values.get(("DPU", "EW_CFG"), 0x383))


def check_lut(values: Values, source: RegisterMap, where: str) -> None:
    """Refuse a LUT task whose RK3588 form has no known vendor rk3576 form (the module doc's shape)."""
    def field(register: str, name: str) -> int:
        return source.register("DPU", register).field(name).extract(values.get(("DPU", register), 0))

    le = _signed(values.get(("DPU", "LUT_LE_START"), 0)), _signed(values.get(("DPU", "LUT_LE_END"), 0))
    lo = _signed(values.get(("DPU", "LUT_LO_START"), 0)), _signed(values.get(("DPU", "LUT_LO_END"), 0))
    bn = values.get(("DPU", "BN_CFG"), 0) & ~BN_ALU_BYPASS
    odd = []
    fp16 = is_fp16(field("DATA_FORMAT", "PROC_PRECISION"))   # its EW stage and OUT_CVT: rk3576_lut_fp16
    if (values.get(("DPU", "EW_CFG"), 0) != RK3588_LUT_EW and not fp16
            or values.get(("DPU", "LUT_CFG"), 0) != RK3588_LUT_CFG):
        odd.append(f"EW_CFG {values.get(('DPU', 'EW_CFG'), 0):#x} / LUT_CFG {values.get(('DPU', 'LUT_CFG'), 0):#x}")
    if le[1] != lo[0] or le[1] - le[0] != lo[1] - lo[0] or field("LUT_INFO", "LUT_LE_INDEX_SELECT") != field(
            "LUT_INFO", "LUT_LO_INDEX_SELECT"):
        odd.append(f"LE {le} and LO {lo} that are not two equal halves of one range")
    if (values.get(("DPU", "LUT_LE_SLOPE_SCALE"), 0) or values.get(("DPU", "LUT_LE_SLOPE_SHIFT"), 0)
            or field("LUT_LO_SLOPE_SCALE", "UFLOW_SCALE") or field("LUT_LO_SLOPE_SHIFT", "UFLOW_SHIFT")):
        odd.append("an LE slope or an LO underflow slope")
    if bn != RK3588_BN_CFG or (values.get(("DPU", "BN_CFG"), 0) & BN_ALU_BYPASS) != 0 and values.get(
            ("DPU", "BN_ALU_CFG"), 0):
        odd.append(f"BN_CFG {values.get(('DPU', 'BN_CFG'), 0):#x} (an ALU add, then a register multiplier is known)")
    if fp16:   # the factor in OUT_CVT (rk3576_lut_fp16)
        odd += check_own(values, source)
    elif field("DATA_FORMAT", "PROC_PRECISION") != INT8:
        odd.append(f"precision {field('DATA_FORMAT', 'PROC_PRECISION')} (int8 and fp16 are known)")
    if odd:
        raise UnsupportedProgramError(f"{where}: a LUT activation with {'; '.join(odd)} has no known vendor rk3576 "
                                      f"form (emulator/REGISTER_SEMANTICS.md 46)")


def bn_record(values: Values, source: RegisterMap) -> bytes:
    """The 64-byte BN record the vendor form points DPU_RDMA 0x5030 at (the relocation of
    ``<output>_BnCfg_BNcfgTensor`` lands there, as ``_BScfgTensor``'s at 0x5024 next to BS_BASE_ADDR) [V ORC]."""
    mul = source.register("DPU", "BN_MUL_CFG")
    negative = source.register("DPU", "DATA_FORMAT").field("BN_MUL_SHIFT_VALUE_NEG").extract(
        values.get(("DPU", "DATA_FORMAT"), 0))
    word = values.get(("DPU", "BN_MUL_CFG"), 0)
    return pack_record(_signed(values.get(("DPU", "BN_ALU_CFG"), 0)), mul.field("BN_MUL_OPERAND").extract(word),
                       mul.field("BN_MUL_SHIFT_VALUE").extract(word), negative)


def table_ends(upload: list[tuple[str, int]]) -> tuple[int, int]:
    """(LE[0], LO[512]) of a LUT upload (LUT_ACCESS_CFG / LUT_ACCESS_DATA writes, table 0 then 1)."""
    tables: dict[int, list[int]] = {}
    current = None
    for name, value in upload:
        if name == "LUT_ACCESS_CFG":
            current = tables.setdefault(value >> 16 & 1, []) if value >> 17 & 1 else None
        elif current is not None:
            current.append(value & 0xFFFF)
    if sorted(tables) != [0, 1] or len(tables[0]) != TABLE or len(tables[1]) != TABLE:
        raise UnsupportedProgramError(f"a LUT upload of tables {sorted(tables)} with "
                                      f"{[len(t) for t in tables.values()]} entries (two of {TABLE} are known)")
    return tables[0][0], tables[1][-1]


def vendor_lut_words(values: Values, source: RegisterMap, ends: tuple[int, int]) -> dict[str, int]:
    """The vendor's DPU LUT words (by vendor register name) of npuemu's RK3588 LUT registers; ``ends``:
    the table's LE[0] and LO[512] (table_ends)."""
    def field(register: str, name: str) -> int:
        return source.register("DPU", register).field(name).extract(values.get(("DPU", register), 0))

    start, end = values.get(("DPU", "LUT_LE_START"), 0), values.get(("DPU", "LUT_LO_END"), 0)
    scale = field("LUT_LO_SLOPE_SCALE", "OFLOW_SCALE")
    under, over = _lanes(ends[0], lane0=False), _lanes(ends[1], lane0=False)
    return {"LUT_CFG": VENDOR_LUT_CFG, "LUT_INFO": values.get(("DPU", "LUT_INFO"), 0),
            **{name: start for name in STARTS}, "LUT_LE_SLOPE_SCALE": 0, **{name: end for name in ENDS},
            "LUTV_OFLOW_SCALE01": _lanes(scale)[0], "LUTV_OFLOW_SCALE23": _lanes(scale)[1],
            "LUTV_OFLOW_SHIFT": field("LUT_LO_SLOPE_SHIFT", "OFLOW_SHIFT") * 0x01010101,
            "LUTV_UFLOW_VALUE01": under[0], "LUTV_UFLOW_VALUE23": under[1],
            "LUTV_OFLOW_VALUE01": over[0], "LUTV_OFLOW_VALUE23": over[1]}


# --- vendor -> RK3588 form (the translation) ---------------------------------------------------


def is_vendor_lut(task: VendorTask) -> bool:
    return task.values.get(("DPU", "CFG_407C")) == LUT_EW_WORD


def _check_vendor(task: VendorTask) -> None:
    raw = task.raw
    starts = {raw("DPU", name) for name in STARTS}
    ends = {raw("DPU", name) for name in ENDS}
    scales = {raw("DPU", "LUTV_OFLOW_SCALE01") >> 16, raw("DPU", "LUTV_OFLOW_SCALE23") & 0xFFFF,
              raw("DPU", "LUTV_OFLOW_SCALE23") >> 16}
    shift = raw("DPU", "LUTV_OFLOW_SHIFT")
    if (raw("DPU", "ACT_CFG") != LUT_ACT_CFG or raw("DPU", "LUT_CFG") != VENDOR_LUT_CFG or len(starts) != 1
            or len(ends) != 1 or len(scales) != 1 or shift != (shift & 0xFF) * 0x01010101
            or raw("DPU", "LUT_LE_SLOPE_SCALE") or raw("DPU_RDMA", "NRDMA_CFG") != BN_RECORD_CFG
            or task.field("DPU", "DATA_FORMAT", "PROC_PRECISION") not in (INT8, FP16)
            or (_signed(next(iter(ends))) - _signed(next(iter(starts)))) % 2):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 LUT task with ACT_CFG {raw('DPU', 'ACT_CFG'):#x}, "
                                      f"LUT_CFG {raw('DPU', 'LUT_CFG'):#x}, starts {sorted(starts)}, ends {sorted(ends)}, "
                                      f"NRDMA_CFG {raw('DPU_RDMA', 'NRDMA_CFG'):#x}: only the int8 / fp16 form of "
                                      f"emulator/REGISTER_SEMANTICS.md 46 / 50 is decoded")


def rk3588_lut_specs(task: VendorTask, read: Reader) -> tuple[int, list[tuple[str, str, dict[str, int]]]]:
    """(BN_MUL_SHIFT_VALUE_NEG, the RK3588 BN / EW / LUT specs) of a vendor LUT conv task; the BN operands
    from its record at DPU_RDMA 0x5030."""
    _check_vendor(task)
    data = read(task.raw("DPU_RDMA", "ADDR_5030"), RECORD_BYTES)
    alu, again, mul = (int.from_bytes(data[at:at + 4], "little", signed=True) for at in (0, 16, 32))
    shift = int.from_bytes(data[48:50], "little")
    if alu != again or not 0 <= mul < 1 << 16 or shift & 0xC0C0:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 BN record [{alu}, {again}, {mul}, {shift:#06x}] "
                                      f"is not one any decoded build holds (emulator/REGISTER_SEMANTICS.md 46)")
    start, end = _signed(task.raw("DPU", "LUT_LE_START")), _signed(task.raw("DPU", "LUTV_END0"))
    middle = (start + end) // 2
    scale = task.raw("DPU", "LUTV_OFLOW_SCALE23") & 0xFFFF
    specs = [
        ("DPU", "BN_CFG", {"raw": RK3588_BN_CFG}), ("DPU", "BN_ALU_CFG", {"raw": alu & 0xFFFFFFFF}),
        ("DPU", "BN_MUL_CFG", {"BN_MUL_OPERAND": mul, "BN_MUL_SHIFT_VALUE": shift & 0xFF}),
        ("DPU", "BN_RELUX_CMP_VALUE", {}), ("DPU", "EW_CFG", {"raw": RK3588_LUT_EW}),
        ("DPU", "EW_CVT_OFFSET_VALUE", {}), ("DPU", "EW_CVT_SCALE_VALUE", {"EW_OP_CVT_SCALE": 1}),
        ("DPU", "EW_RELUX_CMP_VALUE", {}), *[("DPU", f"EW_OP_VALUE_{index}", {}) for index in range(8)],
        ("DPU", "LUT_CFG", {"raw": RK3588_LUT_CFG}), ("DPU", "LUT_INFO", {"raw": task.raw("DPU", "LUT_INFO")}),
        ("DPU", "LUT_LE_START", {"raw": start & 0xFFFFFFFF}), ("DPU", "LUT_LE_END", {"raw": middle & 0xFFFFFFFF}),
        ("DPU", "LUT_LO_START", {"raw": middle & 0xFFFFFFFF}), ("DPU", "LUT_LO_END", {"raw": end & 0xFFFFFFFF}),
        ("DPU", "LUT_LE_SLOPE_SCALE", {}), ("DPU", "LUT_LE_SLOPE_SHIFT", {}),
        ("DPU", "LUT_LO_SLOPE_SCALE", {"OFLOW_SCALE": scale}),
        ("DPU", "LUT_LO_SLOPE_SHIFT", {"OFLOW_SHIFT": task.raw("DPU", "LUTV_OFLOW_SHIFT") & 0xFF}),
        ("DPU_RDMA", "BN_BASE_ADDR", {}),
    ]
    return shift >> 8, specs


# --- the vendor's LUT upload task ---------------------------------------------------------------

#: The vendor's upload task (op-enable 0x18, task record 0 of every LUT pair, int8 and fp16): the DPU-only
#: frame over a 1 x 1 x 16 cube, every stage bypassed, LUT_CFG 0x00ff0000, then LUT_ACCESS_CFG / DATA
#: (the same table words as its rk3588 twin's) [V ORC]. Words not listed hold 0; clamps are unused.
UPLOAD_VENDOR = {("DPU", "FEATURE_MODE_CFG"): 0x5, ("DPU", "DST_SURF_STRIDE"): 0x1, ("DPU", "BS_CHANNEL"): 0xF0F00,
                 ("DPU", "DATA_CUBE_CHANNEL"): 0xF, ("DPU", "CFG_4038"): 0x53, ("DPU", "BS_MODE"): 0x2,
                 ("DPU", "BS_OW_CFG"): 0x20000, ("DPU", "ACT_CFG"): 0x903, ("DPU", "CFG_407C"): 0x010041C1,
                 ("DPU", "CFG_4084"): 0x1, ("DPU", "OUT_CVT_SCALE"): 0x10001, ("DPU", "CFG_40C0"): 0x04440000,
                 ("DPU", "CFG_40D0"): 0x0040FFFF, ("DPU", "LUT_CFG"): 0x00FF0000,
                 ("DPU_RDMA", "DATA_CUBE_CHANNEL"): 0xF, ("DPU_RDMA", "ERDMA_CFG"): 0x1,
                 ("DPU_RDMA", "FEATURE_MODE_CFG"): 0x9}
#: ... and its rk3588 twin's frame (1097 writes with the table; every other register of the frame 0) [V ORC]
UPLOAD_RK3588 = {("DPU", "FEATURE_MODE_CFG"): 0x1E5, ("DPU", "DST_SURF_STRIDE"): 0x10,
                 ("DPU", "DATA_CUBE_CHANNEL"): 0xF000F, ("DPU", "BS_CFG"): 0x53, ("DPU", "BS_OW_CFG"): 0x2,
                 ("DPU", "WDMA_SIZE_0"): 0xF, ("DPU", "BN_CFG"): 0x53, ("DPU", "EW_CFG"): 0x383,
                 ("DPU", "EW_CVT_SCALE_VALUE"): 0x1, ("DPU", "OUT_CVT_SCALE"): 0x1, ("DPU", "SURFACE_ADD"): 0x10,
                 ("DPU_RDMA", "DATA_CUBE_CHANNEL"): 0xF, ("DPU_RDMA", "ERDMA_CFG"): 0x1,
                 ("DPU_RDMA", "FEATURE_MODE_CFG"): 0x7801, ("DPU_RDMA", "WEIGHT"): 0x01010101}
UPLOAD_FRAME = (("DPU", ("FEATURE_MODE_CFG", "DATA_FORMAT", "OFFSET_PEND", "DST_BASE_ADDR", "DST_SURF_STRIDE",
                         "DATA_CUBE_WIDTH", "DATA_CUBE_HEIGHT", "DATA_CUBE_NOTCH_ADDR", "DATA_CUBE_CHANNEL", "BS_CFG",
                         "BS_ALU_CFG", "BS_MUL_CFG", "BS_RELUX_CMP_VALUE", "BS_OW_CFG", "BS_OW_OP", "WDMA_SIZE_0",
                         "WDMA_SIZE_1", "BN_CFG", "BN_ALU_CFG", "BN_MUL_CFG", "BN_RELUX_CMP_VALUE", "EW_CFG",
                         "EW_CVT_OFFSET_VALUE", "EW_CVT_SCALE_VALUE", "EW_RELUX_CMP_VALUE", "OUT_CVT_OFFSET",
                         "OUT_CVT_SCALE", "OUT_CVT_SHIFT", *[f"EW_OP_VALUE_{i}" for i in range(8)], "SURFACE_ADD",
                         "UNDOC_40C4", *LUT_CONFIG)),
                ("DPU_RDMA", ("DATA_CUBE_CHANNEL", "BRDMA_CFG", "NRDMA_CFG", "ERDMA_CFG", "EW_SURF_STRIDE",
                              "FEATURE_MODE_CFG", "SURF_NOTCH", "WEIGHT", "EW_SURF_NOTCH")))
#: carried over as written (the DMA addresses the relocation fills; S_POINTER; the LUT port)
UPLOAD_CARRIED = {("DPU", "DST_BASE_ADDR"), ("DPU", "S_POINTER"), ("DPU_RDMA", "S_POINTER"),
                  ("DPU_RDMA", "SRC_BASE_ADDR"), ("DPU_RDMA", "BS_BASE_ADDR"), ("DPU_RDMA", "BN_BASE_ADDR"),
                  ("DPU_RDMA", "EW_BASE_ADDR"), ("DPU", "LUT_ACCESS_CFG"), ("DPU", "LUT_ACCESS_DATA")}
CLAMP_LIMITS = (1 << 31, (1 << 31) - 1)   # (INT32_MIN as written, INT32_MAX)


def is_lut_upload(task: VendorTask) -> bool:
    """A vendor DPU-only task that uploads a LUT table (LUT_CFG 0x00ff0000 and a write access)."""
    return (task.enable == 0x18 and task.values.get(("DPU", "LUT_CFG")) == UPLOAD_VENDOR[("DPU", "LUT_CFG")]
            and any(name == "LUT_ACCESS_CFG" and value >> 17 & 1 for _, name, value in task.kept))


def translate_lut_upload(task: VendorTask, out: RegisterMap) -> list[tuple[str, str, int]]:
    """The rk3588 twin's upload task: the kept writes (the table through the LUT port, S_POINTER, addresses)
    and the twin's frame; any other frame word is refused by name."""
    odd = []
    for (block, name), value in task.values.items():
        if block not in ("DPU", "DPU_RDMA"):   # the CNA / CORE values of the register group's last conv task
            continue
        expected = UPLOAD_VENDOR.get((block, name), 0)
        if "CLAMP" in name:
            expected = CLAMP_LIMITS[name.endswith("_MAX")]
        if (block, name) not in UPLOAD_CARRIED and value != expected:
            odd.append(f"{block}.{name} {value:#x}")
    if odd:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 LUT upload task with {', '.join(odd)}: only the "
                                      f"frame of emulator/REGISTER_SEMANTICS.md 46 is decoded")
    frame = [(block, name, UPLOAD_RK3588.get((block, name), task.values.get((block, name), 0)
                                             if (block, name) in UPLOAD_CARRIED else 0))
             for block, names in UPLOAD_FRAME for name in names if out.block(block).has(name)]
    return list(task.kept) + frame
