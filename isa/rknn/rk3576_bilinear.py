"""The vendor's rk3576 bilinear Resize: plain edge copies with notches and interleaved depthwise phase convs
(emulator/REGISTER_SEMANTICS.md 49.1, 56.2).

Evidence [V ORC]: rknn-toolkit2 2.5.0 builds of ONNX Resize(linear, half_pixel) x2 for rk3576 and rk3588 side by side
- int8 [1, 32, 12, 20], [1, 16, 6, 10], [1, 16, 8, 8], fp16 [1, 32, 12, 20]. Both targets write the same program
(3.3.1): five DPU-only edge copies (the corner block, the top and bottom rows, the left and right columns of the
padded input) and four 2x2 depthwise phase convs writing interleaved. Against the twins:

- **The line notch moved**: DPU_RDMA 0x5078 holds RK3588's SRC_DMA_CFG.LINE_NOTCH_ADDR (0x15 / 0xb / 0x9 where the
  twins write 21 / 11 / 9 in bits 31:19); every other task writes 0 there (``LINE_NOTCH`` in rk3576_vendor.yaml).
- **DPU 0x401C holds NOTCH_ADDR_0 alone** (2, 0x15, 1 ...); the twins write it in both halves (0x00020002).
- **0x40B8 = SURFACE_ADD - ((h + 1)(w + 1 + notch) - notch)** with w / h the WDMA_SIZE's WIDTH / HEIGHT (not the
  DPU cube's: a 1-row edge copy's cube is the output's, its WDMA one row; 44 tasks of the four builds) - the
  unpooling copy's rule (rk3576_resize.surface_jump) on the written cube.
- **The phase conv** (an int8 / fp16 depthwise 2x2 conv, rk3576_dw8 / rk3576_forms) writes WDMA_SIZE as the twin's
  WDMA_SIZE_1 (HEIGHT_WDMA W - 1, WIDTH 0) and BS_CHANNEL [31:16] = H x the real channels - 1, [15:0] 0x300 (a
  depthwise conv's 0x310 without bit 4); the twin's CHANNEL_WDMA is H x its padded channels - 1 (52).
- The copies are Concat's plain copy frame (rk3576_concat; fp16 too: DPU_RDMA 0x5044 0x10049, twin 0x17849 with
  MRDMA_FP16TOFP32_EN, OUT_CVT_SCALE 0x10001 kept).
"""

from __future__ import annotations

from collections.abc import Callable

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_dpu import BS_BYPASSED, DPU_ONLY_ENABLE, FP32TOFP16
from npuemu.isa.rknn.rk3576_forms import Cbuf, rk3588_specs
from npuemu.isa.rknn.rk3576_layout import (
    ALU, C2, CLAMPS, CONV_ENABLE, EW_BYPASS, FP16, INT8, INT32_MAX, INT32_MIN, VENDOR_DEPTHWISE, VENDOR_DEPTHWISE_SIZES,
    Reader, VendorTask, bs_ow_word, bs_shift, check_conv, round_up,
)
from npuemu.isa.rknn.rk3576_resize import EW_CFG_BYPASSED, INHERITED, LUT_NAMES, UNREAD_ADDRESSES

Spec = tuple[str, str, dict[str, int]]
Write = tuple[str, str, int]

LINE_NOTCH = ("DPU_RDMA", "LINE_NOTCH")
WEIGHT_CPEND = ("CNA", "WEIGHT_CPEND")
PHASE_OW_WORD = 0x23333                    # vendor 0x4050 of every phase conv, int8 and fp16 [V: four builds]
LINE_NOTCH_BITS = 13                       # RK3588 SRC_DMA_CFG.LINE_NOTCH_ADDR [31:19]
LINE_NOTCH_SHIFT = 19
NOTCH_BITS = 13                            # RK3588 DATA_CUBE_NOTCH_ADDR halves [28:16], [12:0]
#: the plain copy's frame words [V: every edge copy of the four builds; Concat's plain copy, 49.2]
COPY_WORDS = {("DPU", "CFG_4038"): 0x53, ("DPU", "BS_MODE"): 2, ("DPU", "BS_OW_CFG"): 0x20000,
              ("DPU", "CFG_40C0"): 0x04440000, ("DPU_RDMA", "BRDMA_CFG"): 0, ("DPU_RDMA", "ERDMA_CFG"): 1}
