"""A vendor rk3576 DPU-only task (op-enable 0x18) as the writes of its rk3588 twin (REGISTER_SEMANTICS.md 41).

The vendor writes a DPU-only task as the DPU and DPU_RDMA part of its conv task (``rk3576_forms``),
with these differences [V ORC: Add of two fp16 graph inputs, 16 x 12 x 20, next to its rk3588 twin]:
DPU 0x400C and DPU_RDMA 0x5044 without bit 30 (set in conv tasks: read as the CORE feed [I]), DPU
0x4030 low half 0xf00, 0x4038 0x53 / 0x4034 2 / 0x4050 0x20000 for the bypassed BS stage, 0x40C0
0x04440000 (conv tasks 0x04440100), and DPU_RDMA 0x5044 keeping MRDMA_DISABLE 0 with bit 3 set. The
MRDMA reads the first operand at SRC_BASE_ADDR, the ERDMA the second at EW_BASE_ADDR.

Decoded: fp16, the BS stage bypassed, an EW Add or Mul of the two operands (rk3576_layout.EW_CONFIGS;
the Mul [V ORC: Mul of the same two fp16 inputs]), no activation. int8: the same frame with 0x4038
0x100012, and the BS stage's operands - RK3588 BS_ALU_CFG, BS_MUL_CFG and DATA_FORMAT's negative shift,
registers there - read from a per-task record in memory at DPU_RDMA 0x5024 (``<input>_BsCfg_BScfgTensor``,
``bs_record``) [V ORC: int8 Add, Add + Relu, Mul of two graph inputs, three quantizations, each next to
its rk3588 twin; compiler/LOWERING.md 44.4].
"""

from __future__ import annotations

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn.rk3576_layout import (
    C2, CONSTANTS, EW_RELU_BYPASS, FP16, INT8, Reader, VendorTask, activation, ew_config, ew_relu, round_up,
)

DPU_ONLY_ENABLE = 0x18                   # DPU + DPU_RDMA (op-enable bits 3, 4)
#: the vendor words of a DPU-only task with the BS stage bypassed, fp16 [V ORC]
DPU_ONLY_WORDS = {("DPU", "CFG_4038"): 0x53, ("DPU", "BS_MODE"): 2, ("DPU", "BS_OW_CFG"): 0x20000,
                  ("DPU", "BS_CHANNEL_MODE"): 0xF00, ("DPU", "CFG_40C0"): 0x04440000}
BS_BYPASSED = 0x53                       # RK3588 BS_CFG / BN_CFG, everything bypassed [V ORC twin]
#: int8: the frame's words; BS_MODE / BS_OW_CFG 0 / 0 with the record's multiplier, 2 / 0x20000 without
#: (as fp16's bypassed stage) [V ORC: Add (twice), Add + Relu 0 / 0; Mul 2 / 0x20000]
INT8_WORDS = {("DPU", "CFG_4038"): 0x100012, ("DPU", "CFG_40C0"): 0x04440000, ("DPU", "BS_CHANNEL_MODE"): 0xF00}
INT8_BS_WORDS = {True: {("DPU", "BS_MODE"): 0, ("DPU", "BS_OW_CFG"): 0},
                 False: {("DPU", "BS_MODE"): 2, ("DPU", "BS_OW_CFG"): 0x20000}}
