"""The vendor's rk3576 register layout (isa/regmaps/rk3576_vendor.yaml) and its translation to
the RK3588 form (isa/rknn/rk3576_layout.py, rk3576_forms.py, rk3576_program.py).

The reference is the vendor itself: ``tests/data/rk3576_vendor/tasks.npz.xz`` holds, per case,
the chain-0 conv task of an ONNX conv built with rknn-toolkit2 2.5.0 for rk3576 (``.rk3576``:
the task body's words, ``.enable``: its op-enable mask, ``.shift``: the int16 word of the
file's ``<output>_BScfgTensor``) and the same ONNX built for rk3588 (``.rk3588``). Made once with
the toolkit (not needed to run this file): ``RKNN.config(target_platform=...)``, ``load_onnx``,
``build(do_quantization=True, dataset=3 random inputs)`` or ``do_quantization=False`` for the
fp16 cases, ``export_rknn``; the words are ``model.program.regcmd`` of chain 0's first task as
``npuemu.isa.rknn.load_rknn`` reads them. Cases (Conv cin -> cout, input HxW, kernel khxkw,
strides y,x, pads top,left,bottom,right; int8 unless named):

  a        24 -> 40, 20x30, 3x5, 2,1, 1,2,1,2        a16      the same in fp16
  sx       32 -> 16, 14x26, 1x3, 1,2, 0,1,0,0        odd      5 -> 17, 9x11, 3x2, 1,1, 1,0,1,1
  relu     16 -> 32, 12x20, 3x3 + Relu               f16relu  the same in fp16
  f16odd   odd in fp16                               k73      16 -> 16, 12x22, 7x3, pads 0
  k13s12   16 -> 16, 12x22, 1x3, 1,2, 0,1,0,1        k35s12   16 -> 16, 12x22, 3x5, 1,2, 1,2,1,2
  t_relu2  6 -> 20, 7x10, 3x2, 2,1, 1,1,1,0 + Relu
  clip     relu's conv + Clip(-0.5, 0.7)  dw  depthwise 32, 18x22, 3x3  sig  relu's conv + Sigmoid
  (the last three: rk3576 only, for the refusals)
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shared_data import RKNN_FIXTURES_OPS
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_layout import KEPT, KEPT_PREFIXES, VENDOR_FAMILY, read_task
from npuemu.isa.rknn.rk3576_program import encode_writes, translate_regcmd, translate_task

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
TWINS = ("a", "a16", "sx", "odd", "relu", "f16relu", "f16odd", "k73", "k13s12", "k35s12", "t_relu2")
VENDOR = load_regmap(VENDOR_FAMILY)
RK3588 = load_regmap("rk3588")
RK3576 = load_regmap("rk3576")
# written by the translation, not by the rk3588 build: the driver writes CNA/CORE S_POINTER over
# MMIO before a chain (REGISTER_SEMANTICS.md 1.1), CLK_GATE is 0 either way
OURS_ONLY = {("CNA", "S_POINTER"), ("CORE", "S_POINTER"), ("CNA", "CLK_GATE")}
NOT_DERIVED = {("CNA", "CONV_CON2")}   # FEATURE_GRAINS: no vendor rk3576 word gives it (10.3)


def _tasks() -> dict[str, np.ndarray]:
    with lzma.open(DATA / "tasks.npz.xz") as f:
        archive = np.load(io.BytesIO(f.read()))
        return {name: archive[name] for name in archive.files}


TASKS = _tasks()


def _writes(words: np.ndarray, regmap) -> dict[tuple[str, str], int]:
    """(block, register) -> last value, decoded with ``regmap`` (rk3588: the twin's own words)."""
    out = {}
    for word in (int(w) for w in words):
        block = regmap.block_for_target(word >> 48)
        register = block.register_at(word & 0xFFFF) if block else None
        if register is not None:
            out[(block.name, register.name)] = (word >> 16) & 0xFFFFFFFF
    return out


def _vendor_task(case: str, where: str = "test"):
    return read_task(TASKS[f"{case}.rk3576"], VENDOR, where, int(TASKS[f"{case}.enable"]))


def _shift_reader(case: str):
    word = int(TASKS[f"{case}.shift"]).to_bytes(2, "little")
    return lambda address, size: word[:size]


def _translated(case: str, out=RK3588) -> dict[tuple[str, str], int]:
    writes = translate_task(_vendor_task(case), out, _shift_reader(case))
    return {(block, name): value for block, name, value in writes}


@pytest.mark.parametrize("case", TWINS)
def test_translation_is_the_vendors_rk3588_build(case):
    """Every register the vendor's rk3588 build writes for the same ONNX gets the same value."""
    ours, twin = _translated(case), _writes(TASKS[f"{case}.rk3588"], RK3588)
    both = set(ours) & set(twin)
    differ = {key: (hex(ours[key]), hex(twin[key])) for key in both - NOT_DERIVED if ours[key] != twin[key]}
    assert not differ, f"{case}: ours, rk3588 build: {differ}"
    assert set(ours) - set(twin) <= OURS_ONLY, sorted(set(ours) - set(twin))
    # what only the rk3588 build writes is 0 (DCOMP_AMOUNT2..15, LUT slopes, ...)
    assert {key: value for key, value in twin.items() if key not in ours and value} == {}


@pytest.mark.parametrize("case", ["odd", "f16relu"])
def test_translation_to_rk3576_positions_drops_only_the_registers_that_map_lacks(case):
    """npuemu's rk3576 map (RK3588 positions, isa/REGISTERS.md) has no FC_DATA_SIZE1 and no
    EW_OP_VALUE_7; everything else is the rk3588 translation at the same offsets."""
    on_3588, on_3576 = _translated(case), _translated(case, RK3576)
    assert set(on_3588) - set(on_3576) == {("CNA", "FC_DATA_SIZE1"), ("DPU", "EW_OP_VALUE_7")}
    for (block, name), value in on_3576.items():
        assert on_3588[(block, name)] == value
        if name not in ("FEATURE_DATA_ADDR", "DST_BASE_ADDR", "OUT_CVT_OFFSET", "OUT_CVT_SCALE", "OUT_CVT_SHIFT"):
            assert RK3576.register(block, name).offset == RK3588.register(block, name).offset


def _fixture_task(case: str, record: int = 0):
    model = load_rknn(RKNN_FIXTURES_OPS / case / "model.rknn")
    task = model.program.tasks[record]
    first = task.regcmd_addr // 8
    return model, model.program.regcmd[first:first + task.regcfg_amount], task


@pytest.mark.parametrize("case", ["dense_rk3576_int8", "dense_rk3576_fp16", "sparse_rk3576_int8"])
def test_fixture_conv_reads_back_as_its_onnx_conv(case):
    """The fixtures' conv (64 -> 64, 3x3, pad 1, 56x56; meta.json) in the vendor map's fields;
    the pad value and OUT_CVT offset are the file's input and output zero points."""
    model, words, record = _fixture_task(case)
    task = read_task(words, VENDOR, case, record.enable_mask)
    f = task.field
    assert (f("CNA", "WEIGHT_KERNELS", "WEIGHT_WIDTH"), f("CNA", "WEIGHT_KERNELS", "WEIGHT_HEIGHT")) == (2, 2)
    assert f("CNA", "WEIGHT_KERNELS", "WEIGHT_KERNELS") == 63 == f("CNA", "DATA_IN_CHANNEL", "DATAIN_CHANNEL")
    assert f("CNA", "DATA_IN_SIZE", "DATAIN_WIDTH") == 55 == f("CNA", "PLANE_WIDTH", "WIDTH_LO")
    assert [f("CNA", "PAD_CON0", side) for side in ("PAD_TOP", "PAD_LEFT", "PAD_RIGHT")] == [1, 1, 1]
    assert f("CNA", "WEIGHT_BYTES", "WEIGHT_BYTES") == 64 * 64 * 9 * (2 if "fp16" in case else 1) // (
        2 if case.startswith("sparse_rk3576_int8") else 1)
    fp16 = "fp16" in case
    assert f("CNA", "CONV_CON1", "FLOAT_EN") == f("CNA", "CONV_CON1", "PROC_PRECISION") // 2 == int(fp16)
    if not fp16:
        assert f("CNA", "PAD_VALUE", "PAD_VALUE") == model.input_tensors[0].zero_points[0]
        assert f("DPU", "OUT_CVT_OFFSET", "OUT_CVT_OFFSET") == model.output_tensors[0].zero_points[0]
        assert f("DPU_RDMA", "BRDMA_CFG", "BRDMA_DATA_USE") == 7 and f("DPU_RDMA", "BRDMA_CFG", "SHIFT_CFG_EN")
    else:
        assert f("DPU_RDMA", "BRDMA_CFG", "BRDMA_DATA_USE") == 1 and not f("DPU_RDMA", "BRDMA_CFG", "SHIFT_CFG_EN")
    assert f("CNA", "WEIGHT_KERNELS", "SPARSE_MODE") == (3 if case == "sparse_rk3576_int8" else 0)