#: DPU_RDMA 0x5044 of the copy by precision (bit 0 FLYING_MODE, bit 3 with the MRDMA reading) [V]
COPY_RDMA_MODE = {INT8: 0x9, FP16: 0x10049}
COPY_CHANNEL_MODE = 0xF00                  # BS_CHANNEL's low half (SIZE_E 0) [V]
PHASE_CHANNEL_MODE = 0x300                 # ... of the phase conv [V: all four builds]
DEPTHWISE_CHANNEL_MODE = 0x310             # ... of a depthwise conv writing plainly (rk3576_layout)


def _notch(task: VendorTask) -> int:
    return task.values.get(("DPU", "DATA_CUBE_NOTCH"), 0)


def _wdma(task: VendorTask) -> tuple[int, int]:
    """(WIDTH_WDMA, HEIGHT_WDMA) of the vendor's WDMA_SIZE word (minus 1 each)."""
    return task.field("DPU", "WDMA_SIZE", "WIDTH_WDMA"), task.field("DPU", "WDMA_SIZE", "HEIGHT_WDMA")


def surface_add(task: VendorTask) -> int:
    """RK3588's SURF_ADD from the vendor's 0x40B8 (module docstring: lines of the WDMA's width + notch)."""
    width, height = _wdma(task)
    notch = _notch(task) & 0xFFFF
    return task.signed("DPU", "SURFACE_JUMP") + (height + 1) * (width + 1 + notch) - notch


# --- the edge copies ------------------------------------------------------------------------------------------


def is_edge_copy(task: VendorTask) -> bool:
    """A plain DPU-only copy (the EW stage bypassed, the ERDMA off, no record, no unpooling) that writes through a
    notch, reads with a line notch, writes fewer lines than its cube or is fp16: a bilinear Resize's edge copy."""
    values = task.values
    if not (task.enable == DPU_ONLY_ENABLE and values.get(("DPU", "CFG_407C")) == EW_BYPASS
            and values.get(("DPU_RDMA", "ERDMA_CFG"), 0) & 1 and not values.get(("DPU_RDMA", "BRDMA_CFG"), 0)
            and not values.get(("DPU_RDMA", "SRC_DMA_CFG"), 0) and not values.get(("DPU", "LUT_CFG"), 0)):
        return False
    cube = (task.field("DPU", "DATA_CUBE_WIDTH", "WIDTH"), task.field("DPU", "DATA_CUBE_HEIGHT", "HEIGHT"))
    return bool(_notch(task) or values.get(LINE_NOTCH, 0) or _wdma(task) != cube
                or task.field("DPU", "DATA_FORMAT", "PROC_PRECISION") == FP16)