#: DPU_RDMA 0x501C bits 3:0 (V_LO): the record holds the ALU operand (2) and the multiplier (8); bit 4
#: (SHIFT_CFG_EN) comes with the multiplier [V ORC: Add 0x1a, Mul 0x2]
RECORD_ALU, RECORD_MUL = 0x2, 0x8
#: the record: 16-byte entries, int32 ALU operand at 0 and again at 16, the multiplier at 32, the shift
#: word at 48 (low byte BS_MUL_SHIFT_VALUE, high byte BS_MUL_SHIFT_VALUE_NEG) [V ORC: Add [-9, -9, 23942,
#: 0x0202] for the twin's BS_ALU_CFG -9, BS_MUL_CFG 0x5d860200 and DATA_FORMAT NEG 2; [-9, -9, 16384, 0]
#: for -9, 0x40000000, 0; Mul [-9, -9, 0, 0] with the multiplier bypassed]
RECORD_BYTES = 64
#: the int8 Mul's EW word, seen in DPU-only tasks only (so not in rk3576_layout.EW_CONFIGS, which conv
#: tasks and npuemu's own packing read) [V ORC int8 Mul twin: EW_CFG 0x904002c4]
DPU_ONLY_EW = {(INT8, 0x810F4094): 0x904002C4}   # + fp16 Max, Sub (FP16_EW_WORDS below)
#: fp16 Max and Sub of two whole operands: 0x407C bits 19:16 hold the twin's EW_ALU_ALGO [V ORC max16, max20, sub16
#: fp16 pairs; rk3576_ew, REGISTER_SEMANTICS.md 54]
FP16_EW_WORDS = {(FP16, 0x0000C0C0): 0x108002C0,   # EW ALU max of the whole ERDMA operand
                 (FP16, 0x0004C0C0): 0x108402C0}   # EW ALU minus
DPU_ONLY_EW.update(FP16_EW_WORDS)
ALL_BYPASSED_BUT_ALU = 0x20040           # RK3588 BS_CFG: ALU add of the register operand, ReLU bypassed
Spec = tuple[str, str, dict[str, int]]


#: RK3588 EW_CFG fields of an int8 Sub (EW ALU minus of the converted ERDMA operand) and of the Add the vendor
#: writes for it (REGISTER_SEMANTICS.md 48.1)
EW_ALU_ALGO_SHIFT, EW_ALU_ALGO_MASK = 16, 0xF << 16
ALU_ADD, ALU_MINUS = 2, 4
EW_OFF_BITS = 0b1_0000_0011             # EW_OP_CVT_BYPASS (8), EW_OP_BYPASS (1), EW_BYPASS (0)
INT8_OPERAND_MAGNITUDE = 128


def minus_as_add(values: dict, source) -> dict:
    """An int8 DPU-only Sub (npuemu: EW ALU minus, ``v - cvt(e)``) as the vendor writes its Sub: the EW Add with
    the operand converter's scale negated, ``v + cvt'(e)`` [V ORC: x - z int8, rk3576 and rk3588 builds, EW_CFG
    add, EW_OP_CVT_SCALE 0x80a2 = -32606]. The same integers: ``cvt'(e) = -cvt(e)`` exactly, as both rounding
    modes of the converter are odd functions (half-even, half-away: emulator/NUMERICS.md 1) and the product
    stays far below the int32 saturation (checked here), and ``v - c = v + (-c)`` in the stage's exact sum,
    saturated once. ``values`` unchanged for any other task (fp16: not seen; a scale of -32768, whose negation
    does not fit the signed 16-bit field; a product that could saturate)."""
    config = values.get(("DPU", "EW_CFG"), 0)
    fmt = source.register("DPU", "DATA_FORMAT").unpack(values.get(("DPU", "DATA_FORMAT"), 0))
    if (fmt["PROC_PRECISION"] != INT8 or config & EW_OFF_BITS or config & EW_OP_MUL
            or (config & EW_ALU_ALGO_MASK) >> EW_ALU_ALGO_SHIFT != ALU_MINUS):
        return values
    word = values.get(("DPU", "EW_CVT_SCALE_VALUE"), 0)
    scale = (word & 0xFFFF) - ((word & 0x8000) << 1)
    offset = values.get(("DPU", "EW_CVT_OFFSET_VALUE"), 0)
    offset -= (offset & 0x80000000) << 1
    if scale == -0x8000 or (INT8_OPERAND_MAGNITUDE + abs(offset)) * abs(scale) >= 1 << 31:
        return values
    return {**values, ("DPU", "EW_CFG"): config & ~EW_ALU_ALGO_MASK | ALU_ADD << EW_ALU_ALGO_SHIFT,
            ("DPU", "EW_CVT_SCALE_VALUE"): word & ~0xFFFF | -scale & 0xFFFF}


