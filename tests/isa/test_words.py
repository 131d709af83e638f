"""The 64-bit command word: encoding, decoding and classification."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.isa.errors import EncodingError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.words import (
    MARKER_WORD, WordKind, decode_word, encode_word, encode_write, op_enable_word, split_word,
    words_from_bytes, words_to_bytes,
)

REGMAP = load_regmap("rk3588")
REGISTERS = list(REGMAP.registers())


@given(st.integers(0, 0xFFFF), st.integers(0, 2**32 - 1), st.integers(0, 0xFFFF))
def test_encode_split_round_trip(target, value, offset):
    word = encode_word(target, value, offset)
    assert 0 <= word < 2**64
    assert split_word(word) == (target, value, offset)


@given(st.integers(0, 2**64 - 1))
def test_split_encode_round_trip_and_decode_never_raises(word):
    assert encode_word(*split_word(word)) == word
    decoded = decode_word(word, REGMAP)
    assert decoded.raw == word
    assert (decoded.kind is WordKind.UNKNOWN) == (decoded.problem is not None)


@given(st.sampled_from(REGISTERS), st.integers(0, 2**32 - 1))
def test_every_register_write_decodes_to_itself(register, value):
    word = encode_write(REGMAP, register.block, register.name, value)
    decoded = decode_word(word, REGMAP)
    assert decoded.kind is WordKind.WRITE
    assert (decoded.block, decoded.register, decoded.value) == (register.block, register.name, value)
    assert decoded.offset == register.offset


def test_word_layout_matches_the_isa_doc():
    # CNA CBUF_CON0 = 0x84 from the rep01 listing, word 0.
    assert encode_write(REGMAP, "CNA", "CBUF_CON0", 0x84) == 0x0201000000841040
    # The TRM's op-enable example enables every block.
    assert op_enable_word(0x7F & REGMAP.op_enable_mask_known) == 0x00810000007D0008
    assert MARKER_WORD == 0x0041000000000000


@pytest.mark.parametrize("word, kind, problem", [
    (0, WordKind.ZERO, None),
    (MARKER_WORD, WordKind.MARKER, None),
    (0x00810000001D0008, WordKind.OP_ENABLE, None),
    (0x00810000001D0010, WordKind.UNKNOWN, "register offset 0x0010, expected 0x0008"),
    (0x00810000001F0008, WordKind.UNKNOWN, "bits 0x2 select no block"),
    (0x0401000000002004, WordKind.UNKNOWN, "unknown target 0x0401"),
    (0x0201000000001234, WordKind.UNKNOWN, "CNA has no register at offset 0x1234"),
    (0x0000000000000001, WordKind.UNKNOWN, "unknown target 0x0000"),
])
def test_classification(word, kind, problem):
    decoded = decode_word(word, REGMAP)
    assert decoded.kind is kind
    assert (problem is None and decoded.problem is None) or problem in decoded.problem


def test_rk356x_block_2000_decodes():
    decoded = decode_word(0x04010000000E2004, load_regmap("rk356x"))
    assert (decoded.kind, decoded.block, decoded.register) == (WordKind.WRITE, "BLOCK_2000", "S_POINTER")


@pytest.mark.parametrize("args", [(0x10000, 0, 0), (0, 2**32, 0), (0, 0, -1), (True, 0, 0), (0, 1.0, 0)])
def test_encode_rejects_out_of_range_parts(args):
    with pytest.raises(EncodingError, match="is not a"):
        encode_word(*args)


def test_encode_write_checks_names_and_value():
    with pytest.raises(EncodingError, match=r"close matches: .*CBUF_CON0"):
        encode_write(REGMAP, "CNA", "CBUF_CON", 0)
    with pytest.raises(EncodingError, match="value"):
        encode_write(REGMAP, "CNA", "CBUF_CON0", -1)


@given(st.lists(st.integers(0, 2**64 - 1), max_size=20))
def test_bytes_round_trip(words):
    data = words_to_bytes(words)
    assert len(data) == 8 * len(words)
    assert words_from_bytes(data) == words


def test_bytes_are_little_endian_and_whole_words():
    assert words_to_bytes([0x0201000000841040]) == bytes.fromhex("4010840000000102")
    with pytest.raises(EncodingError, match="3 bytes left over at byte offset 0x8"):
        words_from_bytes(bytes(11))
    with pytest.raises(EncodingError, match="word 1"):
        words_to_bytes([0, 2**64])
