"""The interleaved write's words in the vendor's rk3576 layout, both ways (isa/rknn/rk3576_deconv.py,
emulator/REGISTER_SEMANTICS.md 53.2): an own phase conv's RK3588-position DPU words -> the vendor's (0x401C the
notch, WDMA_SIZE W - 1 lines, BS_CHANNEL [31:16] H x real channels - 1 and bit 4 clear, 0x40B8 the line step less
W (notch + 1) - notch) -> back, on any cube; the rule is restated here from the vendor's rk3576 bilinear phase conv
(49.1: 12 x 20 x 32, notch 1, SURFACE_ADD 80 -> 0x401C 1, WDMA_SIZE 0x00130000, 0x40B8 41). What is not the
interleaved write in the vendor's split is refused by name."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn.rk3576_bilinear import surface_add as line_step
from npuemu.isa.rknn.rk3576_deconv import (
    is_direct_phase_conv, phase_vendor_words, phase_view, phase_write, phase_writes,
)
from npuemu.isa.rknn.rk3576_layout import CONV_ENABLE, VendorTask

VENDOR, OWN = load_regmap("rk3576_vendor"), load_regmap("rk3576")
DIRECT_MODE = 0x710   # BS_CHANNEL [15:0] of a plain direct conv (rk3576_layout.BS_CHANNEL_ORDER) [V ORC]


def own_values(width: int, height: int, real: int, padded: int, notch: int, surface_add: int, split: str = "vendor"):
    """An own phase conv's DPU words at RK3588 positions (only those the interleaved write concerns)."""
    lines, per_line = (width, height * padded) if split == "vendor" else (height, width * padded)
    return {("DPU", "DATA_CUBE_WIDTH"): OWN.pack("DPU", "DATA_CUBE_WIDTH", WIDTH=width - 1),
            ("DPU", "DATA_CUBE_HEIGHT"): OWN.pack("DPU", "DATA_CUBE_HEIGHT", HEIGHT=height - 1),
            ("DPU", "DATA_CUBE_CHANNEL"): OWN.pack("DPU", "DATA_CUBE_CHANNEL", ORIG_CHANNEL=real - 1, CHANNEL=padded - 1),
            ("DPU", "DATA_CUBE_NOTCH_ADDR"): OWN.pack("DPU", "DATA_CUBE_NOTCH_ADDR", NOTCH_ADDR_1=notch,
                                                      NOTCH_ADDR_0=notch),
            ("DPU", "WDMA_SIZE_0"): OWN.pack("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=per_line - 1),
            ("DPU", "WDMA_SIZE_1"): OWN.pack("DPU", "WDMA_SIZE_1", HEIGHT_WDMA=lines - 1, WIDTH_WDMA=0),
            ("DPU", "SURFACE_ADD"): OWN.pack("DPU", "SURFACE_ADD", SURF_ADD=surface_add)}


def plain_vendor_writes(plain: dict, real: int) -> list[tuple[str, str, int]]:
    """What the plain conv packer writes for these words (rk3576_pack._dpu: WDMA_SIZE from WDMA_SIZE_1, the real
    channels, the plain mode, 0x40B8 SURFACE_ADD - W x H)."""
    def field(register, name):
        return OWN.register("DPU", register).field(name).extract(plain[("DPU", register)])
    width, height = field("DATA_CUBE_WIDTH", "WIDTH"), field("DATA_CUBE_HEIGHT", "HEIGHT")
    return [("DPU", "DATA_CUBE_WIDTH", width), ("DPU", "DATA_CUBE_HEIGHT", height), ("DPU", "DATA_CUBE_NOTCH", 0),
            ("DPU", "DATA_CUBE_CHANNEL", real - 1), ("DPU", "BS_CHANNEL", (real - 1) << 16 | DIRECT_MODE),
            ("DPU", "WDMA_SIZE", field("WDMA_SIZE_1", "HEIGHT_WDMA") << 16 | field("WDMA_SIZE_1", "WIDTH_WDMA")),
            ("DPU", "SURFACE_JUMP", (field("SURFACE_ADD", "SURF_ADD") - (width + 1) * (height + 1)) & 0xFFFFFFFF)]


def test_the_vendors_bilinear_phase_conv_words_follow():
    """12 x 20, notch 1, SURFACE_ADD 80 (two 40-atom rows): the vendor rk3576 bilinear phase conv's 0x401C 1,
    WDMA_SIZE 0x00130000, 0x40B8 41 [V 49.1]; BS_CHANNEL 12 x 32 - 1 = 383 over its 32 real channels, mode
    0x700 for a direct conv (the depthwise's 0x310 -> 0x300 rule)."""
    phase = phase_write(own_values(20, 12, 32, 32, 1, 80), OWN, "t")
    words = {(b, r): v for b, r, v in phase_vendor_words(plain_vendor_writes(phase.plain, 32), phase, "t")}
    assert words[("DPU", "DATA_CUBE_NOTCH")] == 1 and words[("DPU", "WDMA_SIZE")] == 0x00130000
    assert words[("DPU", "SURFACE_JUMP")] == 41 and words[("DPU", "BS_CHANNEL")] == 383 << 16 | 0x700


@settings(max_examples=200, deadline=None)
@given(width=st.integers(2, 400), height=st.integers(1, 256), real=st.integers(1, 128), stride=st.integers(2, 8),
       pass_kernels=st.sampled_from([16, 32]))
def test_the_words_go_there_and_back(width, height, real, stride, pass_kernels):
    padded = -(-real // pass_kernels) * pass_kernels
    if height * padded > 8192 or height * real > 65536:
        return
    notch, surface_add = stride - 1, stride * stride * width   # s rows of the s x W wide output a line
    values = own_values(width, height, real, padded, notch, surface_add)
    phase = phase_write(values, OWN, "t")
    assert phase.plain[("DPU", "DATA_CUBE_NOTCH_ADDR")] == 0
    assert OWN.register("DPU", "WDMA_SIZE_1").unpack(phase.plain[("DPU", "WDMA_SIZE_1")]) == \
        {"HEIGHT_WDMA": height - 1, "WIDTH_WDMA": width - 1}
    words = {(b, r): v for b, r, v in phase_vendor_words(plain_vendor_writes(phase.plain, real), phase, "t")}
    assert words[("DPU", "DATA_CUBE_NOTCH")] == notch and words[("DPU", "WDMA_SIZE")] == (width - 1) << 16
    assert words[("DPU", "BS_CHANNEL")] == (height * real - 1) << 16 | 0x700
    assert (words[("DPU", "SURFACE_JUMP")] - surface_add + width * (notch + 1) - notch) % (1 << 32) == 0
    vendor_words = {**{key: 0 for key in (("CNA", "CONV_CON1"),)}, **words}
    task = VendorTask(VENDOR, "t", vendor_words, (), CONV_ENABLE)
    assert is_direct_phase_conv(task)
    (view, lines), back_surface = phase_view(task), line_step(task)   # SURF_ADD as phase_writes reads it
    assert (lines, back_surface) == (height, surface_add) and not is_direct_phase_conv(view)
    assert view.raw("DPU", "WDMA_SIZE") == (height - 1) << 16 | (width - 1)
    assert view.raw("DPU", "BS_CHANNEL") == (real - 1) << 16 | DIRECT_MODE
    # the RK3588 words again, on top of what the plain conv translates to (its padded channels)
    back = {(b, r): v for b, r, v in phase_writes(task, OWN, lambda plain_task: [
        ("DPU", "DATA_CUBE_CHANNEL", values[("DPU", "DATA_CUBE_CHANNEL")]),
        ("DPU", "WDMA_SIZE_0", OWN.pack("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=padded - 1)),
        ("DPU", "WDMA_SIZE_1", OWN.pack("DPU", "WDMA_SIZE_1", HEIGHT_WDMA=height - 1, WIDTH_WDMA=width - 1)),
        ("DPU", "SURFACE_ADD", 0)])}
    for key in (("DPU", "DATA_CUBE_NOTCH_ADDR"), ("DPU", "WDMA_SIZE_0"), ("DPU", "WDMA_SIZE_1"), ("DPU", "SURFACE_ADD")):
        assert back[key] == values[key], key


def test_npuemus_old_split_is_refused_by_name():
    """H lines of W x C (what npuemu wrote before LOWERING.md 54) has no vendor form: the vendor never writes it."""
    with pytest.raises(UnsupportedProgramError, match="vendor's split"):
        phase_write(own_values(20, 12, 32, 32, 1, 80, split="own"), OWN, "layer t task 0")
    assert phase_write({**own_values(20, 12, 32, 32, 1, 80), ("DPU", "DATA_CUBE_NOTCH_ADDR"): 0}, OWN, "t") is None


def test_inconsistent_vendor_words_are_refused_by_name():
    phase = phase_write(own_values(20, 12, 24, 32, 1, 80), OWN, "t")
    words = {(b, r): v for b, r, v in phase_vendor_words(plain_vendor_writes(phase.plain, 24), phase, "t")}
    bad = {**words, ("CNA", "CONV_CON1"): 0, ("DPU", "WDMA_SIZE"): 0x000b0000}   # 12 lines, not the cube's 20
    with pytest.raises(UnsupportedProgramError, match="W lines of H x C"):
        phase_view(VendorTask(VENDOR, "t", bad, (), CONV_ENABLE))