def twin_channels(precision: int, rdma_channel: int) -> int:
    """The twin's DPU CHANNEL (and WDMA, DPU_RDMA CHANNEL) field of a DPU-only task whose DPU_RDMA 0x5014 holds
    ``rdma_channel`` (channels - 1): rounded up to a whole atom [V ORC int8 24 -> 31 (48.2); fp16 20 -> 23 (54)]."""
    atom = C2.get(precision)
    return rdma_channel if atom is None else round_up(rdma_channel + 1, atom) - 1


def is_dpu_only(enable: int) -> bool:
    return enable == DPU_ONLY_ENABLE


def _expected_words(task: VendorTask, precision: int) -> dict[tuple[str, str], int]:
    if precision == INT8:
        return {**INT8_WORDS, **INT8_BS_WORDS[bool(_record_uses(task) & RECORD_MUL)]}
    return DPU_ONLY_WORDS


def _record_uses(task: VendorTask) -> int:
    return task.field("DPU_RDMA", "BRDMA_CFG", "V_LO")


def _record_ok(task: VendorTask) -> bool:
    """int8: the record holds the ALU operand, with or without the multiplier, the shift word read
    exactly with the multiplier; fp16: no record."""
    f = task.field
    if f("DPU", "DATA_FORMAT", "PROC_PRECISION") != INT8:
        return not task.raw("DPU_RDMA", "BRDMA_CFG")
    uses = _record_uses(task)
    return (not f("DPU_RDMA", "BRDMA_CFG", "BRDMA_DATA_USE") and uses in (RECORD_ALU, RECORD_ALU | RECORD_MUL)
            and f("DPU_RDMA", "BRDMA_CFG", "SHIFT_CFG_EN") == bool(uses & RECORD_MUL))


def check_dpu_only(task: VendorTask) -> None:
    f, where = task.field, task.where
    precision = f("DPU", "DATA_FORMAT", "PROC_PRECISION")
    expected = _expected_words(task, precision) if precision in (INT8, FP16) else {}
    found = {("DPU", "CFG_4038"): task.raw("DPU", "CFG_4038"), ("DPU", "BS_MODE"): task.raw("DPU", "BS_MODE"),
             ("DPU", "BS_OW_CFG"): task.raw("DPU", "BS_OW_CFG"), ("DPU", "CFG_40C0"): task.raw("DPU", "CFG_40C0"),
             ("DPU", "BS_CHANNEL_MODE"): f("DPU", "BS_CHANNEL", "MODE")}
    odd = [f"{block}.{name} {value:#x}" for (block, name), value in found.items()
           if expected.get((block, name)) != value]
    odd += [f"{block}.{name} {task.raw(block, name):#x}" for (block, name), values in CONSTANTS.items()
            if block == "DPU" and name != "CFG_40C0" and task.raw(block, name) not in values]
    if (not expected or odd or f("DPU", "FEATURE_MODE_CFG", "ENABLE") or f("DPU", "FEATURE_MODE_CFG", "CONV_MODE")
            or not _record_ok(task) or task.raw("DPU_RDMA", "NRDMA_CFG")):
        raise UnsupportedProgramError(f"{where}: vendor rk3576 task with op-enable {DPU_ONLY_ENABLE:#x}; only conv "
                                      f"tasks, PPU pools and int8 / fp16 DPU-only Adds / Muls are decoded, not this "
                                      f"one (precision {precision}; {', '.join(odd) or 'a BS, BN or CNA-fed stage'}, "
                                      f"DPU_RDMA.BRDMA_CFG {task.raw('DPU_RDMA', 'BRDMA_CFG'):#x}; "
                                      f"emulator/REGISTER_SEMANTICS.md 41, 44)")
    mode = {name: f("DPU_RDMA", "FEATURE_MODE_CFG", name) for name in ("ENABLE", "COMB_USE", "MRDMA_DISABLE",
                                                                          "CONV_MODE")}
    erdma = task.field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE"), task.field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DATA_MODE")
    # a Mul by a per-channel operand (an SE gate's, REGISTER_SEMANTICS.md 46.3; fp16: 50.4)
    per_channel = erdma == (0, 0) and _ew(task) is not None and _ew(task) & EW_OP_MUL and precision in (INT8, FP16)
    if any(mode.values()) or (erdma != (0, 1) and not per_channel) or _ew(task) is None or activation(task) != "none":
        raise UnsupportedProgramError(f"{where}: vendor rk3576 task with op-enable {DPU_ONLY_ENABLE:#x}; only conv "
                                      f"tasks, PPU pools and DPU-only Adds / Muls of an MRDMA and a whole ERDMA "
                                      f"operand are decoded, not this one (DPU_RDMA FEATURE_MODE_CFG "
                                      f"{task.raw('DPU_RDMA', 'FEATURE_MODE_CFG'):#x}, ERDMA_CFG "
                                      f"{task.raw('DPU_RDMA', 'ERDMA_CFG'):#x}, EW {task.raw('DPU', 'CFG_407C'):#x})")