@pytest.mark.parametrize("case", ["dense_rk3576_int8", "sparse_rk3576_int8", "dense_rk3576_fp16"])
def test_every_nonzero_word_of_the_fixtures_has_a_name(case):
    model = load_rknn(RKNN_FIXTURES_OPS / case / "model.rknn")
    for record in model.program.tasks:
        first = record.regcmd_addr // 8
        for word in (int(w) for w in model.program.regcmd[first:first + record.regcfg_amount]):
            block = VENDOR.block_for_target(word >> 48)
            assert block is not None, hex(word)
            assert block.register_at(word & 0xFFFF) is not None or not (word >> 16) & 0xFFFFFFFF, hex(word)


@pytest.mark.parametrize("case, match", [
    ("dw", r"CONV_CON1.CONV_MODE = 1: a depthwise"),
])
def test_what_is_not_decoded_is_refused_by_name(case, match):
    with pytest.raises(UnsupportedProgramError, match=match):
        translate_task(_vendor_task(case, case), RK3588, _shift_reader(case))


def test_the_clip_with_a_lower_bound_translates_to_the_twins_arrangement():
    """Refused until REGISTER_SEMANTICS.md 46.5: ACT_CFG 0x920, CLAMP2/3 [0, H - L] = [0, 16646], 0x407C 0x241c0,
    EW_OP_VALUE_0 L = -6936; the record (not stored with this case) holds -L twice, as the Clip(-1, 2) pair's
    (tests/compiler/test_rk3576_vendor_clip.py)."""
    record = (6936).to_bytes(4, "little") + bytes(12) + (6936).to_bytes(4, "little") + bytes(44)
    shift = int(TASKS["clip.shift"]).to_bytes(2, "little")
    values = {(block, name): value for block, name, value in translate_task(
        _vendor_task("clip", "clip"), RK3588, lambda address, size: (record if size == 64 else shift)[:size])}
    assert (values[("DPU", "BN_CFG")], values[("DPU", "BN_ALU_CFG")], values[("DPU", "BN_RELUX_CMP_VALUE")]) == (
        0x20090, 6936, 16646)
    assert values[("DPU", "EW_CFG")] == 0x10020380 and values[("DPU", "EW_OP_VALUE_0")] == (-6936) & 0xFFFFFFFF


