"""Conv + a DPU LUT activation in the vendor's rk3576 layout, both ways (isa/rknn/rk3576_lut.py;
emulator/REGISTER_SEMANTICS.md 46, compiler/LOWERING.md 46).

References: the vendor itself. ``tests/data/rk3576_vendor/lut_pairs.npz.xz`` holds, for Conv 3x3 16 -> 16 pad 1
on 12 x 12 followed by Sigmoid (sig), Tanh (tanh), HardSwish (hsw, opset 14), x * Sigmoid(x) (silu) and
HardSigmoid (hsig), built by rknn-toolkit2 2.5.0 int8 (3 N(0, 1) calibration samples) for rk3576 and for
rk3588: the conv task of chain 0 (task record 1; record 0 uploads the table) of each build
(NAME.rk3576 / NAME.rk3588, raw command words), LE[0] and LO[512] of the uploaded table (NAME.ends) and the
64 bytes of ``y_BnCfg_BNcfgTensor`` (NAME.bn), read with npuemu's reader (the ``.rknn`` files are 40-67 KB).
Own builds in the vendor layout must run bit-identically to the same build at RK3588 positions.
"""

from __future__ import annotations

import io
import lzma

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_lut import bn_record, table_ends
from npuemu.isa.rknn.rk3576_pack import check_round_trip, dpu_record, dpu_vendor_writes, vendor_writes
from npuemu.isa.rknn.rk3576_program import translate_task
from npuemu.isa.words import TARGET_OP_ENABLE, encode_write
from tests.compiler.test_rk3576_vendor_emit import DATA, RK3588, SHIFT, VENDOR, _values, conv_model
from tests.compiler.test_rk3576_vendor_forms import _same, _with