def _check_edge_copy(task: VendorTask) -> tuple[int, int]:
    """(precision, channels) of an edge copy whose words are all the decoded form's; refuses the rest by name."""
    f, raw = task.field, task.raw
    precision = f("DPU", "DATA_FORMAT", "PROC_PRECISION")
    channels = f("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    expected = {**{key: value for key, value in INHERITED.items()
                   if not key[1].startswith("RSV_") and key[1] not in UNREAD_ADDRESSES and key != LINE_NOTCH},
                **COPY_WORDS}
    odd = [f"{block}.{name} {raw(block, name):#x}" for (block, name), value in expected.items()
           if raw(block, name) != value]
    odd += [f"DPU.{name}_MIN/MAX" for name in CLAMPS
            if (task.signed("DPU", f"{name}_MIN"), raw("DPU", f"{name}_MAX")) != (INT32_MIN, INT32_MAX)]
    odd += [f"DPU.{name}" for name in LUT_NAMES if task.values.get(("DPU", name), 0)]
    if raw("DPU", "BS_CHANNEL") != (channels - 1) << 16 | COPY_CHANNEL_MODE:
        odd.append(f"DPU.BS_CHANNEL {raw('DPU', 'BS_CHANNEL'):#x}")
    if _notch(task) >> NOTCH_BITS or task.values.get(LINE_NOTCH, 0) >> LINE_NOTCH_BITS:
        odd.append(f"notches {_notch(task):#x} / {task.values.get(LINE_NOTCH, 0):#x}")
    if (precision not in COPY_RDMA_MODE or raw("DPU_RDMA", "FEATURE_MODE_CFG") != COPY_RDMA_MODE[precision]
            or f("DPU", "DATA_FORMAT", "OUT_PRECISION") != precision or f("DPU", "FEATURE_MODE_CFG", "ENABLE")
            or f("DPU", "FEATURE_MODE_CFG", "CONV_MODE")
            or f("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") + 1 != channels):
        odd.append(f"precision {precision}, DPU_RDMA FEATURE_MODE_CFG {raw('DPU_RDMA', 'FEATURE_MODE_CFG'):#x}")
    if raw("DPU", "OUT_CVT_SCALE") != 1 | FP32TOFP16 or raw("DPU", "OUT_CVT_SHIFT") or raw("DPU", "OUT_CVT_OFFSET"):
        odd.append("OUT_CVT other than the identity")
    if odd:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU-only copy with a notch with {', '.join(odd)}; "
                                      f"only the bilinear Resize's plain int8 / fp16 edge copies are decoded "
                                      f"(emulator/REGISTER_SEMANTICS.md 56.2)")
    return precision, channels