def test_the_sigmoid_builds_lut_upload_task_translates_to_rk3588s_upload_frame():
    """Refused until REGISTER_SEMANTICS.md 46.2: every stage bypassed (EW_CFG 0x383, FEATURE_MODE_CFG 0x1e5), the
    two tables' 1,026 entries (and the frame's zero word) through the LUT port as written."""
    writes = translate_task(_vendor_task("sig", "sig"), RK3588, _shift_reader("sig"))
    values = {(block, name): value for block, name, value in writes}
    assert values[("DPU", "EW_CFG")] == 0x383 and values[("DPU", "FEATURE_MODE_CFG")] == 0x1E5
    assert values[("DPU", "LUT_CFG")] == 0 and sum(name == "LUT_ACCESS_DATA" for _, name, _ in writes) == 1027


def _with(case: str, offset: int, value: int) -> np.ndarray:
    words = TASKS[f"{case}.rk3576"].copy()
    hits = [i for i, w in enumerate(words) if int(w) & 0xFFFF == offset]
    assert hits, hex(offset)
    for index in hits:
        words[index] = np.uint64((int(words[index]) & ~(0xFFFFFFFF << 16)) | (value << 16))
    return words


@pytest.mark.parametrize("offset, value, match", [
    (0x1018, 0xC0000404, r"a 9-row window that fetches 9 rows, CBUF_BANKS.RETAIN_ROWS 1"),
    (0x1024, 0xC102000F, r"4:2 sparse weights with the decompressor off"),
    (0x1048, 0x0000000A, r"enables the input converter"),
    (0x406C, 0x00000005, r"DPU activation not decoded \(CLAMP2 = \[5, "),    # CLAMP2_MIN
    (0x1054, 0x00000001, r"writes 0x1 at offset 0x1054, which no decoded register holds"),
    (0x5034, 0x00000040, r"reads a BN or main operand, or an EW operand other than"),
    (0x40C0, 0x04440000, r"DPU.CFG_40C0 = 0x4440000, a value no decoded build writes \(0x4440100\)"),
    (0x4044, 0x00000002, r"DPU.BS_MODE = 0x2, a value no decoded build writes \(0x1\)"),   # fp16's, in int8
])
def test_mutated_vendor_words_are_refused(offset, value, match):
    with pytest.raises(UnsupportedProgramError, match=match):
        translate_task(read_task(_with("odd", offset, value), VENDOR, "odd"), RK3588, _shift_reader("odd"))


