"""ConvTranspose in the vendor's rk3576 layout: its deconvolution conv, and npuemu's interleaved phase convs.

**The vendor's deconvolution conv** [V ORC: rknn-toolkit2 2.5.0 builds of ConvTranspose k2 s2, k4 s2 p1 and a
DepthToSpace (which it builds as a k2 s2 ConvTranspose) on [1, 16, 12, 20] / [1, 64, 12, 20], int8 and fp16, for
rk3576 and rk3588 side by side; REGISTER_SEMANTICS.md 53]: the rk3576 task is the rk3588 twin's CNA deconvolution
(REGISTER_SEMANTICS.md 40) with CONV_CON3.DECONV_Y/X_STRIDE as the twin's (s - 1, at the RK3588 bits 13:11 / 10:8)
but **CONV_CON1.DECONV (bit 16) clear** - the strides alone say it. Every other word is the plain conv's rk3576
form (DATA_IN_SIZE the ONNX input, DATA_OUT the spread output, PAD_CON0 k - 1 - p on top / left as the twin's,
the weights the twin's cube). So the translation is the plain conv's with CONV_CON1.DECONV set and the strides
kept (``deconv_writes``). Before this the strides were dropped and the file ran as a stride-1 conv of the
unspread input: wrong outputs, no error.

**npuemu's phase convs** (compiler/deconv_phases.py: a ConvTranspose as s x s direct convs, each writing its pixels
interleaved into the output, REGISTER_SEMANTICS.md 3.3.1 / 52) have no vendor-built twin: the vendor never writes a
direct conv interleaved. Their rk3576 words (``phase_vendor_words``) are the plain direct conv's vendor form with
the interleaved write's words as the vendor's rk3576 bilinear phase convs write them [V: REGISTER_SEMANTICS.md 49.1,
56.2, depthwise 2x2 convs]: DPU 0x401C NOTCH_ADDR_0 alone; WDMA_SIZE HEIGHT_WDMA W - 1, WIDTH 0 (the vendor's split,
which npuemu's RK3588 form writes too since LOWERING.md 54); BS_CHANNEL [31:16] H x the real channels - 1 and
[15:0] the plain conv's mode without bit 4 (depthwise 0x310 -> 0x300 [V]; direct 0x710 -> 0x700 [I]: the bit the
interleaved write clears in the one conv kind seen); 0x40B8 SURFACE_ADD - (W (notch + 1) - notch). The inverse
(``phase_view`` / ``phase_writes``) gives npuemu's RK3588 words back, which proves each own task
(rk3576_pack.check_round_trip).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_bilinear import NOTCH_BITS, interleaved_writes
from npuemu.isa.rknn.rk3576_layout import CONV_ENABLE, VENDOR_DEPTHWISE, VendorTask, field_reader

Write = tuple[str, str, int]
Values = Mapping[tuple[str, str], int]

PLAIN_WRITE_BIT = 0x10          # BS_CHANNEL [15:0] bit 4: set in a plain write, clear in the interleaved [V 49.1]
CHANNEL_FIELD = 0xFFFF          # BS_CHANNEL [31:16]: H x real channels - 1 when interleaved
DECONV_STRIDES = ("DECONV_Y_STRIDE", "DECONV_X_STRIDE")


# --- the vendor's deconvolution conv --------------------------------------------------------------------------


def is_vendor_deconv(task: VendorTask) -> bool:
    """A conv task whose CONV_CON3 holds deconvolution strides (the rk3576 form of CONV_CON1.DECONV)."""
    return task.enable == CONV_ENABLE and any(task.field("CNA", "CONV_CON3", name) for name in DECONV_STRIDES)


def deconv_writes(task: VendorTask, out: RegisterMap, translate: Callable[[VendorTask], list[Write]]) -> list[Write]:
    """The twin's deconvolution task: ``translate`` of the task without its strides (a plain conv), then
    CONV_CON1.DECONV set and CONV_CON3's strides as written. Depthwise refused (the CNA's mode is known for
    direct convs only, REGISTER_SEMANTICS.md 40)."""
    if task.field("CNA", "CONV_CON1", "CONV_MODE") == VENDOR_DEPTHWISE:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 depthwise deconvolution; only direct ones are "
                                      f"decoded (emulator/REGISTER_SEMANTICS.md 53)")
    con3 = task.regmap.register("CNA", "CONV_CON3")
    strides = {name: task.field("CNA", "CONV_CON3", name) for name in DECONV_STRIDES}
    plain = dict(task.values)
    plain[("CNA", "CONV_CON3")] = con3.pack({**con3.unpack(task.raw("CNA", "CONV_CON3")), **dict.fromkeys(strides, 0)})
    writes = translate(VendorTask(task.regmap, task.where, plain, task.kept, task.enable))
    con1_out, con3_out = out.register("CNA", "CONV_CON1"), out.register("CNA", "CONV_CON3")
    patched = []
    for block, name, value in writes:
        if (block, name) == ("CNA", "CONV_CON1"):
            value = con1_out.pack({**con1_out.unpack(value), "DECONV": 1})
        elif (block, name) == ("CNA", "CONV_CON3"):
            value = con3_out.pack({**con3_out.unpack(value), **strides})
        patched.append((block, name, value))
    return patched


# --- npuemu's phase convs: the interleaved write in the vendor's words ------------------------------------------


@dataclass(frozen=True)
class PhaseWrite:
    """An own conv task's interleaved write (RK3588 words): ``plain`` its values writing the cube plainly."""

    plain: dict
    notch: int
    width: int
    height: int
    surface_add: int


