"""Tasks and chains: layout, tails, fetch amounts, round trips and malformed input."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.isa.chain import (
    DecodedChain, decode_chain, encode_chain, fetch_amount, fetch_words, segment_words,
)
from npuemu.isa.errors import EncodingError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain, RegisterWrite, Task, write
from npuemu.isa.words import MARKER_WORD, encode_write, op_enable_word, words_from_bytes

RK3588 = load_regmap("rk3588")
RK356X = load_regmap("rk356x")


def _tasks(regmap):
    registers = list(regmap.registers())
    writes = st.builds(lambda r, v: RegisterWrite(r.block, r.name, v), st.sampled_from(registers),
                       st.integers(0, 2**32 - 1))
    bits = list(regmap.op_enable_blocks)
    masks = st.lists(st.sampled_from(bits), unique=True).map(lambda b: sum(1 << x for x in b))
    return st.builds(Task, st.lists(writes, max_size=40).map(tuple), masks,
                     amount_hi16=st.integers(0, 0xFFFF))


def _chains(regmap):
    return st.lists(_tasks(regmap), min_size=1, max_size=5).map(lambda t: Chain(tuple(t)))


def _decode(encoded, regmap=RK3588):
    return decode_chain(encoded.data, regmap, encoded.base_addr, encoded.task_addresses[0],
                        encoded.first_amount, encoded.scale)


def _conv_task(rows: int) -> Task:
    writes = (
        write(RK3588, "CNA", "DATA_SIZE0", DATAIN_WIDTH=56, DATAIN_HEIGHT=rows),
        write(RK3588, "CNA", "CONV_CON1", CONV_MODE=0),
        write(RK3588, "DPU", "OUT_CVT_OFFSET", OUT_CVT_OFFSET=-128),
    )
    return Task(writes, RK3588.op_enable_mask(["CNA", "CORE", "DPU", "DPU_RDMA"]))


@pytest.mark.parametrize("writes, scale, amount", [
    (126, 2, 0x40), (122, 2, 62), (26, 2, 14), (23, 2, 13), (17, 2, 10), (69, 2, 36),
    (1097, 2, 550), (0, 2, 1), (13, 2, 8), (108, 2, 55), (12, 2, 7), (126, 1, 129), (0, 1, 3),
])
def test_fetch_amount_formula(writes, scale, amount):
    assert fetch_amount(writes, scale) == amount
    assert writes + 4 <= fetch_words(amount, scale) < writes + 4 + scale


def test_fetch_amount_limits():
    assert fetch_amount(2 * 0x10000 - 4, 2) == 0xFFFF
    with pytest.raises(EncodingError, match="more than the 16-bit field holds"):
        fetch_amount(2 * 0x10000 - 3, 2)
    with pytest.raises(EncodingError, match="scale 3"):
        fetch_amount(1, 3)


def test_layout_and_tail_words_match_rknn_streams():
    chain = Chain((_conv_task(29), _conv_task(29), _conv_task(3)))
    encoded = encode_chain(chain, RK3588, base_addr=0x1000)
    assert encoded.task_addresses == (0x1000, 0x1040, 0x1080)
    assert encoded.write_counts == (3, 3, 3)
    assert encoded.first_amount == fetch_amount(3, 2) == 3
    assert len(encoded.data) == 3 * 64
    words = words_from_bytes(encoded.data)
    assert words[3:8] == [
        encode_write(RK3588, "PC", "BASE_ADDRESS", 0x1040),
        encode_write(RK3588, "PC", "REGISTER_AMOUNTS", 3),
        MARKER_WORD, op_enable_word(0x1D), 0,
    ]
    # The last task's tail starts with a literal zero word and carries amount 0.
    assert words[16 + 3:16 + 7] == [0, encode_write(RK3588, "PC", "REGISTER_AMOUNTS", 0), MARKER_WORD,
                                    op_enable_word(0x1D)]


def test_amount_hi16_is_carried():
    chain = Chain((Task(_conv_task(1).writes, 0x1D, amount_hi16=2), _conv_task(2)))
    words = words_from_bytes(encode_chain(chain, RK3588).data)
    assert words[4] == encode_write(RK3588, "PC", "REGISTER_AMOUNTS", 0x20003)
    assert _decode(encode_chain(chain, RK3588)).chain == chain


@given(_chains(RK3588), st.integers(0, 2**20).map(lambda k: 64 * k))
def test_chain_round_trip_property(chain, base_addr):
    encoded = encode_chain(chain, RK3588, base_addr)
    assert len(encoded.data) % 64 == 0
    assert all(address % 64 == 0 for address in encoded.task_addresses)
    decoded = _decode(encoded)
    assert decoded.chain == chain
    assert decoded.task_addresses == encoded.task_addresses
    assert encode_chain(decoded.chain, RK3588, base_addr).data == encoded.data


@given(_chains(RK356X))
def test_chain_round_trip_at_scale_one(chain):
    encoded = encode_chain(chain, RK356X)
    assert encoded.scale == 1
    assert encoded.first_amount == len(chain.tasks[0].writes) + 3
    assert _decode(encoded, RK356X).chain == chain


def _needed_bytes(encoded) -> int:
    """Bytes the PC fetches, from the start of the buffer to the end of the last fetch."""
    ends = [address - encoded.base_addr + fetch_words(fetch_amount(count, encoded.scale), encoded.scale) * 8
            for address, count in zip(encoded.task_addresses, encoded.write_counts)]
    return max(ends)


def _decode_or_error(data, encoded):
    try:
        return decode_chain(data, RK3588, encoded.base_addr, encoded.task_addresses[0],
                            encoded.first_amount)
    except EncodingError:
        return None


@given(_chains(RK3588), st.data())
def test_truncation_inside_the_fetch_always_fails_cleanly(chain, data):
    encoded = encode_chain(chain, RK3588)
    cut = data.draw(st.integers(0, len(encoded.data) - 1))
    result = _decode_or_error(encoded.data[:cut], encoded)
    if cut < _needed_bytes(encoded):
        assert result is None
    else:
        assert result.chain == chain


@given(_chains(RK3588), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6))
def test_byte_mutations_decode_or_raise_encoding_error(chain, mutations):
    encoded = encode_chain(chain, RK3588)
    data = bytearray(encoded.data)
    for position, value in mutations:
        data[position % len(data)] = value
    result = _decode_or_error(bytes(data), encoded)
    assert result is None or isinstance(result, DecodedChain)


@given(st.binary(max_size=512), st.integers(0, 2**32), st.integers(-2, 0x10000), st.sampled_from([1, 2]))
def test_arbitrary_buffers_and_parameters_never_crash(data, start, amount, scale):
    try:
        decode_chain(data, RK3588, 0, start, amount, scale)
    except EncodingError:
        pass


def test_absurd_amounts_allocate_nothing_big():
    encoded = encode_chain(Chain((_conv_task(1),)), RK3588)
    tracemalloc.start()
    try:
        with pytest.raises(EncodingError, match="outside the 64-byte buffer"):
            decode_chain(encoded.data, RK3588, 0, 0, 0xFFFF)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def _two_tasks():
    return encode_chain(Chain((_conv_task(1), _conv_task(2))), RK3588)


def _patched(encoded, index, word):
    words = words_from_bytes(encoded.data)
    words[index] = word
    return b"".join(w.to_bytes(8, "little") for w in words)


@pytest.mark.parametrize("index, word, message", [
    (3 + 8, encode_write(RK3588, "PC", "BASE_ADDRESS", 0x0), "loops back"),  # task 1 links to task 0
    (6, 0, r"word 6 \(byte offset 0x30\) is 0x0000000000000000; expected the op-enable word"),
    (5, 0, r"word 5 .* expected the 0x0041 marker"),
    (4, MARKER_WORD, r"word 4 .* expected the tail's PC REGISTER_AMOUNTS write"),
    (3, MARKER_WORD, r"word 3 .* expected PC BASE_ADDRESS or a zero word"),
    (3, 0, r"is a zero word but the tail's amount 3 continues the chain"),
    (1, 0x0401000000002004, r"word 1 .* \(unknown target 0x0401 .*\); expected a register write"),
    (1, 0x0201000000001234, r"word 1 .*no register at offset 0x1234"),
    (0, op_enable_word(0x1D), r"word 0 .*expected a register write"),
    (6, 0x00810000001F0008, r"word 6 .*bits 0x2 select no block"),
    (3, encode_write(RK3588, "PC", "BASE_ADDRESS", 0x41), r"PC_SEL must be 0"),
    (3, encode_write(RK3588, "PC", "BASE_ADDRESS", 0x400), r"outside the 128-byte buffer"),
    (4, encode_write(RK3588, "PC", "REGISTER_AMOUNTS", 0x3F), r"PC_DATA_AMOUNT 63 fetches 128 words"),
])
def test_malformed_chains_name_the_word(index, word, message):
    encoded = _two_tasks()
    if message == "loops back":
        data = _patched(encoded, index, word)
        words = words_from_bytes(data)
        words[4 + 8] = encode_write(RK3588, "PC", "REGISTER_AMOUNTS", 3)
        data = b"".join(w.to_bytes(8, "little") for w in words)
    else:
        data = _patched(encoded, index, word)
    with pytest.raises(EncodingError, match=message):
        decode_chain(data, RK3588, 0, 0, encoded.first_amount)


@pytest.mark.parametrize("kwargs, message", [
    ({"start_addr": 8}, "not 16-byte aligned"),
    ({"start_addr": -64}, "outside the"),
    ({"first_amount": 0}, "fewer words than the 4-word tail"),
    ({"first_amount": 0x10000}, "not a 16-bit PC_DATA_AMOUNT"),
    ({"base_addr": 8}, "base address 8 is not 16-byte aligned"),
    ({"scale": 3}, "scale 3"),
])
def test_bad_decode_parameters(kwargs, message):
    encoded = _two_tasks()
    arguments = {"base_addr": 0, "start_addr": 0, "first_amount": encoded.first_amount, **kwargs}
    with pytest.raises(EncodingError, match=message):
        decode_chain(encoded.data, RK3588, **arguments)


def test_odd_fetch_includes_one_padding_word():
    # 1 write + 4 tail = 5 words; at scale 2 the PC fetches 6, the 6th being padding.
    chain = Chain((Task((write(RK3588, "CNA", "CONV_CON1"),), 0x1D), _conv_task(5)))
    encoded = encode_chain(chain, RK3588)
    assert fetch_words(encoded.first_amount, 2) == 6
    assert _decode(encoded).chain == chain
    data = _patched(encoded, 5, 0x0201000000001234)  # garbage where padding belongs
    with pytest.raises(EncodingError, match="word 5"):
        decode_chain(data, RK3588, 0, 0, encoded.first_amount)


@pytest.mark.parametrize("chain, kwargs, message", [
    (Chain(()), {}, "at least one task"),
    (Chain((_conv_task(1),)), {"base_addr": 16}, "not a 64-byte aligned"),
    (Chain((_conv_task(1), _conv_task(2))), {"base_addr": 2**32 - 64}, "beyond the 32-bit address space"),
    (Chain((_conv_task(1),)), {"scale": 0}, "scale 0"),
    (Chain((Task((RegisterWrite("CNA", "CONV_CON9", 0),), 0x1D),)), {}, r"task 0 write 0: .*CONV_CON1"),
    (Chain((Task((RegisterWrite("CNA", "CONV_CON1", -1),), 0x1D),)), {}, r"task 0 write 0: CNA.CONV_CON1"),
    (Chain((Task((), 0x2),)), {}, r"task 0: op-enable mask 0x2"),
    (Chain((Task((), 0x1D, amount_hi16=0x10000),)), {}, "amount_hi16"),
    (Chain(("not a task",)), {}, "expected a Task"),
])
def test_encode_rejects_bad_chains(chain, kwargs, message):
    with pytest.raises(EncodingError, match=message):
        encode_chain(chain, RK3588, **kwargs)


def test_write_helper_packs_fields_and_keeps_raw_values():
    assert write(RK3588, "CNA", "CONV_CON1", CONV_MODE=3).value == 3
    assert write(RK3588, "CNA", "CONV_CON2", 0x10000260).value == 0x10000260
    assert write(RK3588, "CNA", "CONV_CON2", 0x10000260, FEATURE_GRAINS=29).value == 0x100001D0
    with pytest.raises(EncodingError, match=r"CNA.PAD_CON1.PAD_VALUE"):
        write(RK3588, "CNA", "PAD_CON1", PAD_VALUE=2**31)


def test_segment_words():
    assert [segment_words(n) for n in (0, 4, 5, 126, 122, 26)] == [8, 8, 16, 136, 128, 32]
