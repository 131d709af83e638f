"""The vendor's rk3576 fp16 DPU-only Max / Sub / padded Mul and its standalone LUT tasks, both ways: the translation
gives the rk3588 twin register for register, the twin re-packs into the vendor's words word for word
(isa/rknn/rk3576_ew.py, rk3576_pack.dpu_vendor_writes / lut_dpu_vendor_writes; emulator/REGISTER_SEMANTICS.md 54).

References: the vendor's own builds, ``tests/data/rk3576_vendor/ew_*`` and ``lut1_*`` (how they were made:
tests/emulator/test_rknn_rk3576_ew.py), read here with npuemu's reader.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import default_bases, load_rknn, plan_memory, relocate
from npuemu.isa.rknn.rk3576_ew import twin_alu, as_the_record_holds_it, without_lut_flag
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_lut import bn_record, table_ends
from npuemu.isa.rknn.rk3576_pack import check_round_trip, dpu_vendor_writes, lut_dpu_vendor_writes
from npuemu.isa.rknn.rk3576_program import region_reader, translate_task
from npuemu.isa.words import encode_write

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
VENDOR, RK3588 = load_regmap("rk3576_vendor"), load_regmap("rk3588")
DPU_ONLY = 0x18
EW = {"ew_max16_fp16": 0x108002C0, "ew_sub16_fp16": 0x108402C0, "ew_mul20_fp16": 0x108003C4}
#: relocated in the translated task, 0 in the twin's stored stream; MRDMA_FP16TOFP32_EN, which the vendor's DPU-only
#: tasks set and no unit reads here (rk3576_pack.FREE_BITS)
ADDRESSES = {("DPU", "DST_BASE_ADDR"), ("DPU_RDMA", "SRC_BASE_ADDR"), ("DPU_RDMA", "EW_BASE_ADDR")}
FREE = {("DPU_RDMA", "FEATURE_MODE_CFG"): 0x8}


def _model(name: str):
    return load_rknn(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()), name)


def _stored(name: str, index: int) -> list[int]:
    model = _model(name)
    record = model.program.tasks[model.program.chains[0].tasks[index]]
    start = record.regcmd_addr // 8
    return [int(w) for w in model.program.regcmd[start:start + record.regcfg_amount]]


def _twin(name: str, index: int) -> dict[tuple[str, str], int]:
    """The rk3588 twin's task ``index`` of chain 0 as RK3588 values (the last value of a register written twice)."""
    twin = {}
    for word in _stored(f"{name}_rk3588", index):
        block = RK3588.block_for_target(word >> 48)
        register = block.register_at(word & 0xFFFF) if block else None
        if register is not None:
            twin[(block.name, register.name)] = (word >> 16) & 0xFFFFFFFF
    return twin