def test_bs_shift_word_bytes_are_the_two_shifts():
    """Low byte -> BS_MUL_SHIFT_VALUE, high byte -> DATA_FORMAT.BS_MUL_SHIFT_VALUE_NEG [I: 0x0e0e in
    every build]; swapped bytes must show up swapped."""
    task = _vendor_task("odd")
    writes = {(b, n): v for b, n, v in translate_task(task, RK3588, lambda a, s: b"\x0c\x0d")}
    assert RK3588.register("DPU", "BS_MUL_CFG").unpack(writes[("DPU", "BS_MUL_CFG")])["BS_MUL_SHIFT_VALUE"] == 12
    assert RK3588.register("DPU", "DATA_FORMAT").unpack(writes[("DPU", "DATA_FORMAT")])["BS_MUL_SHIFT_VALUE_NEG"] == 13


def test_encode_writes_keeps_the_block_size():
    writes = translate_task(_vendor_task("relu"), RK3588, _shift_reader("relu"))
    words = encode_writes(writes, RK3588, 139, "relu")
    assert len(words) == 139 and words[len(writes):] == [words[len(writes) - 1]] * (139 - len(writes))
    with pytest.raises(UnsupportedProgramError, match=r"needs \d+ writes, more than its 20"):
        encode_writes(writes, RK3588, 20, "relu")


