"""Relocation invariants of docs/rknn-relocation.md, checked on every fixture and for two
different address assignments. The expected words are recomputed here from the rules (R1, R2)
with plain integer arithmetic, not with the module's helpers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npuemu.isa.errors import ConfigError
from npuemu.isa.rknn import Bases, Region, load_rknn, plan_memory, region_image, relocate, tensor_addresses
from npuemu.isa.rknn.relocate import default_bases

FIXTURES = Path(__file__).parents[2] / ".." / "shared" / "rknn-fixtures"
NAMES = [
    "mobilenet_v2", "rep01_conv3x3s1_32to32_56_relu", "rep02_conv1x1_64to128_28", "rep03_conv3x3s2_3to32_224_first",
    "rep03b_conv3x3s2_3to32_224_first_meanstd", "rep04_dw3x3s1_64_56", "rep05_dw3x3s2_96_112",
    "rep06_conv3x3s1_64to64_150_bigcbuf", "rep07_maxpool_k3s2p1_64_112", "rep08_avgpool_k2s2_64_56",
    "rep09_add_64_56", "rep10_sigmoid_64_56", "rep11_fc_512to1000", "rep12_resblock_convadd_3x3_64_56", "resnet18",
]
_MODELS: dict = {}


def model_of(name: str):
    path = FIXTURES / name / "model.rknn"
    if not path.is_file():
        pytest.fail(f"fixture {path} is missing (the shared folder must sit next to the repository)")
    if name not in _MODELS:
        _MODELS[name] = load_rknn(path)
    return _MODELS[name]


def high_bases(model, plan) -> Bases:
    """A second assignment: regions in another order, near the top of the 32-bit space."""
    words = model.program.regcmd_words * 8
    cursor = 0x8000_0000
    bases = {}
    for name, size in (("internal", plan.sizes[Region.INTERNAL]), ("lut", plan.sizes[Region.LUT]),
                       ("misc", plan.sizes[Region.MISC]), ("weight", plan.sizes[Region.WEIGHT]),
                       ("task", len(model.program.tasks) * 40), ("regcmd", words)):
        bases[name] = cursor
        cursor = (cursor + size + 0x10FFF) // 0x1000 * 0x1000   # leave a gap between regions
    return Bases(**bases)


def value(word: int) -> int:
    return (word >> 16) & 0xFFFF_FFFF


@pytest.fixture(params=NAMES)
def name(request):
    return request.param


@pytest.mark.parametrize("assignment", ["default", "high"])
def test_relocation_invariants(name, assignment):
    model = model_of(name)
    plan = plan_memory(model)
    bases = default_bases(model, plan) if assignment == "default" else high_bases(model, plan)
    result = relocate(model, plan, bases)
    stored = [int(w) for w in model.program.regcmd]
    after = [int(w) for w in result.regcmd]
    placements = plan.by_name()

    # R1: each table word holds address(tensor) + offset; target and register bits are kept.
    expected = list(stored)
    for entry in model.relocations:
        placement = placements[entry.tensor_name]
        address = getattr(bases, placement.region.value) + placement.offset
        for offset, word in entry.pairs:
            assert value(stored[word]) == offset, (entry.tensor_name, word)   # stored value = offset
            expected[word] = (stored[word] & 0xFFFF_0000_0000_FFFF) | ((address + offset) << 16)

    # R2: tails that continue a chain point at base + the start of a task's block, patched once.
    starts = {task.regcmd_addr for task in model.program.tasks}
    for tail in model.program.tails:
        if not tail.ends_chain:
            assert tail.next_offset in starts
            expected[tail.word_index] = stored[tail.word_index] + (bases.regcmd << 16)
    assert after == expected
    assert len(set(result.patched_tails)) == len(result.patched_tails)

    for task, moved in zip(model.program.tasks, result.tasks):
        assert moved.regcmd_addr == task.regcmd_addr + bases.regcmd
    first_address = bases.regcmd + model.program.tasks[0].regcmd_addr
    assert result.task_blob[32:40] == first_address.to_bytes(8, "little")   # the u64 after eight u32 fields


def test_chain0_walk_follows_relocated_tails(name):
    """Following PC_BASE_ADDRESS from task 0 visits chain 0's records in order, with the amount rule of rk3588."""
    model = model_of(name)
    result = relocate(model)
    tasks = result.tasks
    chain0 = model.program.chains[0]
    for index in chain0.tasks:
        task = tasks[index]
        tail = (task.regcmd_addr - result.bases.regcmd) // 8 + task.regcfg_amount
        base_word, amount_word = int(result.regcmd[tail]), int(result.regcmd[tail + 1])
        assert amount_word >> 48 == 0x0101 and amount_word & 0xFFFF == 0x0014
        op_enable = int(result.regcmd[tail + 3])
        assert op_enable & 0xFFFF == 0x0008 and value(op_enable) == task.enable_mask
        if index == chain0.tasks[-1]:
            assert value(amount_word) == 0
            continue
        following = tasks[index + 1]
        assert value(base_word) == following.regcmd_addr
        assert value(amount_word) == -(-(following.regcfg_amount + 4) // 2) - 1   # PC fetch unit 2 words


def test_relocated_registers_are_complete_in_chain0(name):
    """R3: in chain 0, every non-zero write to a relocated (target, register) pair is covered by the table."""
    model = model_of(name)
    words = model.program.regcmd
    table_words = {word for entry in model.relocations for _, word in entry.pairs}
    relocated_registers = {(int(words[w]) >> 48, int(words[w]) & 0xFFFF) for w in table_words}
    for index in model.program.chains[0].tasks:
        task = model.program.tasks[index]
        for w in range(task.first_word, task.first_word + task.regcfg_amount):
            word = int(words[w])
            if (word >> 48, word & 0xFFFF) in relocated_registers and value(word):
                assert w in table_words, (index, w, hex(word))


def test_overrides_move_only_their_tensor():
    model = model_of("rep09_add_64_56")
    plan = plan_memory(model)
    bases = default_bases(model, plan)
    plain = relocate(model, plan, bases)
    moved = relocate(model, plan, bases, overrides={"in1": 0x4000_0000})
    in1_words = {word for entry in model.relocations if entry.tensor_name == "in1" for _, word in entry.pairs}
    assert in1_words
    changed = set(np.flatnonzero(plain.regcmd != moved.regcmd).tolist())
    assert changed == in1_words
    for entry in model.relocations:
        if entry.tensor_name == "in1":
            for offset, word in entry.pairs:
                assert value(int(moved.regcmd[word])) == 0x4000_0000 + offset


def test_region_images_hold_the_blobs():
    model = model_of("rep12_resblock_convadd_3x3_64_56")
    plan = plan_memory(model)
    image = region_image(model, plan, Region.WEIGHT)
    assert len(image) == model.regions.weight
    for placement in plan.in_region(Region.WEIGHT):
        blob = model.blob(model.tensors[placement.tensor_index])
        assert image[placement.offset:placement.offset + len(blob)] == blob
    lut = region_image(load_rknn(FIXTURES / "rep10_sigmoid_64_56" / "model.rknn"),
                       plan_memory(model_of("rep10_sigmoid_64_56")), Region.LUT)
    assert len(lut) == 8776


def test_tensor_addresses_follow_the_plan():
    model = model_of("rep12_resblock_convadd_3x3_64_56")
    plan = plan_memory(model)
    bases = default_bases(model, plan)
    addresses = tensor_addresses(plan, bases)
    assert addresses["w7"] == bases.weight + 0x1200            # rknn-relocation.md §3, rep12
    assert addresses["relu_out5"] == bases.internal + 0x31000
    assert addresses["add_out17"] == bases.internal + 0x62000
    assert addresses["relu_out11"] == bases.internal            # reuses in0's space


@pytest.mark.parametrize("change, message", [
    ({"weight": 0x1001}, "multiple of 64"),
    ({"internal": 0xFFFF_F000}, "below 4 GiB"),
    ({"weight": "regcmd"}, "overlaps"),
])
def test_bad_bases_are_refused(change, message):
    model = model_of("rep01_conv3x3s1_32to32_56_relu")
    plan = plan_memory(model)
    fields = vars(default_bases(model, plan)).copy()
    for key, new in change.items():
        fields[key] = fields[new] if isinstance(new, str) else new
    with pytest.raises(ConfigError, match=message):
        relocate(model, plan, Bases(**fields))


def test_bad_overrides_are_refused():
    model = model_of("rep01_conv3x3s1_32to32_56_relu")
    with pytest.raises(ConfigError, match="does not place"):
        relocate(model, overrides={"nope": 0x1000})
    with pytest.raises(ConfigError, match="32-bit"):
        relocate(model, overrides={"in0": 1 << 32})