def edge_copy_specs(task: VendorTask) -> list[Spec]:
    """The RK3588 writes of the twin's edge copy (its 69-write DPU-only task) for a vendor edge copy."""
    precision, real = _check_edge_copy(task)
    f = task.field
    channels = round_up(real, C2[precision])
    notch = _notch(task)
    source = task.raw("DPU_RDMA", "SRC_DMA_CFG") | task.values.get(LINE_NOTCH, 0) << LINE_NOTCH_SHIFT
    return [
        ("DPU", "FEATURE_MODE_CFG", {"BURST_LEN": 15, "OUTPUT_MODE": f("DPU", "FEATURE_MODE_CFG", "OUTPUT_MODE"),
                                     "FLYING_MODE": f("DPU", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU", "DATA_FORMAT", {"OUT_PRECISION": precision, "IN_PRECISION": precision, "PROC_PRECISION": precision}),
        ("DPU", "OFFSET_PEND", {}), ("DPU", "DST_BASE_ADDR", {"raw": task.raw("DPU", "DST_BASE_ADDR")}),
        ("DPU", "DST_SURF_STRIDE", {"DST_SURF_STRIDE": f("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")}),
        ("DPU", "DATA_CUBE_WIDTH", {"WIDTH": f("DPU", "DATA_CUBE_WIDTH", "WIDTH")}),
        ("DPU", "DATA_CUBE_HEIGHT", {"HEIGHT": f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")}),
        ("DPU", "DATA_CUBE_NOTCH_ADDR", {"raw": notch << 16 | notch}),
        ("DPU", "DATA_CUBE_CHANNEL", {"ORIG_CHANNEL": real - 1, "CHANNEL": channels - 1}),
        ("DPU", "BS_CFG", {"raw": BS_BYPASSED}), ("DPU", "BS_ALU_CFG", {}), ("DPU", "BS_MUL_CFG", {}),
        ("DPU", "BS_RELUX_CMP_VALUE", {}), ("DPU", "BS_OW_CFG", {"OD_BYPASS": 1}), ("DPU", "BS_OW_OP", {}),
        ("DPU", "WDMA_SIZE_0", {"CHANNEL_WDMA": channels - 1}),
        ("DPU", "WDMA_SIZE_1", {"HEIGHT_WDMA": _wdma(task)[1], "WIDTH_WDMA": _wdma(task)[0]}),
        ("DPU", "BN_CFG", {"raw": BS_BYPASSED}), ("DPU", "BN_ALU_CFG", {}), ("DPU", "BN_MUL_CFG", {}),
        ("DPU", "BN_RELUX_CMP_VALUE", {}), ("DPU", "EW_CFG", {"raw": EW_CFG_BYPASSED}),
        ("DPU", "EW_CVT_OFFSET_VALUE", {}), ("DPU", "EW_CVT_SCALE_VALUE", {"raw": 1}),
        ("DPU", "EW_RELUX_CMP_VALUE", {}), *[("DPU", f"EW_OP_VALUE_{index}", {}) for index in range(8)],
        ("DPU", "OUT_CVT_OFFSET", {}),
        # FP32TOFP16_EN as the twins: set in the fp16 copy, clear in the int8 one [V]
        ("DPU", "OUT_CVT_SCALE", {"raw": 1 | (FP32TOFP16 if precision == FP16 else 0)}),
        ("DPU", "OUT_CVT_SHIFT", {}),
        ("DPU", "SURFACE_ADD", {"SURF_ADD": surface_add(task)}), ("DPU", "UNDOC_40C4", {}),
        ("DPU_RDMA", "DATA_CUBE_CHANNEL", {"CHANNEL": channels - 1}), ("DPU_RDMA", "BRDMA_CFG", {}),
        ("DPU_RDMA", "NRDMA_CFG", {}), ("DPU_RDMA", "ERDMA_CFG", {"ERDMA_DISABLE": 1}),
        ("DPU_RDMA", "FEATURE_MODE_CFG", {"IN_PRECISION": precision, "BURST_LEN": 15, "PROC_PRECISION": precision,
                                          "MRDMA_FP16TOFP32_EN": int(precision == FP16),
                                          "FLYING_MODE": f("DPU_RDMA", "FEATURE_MODE_CFG", "FLYING_MODE")}),
        ("DPU_RDMA", "WEIGHT", {"E_WEIGHT": 1, "N_WEIGHT": 1, "B_WEIGHT": 1, "M_WEIGHT": 1}),
        ("DPU_RDMA", "EW_SURF_STRIDE", {}),
        ("DPU_RDMA", "SURF_NOTCH", {"SURF_NOTCH_ADDR": f("DPU_RDMA", "SURF_NOTCH", "SURF_NOTCH_ADDR")}),
        ("DPU_RDMA", "EW_SURF_NOTCH", {}),
        ("DPU_RDMA", "SRC_DMA_CFG", {"raw": source}),   # kept, with the line notch back at bits 31:19
    ]


def check_notch_words(task: VendorTask) -> None:
    """Refuse a line notch (DPU_RDMA 0x5078) outside an edge copy and a constant CPEND (CNA 0x1074) outside an int8
    phase conv: every other decoded task writes 0 to both."""
    if task.values.get(LINE_NOTCH, 0) and not is_edge_copy(task):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU_RDMA 0x5078 (the line notch) = "
                                      f"{task.values[LINE_NOTCH]:#x} in a task other than a plain DPU-only copy; not "
                                      f"decoded (emulator/REGISTER_SEMANTICS.md 56.2)")
    if task.values.get(WEIGHT_CPEND, 0) and not is_cpend_depthwise(task):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 CNA 0x1074 (a constant CPEND) = "
                                      f"{task.values[WEIGHT_CPEND]:#x} in a task other than an int8 depthwise conv "
                                      f"writing interleaved; not decoded (emulator/REGISTER_SEMANTICS.md 56.2)")


# --- the phase convs --------------------------------------------------------------------------------------------


def is_phase_conv(task: VendorTask) -> bool:
    """A depthwise conv task writing interleaved: a DPU notch, one WDMA column (WIDTH 0) and BS_CHANNEL's 0x300."""
    values = task.values
    return (task.enable == CONV_ENABLE and task.field("CNA", "CONV_CON1", "CONV_MODE") == VENDOR_DEPTHWISE
            and bool(values.get(("DPU", "DATA_CUBE_NOTCH"), 0))
            and values.get(("DPU", "BS_CHANNEL"), 0) & 0xFFFF == PHASE_CHANNEL_MODE)


def phase_view(task: VendorTask) -> tuple[VendorTask, int]:
    """(the phase conv as a depthwise conv writing its cube plainly, its interleaved lines H); refuses what the
    interleaved write does not give (the twin's words, module docstring)."""
    f = task.field
    real = f("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    lines, rest = divmod((task.raw("DPU", "BS_CHANNEL") >> 16) + 1, real)
    width, height = f("DPU", "DATA_CUBE_WIDTH", "WIDTH"), f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
    if rest or lines != height + 1 or _wdma(task) != (0, width) or _notch(task) >> NOTCH_BITS:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 depthwise conv writing through a notch with "
                                      f"BS_CHANNEL {task.raw('DPU', 'BS_CHANNEL'):#x}, WDMA_SIZE "
                                      f"{task.raw('DPU', 'WDMA_SIZE'):#x} on a {width + 1} x {height + 1} x {real} "
                                      f"cube; "
                                      f"only the interleaved write of W lines of H x C is decoded "
                                      f"(emulator/REGISTER_SEMANTICS.md 56.2)")
    plain = {("DPU", "DATA_CUBE_NOTCH"): 0, ("DPU", "WDMA_SIZE"): height << 16 | width,
             ("DPU", "BS_CHANNEL"): (real - 1) << 16 | DEPTHWISE_CHANNEL_MODE,
             ("DPU", "SURFACE_JUMP"): 0}   # SURF_ADD is the interleaved write's, written by phase_writes
    return VendorTask(task.regmap, task.where, {**task.values, **plain}, task.kept, task.enable), lines


def phase_writes(task: VendorTask, out: RegisterMap, translate: Callable[[VendorTask], list[Write]]) -> list[Write]:
    """The twin's phase conv: ``translate`` of the plain view, then the interleaved write's DPU words - NOTCH_ADDR in
    both halves, WDMA_SIZE_1 as the vendor's, CHANNEL_WDMA = H x the padded channels - 1, SURF_ADD (52's split)."""
    view, lines = phase_view(task)
    return interleaved_writes(task, out, translate(view), lines)


def interleaved_writes(task: VendorTask, out: RegisterMap, writes: list[Write], lines: int) -> list[Write]:
    """``writes`` (the RK3588 words of ``task``'s plain view) with the interleaved write's words of ``task`` writing
    ``lines`` x C a WDMA line (phase_writes; rk3576_deconv's direct phase convs too)."""
    channel = out.register("DPU", "DATA_CUBE_CHANNEL")
    padded = next(channel.field("CHANNEL").extract(value) for block, name, value in writes
                  if (block, name) == ("DPU", "DATA_CUBE_CHANNEL")) + 1
    notch = _notch(task)
    width, height = _wdma(task)
    words = {("DPU", "DATA_CUBE_NOTCH_ADDR"): notch << 16 | notch,
             ("DPU", "WDMA_SIZE_0"): out.register("DPU", "WDMA_SIZE_0").pack({"CHANNEL_WDMA": lines * padded - 1}),
             ("DPU", "WDMA_SIZE_1"): out.register("DPU", "WDMA_SIZE_1").pack({"HEIGHT_WDMA": height,
                                                                              "WIDTH_WDMA": width}),
             ("DPU", "SURFACE_ADD"): out.register("DPU", "SURFACE_ADD").pack({"SURF_ADD": surface_add(task)})}
    missing = [key for key in words if key not in {(block, name) for block, name, _ in writes}]
    return [(block, name, words.get((block, name), value)) for block, name, value in writes] + [
        (*key, words[key]) for key in missing]


# --- int8 depthwise convs with a constant CPEND (the phase convs, the x8 nearest Resize's conv) ---------------------


def is_cpend_depthwise(task: VendorTask) -> bool:
    """An int8 depthwise conv task with one kernel and a bias-only record: the cube holds the weights alone (not
    rk3576_dw8's cube with CPEND: two "kernels", ALU + MUL record); CNA 0x1074 holds a CPEND common to all channels."""
    values = task.values
    return (task.enable == CONV_ENABLE and task.field("CNA", "CONV_CON1", "CONV_MODE") == VENDOR_DEPTHWISE
            and not task.field("CNA", "CONV_CON1", "PROC_PRECISION")
            and not task.field("CNA", "WEIGHT_KERNELS", "WEIGHT_KERNELS")
            and values.get(("DPU_RDMA", "BRDMA_CFG"), 0) >> 8 & 0xF == ALU)


def is_int8_phase(task: VendorTask) -> bool:
    return is_phase_conv(task) and not task.field("CNA", "CONV_CON1", "PROC_PRECISION")


def _signed8(value: int) -> int:
    value &= 0xFF
    return value - 0x100 if value & 0x80 else value


def cpend_depthwise_specs(view: VendorTask, read: Reader, cbuf: Cbuf) -> list[Spec]:
    """The twin's words of an int8 depthwise conv with a constant CPEND (``view``: a phase conv's plain view, or the
    task). CNA 0x1074 holds the CPEND once per byte of a channel pair (0x8080: 128, read as rk3576_dw8 reads its
    bytes; 0 in the x8 Resize's conv). The twins [V: three bilinear builds, the x8 Resize]: BS_CFG ALU from the
    record, the OW stage on with BS_OW_OP = that CPEND from the register (BS_OW_CFG OD_BYPASS 0, OW_SRC 0), QD_EN,
    PAD_CON1 the zero point in two bytes (0x404, 0xfffff7f7, 0x808). The vendor's 0x4050 is 0x2_3_x_33 (precision
    field 2, SIZE_E 3; [11:8] over the interleaved channels [I], not read)."""
    cpend = view.values.get(WEIGHT_CPEND, 0)
    pad = view.raw("CNA", "PAD_VALUE")   # the zero point, sign-extended [V: 0x4, 0xfffffff7]
    ow = view.raw("DPU", "BS_OW_CFG")
    if (cpend >> 16 or cpend >> 8 != cpend & 0xFF or ow & ~0xF00 != PHASE_OW_WORD & ~0xF00 or ow >> 8 & 0xF > 3
            or pad != _signed8(pad) & 0xFFFFFFFF or view.field("CNA", "CONV_CON1", "CONV_MODE") != VENDOR_DEPTHWISE):
        raise UnsupportedProgramError(f"{view.where}: vendor rk3576 int8 depthwise conv with a bias-only record, CNA "
                                      f"0x1074 {cpend:#x}, BS_OW_CFG {ow:#x}, PAD_VALUE {pad:#x}: only the bilinear "
                                      f"and x8 nearest Resizes' form is decoded (emulator/REGISTER_SEMANTICS.md 56.2)")
    channels = view.field("CORE", "DATAOUT_SIZE_1", "DATAOUT_CHANNEL") + 1
    zero = _signed8(pad)
    plain = VendorTask(view.regmap, view.where, {
        **view.values, ("DPU", "BS_OW_CFG"): bs_ow_word(INT8, VENDOR_DEPTHWISE_SIZES, False, channels),
        ("CNA", "PAD_VALUE"): (zero << 8 | zero & 0xFF) & 0xFFFFFFFF}, view.kept, view.enable)
    check_conv(plain, int8_depthwise=True)
    sizes = dict(zip(("SIZE_E_2", "SIZE_E_1", "SIZE_E_0"), VENDOR_DEPTHWISE_SIZES))
    replaced = {("DPU", "BS_OW_CFG"): {**sizes, "OD_BYPASS": 0, "OW_SRC": 0},
                ("DPU", "BS_OW_OP"): {"OW_OP": (128 if cpend & 0xFF == 0x80 else _signed8(cpend)) & 0xFFFF}}
    out = []
    for block, name, fields in rk3588_specs(plain, INT8, bs_shift(plain, read), cbuf, None):
        if (block, name) == ("CORE", "MISC_CFG"):
            fields = {**fields, "QD_EN": 1}
        out.append((block, name, replaced.get((block, name), fields)))
    return out