def _ew(task: VendorTask) -> int | None:
    """The RK3588 EW_CFG of the task's EW stage (rk3576_layout.ew_config, or the int8 Mul's)."""
    key = (task.field("DPU", "DATA_FORMAT", "PROC_PRECISION"), task.raw("DPU", "CFG_407C"))
    return DPU_ONLY_EW[key] if key in DPU_ONLY_EW else ew_config(task)


def bs_record(task: VendorTask, read: Reader) -> tuple[int, int, int, int]:
    """(ALU operand, multiplier, BS_MUL_SHIFT_VALUE, BS_MUL_SHIFT_VALUE_NEG) of an int8 DPU-only task's
    record at DPU_RDMA 0x5024 (RECORD_BYTES above); multiplier and shifts 0 without RECORD_MUL."""
    data = read(task.raw("DPU_RDMA", "BS_CFG_ADDR"), RECORD_BYTES)
    alu, again, mul = (int.from_bytes(data[at:at + 4], "little", signed=True) for at in (0, 16, 32))
    shift = int.from_bytes(data[48:50], "little")
    if not _record_uses(task) & RECORD_MUL:
        return alu, 0, 0, 0
    if alu != again or not 0 <= mul < 1 << 16 or shift >> 8 > 0x3F or shift & 0xFF > 0x3F:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 int8 DPU-only BS record [{alu}, {again}, {mul}, "
                                      f"{shift:#06x}] is not one any decoded build holds (the ALU operand twice, a "
                                      f"16-bit multiplier, two 6-bit shifts; emulator/REGISTER_SEMANTICS.md 44)")
    return alu, mul, shift & 0xFF, shift >> 8


def pack_record(alu: int, mul: int | None, shift: int, negative: int) -> bytes:
    """The inverse of :func:`bs_record`: the 64-byte record of an int8 DPU-only task (``mul`` None: the
    multiplier bypassed, its entries 0)."""
    entries = (alu, alu, mul or 0, (negative << 8 | shift) if mul is not None else 0)
    return b"".join((value & 0xFFFFFFFF).to_bytes(4, "little") + bytes(12) for value in entries)


def record_cfg(has_mul: bool) -> int:
    """DPU_RDMA 0x501C of an int8 DPU-only task: V_LO, SHIFT_CFG_EN with the multiplier [V ORC]."""
    return (RECORD_ALU | RECORD_MUL | 1 << 4) if has_mul else RECORD_ALU


