"""The 44 vendor op fixtures (``../shared/rknn-fixtures-ops``): every file inspects and
disassembles, and ``npuemu run`` either runs it or refuses it with a one-line error.

They are rknn-toolkit2 2.5.0 builds of ops npuemu does not all run yet (Resize, LayerNorm,
exLSTM, rk3576 convs, ...). When they were made, inspect refused 16 and disasm 8 of them; the
loader's tail and const-size checks now accept what the vendor really writes
(isa/RKNN_TAILS.md). ``npuemu run`` must run exactly the fixtures of ``RUNS`` (their outputs are
compared with the vendor simulator in the tests of the modes they need: test_rknn_fixtures_run,
test_vendor_dpu_transpose, test_vendor_dpu_modes, test_rknn_rk3576, test_cna_input_convert, ...)
and refuse the others with a clean one-line NpuemuError, never a traceback. Skipped when ../shared
is absent (tests/shared_data.py).
"""

from __future__ import annotations

import importlib
import json
import lzma
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.shared_data import MISSING_REASON, RKNN_FIXTURES_OPS
from npuemu.isa.errors import EmulationError, ModelFileError
from npuemu.isa.rknn import load_rknn, plan_memory
from npuemu.tools.cli import main

relocation = importlib.import_module("npuemu.isa.rknn.relocate")   # the package re-exports a function of that name

FIXTURE_COUNT = 44   # the folder's README: 23 cases, int8 and fp16 builds
#: the 36 that run (session 10), and gru x2 (session 11: fp32 processing, REGISTER_SEMANTICS.md 38); the
#: others stop at DPU bf16 output (layernorm x4) and DPU int32 (lstm x2), REGISTER_SEMANTICS.md 32 and 35
#: - and since helper LN the layernorm x4 run too (session 11: bf16 DPU and CNA, the exNorm stream,
#: REGISTER_SEMANTICS.md 37; compared with the simulator in tests/emulator/test_vendor_layernorm.py)
#: - and the lstm x2 (helper RQ: int32 / int16 DPU and int16 conv, the exLSTM's self-writing program,
#: REGISTER_SEMANTICS.md 38; tests/emulator/test_vendor_recurrent_modes.py): all 44 run
RUNS = frozenset("""
    conv1d_fp16 conv1d_int8 conv_hardswish_fp16 conv_hardswish_int8 conv_silu_add_fp16 dense_rk3576_fp16
    dense_rk3576_int8 dynamic_shape_fp16 dynamic_shape_int8 focus_slice_fp16 focus_slice_int8 gelu_fp16 gelu_int8
    glu_fp16 glu_int8 gru_fp16 gru_int8 lstm_fp16 lstm_int8 matmul_act_fp16 matmul_act_int8 matmul_rows_fp16
    matmul_rows_int8
    qdq_prequant_int8 layernorm_decomposed_fp16 layernorm_decomposed_int8 layernorm_fp16 layernorm_int8
    resize_bilinear_2x_fp16 resize_bilinear_2x_int8 resize_nearest_2x_fp16 resize_nearest_2x_int8 se_gate_fp16
    se_gate_int8 softmax_last_fp16 softmax_last_int8 sparse_rk3576_fp16 sparse_rk3576_int8 sparse_rk3576_off_fp16
    sparse_rk3576_off_int8 transpose_heads_fp16 transpose_heads_int8 transpose_nhwc_fp16 transpose_nhwc_int8
""".split())
NAMES = sorted(path.parent.name for path in RKNN_FIXTURES_OPS.glob("*/model.rknn"))
CASES = NAMES or [pytest.param(None, marks=pytest.mark.skip(reason=MISSING_REASON))]


def _model(name: str) -> Path:
    return RKNN_FIXTURES_OPS / name / "model.rknn"