def phase_write(values: Values, source: RegisterMap, where: str) -> PhaseWrite | None:
    """The interleaved write of npuemu's conv task ``values`` (RK3588 positions, packed with ``source``), None for a
    plain write. Refuses a notch other than the interleaved write's (npuemu writes no other on a conv)."""
    notch_word = values.get(("DPU", "DATA_CUBE_NOTCH_ADDR"), 0)
    if not notch_word:
        return None
    field = field_reader(values, source)
    notch = field("DPU", "DATA_CUBE_NOTCH_ADDR", "NOTCH_ADDR_0")
    width, height = field("DPU", "DATA_CUBE_WIDTH", "WIDTH") + 1, field("DPU", "DATA_CUBE_HEIGHT", "HEIGHT") + 1
    channels = field("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    wdma = (field("DPU", "WDMA_SIZE_1", "WIDTH_WDMA"), field("DPU", "WDMA_SIZE_1", "HEIGHT_WDMA"),
            field("DPU", "WDMA_SIZE_0", "CHANNEL_WDMA"))
    if (field("DPU", "DATA_CUBE_NOTCH_ADDR", "NOTCH_ADDR_1") != notch or width < 2
            or wdma != (0, width - 1, height * channels - 1)):
        raise UnsupportedProgramError(f"{where}: DPU notch {notch_word:#x} with WDMA sizes {wdma} on a {width} x {height} x "
                                      f"{channels} cube: only the interleaved write in the vendor's split (W lines of "
                                      f"H x C) has a vendor rk3576 form (REGISTER_SEMANTICS.md 52, 53)")
    plain = {**values, ("DPU", "DATA_CUBE_NOTCH_ADDR"): 0,
             ("DPU", "WDMA_SIZE_0"): source.update("DPU", "WDMA_SIZE_0", values.get(("DPU", "WDMA_SIZE_0"), 0),
                                                   CHANNEL_WDMA=channels - 1),
             ("DPU", "WDMA_SIZE_1"): source.pack("DPU", "WDMA_SIZE_1", HEIGHT_WDMA=height - 1, WIDTH_WDMA=width - 1)}
    return PhaseWrite(plain, notch, width, height, field("DPU", "SURFACE_ADD", "SURF_ADD"))