def dpu_only_specs(task: VendorTask, read: Reader | None = None) -> list[Spec]:
    """The RK3588 field values of the task's DPU and DPU_RDMA registers (the twin's); ``read`` reads the
    int8 task's BS record by device address."""
    check_dpu_only(task)
    f = task.field
    real = f("DPU", "DATA_CUBE_CHANNEL", "CHANNEL")
    # the channels padded to whole atoms are DPU_RDMA's word, the real ones the DPU's [V ORC se8: 7 / 15]; a whole
    # operand's int8 task writes the real count in both, its twin the padded one [V ORC x - z, 24 channels: 23 / 31];
    # fp16 alike with its 8-channel atom [V ORC Max, Mul of 20 channels: 19 / 23] (rk3576_ew)
    channels = twin_channels(f("DPU", "DATA_FORMAT", "PROC_PRECISION"), f("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL"))
    width, height = f("DPU", "DATA_CUBE_WIDTH", "WIDTH"), f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    config = _ew(task) & ~(EW_RELU_BYPASS if ew_relu(task) else 0)
    # EW_DATA_MODE follows the ERDMA's: 0 an operand per channel (an SE gate's Mul) [V ORC se, se8 twins]
    config = config & ~EW_DATA_MODE | f("DPU_RDMA", "ERDMA_CFG", "ERDMA_DATA_MODE") << 28
    int8 = f("DPU", "DATA_FORMAT", "PROC_PRECISION") == INT8
    if int8 and read is None:
        raise UnsupportedProgramError(f"{task.where}: an int8 DPU-only task needs its BS record read from memory")
    alu, mul, shift, negative = bs_record(task, read) if int8 else (0, 0, 0, 0)
    return [
        ("DPU", "FEATURE_MODE_CFG", {"BURST_LEN": 15, "OUTPUT_MODE": f("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE"),
                                     "FLYING_MODE": f("DPU", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU", "DATA_FORMAT", {"OUT_PRECISION": f("DPU", "DATA_FORMAT", "OUT_PRECISION"),
                                "IN_PRECISION": f("DPU", "DATA_FORMAT", "PROC_PRECISION"),
                                "PROC_PRECISION": f("DPU", "DATA_FORMAT", "PROC_PRECISION"),
                                "BS_MUL_SHIFT_VALUE_NEG": negative}),
        ("DPU", "OFFSET_PEND", {"OFFSET_PEND": f("DPU", "OFFSET_PEND", "OFFSET_PEND")}),
        ("DPU", "DST_BASE_ADDR", {"DST_BASE_ADDR": task.raw("DPU", "DST_BASE_ADDR")}),
        ("DPU", "DST_SURF_STRIDE", {"DST_SURF_STRIDE": f("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")}),
        ("DPU", "DATA_CUBE_WIDTH", {"WIDTH": width}), ("DPU", "DATA_CUBE_HEIGHT", {"HEIGHT": height}),
        ("DPU", "DATA_CUBE_NOTCH_ADDR", {}),
        ("DPU", "DATA_CUBE_CHANNEL", {"ORIG_CHANNEL": real, "CHANNEL": channels}),
        *_bs_specs(int8, bool(_record_uses(task) & RECORD_MUL), alu, mul, shift),
        ("DPU", "WDMA_SIZE_0", {"CHANNEL_WDMA": channels}),
        ("DPU", "WDMA_SIZE_1", {"HEIGHT_WDMA": f("DPU", "WDMA_SIZE", "HEIGHT_WDMA"),
                                "WIDTH_WDMA": f("DPU", "WDMA_SIZE", "WIDTH_WDMA")}),
        ("DPU", "BN_CFG", {"raw": BS_BYPASSED}), ("DPU", "BN_ALU_CFG", {}), ("DPU", "BN_MUL_CFG", {}),
        ("DPU", "BN_RELUX_CMP_VALUE", {}), ("DPU", "EW_CFG", {"raw": config}),
        ("DPU", "EW_CVT_OFFSET_VALUE", {"raw": task.raw("DPU", "CFG_4080")}),
        ("DPU", "EW_CVT_SCALE_VALUE", {"raw": task.raw("DPU", "CFG_4084")}), ("DPU", "EW_RELUX_CMP_VALUE", {}),
        *[("DPU", f"EW_OP_VALUE_{index}", {}) for index in range(8)],
        *[("DPU", name, {"raw": task.raw("DPU", name)}) for name in ("OUT_CVT_OFFSET", "OUT_CVT_SHIFT")],
        # bit 16 (FP32TOFP16_EN) set by the vendor in int8 EW tasks, not by its rk3588 twin [V ORC]
        ("DPU", "OUT_CVT_SCALE", {"raw": task.raw("DPU", "OUT_CVT_SCALE") & ~(FP32TOFP16 if int8 else 0)}),
        ("DPU", "SURFACE_ADD", {"SURF_ADD": task.raw("DPU", "SURFACE_JUMP") + (width + 1) * (height + 1)}),
        ("DPU", "UNDOC_40C4", {}),
        *_dpu_rdma_specs(task, channels),
    ]


FP32TOFP16 = 1 << 16


def _bs_specs(int8: bool, has_mul: bool, alu: int, mul: int, shift: int) -> list[Spec]:
    """BS bypassed (fp16), or the ALU add of the record's operand, then its multiplier if it has one
    (RK3588 BS_CFG 0x20040 / 0x20050, operands in registers) [V ORC int8 twins]."""
    if not int8:
        return [("DPU", "BS_CFG", {"raw": BS_BYPASSED}), ("DPU", "BS_ALU_CFG", {}), ("DPU", "BS_MUL_CFG", {}),
                ("DPU", "BS_RELUX_CMP_VALUE", {}), ("DPU", "BS_OW_CFG", {"OD_BYPASS": 1}), ("DPU", "BS_OW_OP", {})]
    return [("DPU", "BS_CFG", {"raw": ALL_BYPASSED_BUT_ALU | (0 if has_mul else BS_MUL_BYPASS)}),
            ("DPU", "BS_ALU_CFG", {"raw": alu & 0xFFFFFFFF}),
            ("DPU", "BS_MUL_CFG", {"BS_MUL_OPERAND": mul, "BS_MUL_SHIFT_VALUE": shift} if has_mul else {}),
            ("DPU", "BS_RELUX_CMP_VALUE", {}), ("DPU", "BS_OW_CFG", {"OD_BYPASS": 1}), ("DPU", "BS_OW_OP", {})]


BS_MUL_BYPASS = 1 << 4                   # RK3588 BS_CFG.BS_MUL_BYPASS
EW_OP_MUL = 1 << 2                       # RK3588 EW_CFG.EW_OP_TYPE
EW_DATA_MODE = 3 << 28                   # RK3588 EW_CFG.EW_DATA_MODE


def _dpu_rdma_specs(task: VendorTask, channels: int) -> list[Spec]:
    f = task.field
    erdma = {name: f("DPU_RDMA", "ERDMA_CFG", name) for name in
             ("ERDMA_DATA_MODE", "ERDMA_SURF_MODE", "ERDMA_DATA_SIZE", "OV4K_BYPASS", "ERDMA_DISABLE")}
    mode = {name: f("DPU_RDMA", "FEATURE_MODE_CFG", name) for name in
            ("IN_PRECISION", "PROC_PRECISION", "MRDMA_FP16TOFP32_EN", "FLYING_MODE")}
    return [
        ("DPU_RDMA", "DATA_CUBE_CHANNEL", {"CHANNEL": channels}), ("DPU_RDMA", "BRDMA_CFG", {}),
        ("DPU_RDMA", "NRDMA_CFG", {}), ("DPU_RDMA", "ERDMA_CFG", erdma),
        ("DPU_RDMA", "FEATURE_MODE_CFG", {**mode, "BURST_LEN": 15}),
        ("DPU_RDMA", "WEIGHT", {"E_WEIGHT": 1, "N_WEIGHT": 1, "B_WEIGHT": 1, "M_WEIGHT": 1}),
        ("DPU_RDMA", "EW_SURF_STRIDE", {"EW_SURF_STRIDE": f("DPU_RDMA", "EW_SURF_STRIDE", "EW_SURF_STRIDE")}),
        ("DPU_RDMA", "SURF_NOTCH", {"SURF_NOTCH_ADDR": f("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR")}),
        ("DPU_RDMA", "EW_SURF_NOTCH", {"EW_SURF_NOTCH": f("DPU_RDMA", "EW_SURF_NOTCH", "EW_SURF_NOTCH")}),
    ]


def frame_specs(task: VendorTask, negative: int = 0) -> list[Spec]:
    """The RK3588 DPU / DPU_RDMA specs of a DPU-only task's frame - geometry, the BS stage bypassed, OUT_CVT as
    written, the DMA words - without its BN and EW stages (a standalone LUT's come from rk3576_lut: rk3576_ew);
    ``negative``: DATA_FORMAT's BN_MUL_SHIFT_VALUE_NEG."""
    f = task.field
    precision = f("DPU", "DATA_FORMAT", "PROC_PRECISION")
    channels = twin_channels(precision, f("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL"))
    width, height = f("DPU", "DATA_CUBE_WIDTH", "WIDTH"), f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    return [
        ("DPU", "FEATURE_MODE_CFG", {"BURST_LEN": 15, "OUTPUT_MODE": f("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE"),
                                     "FLYING_MODE": f("DPU", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU", "DATA_FORMAT", {"OUT_PRECISION": f("DPU", "DATA_FORMAT", "OUT_PRECISION"), "IN_PRECISION": precision,
                                "PROC_PRECISION": precision, "BN_MUL_SHIFT_VALUE_NEG": negative}),
        ("DPU", "OFFSET_PEND", {"OFFSET_PEND": f("DPU", "OFFSET_PEND", "OFFSET_PEND")}),
        ("DPU", "DST_BASE_ADDR", {"DST_BASE_ADDR": task.raw("DPU", "DST_BASE_ADDR")}),
        ("DPU", "DST_SURF_STRIDE", {"DST_SURF_STRIDE": f("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")}),
        ("DPU", "DATA_CUBE_WIDTH", {"WIDTH": width}), ("DPU", "DATA_CUBE_HEIGHT", {"HEIGHT": height}),
        ("DPU", "DATA_CUBE_NOTCH_ADDR", {}),
        ("DPU", "DATA_CUBE_CHANNEL", {"ORIG_CHANNEL": f("DPU", "DATA_CUBE_CHANNEL", "CHANNEL"), "CHANNEL": channels}),
        *_bs_specs(False, False, 0, 0, 0),
        ("DPU", "WDMA_SIZE_0", {"CHANNEL_WDMA": channels}),
        ("DPU", "WDMA_SIZE_1", {"HEIGHT_WDMA": f("DPU", "WDMA_SIZE", "HEIGHT_WDMA"),
                                "WIDTH_WDMA": f("DPU", "WDMA_SIZE", "WIDTH_WDMA")}),
        *[("DPU", name, {"raw": task.raw("DPU", name)})
          for name in ("OUT_CVT_OFFSET", "OUT_CVT_SHIFT", "OUT_CVT_SCALE")],
        ("DPU", "SURFACE_ADD", {"SURF_ADD": task.raw("DPU", "SURFACE_JUMP") + (width + 1) * (height + 1)}),
        ("DPU", "UNDOC_40C4", {}),
        *_dpu_rdma_specs(task, channels),
    ]
