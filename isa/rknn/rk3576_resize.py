"""The vendor's rk3576 Resize (nearest): DPU_RDMA unpooling copies and the "clear" convs around them
(emulator/REGISTER_SEMANTICS.md 49).

Evidence [V ORC]: rknn-toolkit2 2.5.0 builds of ONNX Resize(nearest, asymmetric, floor) for rk3576 and for rk3588
side by side - int8 [1, 16, 12, 20] x2, [1, 48, 6, 10] x4, [1, 32, 3, 5] x8, fp16 [1, 16, 12, 20] x2. The rk3588
twin writes one DPU-only unpooling copy per 16-byte surface (npuemu's own form, compiler/lower/lower_resize.py).
The rk3576 program of the same layer is: two 1x1 "clear" convs (``clear_unpooling_*`` constants: a 1 x 1 x 16
int8 cube of ones times 16 kernels of ones, written to a constant of their own), then the copies as 30-32-word
delta tasks on top of the register group the clear conv left (REGISTER_SEMANTICS.md 1.1), later surfaces as
11-word deltas of the copy two before, then two more clear convs - so every register a delta task does not
write holds the clear conv's value. Read here as: the clear convs give both register groups a whole, known
state before the copies and restore it after them [I: their outputs are never read].

The copy, in effect (the delta on the clear conv's words; 89 words of the DPU-only frame, rk3576_dpu):
DPU 0x400C ENABLE 0, 0x4038 0x53, BS_MODE 2, 0x40C0 0x04440000, 0x4050 0x20000 + (f - 1) << 8 + SIZE_E_1 << 4 +
SIZE_E_0 (f = the vertical factor; twin SIZE_E = f - 1), BS_CHANNEL (C2 - 1) << 16 | (16 / (SIZE_E_0 + 1) - 1) << 8,
OUT_CVT_SCALE 0x10001 (twin 1), DPU_RDMA IN_PRECISION 4 with CHANNEL 3 (an atom as four 4-byte elements; the twin
int16, CHANNEL 7), SURFACE_JUMP = SURFACE_ADD - ((H + 1)(W + 1 + notch) - notch) (the conv rule SURF_ADD - W x H
with lines W + notch apart: x2 40, x4 120, x8 280 for the twins' 960), DST / DPU_RDMA strides in atoms from bit
0 as every rk3576 task. Everything else as the twin (stages bypassed, the EW word 0x010041c1, clamps open).
"""

from __future__ import annotations

from collections.abc import Mapping

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_dpu import BS_BYPASSED, DPU_ONLY_ENABLE, FP32TOFP16
from npuemu.isa.rknn.rk3576_layout import (
    C2, CLAMPS, CONV_ENABLE, EW_BYPASS, FP16, INT8, INT32_MAX, INT32_MIN, VendorTask, check_conv, field_reader,
)

Spec = tuple[str, str, dict[str, int]]
VendorWrite = tuple[str, str, int]
Values = Mapping[tuple[str, str], int]