def phase_vendor_words(writes: list[Write], phase: PhaseWrite, where: str) -> list[Write]:
    """The vendor-layout ``writes`` of ``phase.plain`` with the interleaved write's words (module docstring)."""
    words = {}
    for block, name, value in writes:
        if (block, name) == ("DPU", "BS_CHANNEL"):
            real = (value >> 16) + 1
            if phase.height * real > CHANNEL_FIELD + 1 or not value & PLAIN_WRITE_BIT:
                raise UnsupportedProgramError(f"{where}: an interleaved write of {phase.height} lines x {real} "
                                              f"channels (BS_CHANNEL {value:#x}) has no vendor rk3576 form")
            words[(block, name)] = (phase.height * real - 1) << 16 | (value & CHANNEL_FIELD & ~PLAIN_WRITE_BIT)
    words[("DPU", "DATA_CUBE_NOTCH")] = phase.notch
    words[("DPU", "WDMA_SIZE")] = (phase.width - 1) << 16
    words[("DPU", "SURFACE_JUMP")] = (phase.surface_add - (phase.width * (phase.notch + 1) - phase.notch)) & 0xFFFFFFFF
    return [(block, name, words.get((block, name), value)) for block, name, value in writes]


def is_direct_phase_conv(task: VendorTask) -> bool:
    """A direct conv writing interleaved: a DPU notch and BS_CHANNEL's plain-write bit clear (the depthwise phase
    convs of the vendor's bilinear Resize are rk3576_bilinear's)."""
    return (task.enable == CONV_ENABLE and task.field("CNA", "CONV_CON1", "CONV_MODE") != VENDOR_DEPTHWISE
            and bool(task.values.get(("DPU", "DATA_CUBE_NOTCH"), 0))
            and not task.values.get(("DPU", "BS_CHANNEL"), 0) & PLAIN_WRITE_BIT)


def phase_view(task: VendorTask) -> tuple[VendorTask, int]:
    """(the task as the plain conv it is made of, its lines H); refuses words other than the interleaved write's of
    ``phase_vendor_words``. Its SURFACE_ADD is rk3576_bilinear.surface_add's: W (notch + 1) - notch on top of 0x40B8."""
    f = task.field
    notch = task.raw("DPU", "DATA_CUBE_NOTCH")
    width, height = f("DPU", "DATA_CUBE_WIDTH", "WIDTH") + 1, f("DPU", "DATA_CUBE_HEIGHT", "HEIGHT") + 1
    real = f("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") + 1
    channel = task.raw("DPU", "BS_CHANNEL")
    wdma = task.raw("DPU", "WDMA_SIZE")
    if (channel >> 16) + 1 != height * real or wdma != (width - 1) << 16 or notch >> NOTCH_BITS or width < 2:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 direct conv writing through notch {notch:#x} with "
                                      f"BS_CHANNEL {channel:#x}, WDMA_SIZE {wdma:#x} on a {width} x {height} x {real} "
                                      f"cube; only the interleaved write of W lines of H x C is decoded "
                                      f"(emulator/REGISTER_SEMANTICS.md 53)")
    plain = {("DPU", "DATA_CUBE_NOTCH"): 0, ("DPU", "WDMA_SIZE"): (height - 1) << 16 | (width - 1),
             ("DPU", "BS_CHANNEL"): (real - 1) << 16 | (channel & CHANNEL_FIELD) | PLAIN_WRITE_BIT,
             # the plain conv reads its jump unsigned (rk3576_forms): 0 there, the line step written after
             ("DPU", "SURFACE_JUMP"): 0}
    return VendorTask(task.regmap, task.where, {**task.values, **plain}, task.kept, task.enable), height


def phase_writes(task: VendorTask, out: RegisterMap, translate: Callable[[VendorTask], list[Write]]) -> list[Write]:
    """npuemu's RK3588 phase conv: ``translate`` of the plain view, then the interleaved write's words - NOTCH_ADDR
    in both halves, W lines (HEIGHT_WDMA W - 1, WIDTH 0) of H x the padded channels, SURF_ADD the line step - as for
    the vendor's depthwise phase convs (rk3576_bilinear.interleaved_writes)."""
    view, lines = phase_view(task)
    return interleaved_writes(task, out, translate(view), lines)