def _translated(name: str, index: int):
    """The vendor task as relocated at the runner's default bases, translated; and the file's memory reader."""
    model = _model(name)
    plan = plan_memory(model)
    program = relocate(model, plan, default_bases(model, plan))
    record = model.program.tasks[model.program.chains[0].tasks[index]]
    words = program.regcmd[record.regcmd_addr // 8:record.regcmd_addr // 8 + record.regcfg_amount]
    task = read_task(without_lut_flag(words, VENDOR), VENDOR, name, record.enable_mask)
    read = region_reader(model, program)
    return task, {(b, n): v for b, n, v in translate_task(task, RK3588, read)}, read


def _differ(ours, twin, ignore=frozenset()):
    return {key: (hex(ours.get(key, 0)), hex(twin.get(key, 0))) for key in (set(ours) | set(twin)) - ADDRESSES - ignore
            if ours.get(key, 0) & ~FREE.get(key, 0) != twin.get(key, 0) & ~FREE.get(key, 0)}


@pytest.mark.parametrize("name", EW)
def test_vendor_fp16_ew_task_translates_to_its_twin(name):
    """0x407C's bits 19:16 are the twin's EW_ALU_ALGO (Max 0, Sub 4); 20 channels written as 19 in every vendor
    channel word come back as the twin's CHANNEL 23 (DPU, WDMA, DPU_RDMA), ORIG_CHANNEL 19."""
    _, ours, _ = _translated(name, 0)
    twin = _twin(name, 0)
    assert not _differ(ours, twin)
    assert ours[("DPU", "EW_CFG")] == EW[name]
    if name == "ew_mul20_fp16":
        assert ours[("DPU", "DATA_CUBE_CHANNEL")] == 0x130017 and ours[("DPU_RDMA", "DATA_CUBE_CHANNEL")] == 23


@pytest.mark.parametrize("name", EW)
def test_the_twin_repacks_to_the_vendors_words(name):
    twin = _twin(name, 0)
    writes = dpu_vendor_writes(twin, RK3588, name, 0)
    assert [encode_write(VENDOR, b, n, v) for b, n, v in writes] == _stored(name, 0)
    check_round_trip(twin, RK3588, VENDOR, writes, 0, name, DPU_ONLY)


def _ends(name: str) -> tuple[int, int]:
    """LE[0] and LO[512] of the table the twin's upload task (record 0) writes."""
    upload = []
    for word in _stored(f"{name}_rk3588", 0):
        block = RK3588.block_for_target(word >> 48)
        register = block.register_at(word & 0xFFFF) if block else None
        if register is not None and register.name.startswith("LUT_ACCESS_"):
            upload.append((register.name, (word >> 16) & 0xFFFFFFFF))
    return table_ends(upload)


@pytest.mark.parametrize("name", ["lut1_hsw_int8", "lut1_tanh_fp16"])
def test_vendor_standalone_lut_translates_to_its_twin(name):
    """The LUT conv's words (REGISTER_SEMANTICS.md 46.1 / 50.1) in the DPU-only frame; int8: the twin's BN_ALU_CFG
    is the record's ALU operand times its multiplier (12 x 18118 = 217416)."""
    _, ours, _ = _translated(name, 1)
    twin = _twin(name, 1)
    # the LUT slope words rk3576.yaml lacks (as tests/emulator/test_rknn_rk3576_dpu_int8.py); their values are checked
    # in the emulator runs against the twins
    assert not _differ(ours, twin, {("DPU", "LUT_LE_SLOPE_SHIFT"), ("DPU", "LUT_LO_SLOPE_SCALE"),
                                    ("DPU", "LUT_LO_SLOPE_SHIFT")})
    if name.endswith("int8"):
        assert twin[("DPU", "BN_ALU_CFG")] == 12 * 18118 and twin[("DPU", "BN_MUL_CFG")] >> 16 == 18118


def test_the_int8_lut_twin_repacks_to_the_vendors_words_and_record():
    """The inverse: the twin's registers (BN_ALU_CFG 217416, OUT_CVT_SCALE without bit 16) pack into the vendor's 89
    words word for word (0x40CC = 0x10, DPU_RDMA 0x5044 bit 3, OUT_CVT_SCALE bit 16) and its record byte for byte."""
    name = "lut1_hsw_int8"
    twin = _twin(name, 1)
    writes = lut_dpu_vendor_writes(twin, RK3588, name, (0, _ends(name)))
    assert [encode_write(VENDOR, b, n, v) for b, n, v in writes] == _stored(name, 1)
    task, _, read = _translated(name, 1)
    record = bn_record(as_the_record_holds_it(twin, RK3588, name), RK3588)
    assert record == read(task.raw("DPU_RDMA", "ADDR_5030"), 64)
    check_round_trip(twin, RK3588, VENDOR, writes, 0, name, DPU_ONLY, record)


def test_an_int8_alu_operand_that_is_not_a_multiple_of_the_multiplier_is_refused_by_name():
    twin = _twin("lut1_hsw_int8", 1)
    with pytest.raises(UnsupportedProgramError, match="not a multiple of its multiplier"):
        as_the_record_holds_it({**twin, ("DPU", "BN_ALU_CFG"): 12 * 18118 + 1}, RK3588, "odd")


def test_an_fp16_alu_operand_other_than_zero_is_refused_by_name():
    values = {("DPU", "DATA_FORMAT"): 0x48000002, ("DPU", "BN_ALU_CFG"): 0x3F800000}   # fp32 1.0
    with pytest.raises(UnsupportedProgramError, match="BN ALU operand 0x3f800000"):
        as_the_record_holds_it(values, RK3588, "fp16")
    assert as_the_record_holds_it({**values, ("DPU", "BN_ALU_CFG"): 0x80000000}, RK3588, "fp16")[
        ("DPU", "BN_ALU_CFG")] == 0x80000000


def test_the_lut_flag_is_dropped_only_from_a_dpu_only_lut_block():
    """0x40CC = 0x10 is zeroed in the standalone LUT task; a block without the LUT word keeps it (read_task then
    refuses it by name, as any non-zero reserved word)."""
    words = _stored("lut1_hsw_int8", 1)
    flag = next(w for w in words if w & 0xFFFF == 0x40CC)
    assert (flag >> 16) & 0xFFFFFFFF == 0x10
    assert flag not in without_lut_flag(words, VENDOR) and len(without_lut_flag(words, VENDOR)) == len(words)
    plain = [w for w in words if w & 0xFFFF != 0x407C]
    assert without_lut_flag(plain, VENDOR) == plain
    with pytest.raises(UnsupportedProgramError, match="0x40cc"):
        read_task(plain, VENDOR, "plain", DPU_ONLY)


def test_an_fp16_per_channel_mul_over_padded_channels_stays_refused():
    """The per-channel Mul (an SE gate's) is known on whole atoms only (REGISTER_SEMANTICS.md 46.3, 50.4)."""
    twin = _twin("ew_mul20_fp16", 0)
    per_channel = {**twin, ("DPU", "EW_CFG"): 0x8003C4, ("DPU_RDMA", "ERDMA_CFG"): 0x8}
    with pytest.raises(UnsupportedProgramError, match="no known form in the vendor rk3576"):
        dpu_vendor_writes(per_channel, RK3588, "se20", 0)


@settings(max_examples=200, deadline=None)
@given(record=st.integers(-(1 << 20), 1 << 20), mul=st.integers(1, (1 << 16) - 1))
def test_the_record_alu_and_the_twins_are_one_operand(record, mul):
    """as_the_record_holds_it (BN_ALU / BN_MUL, the re-pack) and the translation (record x BN_MUL) are inverses on
    every operand that fits int32, checked through the emulator-independent product here."""
    alu = record * mul
    if not -(1 << 31) <= alu < 1 << 31:
        return
    values = {("DPU", "DATA_FORMAT"): 0, ("DPU", "BN_ALU_CFG"): alu & 0xFFFFFFFF, ("DPU", "BN_MUL_CFG"): mul << 16}
    held = as_the_record_holds_it(values, RK3588, "h")[("DPU", "BN_ALU_CFG")]
    assert held - ((held & 1 << 31) << 1) == record
    lut = [("DPU", "BN_MUL_CFG", {"BN_MUL_OPERAND": mul})]
    assert twin_alu({"raw": held}, lut, "h") == alu & 0xFFFFFFFF