VENDOR_ELEMENT, VENDOR_ELEMENT_BYTES = 4, 4      # DPU_RDMA IN_PRECISION of the vendor's copy: 4-byte elements [V]
RK3588_ELEMENT, RK3588_ELEMENT_BYTES = 1, 2      # its twin's (and npuemu's): int16 [V]
ATOM_BYTES = 16
EW_CFG_BYPASSED = 0x383                          # RK3588 EW_CFG bypassed [V twins]
OW_BYPASSED = 0x20000                            # vendor 0x4050 with the BS stage bypassed (rk3576_dpu) [V]
ACT_NONE = 0x903
#: the copy's words with no RK3588 counterpart [V: all four builds]
COPY_WORDS = {("DPU", "CFG_4038"): 0x53, ("DPU", "BS_MODE"): 2, ("DPU", "CFG_40C0"): 0x04440000}
#: words the copy inherits from the clear conv (the frame's other words), as every build holds them [V]
INHERITED = {("DPU", "OFFSET_PEND"): 0, ("DPU", "RSV_403C"): 0, ("DPU", "ACT_CFG"): ACT_NONE,
             ("DPU", "CFG_407C"): EW_BYPASS, ("DPU", "CFG_4080"): 0, ("DPU", "CFG_4084"): 1,
             ("DPU", "EW_OP_VALUE_0"): 0, ("DPU", "CFG_4094"): 0, ("DPU", "CFG_409C"): 0,
             ("DPU", "OUT_CVT_OFFSET"): 0, ("DPU", "CFG_40BC"): 0, ("DPU", "RSV_40C8"): 0, ("DPU", "RSV_40CC"): 0,
             ("DPU", "CFG_40D0"): 0x0040FFFF, ("DPU_RDMA", "BRDMA_CFG"): 0, ("DPU_RDMA", "BS_BASE_ADDR"): 0,
             ("DPU_RDMA", "BS_CFG_ADDR"): 0, ("DPU_RDMA", "NRDMA_CFG"): 0, ("DPU_RDMA", "BN_BASE_ADDR"): 0,
             ("DPU_RDMA", "ADDR_5030"): 0, ("DPU_RDMA", "ERDMA_CFG"): 1, ("DPU_RDMA", "EW_BASE_ADDR"): 0,
             ("DPU_RDMA", "EW_SURF_STRIDE"): 0, ("DPU_RDMA", "PAD_CFG"): 0, ("DPU_RDMA", "EW_SURF_NOTCH"): 0,
             ("DPU_RDMA", "LINE_NOTCH"): 0, ("DPU_RDMA", "RSV_507C"): 0}
LUT_NAMES = ("LUT_ACCESS_CFG", "LUT_ACCESS_DATA", "LUT_CFG", "LUT_INFO", "LUT_LE_START", "LUT_LE_END",
             "LUT_LO_START", "LUT_LO_END", "LUT_LE_SLOPE_SCALE", "RSV_4130", "LUTV_END0", "LUTV_END1", "LUTV_END2",
             "LUTV_END3", "RSV_4150", "RSV_4154", "RSV_4160", "LUTV_OFLOW_SCALE01", "LUTV_OFLOW_SCALE23",
             "LUTV_OFLOW_SHIFT", "LUTV_UFLOW_VALUE01", "LUTV_UFLOW_VALUE23", "LUTV_OFLOW_VALUE01", "LUTV_OFLOW_VALUE23")
#: the clear conv's words that differ from a plain int8 1x1 conv's [V: every rk3576 Resize build]; its input is
#: one pixel (DATA_IN_SIZE 0), its BS record ``clear_unpooling_output_BScfgTensor`` holds zeros where it is read
CLEAR_WORDS = {("DPU", "CFG_4038"): 0x20040, ("DPU", "BS_OW_CFG"): 0x80021011, ("DPU_RDMA", "BRDMA_CFG"): 0x14,
               ("DPU", "BS_MODE"): 0, ("CNA", "DATA_IN_SIZE"): 0}
PLAIN_INT8_CONV = {("DPU", "CFG_4038"): 0x120080, ("DPU", "BS_OW_CFG"): 0x80011011, ("DPU_RDMA", "BRDMA_CFG"): 0x110,
                   ("DPU", "BS_MODE"): 1}


# --- vendor -> RK3588 ------------------------------------------------------------------------------------------


def is_vendor_unpool(task: VendorTask) -> bool:
    """A DPU-only task whose DPU_RDMA unpools (SRC_DMA_CFG.UNPOOLING_EN, kept at its RK3588 position)."""
    return (task.enable == DPU_ONLY_ENABLE and ("DPU_RDMA", "SRC_DMA_CFG") in task.values
            and bool(task.field("DPU_RDMA", "SRC_DMA_CFG", "UNPOOLING_EN")))


def is_clear_conv(task: VendorTask) -> bool:
    """The vendor's 1x1 "clear" conv around its rk3576 unpooling copies (module docstring)."""
    return task.enable == CONV_ENABLE and all(task.values.get(key) == value for key, value in CLEAR_WORDS.items())