def test_regcmd_rewrite_touches_task_bodies_and_the_sync_bit_only():
    """dense_rk3576_int8: records 2 and 3 (the 2-core program) end with OP_EN 0x0100001d
    (isa/RKNN_TAILS.md 1); the rewrite clears bit 24 there and leaves every other tail word and
    the padding as stored."""
    model = load_rknn(RKNN_FIXTURES_OPS / "dense_rk3576_int8" / "model.rknn")
    regcmd, records = model.program.regcmd, model.program.tasks
    words = translate_regcmd(regcmd, [[record] for record in records], VENDOR, RK3576, lambda a, s: b"\x0e\x0e",
                             "dense")   # four one-task lists: chain 0, its core-1 copy, the 2-core pair
    bodies = {i for r in records for i in range(r.regcmd_addr // 8, r.regcmd_addr // 8 + r.regcfg_amount)}
    changed = {i for i in range(len(words)) if words[i] != regcmd[i]} - bodies
    op_en = {r.regcmd_addr // 8 + r.regcfg_amount + 3 for r in records[2:]}
    assert changed == op_en
    assert all(int(words[i]) == 0x0081_0000_001D_0008 for i in op_en)
    assert all(int(regcmd[i]) == 0x0081_0100_001D_0008 for i in op_en)


@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, 138), value=st.integers(0, 0xFFFFFFFF))
def test_a_damaged_word_is_translated_or_refused_never_crashes(index, value):
    words = TASKS["relu.rk3576"].copy()
    index %= len(words)
    words[index] = np.uint64((int(words[index]) & ~(0xFFFFFFFF << 16)) | (value << 16))
    regcmd = np.concatenate([words, np.zeros(4, np.uint64)])
    record = type("Record", (), {"regcmd_addr": 0, "regcfg_amount": len(words), "enable_mask": 0x1D, "index": 0})
    try:
        out = translate_regcmd(regcmd, [[record]], VENDOR, RK3576, _shift_reader("relu"), "damaged")
    except UnsupportedProgramError:
        return
    assert len(out) == len(regcmd)


def test_a_split_conv_keeps_rows_and_writes_deltas():
    """tests/data/rk3576_vendor/tall.rknn.xz (Conv 16 -> 16, 3400x16, 3x3 pad 1; built like the
    cases above): three tasks of 1280, 1280 and 844 input rows; the 2nd and 3rd keep 2 rows in the
    CBUF (CNA 0x1018 bit 31; 1278 / 842 rows fetched, the feature address at the first fetched
    row) and the 3rd writes 32 words, a delta on the 1st (REGISTER_SEMANTICS.md 1.1). The RK3588
    form re-fetches the kept rows: its feature address is 2 rows (2 x 16 atoms of 16 bytes)
    earlier, its window 1280 / 844 rows; the 3rd task's words write only what differs from the
    1st task's RK3588 form."""
    with lzma.open(DATA / "tall.rknn.xz") as f:
        model = load_rknn(f.read(), name="tall.rknn")
    records, regcmd = model.program.tasks, model.program.regcmd
    assert [r.regcfg_amount for r in records[:3]] == [139, 139, 32]
    words = translate_regcmd(regcmd, [records[:3]], VENDOR, RK3588, lambda a, s: b"\x0e\x0e", "tall")
    blocks = [_writes(words[r.regcmd_addr // 8:r.regcmd_addr // 8 + r.regcfg_amount], RK3588) for r in records[:3]]
    vendor = [_writes(regcmd[r.regcmd_addr // 8:r.regcmd_addr // 8 + r.regcfg_amount], VENDOR) for r in records[:3]]
    row = 16 * 16
    for index, rows in ((1, 1280), (2, 844)):
        assert blocks[index][("CNA", "FEATURE_DATA_ADDR")] == vendor[index][("CNA", "FEATURE_DATA_ADDR")] - 2 * row
    assert blocks[0][("CNA", "DATA_SIZE0")] & 0x7FF == 1280 == blocks[1][("CNA", "DATA_SIZE0")] & 0x7FF
    assert blocks[2][("CNA", "DATA_SIZE0")] & 0x7FF == 844
    delta = {key for key in blocks[2]   # the translated writes (kept ones are copied as written)
             if key[1] not in KEPT.get(key[0], ()) and not key[1].startswith(KEPT_PREFIXES)}
    assert ("CNA", "FEATURE_DATA_ADDR") in delta and ("DPU", "DST_BASE_ADDR") in delta
    assert all(blocks[2][key] != blocks[0].get(key) for key in delta), "a delta writes only what changed"
    assert ("CNA", "WEIGHT_SIZE0") not in blocks[2] and ("DPU", "OUT_CVT_SCALE") not in blocks[2]