def _one_line_error(err: str, name: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, f"{name}: not a one-line refusal:\n{err}"
    assert lines[0].startswith("npuemu run: error: "), lines[0]


def test_all_fixtures_are_present():
    if not RKNN_FIXTURES_OPS.is_dir():
        pytest.skip(MISSING_REASON)
    assert len(NAMES) == FIXTURE_COUNT, NAMES


@pytest.mark.parametrize("name", CASES)
def test_inspect(name, capsys):
    assert main(["inspect", str(_model(name))]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "vendor RKNN model, format 6" in out and "single-core program" in out


@pytest.mark.parametrize("name", CASES)
def test_disasm(name, tmp_path, capsys):
    text = tmp_path / "model.s"
    assert main(["disasm", str(_model(name)), "-o", str(text)]) == 0, capsys.readouterr().err
    assert ".task 0" in text.read_text()


def _inputs(name: str, folder: Path) -> list[str]:
    """input_0 of each graph input (fixture README: input_0.npy.xz, or input_0_<name>.npy.xz)."""
    names = [entry["name"] for entry in json.loads((RKNN_FIXTURES_OPS / name / "meta.json").read_text())["inputs"]]
    shipped = ["input_0.npy.xz"] if len(names) == 1 else [f"input_0_{n}.npy.xz" for n in names]
    paths = []
    for position, file_name in enumerate(shipped):
        path = folder / f"input_{position}.npy"
        np.save(path, np.load(lzma.open(RKNN_FIXTURES_OPS / name / file_name)))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("name", CASES)
def test_run_runs_or_refuses_cleanly(name, tmp_path, capsys):
    arguments = ["run", str(_model(name))]
    for path in _inputs(name, tmp_path):
        arguments += ["--input", path]
    code = main(arguments)
    err = capsys.readouterr().err
    if code == 0:
        assert "Traceback" not in err
    else:
        assert code == 2, err
        _one_line_error(err, name)
    assert (code == 0) == (name in RUNS), err


# --- the three relaxations (isa/RKNN_TAILS.md), and what they still refuse --------------------------

WORD = 8


def _with_words(name: str, words: dict[int, int]) -> bytes:
    """The fixture's bytes with regcmd words replaced (index -> new 64-bit word)."""
    if not RKNN_FIXTURES_OPS.is_dir():
        pytest.skip(MISSING_REASON)
    data = bytearray(_model(name).read_bytes())
    model = load_rknn(bytes(data))
    start = model.blob_offsets[model.tensors[model.program.regcmd_tensor].blob_index]
    for index, word in words.items():
        data[start + index * WORD:start + (index + 1) * WORD] = word.to_bytes(WORD, "little")
    return bytes(data)


def test_rk3576_two_core_chain_ends_carry_hi16():
    model = load_rknn(_with_words("dense_rk3576_int8", {}))
    ends = [(tail.word_index, tail.amount_word) for tail in model.program.tails if tail.amount_word >> 16]
    assert ends == [(426, 0x10000), (570, 0x10000)]
    assert all(model.program.tail_of(model.program.tasks[i]).ends_chain for i in (2, 3))


def test_zero_link_that_would_fetch_is_still_refused():
    # word 427 with HI16 1 and a fetch amount of 1: a zero link would fetch from offset 0
    with pytest.raises(ModelFileError, match=r"regcmd word 426 .*0 at a chain end \(fetch amount 0; here 1\)"):
        load_rknn(_with_words("dense_rk3576_int8", {427: 0x0101_0001_0001_0014}))


def test_lstm_repeated_tail_links_through_its_base_writes():
    model = load_rknn(_with_words("lstm_int8", {}))
    tail = model.program.tail_of(model.program.tasks[75])
    assert (tail.word_index, tail.base_words, tail.next_offset, tail.amount) == (11080, (11077, 11078, 11079),
                                                                                 0x15A80, 0x24)
    regcmd = model.program.regcmd.copy()
    patched = relocation._patch_tails(model, regcmd, 0x10000)
    assert {11077, 11078, 11079} <= set(patched)
    assert all((int(regcmd[w]) >> 16) & 0xFFFF_FFFF == 0x25A80 for w in (11077, 11078, 11079))


def test_lstm_base_writes_that_disagree_are_refused():
    with pytest.raises(ModelFileError, match=r"repeats the PC_REGISTER_AMOUNTS write, but the PC_BASE_ADDRESS "
                                             r"writes before it .* disagree: 0x15a00, 0x15a80"):
        load_rknn(_with_words("lstm_int8", {11077: 0x0101_0001_5A00_0010}))


def test_lstm_repeated_amounts_without_base_write_is_refused():
    other = 0x2001_0000_0000_506C   # the DPU_RDMA write that precedes the PC words in ordinary blocks
    with pytest.raises(ModelFileError, match="no PC_BASE_ADDRESS write precedes it"):
        load_rknn(_with_words("lstm_int8", {11077: other, 11078: other, 11079: other}))


def test_lstm_run_is_refused_as_self_modifying():
    with pytest.raises(EmulationError, match="placeholder tensor 0, i.e. into the regcmd buffer itself"):
        relocation.relocate(load_rknn(_with_words("lstm_int8", {})))


def test_padded_consts_follow_the_vendor_const_table():
    model = load_rknn(_with_words("layernorm_int8", {}))
    weight = {p.name: (p.offset, p.size) for p in plan_memory(model).placements if p.region.value == "weight"}
    # librknnc_tables.txt: gamma1 0x0-0x100, beta2 0x100-0x300, x_rs_i1 0x300-0x320, y-rs_i1 0x340-0x358
    assert weight == {"gamma1": (0, 0x100), "beta2": (0x100, 0x200), "x_rs_i1": (0x300, 0x20), "y-rs_i1": (0x340, 0x18)}


@pytest.mark.parametrize("change, accepted", [
    ({}, True),                                  # scales2: blob 16, slot 256 (resize_nearest_2x_int8)
    ({"kind": 4}, False),                        # only kind-5 consts are padded
    ({"size": 65}, False),                       # not whole 64-byte granules
    ({"size": 16 + 4096 + 48}, False),           # a page or more of padding
    ({"size": 0}, False),                        # blob longer than its slot
])
def test_padding_rule_stays_narrow(change, accepted):
    model = load_rknn(_with_words("resize_nearest_2x_int8", {}))
    tensor = replace(model.tensor("scales2"), **change)
    blob = len(model.blob(tensor))
    assert relocation._is_padded_const(tensor, blob) is accepted