def ow_word(size_e: tuple[int, int, int], factor_h: int) -> int:
    """Vendor 0x4050 of a copy: [11:8] the last kernel row (each row is an output "surface", DST_SURF_STRIDE
    apart), [7:4] / [3:0] SIZE_E_1 / SIZE_E_0 [V: 0x20111 x2, 0x20333 x4, 0x20777 x8; twins SIZE_E f - 1]."""
    return OW_BYPASSED | (factor_h - 1) << 8 | size_e[1] << 4 | size_e[2]


def channel_mode(size_e_0: int) -> int:
    """BS_CHANNEL's low half: 16 / (SIZE_E_0 + 1) - 1 in bits 11:8 [V: copies 0x700 / 0x300 / 0x100; the same
    reading fits the DPU-only Add's 0xf00 (SIZE_E 0), the conv's 0x710 (1) and the depthwise 0x310 (3)]."""
    return (16 // (size_e_0 + 1) - 1) << 8


def surface_jump(surface_add: int, width: int, height: int, notch: int) -> int:
    """0x40B8: SURFACE_ADD less the atoms the cube's lines span, lines ``width + notch`` apart (``width`` /
    ``height`` as the registers hold them, minus 1) [V: x2 40, x4 120, x8 280; notch 0: the conv's rule]."""
    return surface_add - ((height + 1) * (width + 1 + notch) - notch)


def _refuse(task: VendorTask, what: str) -> UnsupportedProgramError:
    return UnsupportedProgramError(f"{task.where}: vendor rk3576 unpooling copy with {what}; not decoded "
                                   f"(emulator/REGISTER_SEMANTICS.md 49)")


def _check_unpool(task: VendorTask) -> tuple[int, int]:
    """(precision, the DPU's channels) of a copy whose words are all the decoded form's."""
    f, raw = task.field, task.raw
    precision = f("DPU", "DATA_FORMAT", "PROC_PRECISION")
    channels = f("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    expected = {**COPY_WORDS, **{key: value for key, value in INHERITED.items()
                                    if key[0] == "DPU" and not key[1].startswith("RSV_")}}
    odd = [f"{block}.{name} {raw(block, name):#x}" for (block, name), value in expected.items()
           if raw(block, name) != value]
    odd += [f"DPU.{name}_MIN/MAX" for name in CLAMPS
            if (task.signed("DPU", f"{name}_MIN"), raw("DPU", f"{name}_MAX")) != (INT32_MIN, INT32_MAX)]
    odd += [f"DPU.{name}" for name in LUT_NAMES if task.values.get(("DPU", name), 0)]
    size_e = raw("DPU", "BS_OW_CFG") & 0xF
    factor_h = f("DPU_RDMA", "SRC_DMA_CFG", "KERNEL_HEIGHT") + 1
    if raw("DPU", "BS_OW_CFG") != ow_word((size_e,) * 3, factor_h):
        odd.append(f"DPU.BS_OW_CFG {raw('DPU', 'BS_OW_CFG'):#x}")
    if raw("DPU", "BS_CHANNEL") != (channels - 1) << 16 | channel_mode(size_e):
        odd.append(f"DPU.BS_CHANNEL {raw('DPU', 'BS_CHANNEL'):#x}")
    if raw("DPU", "OUT_CVT_SCALE") & ~FP32TOFP16 != 1 or raw("DPU", "OUT_CVT_SHIFT"):
        odd.append("OUT_CVT other than the identity")
    rdma = (f("DPU_RDMA", "FEATURE_MODE_CFG", "IN_PRECISION"), f("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") + 1)
    if (precision not in (INT8, FP16) or rdma != (VENDOR_ELEMENT, ATOM_BYTES // VENDOR_ELEMENT_BYTES)
            or channels != C2[precision] or f("DPU", "FEATURE_MODE_CFG", "ENABLE")
            or f("DPU", "FEATURE_MODE_CFG", "CONV_MODE") or f("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE")
            or f("DPU_RDMA", "FEATURE_MODE_CFG", "COMB_USE") or f("DPU_RDMA", "FEATURE_MODE_CFG", "CONV_MODE")):
        odd.append(f"precision {precision}, {channels} channels, DPU_RDMA FEATURE_MODE_CFG "
                   f"{raw('DPU_RDMA', 'FEATURE_MODE_CFG'):#x} / CHANNEL {rdma[1] - 1}")
    odd += [f"DPU_RDMA.{name} {raw(block, name):#x}" for (block, name), value in INHERITED.items()
            if block == "DPU_RDMA" and not name.startswith("RSV_") and name not in UNREAD_ADDRESSES and raw(block, name) != value]
    if odd:
        raise _refuse(task, ", ".join(odd))
    return precision, channels


UNREAD_ADDRESSES = ("BS_BASE_ADDR", "BN_BASE_ADDR", "EW_BASE_ADDR", "BS_CFG_ADDR", "ADDR_5030")   # unread: no operand


def unpool_specs(task: VendorTask) -> list[Spec]:
    """The RK3588 writes of the twin's copy (lower_resize's 69-write form) for a vendor copy."""
    precision, channels = _check_unpool(task)
    f = task.field
    width, height = f("DPU", "DATA_CUBE_WIDTH", "WIDTH"), f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    notch = task.raw("DPU", "DATA_CUBE_NOTCH")
    size_e = task.raw("DPU", "BS_OW_CFG") & 0xF
    surface_add = task.signed("DPU", "SURFACE_JUMP") + (height + 1) * (width + 1 + (notch & 0xFFFF)) - (notch & 0xFFFF)
    rdma_channels = (f("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") + 1) * VENDOR_ELEMENT_BYTES // RK3588_ELEMENT_BYTES
    return [
        ("DPU", "FEATURE_MODE_CFG", {"BURST_LEN": 15, "OUTPUT_MODE": f("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE"),
                                     "FLYING_MODE": f("DPU", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU", "DATA_FORMAT", {"OUT_PRECISION": f("DPU", "DATA_FORMAT", "OUT_PRECISION"),
                                "IN_PRECISION": RK3588_ELEMENT, "PROC_PRECISION": precision}),
        ("DPU", "OFFSET_PEND", {}), ("DPU", "DST_BASE_ADDR", {"raw": task.raw("DPU", "DST_BASE_ADDR")}),
        ("DPU", "DST_SURF_STRIDE", {"DST_SURF_STRIDE": f("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")}),
        ("DPU", "DATA_CUBE_WIDTH", {"WIDTH": width}), ("DPU", "DATA_CUBE_HEIGHT", {"HEIGHT": height}),
        ("DPU", "DATA_CUBE_NOTCH_ADDR", {"raw": notch}),
        ("DPU", "DATA_CUBE_CHANNEL", {"ORIG_CHANNEL": channels - 1, "CHANNEL": channels - 1}),
        ("DPU", "BS_CFG", {"raw": BS_BYPASSED}), ("DPU", "BS_ALU_CFG", {}), ("DPU", "BS_MUL_CFG", {}),
        ("DPU", "BS_RELUX_CMP_VALUE", {}),
        ("DPU", "BS_OW_CFG", {"SIZE_E_2": size_e, "SIZE_E_1": size_e, "SIZE_E_0": size_e, "OD_BYPASS": 1}),
        ("DPU", "BS_OW_OP", {}), ("DPU", "WDMA_SIZE_0", {"CHANNEL_WDMA": channels - 1}),
        ("DPU", "WDMA_SIZE_1", {"HEIGHT_WDMA": f("DPU", "WDMA_SIZE", "HEIGHT_WDMA"),
                                "WIDTH_WDMA": f("DPU", "WDMA_SIZE", "WIDTH_WDMA")}),
        ("DPU", "BN_CFG", {"raw": BS_BYPASSED}), ("DPU", "BN_ALU_CFG", {}), ("DPU", "BN_MUL_CFG", {}),
        ("DPU", "BN_RELUX_CMP_VALUE", {}), ("DPU", "EW_CFG", {"raw": EW_CFG_BYPASSED}),
        ("DPU", "EW_CVT_OFFSET_VALUE", {}), ("DPU", "EW_CVT_SCALE_VALUE", {"raw": 1}), ("DPU", "EW_RELUX_CMP_VALUE", {}),
        ("DPU", "OUT_CVT_OFFSET", {}), ("DPU", "OUT_CVT_SCALE", {"raw": 1}), ("DPU", "OUT_CVT_SHIFT", {}),
        *[("DPU", f"EW_OP_VALUE_{index}", {}) for index in range(8)],
        ("DPU", "SURFACE_ADD", {"SURF_ADD": surface_add}), ("DPU", "UNDOC_40C4", {}),
        ("DPU_RDMA", "DATA_CUBE_CHANNEL", {"CHANNEL": rdma_channels - 1}), ("DPU_RDMA", "BRDMA_CFG", {}),
        ("DPU_RDMA", "NRDMA_CFG", {}), ("DPU_RDMA", "ERDMA_CFG", {"ERDMA_DISABLE": 1}),
        ("DPU_RDMA", "FEATURE_MODE_CFG", {"IN_PRECISION": RK3588_ELEMENT, "BURST_LEN": 15, "PROC_PRECISION": precision,
                                          "FLYING_MODE": f("DPU_RDMA", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU_RDMA", "WEIGHT", {"E_WEIGHT": 1, "N_WEIGHT": 1, "B_WEIGHT": 1, "M_WEIGHT": 1}),
        ("DPU_RDMA", "EW_SURF_STRIDE", {}),
        ("DPU_RDMA", "SURF_NOTCH", {"SURF_NOTCH_ADDR": f("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR")}),
        ("DPU_RDMA", "EW_SURF_NOTCH", {}),
    ]


def clear_conv_view(task: VendorTask) -> VendorTask:
    """The clear conv read as a plain int8 1x1 conv (its BS record's operands dropped afterwards by
    :func:`clear_conv_specs`)."""
    view = VendorTask(task.regmap, task.where, {**task.values, **PLAIN_INT8_CONV}, task.kept, task.enable)
    check_conv(view)
    return view


def clear_conv_specs(specs: list[Spec]) -> list[Spec]:
    """The clear conv's RK3588 form: the plain conv's with the BS stage bypassed and no BS record read - its
    record holds zeros where the vendor reads it [V], and its output is a constant nothing reads [I]."""
    bypass = {("DPU", "BS_CFG"): {"raw": BS_BYPASSED}, ("DPU", "BS_ALU_CFG"): {}, ("DPU", "BS_MUL_CFG"): {},
              ("DPU", "BS_OW_CFG"): {"SIZE_E_2": 1, "SIZE_E_1": 1, "SIZE_E_0": 1, "OD_BYPASS": 1},
              ("DPU_RDMA", "BRDMA_CFG"): {}, ("DPU", "DATA_FORMAT"): None}
    out = []
    for block, name, fields in specs:
        if (block, name) == ("DPU", "DATA_FORMAT"):
            fields = {**fields, "BS_MUL_SHIFT_VALUE_NEG": 0}
        elif (block, name) in bypass:
            fields = bypass[(block, name)]
        out.append((block, name, fields))
    return out


# --- RK3588 -> vendor (npuemu's own builds) --------------------------------------------------------------------


def is_unpool_values(values: Values, source: RegisterMap) -> bool:
    """npuemu's RK3588-position task is an unpooling copy (lower_resize)."""
    return bool(source.register("DPU_RDMA", "SRC_DMA_CFG").field("UNPOOLING_EN").extract(
        values.get(("DPU_RDMA", "SRC_DMA_CFG"), 0)))


def unpool_vendor_writes(values: Values, source: RegisterMap, where: str) -> list[VendorWrite]:
    """The vendor's copy (module docstring) for npuemu's RK3588-position copy, as the whole 89-word DPU-only frame
    (the vendor's 30-word delta on its clear conv, in effect); refuses what lower_resize does not write."""
    field = field_reader(values, source)
    precision = field("DPU", "DATA_FORMAT", "PROC_PRECISION")
    channels = field("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    sizes = tuple(field("DPU", "BS_OW_CFG", name) for name in ("SIZE_E_2", "SIZE_E_1", "SIZE_E_0"))
    if (precision not in (INT8, FP16) or channels != C2[precision]
            or field("DPU", "DATA_CUBE_CHANNEL", "ORIG_CHANNEL") + 1 != channels
            or field("DPU", "DATA_FORMAT", "IN_PRECISION") != RK3588_ELEMENT
            or field("DPU_RDMA", "FEATURE_MODE_CFG", "IN_PRECISION") != RK3588_ELEMENT
            or (field("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") + 1) * RK3588_ELEMENT_BYTES != ATOM_BYTES
            or any(values.get(("DPU", name), 0) != BS_BYPASSED for name in ("BS_CFG", "BN_CFG"))
            or values.get(("DPU", "EW_CFG"), 0) != EW_CFG_BYPASSED or len(set(sizes)) != 1
            or values.get(("DPU", "OUT_CVT_SCALE"), 0) != 1 or values.get(("DPU", "OUT_CVT_SHIFT"), 0)
            or values.get(("DPU", "OUT_CVT_OFFSET"), 0) or not field("DPU_RDMA", "ERDMA_CFG", "ERDMA_DISABLE")
            or values.get(("DPU_RDMA", "BRDMA_CFG"), 0) or values.get(("DPU_RDMA", "NRDMA_CFG"), 0)
            or values.get(("DPU", "LUT_CFG"), 0) or field("DPU_RDMA", "FEATURE_MODE_CFG", "MRDMA_DISABLE")):
        raise UnsupportedProgramError(f"{where}: an unpooling copy other than lower_resize's (a 16-byte atom of "
                                      f"int8 / fp16, every stage bypassed) has no known vendor rk3576 form "
                                      f"(emulator/REGISTER_SEMANTICS.md 49)")
    width, height = field("DPU", "DATA_CUBE_WIDTH", "WIDTH"), field("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    notch = values.get(("DPU", "DATA_CUBE_NOTCH_ADDR"), 0)
    factor_h = field("DPU_RDMA", "SRC_DMA_CFG", "KERNEL_HEIGHT") + 1
    frame = {
        ("DPU", "FEATURE_MODE_CFG"): field("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE") << 1
        | field("DPU", "FEATURE_MODE_CFG", "FLYING_MODE"),
        ("DPU", "DATA_FORMAT"): field("DPU", "DATA_FORMAT", "OUT_PRECISION") << 29 | precision,
        ("DPU", "DST_BASE_ADDR"): values.get(("DPU", "DST_BASE_ADDR"), 0),
        ("DPU", "DST_SURF_STRIDE"): field("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE"),
        ("DPU", "DATA_CUBE_WIDTH"): width, ("DPU", "DATA_CUBE_HEIGHT"): height, ("DPU", "DATA_CUBE_NOTCH"): notch,
        ("DPU", "DATA_CUBE_CHANNEL"): channels - 1,
        ("DPU", "BS_CHANNEL"): (channels - 1) << 16 | channel_mode(sizes[2]),
        ("DPU", "WDMA_SIZE"): field("DPU", "WDMA_SIZE_1", "HEIGHT_WDMA") << 16 | field("DPU", "WDMA_SIZE_1", "WIDTH_WDMA"),
        ("DPU", "BS_OW_CFG"): ow_word(sizes, factor_h),
        ("DPU", "OUT_CVT_SCALE"): 1 | FP32TOFP16, ("DPU", "OUT_CVT_SHIFT"): 0,
        ("DPU", "SURFACE_JUMP"): surface_jump(field("DPU", "SURFACE_ADD", "SURF_ADD"), width, height,
                                              notch & 0xFFFF) & 0xFFFFFFFF,   # signed [V: transposes' 0xffffff0f]
        ("DPU_RDMA", "DATA_CUBE_CHANNEL"): ATOM_BYTES // VENDOR_ELEMENT_BYTES - 1,
        ("DPU_RDMA", "FEATURE_MODE_CFG"): VENDOR_ELEMENT << 15 | precision << 5 | 1 << 3
        | field("DPU_RDMA", "FEATURE_MODE_CFG", "FLYING_MODE"),
        ("DPU_RDMA", "SURF_NOTCH"): field("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR"),
        **COPY_WORDS,
    }
    return frame_writes(values, frame, COPY_KEPT)


#: the frame's words a copy writes as npuemu's RK3588-position task holds them
COPY_KEPT = frozenset({("DPU", "S_POINTER"), ("DPU_RDMA", "S_POINTER"), ("DPU_RDMA", "DATA_CUBE_WIDTH"),
                       ("DPU_RDMA", "DATA_CUBE_HEIGHT"), ("DPU_RDMA", "SRC_BASE_ADDR"), ("DPU_RDMA", "SRC_DMA_CFG")})


def frame_writes(values: Values, frame: Mapping[tuple[str, str], int],
                 kept: frozenset[tuple[str, str]]) -> list[VendorWrite]:
    """The DPU-only FRAME's words in order: ``kept`` ones as ``values`` (npuemu's task) holds them, then ``frame``'s,
    the rest as the clear conv leaves them (clamps open, else :data:`INHERITED`)."""
    return [(block, name, values.get((block, name), 0) if (block, name) in kept else
             frame[(block, name)] if (block, name) in frame else _frame_default(block, name))
            for block, name in FRAME]


def _frame_default(block: str, name: str) -> int:
    if name.endswith("_MIN"):
        return INT32_MIN & 0xFFFFFFFF
    if name.endswith("_MAX"):
        return INT32_MAX
    return INHERITED.get((block, name), 0)


#: the DPU-only frame: the conv task's DPU and DPU_RDMA words in the vendor's order [V: every DPU-only task]
FRAME = (
    [("DPU", "S_POINTER"), ("DPU_RDMA", "S_POINTER")]
    + [("DPU", name) for name in (
        "FEATURE_MODE_CFG", "DATA_FORMAT", "OFFSET_PEND", "DST_BASE_ADDR", "DST_SURF_STRIDE", "DATA_CUBE_WIDTH",
        "DATA_CUBE_HEIGHT", "DATA_CUBE_NOTCH", "DATA_CUBE_CHANNEL", "BS_CHANNEL", "WDMA_SIZE", "CFG_4038", "RSV_403C",
        "BS_MODE", "BS_CLAMP0_MIN", "BS_CLAMP0_MAX", "BS_OW_CFG", "CLAMP1_MIN", "CLAMP1_MAX", "ACT_CFG", "CLAMP2_MIN",
        "CLAMP2_MAX", "CLAMP3_MIN", "CLAMP3_MAX", "CFG_407C", "CFG_4080", "CFG_4084", "CLAMP4_MIN", "CLAMP4_MAX",
        "EW_OP_VALUE_0", "CFG_4094", "CFG_409C", "CLAMP5_MIN", "CLAMP5_MAX", "OUT_CVT_OFFSET", "OUT_CVT_SCALE",
        "OUT_CVT_SHIFT", "SURFACE_JUMP", "CFG_40BC", "CFG_40C0", "RSV_40C8", "RSV_40CC", "CFG_40D0", *LUT_NAMES)]
    + [("DPU_RDMA", name) for name in (
        "DATA_CUBE_WIDTH", "DATA_CUBE_HEIGHT", "DATA_CUBE_CHANNEL", "SRC_BASE_ADDR", "BRDMA_CFG", "BS_BASE_ADDR",
        "BS_CFG_ADDR", "NRDMA_CFG", "BN_BASE_ADDR", "ADDR_5030", "ERDMA_CFG", "EW_BASE_ADDR", "EW_SURF_STRIDE",
        "FEATURE_MODE_CFG", "SRC_DMA_CFG", "SURF_NOTCH", "PAD_CFG", "EW_SURF_NOTCH", "LINE_NOTCH", "RSV_507C")]
)
