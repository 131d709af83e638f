"""Assembler and disassembler: exact round trips, the text forms, errors and the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.isa.asm import assemble
from npuemu.isa.chain import encode_chain
from npuemu.isa.disasm import disassemble
from npuemu.isa.errors import EncodingError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain, RegisterWrite, Task
from npuemu.isa.words import MARKER_WORD, encode_write, op_enable_word, words_to_bytes
from npuemu.tools.cli import main

RK3588 = load_regmap("rk3588")
REGISTERS = list(RK3588.registers())
LISTING_DIR = Path(__file__).parents[2] / ".." / "shared" / "docs" / "vendor-corpus" / "regcmd"

_valid_write = st.builds(lambda r, v: encode_write(RK3588, r.block, r.name, v), st.sampled_from(REGISTERS),
                         st.integers(0, 2**32 - 1))
_words = st.one_of(
    _valid_write, _valid_write, st.just(0), st.just(MARKER_WORD),
    st.integers(0, 0x7F).map(lambda m: op_enable_word(m & RK3588.op_enable_mask_known)),
    st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1).map(lambda v: (0x0081 << 48) | (v << 16) | 8),
)


def _chains():
    writes = st.builds(lambda r, v: RegisterWrite(r.block, r.name, v), st.sampled_from(REGISTERS),
                       st.integers(0, 2**32 - 1))
    masks = st.sets(st.sampled_from(list(RK3588.op_enable_blocks))).map(lambda b: sum(1 << x for x in b))
    tasks = st.builds(Task, st.lists(writes, max_size=20).map(tuple), masks, amount_hi16=st.integers(0, 3))
    return st.lists(tasks, min_size=1, max_size=4).map(lambda t: Chain(tuple(t)))


@given(st.binary(max_size=300))
def test_round_trip_of_arbitrary_bytes(data):
    assert assemble(disassemble(data, RK3588)) == data


@given(st.lists(_words, max_size=60), st.binary(max_size=7))
def test_round_trip_of_mixed_words(words, trailing):
    data = words_to_bytes(words) + trailing
    assert assemble(disassemble(data, RK3588, base_addr=0x1000)) == data


@given(_chains(), st.integers(0, 1000).map(lambda k: 64 * k))
def test_round_trip_of_encoded_chains(chain, base_addr):
    encoded = encode_chain(chain, RK3588, base_addr)
    text = disassemble(encoded.data, RK3588, base_addr)
    assert assemble(text) == encoded.data
    assert len(re.findall(r"^\.task ", text, re.M)) == len(chain.tasks)
    assert len(re.findall(r"^TAIL ", text, re.M)) == 4 * len(chain.tasks)


def _listing_blobs():
    paths = sorted(LISTING_DIR.glob("*.txt"))
    if len(paths) != 13:
        pytest.fail(f"expected 13 vendor regcmd listings in {LISTING_DIR.resolve()}, found {len(paths)}")
    for path in paths:
        text = path.read_text()
        words = [0] * int(re.search(r"regcmd blob (\d+) words", text).group(1))
        for match in re.finditer(r"^\s*(\d+) ([0-9a-f]{16}) ", text, re.M):
            words[int(match.group(1))] = int(match.group(2), 16)
        yield path.stem, words_to_bytes(words)


def test_round_trip_of_the_rknn_streams():
    for name, blob in _listing_blobs():
        text = disassemble(blob, RK3588)
        assert ".word" not in text, name  # every word of the real streams decodes
        assert assemble(text) == blob, name


def test_disassembly_shows_fields_tails_and_padding():
    chain = Chain((
        Task((RegisterWrite("CNA", "CONV_CON2", 0x100001D0),), 0x1D, amount_hi16=1),
        Task((RegisterWrite("DPU", "OUT_CVT_OFFSET", 0xFFFFFF80),), 0x18),
    ))
    text = disassemble(encode_chain(chain, RK3588).data, RK3588)
    assert "CNA      CONV_CON2              = 0x100001d0  ; KERNEL_GROUP=0 FEATURE_GRAINS=29" in text
    assert "rsv=0x10000000" in text
    assert "OUT_CVT_OFFSET=-128" in text
    assert "TAIL PC       BASE_ADDRESS           = 0x00000040  ; PC_SOURCE_ADDR=4 PC_SEL=0 -> next task at word 8" in text
    assert "HI16=1 PC_DATA_AMOUNT=2 -> fetches 6 words" in text
    assert "TAIL ZERO  ; chain ends after this task" in text
    assert "TAIL OP_EN = 0x0000001d  ; CNA CORE DPU DPU_RDMA" in text
    assert ".align 64  ; 3 zero word(s)" in text
    assert ".task 1  ; @0x00000040 word 8: 1 writes, enable 0x18 (DPU DPU_RDMA)" in text


def test_undecodable_words_and_trailing_bytes():
    data = words_to_bytes([0x0201000000001234, 0x0401000000002004, MARKER_WORD | 5]) + b"\x01\x02"
    text = disassemble(data, RK3588)
    assert ".word 0x0201000000001234  ; block CNA has no register at offset 0x1234" in text
    assert ".word 0x0401000000002004  ; unknown target 0x0401" in text
    assert ".word 0x0041000000000005  ; marker with a non-zero payload" in text
    assert ".byte 0x01, 0x02" in text
    assert "(incomplete)" in text
    assert assemble(text) == data


def test_field_form_equals_value_form_and_names_are_case_insensitive():
    by_fields = assemble("CNA CONV_CON1 CONV_MODE=3 IN_PRECISION=0  ; comment\n")
    assert by_fields == assemble("cna conv_con1 = 0x3") == assemble("TAIL CNA CONV_CON1 conv_mode = 3")
    assert by_fields == encode_write(RK3588, "CNA", "CONV_CON1", 3).to_bytes(8, "little")
    assert assemble("DPU OUT_CVT_OFFSET = -128") == assemble("DPU OUT_CVT_OFFSET OUT_CVT_OFFSET=-128")
    assert assemble("CNA CONV_CON1") == assemble("CNA CONV_CON1 = 0")


def test_special_words_and_directives():
    text = """
        .map rk3588
        .base 0x1000
        .task 0 ; informational in raw mode
        ZERO
        MARKER
        OP_EN CNA CORE DPU DPU_RDMA
        OP_EN = 0x60
        .align 64
        .zero 2
        .word 0x0123456789abcdef, 0x1
        .byte 1, 0x2
    """
    words = [0, MARKER_WORD, op_enable_word(0x1D), op_enable_word(0x60), 0, 0, 0, 0, 0, 0,
             0x0123456789ABCDEF, 1]
    assert assemble(text) == words_to_bytes(words) + b"\x01\x02"


def test_map_directive_selects_the_family():
    assert assemble(".map rk356x\nBLOCK_2000 S_POINTER = 0xe") == (0x04010000000E2004).to_bytes(8, "little")
    with pytest.raises(EncodingError, match="no block 'BLOCK_2000'"):
        assemble("BLOCK_2000 S_POINTER = 0xe")
    with pytest.raises(EncodingError, match="conflicts with the map in use, rk3588"):
        assemble(".map rk356x\n", RK3588)


def test_chain_mode_lays_out_tails():
    text = """
        .chain base=0x40
        .task enable=CNA,CORE,DPU,DPU_RDMA hi16=1
            CNA CONV_CON1 CONV_MODE=3
            DPU OUT_CVT_OFFSET = -128
        .task enable=0x60
            PPU OPERATION_MODE_CFG POOLING_METHOD=1 FLYING_MODE=1
    """
    chain = Chain((
        Task((RegisterWrite("CNA", "CONV_CON1", 3), RegisterWrite("DPU", "OUT_CVT_OFFSET", 0xFFFFFF80)), 0x1D,
             amount_hi16=1),
        Task((RegisterWrite("PPU", "OPERATION_MODE_CFG", 0x11),), 0x60),
    ))
    assert assemble(text) == encode_chain(chain, RK3588, 0x40).data


@pytest.mark.parametrize("text, message", [
    ("CNA CONV_CON9 = 1", r"<input>:1: block CNA has no register 'CONV_CON9'; close matches: .*CONV_CON1"),
    ("\nCNA CONV_CON1 CONV_MODE=16", r"<input>:2: CNA.CONV_CON1.CONV_MODE \(bits 3:0, unsigned 0..15\): value 16"),
    ("CAN CONV_CON1 = 1", r"no block 'CAN'; close matches: CNA"),
    ("CNA CONV_CON1 = 0x100000000", "does not fit 32 bits"),
    ("CNA CONV_CON1 = 1 2", "expected one value after '='"),
    ("CNA CONV_CON1 CONV_MODE 3", "FIELD=VALUE pairs"),
    ("CNA CONV_CON1 = zz", "bad number"),
    ("BOGUS", r"expected 'BLOCK REGISTER = VALUE'"),
    ("OP_EN = 0x2", "bits 0x2 select no block"),
    ("OP_EN CNA PC", "block PC of map rk3588 has no op-enable bit"),
    ("MARKER 1", "MARKER takes no operands"),
    ("TAIL", "TAIL must be followed by a word"),
    (".align 12", "positive multiple of 8"),
    (".word 0x10000000000000000", "not a 64-bit unsigned value"),
    (".byte 256", "values 0..255"),
    (".zero -1", "word count >= 0"),
    (".frobnicate", "unknown directive .frobnicate"),
    (".map rk9999", "no register map named 'rk9999'"),
    ("ZERO\n.chain", ".chain must come once, before any word"),
    (".chain\nCNA CONV_CON1 = 1", "must follow a .task line"),
    (".chain\n.task enable=0x1d\nZERO", "lays out the tails itself"),
    (".chain\n.task enable=0x1d\nTAIL MARKER", "lays out the tails itself"),
    (".chain\n.task\n", "needs enable=MASK"),
    (".chain\n.task enable=0x1d speed=3", "unknown options speed"),
    (".chain\n.align 64", "not allowed in chain mode"),
    (".chain base=0x10\n.task enable=0x1d", "<input>: chain base address 16 is not a 64-byte aligned"),
])
def test_errors_name_the_line(text, message):
    with pytest.raises(EncodingError, match=message):
        assemble(text)


def test_cli_round_trip(tmp_path, capsys):
    blob = encode_chain(Chain((Task((RegisterWrite("CNA", "CONV_CON1", 3),), 0x1D),)), RK3588).data
    (tmp_path / "in.bin").write_bytes(blob)
    assert main(["disasm", str(tmp_path / "in.bin"), "--base-addr", "0x2000"]) == 0
    text = capsys.readouterr().out
    assert ".base 0x00002000" in text and "CONV_MODE=3" in text
    (tmp_path / "prog.s").write_text(text)
    assert main(["asm", str(tmp_path / "prog.s"), "-o", str(tmp_path / "out.bin")]) == 0
    assert (tmp_path / "out.bin").read_bytes() == blob
    assert main(["disasm", str(tmp_path / "in.bin"), "--map", "rk356x", "-o", str(tmp_path / "x.s")]) == 0
    assert ".map rk356x" in (tmp_path / "x.s").read_text()
    assert main(["asm", str(tmp_path / "prog.s")]) == 0
    assert (tmp_path / "prog.bin").read_bytes() == blob


def test_cli_errors_have_no_traceback(tmp_path, capsys):
    (tmp_path / "bad.s").write_text("CNA CONV_CON1 CONV_MODE=99\n")
    assert main(["asm", str(tmp_path / "bad.s"), "-o", str(tmp_path / "o.bin")]) == 2
    err = capsys.readouterr().err
    assert "bad.s:1: CNA.CONV_CON1.CONV_MODE" in err and "Traceback" not in err
    assert main(["disasm", str(tmp_path / "missing.bin")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["disasm", str(tmp_path / "bad.s"), "--map", "nope"]) == 2
    assert "no register map named 'nope'" in capsys.readouterr().err