with lzma.open(DATA / "lut_pairs.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    PAIRS = {name: _archive[name] for name in _archive.files}
CASES = ("sig_i8", "tanh_i8", "hsw_i8", "silu_i8", "hsig_i8")


def _words(writes):
    return [encode_write(VENDOR, block, name, value) for block, name, value in writes]


def _reader(case):
    """The vendor's memory as the tasks read it: the shift word (2-byte reads), the BN record (64)."""
    record = PAIRS[f"{case}.bn"].tobytes()
    return lambda address, size: (record if size == 64 else SHIFT.to_bytes(2, "little"))[:size]


@pytest.mark.parametrize("case", CASES)
def test_lut_conv_repacks_to_the_vendors_words(case):
    """The rk3588 twin's conv task re-packed with the table's ends is the vendor's rk3576 task word for
    word (139 words; addresses 0 in the stored files), its BN record the vendor's record byte for byte."""
    twin = _values(PAIRS[f"{case}.rk3588"], RK3588)
    # the twin's second task writes no CNA / CORE S_POINTER; the vendor's writes its DPU value (0x30) there
    twin.update({(block, "S_POINTER"): twin[("DPU", "S_POINTER")] for block in ("CNA", "CORE")})
    ends = tuple(int(e) for e in PAIRS[f"{case}.ends"])
    writes = vendor_writes(twin, RK3588, shift_address=0, where=case, lut=(0, ends))
    assert _words(writes) == [int(w) for w in PAIRS[f"{case}.rk3576"]]
    assert bn_record(twin, RK3588) == PAIRS[f"{case}.bn"].tobytes()


@pytest.mark.parametrize("case", CASES)
def test_vendor_lut_conv_translates_to_its_twin(case):
    """Register for register but CONV_CON2 (FEATURE_GRAINS, unread) - the BN stage from the record."""
    task = read_task(PAIRS[f"{case}.rk3576"], VENDOR, case)
    ours = {(b, n): v for b, n, v in translate_task(task, RK3588, _reader(case))}
    twin = _values(PAIRS[f"{case}.rk3588"], RK3588)
    assert {key for key in set(ours) & set(twin) if ours[key] != twin[key]} == {("CNA", "CONV_CON2")}
    assert ours[("DPU", "BN_CFG")] == 0x20040 and ours[("DPU", "LUT_CFG")] == 0x68


def _lanes(words, name):
    return next((int(w) >> 16) & 0xFFFFFFFF for w in words
                if VENDOR.block_for_target(int(w) >> 48).register_at(int(w) & 0xFFFF).name == name)


def test_the_out_of_range_words_are_the_tables_ends():
    """0x4188-0x4194 hold LE[0] and LO[512] in lanes 1-3, lane 0 zero [V: every pair]; an independent
    reading of the words, not the packer's."""
    for case in CASES:
        words, (low, high) = PAIRS[f"{case}.rk3576"], (int(e) for e in PAIRS[f"{case}.ends"])
        assert _lanes(words, "LUTV_UFLOW_VALUE01") == low << 16 and _lanes(words, "LUTV_UFLOW_VALUE23") == low * 0x10001
        assert _lanes(words, "LUTV_OFLOW_VALUE01") == high << 16 and _lanes(words, "LUTV_OFLOW_VALUE23") == high * 0x10001


def test_table_ends_reads_the_upload_and_refuses_other_shapes():
    upload = [("LUT_ACCESS_CFG", 0x20000)] + [("LUT_ACCESS_DATA", i) for i in range(513)]
    upload += [("LUT_ACCESS_CFG", 0x30000)] + [("LUT_ACCESS_DATA", 1000 + i) for i in range(513)]
    assert table_ends(upload) == (0, 1512)
    with pytest.raises(UnsupportedProgramError, match="two of 513"):
        table_ends(upload[:-1])


def test_a_lut_the_vendor_form_cannot_say_is_refused_by_name():
    twin = _values(PAIRS["sig_i8.rk3588"], RK3588)
    uneven = {**twin, ("DPU", "LUT_LO_END"): 0x2000}
    with pytest.raises(UnsupportedProgramError, match="two equal halves"):
        vendor_writes(uneven, RK3588, shift_address=0, where="t", lut=(0, (0, 0)))
    sloped = {**twin, ("DPU", "LUT_LE_SLOPE_SCALE"): 0x100}
    with pytest.raises(UnsupportedProgramError, match="LE slope"):
        vendor_writes(sloped, RK3588, shift_address=0, where="t", lut=(0, (0, 0)))
    writes = vendor_writes(twin, RK3588, shift_address=0, where="t", lut=(0, (59, 32708)))
    check_round_trip(twin, RK3588, VENDOR, writes, SHIFT, "t", record=bn_record(twin, RK3588))
    with pytest.raises(UnsupportedProgramError, match="comes back from the vendor"):   # another record: seen
        check_round_trip(twin, RK3588, VENDOR, writes, SHIFT, "t", record=bytes(64))


# --- own builds -------------------------------------------------------------------------------


def lut_model(op, kernel=(3, 3), cin=16, cout=16, size=(12, 20), **attributes):
    model = conv_model(cin, cout, size, kernel, (1, 1), (kernel[0] // 2, kernel[1] // 2) * 2)
    if op == "Silu":   # x * Sigmoid(x): npuemu fuses it into one LUT
        model = _with(model, helper.make_node("Sigmoid", ["t"], ["s"]))
        model.graph.node.append(helper.make_node("Mul", ["t", "s"], ["y"]))
        return model
    model = _with(model, helper.make_node(op, ["t"], ["y"], **attributes))
    model.opset_import[0].version = 14
    return model


@pytest.mark.parametrize("op", ["Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Silu"])
def test_own_lut_conv_build_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, op):
    _same(lut_model(op), 16, monkeypatch)


@pytest.mark.parametrize("op, cin, cout, size, kernel", [("Sigmoid", 16, 40, (9, 7), (1, 1)),
                                                        ("Sigmoid", 16, 64, (20, 24), (3, 3)),
                                                        ("HardSwish", 3, 16, (224, 224), (3, 3))])
def test_own_lut_convs_of_other_shapes_run_like_the_old_layout(monkeypatch, op, cin, cout, size, kernel):
    """The last (an image input, stored unpacked): three row tasks, one of them without a table upload of its
    own (it takes the ends of the table last uploaded, emit_rk3576._lut_parts)."""
    built = _same(lut_model(op, kernel=kernel, cin=cin, cout=cout, size=size), cin, monkeypatch, size=size)
    regcmd = next(section for section in built.sections if section.name == "regcmd").data
    uploads = sum(int.from_bytes(regcmd[i:i + 8], "little") & 0xFFFF == 0x4100 and regcmd[i + 4] & 2
                  for i in range(0, len(regcmd), 8))
    assert uploads and uploads % 2 == 0                                  # table 0 and table 1 each time
    assert size != (224, 224) or (_tasks(built), uploads) == (3, 4)      # a task without an upload


def _tasks(built) -> int:
    """Conv tasks in the regcmd (their op-enable words)."""
    regcmd = next(section for section in built.sections if section.name == "regcmd").data
    words = [int.from_bytes(regcmd[i:i + 8], "little") for i in range(0, len(regcmd), 8)]
    return sum(word >> 48 == TARGET_OP_ENABLE and (word >> 16) & 0xFFFFFFFF == 0x1D for word in words)


# --- the SE gate's per-channel Mul (REGISTER_SEMANTICS.md 46.3) ---------------------------------


def _se_task(target: str):
    """The vendor's DPU-only Mul (the last task of chain 0) of the committed 8-channel SE gate build
    (tests/emulator/test_rknn_rk3576_lut.py says how it was made)."""
    model = load_rknn(lzma.decompress((DATA / f"se8_int8{'' if target == 'rk3576' else '_rk3588'}.rknn.xz")
                                      .read_bytes()), target)
    record = model.program.tasks[model.program.chains[0].tasks[-1]]
    words = model.program.regcmd[record.regcmd_addr // 8:record.regcmd_addr // 8 + record.regcfg_amount]
    return [int(w) for w in words], record.enable_mask


def test_se_gate_mul_repacks_to_the_vendors_words_and_translates_to_its_twin():
    """ERDMA_DATA_MODE 0 with the whole-operand Mul's 0x407C; 8 real channels in DPU 0x402C, the 16 computed in
    DPU_RDMA 0x5014; the twin's EW_CFG 0x804002c4 (EW_DATA_MODE 0) back from the ERDMA word."""
    vendor, enable = _se_task("rk3576")
    twin = _values(_se_task("rk3588")[0], RK3588)
    assert enable == 0x18 and twin[("DPU", "EW_CFG")] == 0x804002C4 and twin[("DPU", "DATA_CUBE_CHANNEL")] == 0x7000F
    record = dpu_record(twin, RK3588)
    writes = dpu_vendor_writes(twin, RK3588, "se8", 0)
    assert _words(writes) == vendor
    check_round_trip(twin, RK3588, VENDOR, writes, 0, "se8", 0x18, record)
    ours = {(b, n): v for b, n, v in translate_task(read_task(vendor, VENDOR, "se8", 0x18), RK3588,
                                                    lambda address, size: record[:size])}
    free = {("DPU_RDMA", "FEATURE_MODE_CFG"): 0x8}   # MRDMA_FP16TOFP32_EN: the vendor sets it, no unit reads it here
    differ = {key for key in set(ours) & set(twin) if (ours[key] ^ twin[key]) & ~free.get(key, 0)}
    assert differ <= {("DPU", "LUT_LE_SLOPE_SHIFT"), ("DPU", "LUT_LO_SLOPE_SCALE"), ("DPU", "LUT_LO_SLOPE_SHIFT")}
    assert ours[("DPU", "EW_CFG")] == 0x804002C4 and ours[("DPU", "DATA_CUBE_CHANNEL")] == 0x7000F


def se_model(channels, gate="HardSigmoid", size=(12, 20)):
    """x -> Conv 3x3 + Relu -> t; y = t * gate(Conv1x1(GlobalAveragePool(t))) (PP-LCNet's SE block)."""
    model = conv_model(channels, channels, size, (3, 3), (1, 1), (1, 1, 1, 1), relu=True)
    rng = np.random.default_rng(2)
    model.graph.node[-1].output[0] = "t"   # the Identity
    model.graph.initializer.extend([
        numpy_helper.from_array((rng.normal(size=(channels, channels, 1, 1)) * 0.3).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, channels).astype(np.float32), "b2")])
    model.graph.node.extend([helper.make_node("GlobalAveragePool", ["t"], ["p"]),
                             helper.make_node("Conv", ["p", "w2", "b2"], ["c2"], kernel_shape=[1, 1]),
                             helper.make_node(gate, ["c2"], ["g"]), helper.make_node("Mul", ["t", "g"], ["y"])])
    return model


@pytest.mark.parametrize("channels, gate", [(8, "HardSigmoid"), (16, "Sigmoid"), (40, "HardSigmoid")])
def test_own_se_gate_build_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, channels, gate):
    _same(se_model(channels, gate), channels, monkeypatch)
