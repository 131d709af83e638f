"""A conv with a Clip whose lower bound is not 0 in the vendor's rk3576 layout, both ways
(emulator/REGISTER_SEMANTICS.md 46.5, compiler/LOWERING.md 46.3).

Evidence [V ORC]: rknn-toolkit2 2.5.0 int8 builds of Conv 3x3 16 -> 16 pad 1 on 12 x 12 + Clip(-1, 2) for rk3576 and
rk3588 (and 10.3's Clip(-0.5, 0.7), the same words). With L, H the bounds after the BS stage (int32):

| vendor rk3576 | rk3588 twin |
|---|---|
| DPU_RDMA NRDMA_CFG 0x2, 0x5030 -> record [-L, -L, 0, 0] (rk3576_dpu's 64-byte record, ALU only) | BN_CFG 0x20090: ALU add -L, ReLU, ReLU-X |
| ACT_CFG 0x920, CLAMP2 / CLAMP3 [0, H - L] | BN_RELUX_CMP_VALUE H - L |
| 0x407C 0x000241C0, EW_OP_VALUE_0 L | EW_CFG 0x10020380: EW add of the register operand; EW_OP_VALUE_0-7 = L |

So y = min(relu(x - L), H - L) + L. npuemu's own RK3588 form of the same Clip is BN max(x, L) then ReLU-X H (BN_CFG
0xd0): the same integers for every int32 x whose x - L does not overflow. Its vendor form writes the vendor's
arrangement; the round trip compares against npuemu's values re-arranged as the twin's (``as_the_twin_writes_it``),
and the emulated outputs of both layouts are compared in tests.
"""

from __future__ import annotations

from collections.abc import Mapping

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_dpu import RECORD_BYTES, pack_record
from npuemu.isa.rknn.rk3576_layout import CLIP_ACT_CFG, CLIP_EW_WORD, INT8, INT32_MAX, Reader, VendorTask

Values = Mapping[tuple[str, str], int]

CLIP_RECORD_CFG = 0x2             # DPU_RDMA 0x5028: the record's ALU operand only [V ORC]
TWIN_BN_CFG = 0x20090             # ALU add (register operand), ReLU, ReLU-X, multiplier bypassed [V ORC twin]
TWIN_EW_CFG = 0x10020380          # EW add of EW_OP_VALUE_0 [V ORC twin]
NPUEMU_BN_CFG = 0xD0              # npuemu's Clip: BN ALU max(x, L), ReLU-X H (lower/lower_conv.py)
EW_CFG_BYPASS = 0x383


def _signed(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >> 31 else value


def npuemu_clip(values: Values) -> tuple[int, int] | None:
    """(L, H) of npuemu's int8 RK3588-position Clip (BN max then ReLU-X, EW bypassed); None otherwise."""
    if (values.get(("DPU", "BN_CFG")) != NPUEMU_BN_CFG or values.get(("DPU", "EW_CFG"), EW_CFG_BYPASS) != EW_CFG_BYPASS
            or values.get(("DPU", "BN_MUL_CFG"), 0) or values.get(("DPU", "DATA_FORMAT"), 0) & 0x7 != INT8):
        return None
    low, high = _signed(values.get(("DPU", "BN_ALU_CFG"), 0)), _signed(values.get(("DPU", "BN_RELUX_CMP_VALUE"), 0))
    return (low, high) if low < high and high - low <= INT32_MAX and -low <= INT32_MAX else None


def clip_record(bounds: tuple[int, int]) -> bytes:
    return pack_record(-bounds[0], None, 0, 0)


def vendor_clip_words(bounds: tuple[int, int]) -> dict[str, int]:
    """The vendor's DPU words of the Clip (by vendor register name) but the record's address."""
    low, high = bounds
    return {"ACT_CFG": CLIP_ACT_CFG, "CFG_407C": CLIP_EW_WORD, "EW_OP_VALUE_0": low & 0xFFFFFFFF,
            "CLAMP_MAX": high - low}


def as_the_twin_writes_it(values: Values, source: RegisterMap) -> Values:
    """npuemu's Clip re-arranged as the vendor's rk3588 twin writes it (the same integers: module doc), in the
    registers ``source`` has (rk3576.yaml has no EW_OP_VALUE_7)."""
    bounds = npuemu_clip(values)
    if bounds is None:
        return values
    low, high = bounds
    return {**values, ("DPU", "BN_CFG"): TWIN_BN_CFG, ("DPU", "BN_ALU_CFG"): -low & 0xFFFFFFFF,
            ("DPU", "BN_RELUX_CMP_VALUE"): high - low, ("DPU", "EW_CFG"): TWIN_EW_CFG,
            ("DPU", "EW_CVT_SCALE_VALUE"): 1, **{("DPU", f"EW_OP_VALUE_{i}"): low & 0xFFFFFFFF for i in range(8)
                                                 if source.block("DPU").has(f"EW_OP_VALUE_{i}")}}


def is_vendor_clip(task: VendorTask) -> bool:
    return task.values.get(("DPU", "CFG_407C")) == CLIP_EW_WORD and task.values.get(("DPU", "ACT_CFG")) == CLIP_ACT_CFG


def rk3588_clip_specs(task: VendorTask, read: Reader) -> tuple[int, list[tuple[str, str, dict[str, int]]]]:
    """(0, the twin's BN / EW specs) of a vendor Clip task; -L from its record at DPU_RDMA 0x5030."""
    raw = task.raw
    data = read(raw("DPU_RDMA", "ADDR_5030"), RECORD_BYTES)
    alu, again, rest = (int.from_bytes(data[at:at + 4], "little", signed=True) for at in (0, 16, 32))
    if (raw("DPU_RDMA", "NRDMA_CFG") != CLIP_RECORD_CFG or alu != again or rest or data[48:50] != bytes(2)
            or task.field("DPU", "DATA_FORMAT", "PROC_PRECISION") != INT8 or raw("DPU", "CFG_4080")
            or raw("DPU", "CFG_4084") != 1):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 Clip task with NRDMA_CFG "
                                      f"{raw('DPU_RDMA', 'NRDMA_CFG'):#x}, record [{alu}, {again}, {rest}]: only the int8 "
                                      f"form of emulator/REGISTER_SEMANTICS.md 46.5 is decoded")
    return 0, [
        ("DPU", "BN_CFG", {"raw": TWIN_BN_CFG}), ("DPU", "BN_ALU_CFG", {"raw": alu & 0xFFFFFFFF}),
        ("DPU", "BN_MUL_CFG", {}), ("DPU", "BN_RELUX_CMP_VALUE", {"raw": task.signed("DPU", "CLAMP2_MAX") & 0xFFFFFFFF}),
        ("DPU", "EW_CFG", {"raw": TWIN_EW_CFG}), ("DPU", "EW_CVT_OFFSET_VALUE", {}),
        ("DPU", "EW_CVT_SCALE_VALUE", {"EW_OP_CVT_SCALE": 1}), ("DPU", "EW_RELUX_CMP_VALUE", {}),
        *[("DPU", f"EW_OP_VALUE_{index}", {"raw": raw("DPU", "EW_OP_VALUE_0")}) for index in range(8)],
        ("DPU_RDMA", "BN_BASE_ADDR", {}),
    ]
