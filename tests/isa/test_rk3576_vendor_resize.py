"""The vendor's rk3576 Resize copy against its rk3588 twin, both ways, word for word (emulator/REGISTER_SEMANTICS.md
49; isa/rknn/rk3576_resize.py). The files are tests/emulator/test_rknn_rk3576_resize.py's (how they were made is
said there). A vendor copy is a delta on the register group its clear conv left, so both programs are read with
the group overlay (task n on top of task n - 2, REGISTER_SEMANTICS.md 1.1)."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_resize import (
    FRAME, channel_mode, is_clear_conv, is_vendor_unpool, ow_word, surface_jump, unpool_specs, unpool_vendor_writes,
)
from npuemu.isa.words import TARGET_MARKER, TARGET_OP_ENABLE

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
VENDOR, RK3588, OWN = load_regmap("rk3576_vendor"), load_regmap("rk3588"), load_regmap("rk3576")
NAMES = ("resize2_int8", "resize4_int8", "resize2_fp16")


def _program(name: str):
    model = load_rknn(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()), name)
    program = model.program
    return [(program.tasks[i], program.regcmd[program.tasks[i].first_word:program.tasks[i].tail_word])
            for i in program.chains[0].tasks]


def _vendor_tasks(name: str):
    groups, out = [{}, {}], []
    for position, (record, words) in enumerate(_program(name)):
        task = read_task(words, VENDOR, f"{name} task {position}", record.enable_mask, groups[position % 2])
        groups[position % 2] = dict(task.values)
        out.append(task)
    return out


def _twin_values(name: str) -> list[dict]:
    """Each rk3588 task's register values, decoded here from the words with the rk3588 map."""
    groups, out = [{}, {}], []
    for position, (_, words) in enumerate(_program(f"{name}_rk3588")):
        values = dict(groups[position % 2])
        for word in (int(w) for w in words):
            target, value, offset = word >> 48, (word >> 16) & 0xFFFFFFFF, word & 0xFFFF
            if word and target not in (TARGET_MARKER, TARGET_OP_ENABLE):
                block = RK3588.block_for_target(target)
                values[(block.name, block.register_at(offset).name)] = value
        groups[position % 2] = values
        out.append(values)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_twins_copies_re_pack_into_the_vendors_word_for_word(name):
    copies = [task for task in _vendor_tasks(name) if is_vendor_unpool(task)]
    twins = _twin_values(name)
    assert len(copies) == len(twins) >= 1
    for task, twin in zip(copies, twins):
        writes = unpool_vendor_writes(twin, OWN, name)
        assert [(block, register) for block, register, _ in writes] == FRAME and len(FRAME) == 89
        for block, register, value in writes:
            expected = 0 if register.startswith("RSV_") else task.values[(block, register)]
            assert value == expected, (name, block, register, hex(value), hex(expected))


@pytest.mark.parametrize("name", NAMES)
def test_the_vendors_copies_translate_to_their_twins(name):
    copies = [task for task in _vendor_tasks(name) if is_vendor_unpool(task)]
    for task, twin in zip(copies, _twin_values(name)):
        for block, register, fields in unpool_specs(task):
            value = fields["raw"] if "raw" in fields else RK3588.register(block, register).pack(fields)
            assert value == twin.get((block, register), 0), (name, block, register, hex(value))
        # kept at its RK3588 position (a delta copy leaves it to the copy two before)
        assert task.values[("DPU_RDMA", "SRC_DMA_CFG")] == twin[("DPU_RDMA", "SRC_DMA_CFG")]


def test_every_resize_program_is_clear_convs_around_the_copies():
    for name in NAMES:
        kinds = ["clear" if is_clear_conv(t) else "copy" if is_vendor_unpool(t) else "?" for t in _vendor_tasks(name)]
        copies = kinds.count("copy")
        assert kinds == ["clear"] * 2 + ["copy"] * copies + ["clear"] * 2, (name, kinds)


def test_the_derived_words_match_the_values_seen():
    """[V] x2 / x4 / x8 copies (the x8 build: int8 [1, 32, 3, 5], not committed) and the other frames' values the
    same reading gives."""
    assert [ow_word((f - 1,) * 3, f) for f in (2, 4, 8)] == [0x20111, 0x20333, 0x20777]
    assert [channel_mode(size) for size in (0, 1, 3, 7)] == [0xF00, 0x700, 0x300, 0x100]
    assert [surface_jump(960, 39, height, 40 * (f - 1)) for height, f in ((11, 2), (5, 4), (2, 8))] == [40, 120, 280]
    assert surface_jump(240, 19, 11, 0) == 0   # a conv's SURF_ADD - W x H


def test_an_unpooling_copy_with_a_bs_stage_has_no_vendor_form():
    twin = dict(_twin_values("resize2_int8")[0])
    twin[("DPU", "BS_CFG")] = 0x20040
    with pytest.raises(UnsupportedProgramError, match="unpooling copy other than lower_resize's"):
        unpool_vendor_writes(twin, OWN, "here")
