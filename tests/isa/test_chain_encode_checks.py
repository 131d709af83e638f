"""encode_chain's one-pass check-and-encode (issue 20: compile time) refuses exactly what
check_task refuses, with check_task's message, in task order, and encodes what it accepts
word for word as the ISA says (target[63:48] | value[47:16] | offset[15:0], docs/rknpu-isa.md 2.1)."""

from __future__ import annotations

import enum
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.isa.chain import encode_chain, segment_words
from npuemu.isa.errors import EncodingError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain, RegisterWrite, Task, check_task

MAP = load_regmap("rk3588")
REGISTERS = [(block.name, reg.name) for block in MAP.blocks for reg in block.registers if block.name != "PC"]
GOOD = RegisterWrite("CNA", "CONV_CON1", 3)
ENABLE = 0x0D  # CNA, CORE, DPU


class Small(enum.IntEnum):
    FIVE = 5


def _reference_body(task: Task) -> list[int]:
    words = []
    for write in task.writes:
        block = next(b for b in MAP.blocks if b.name == write.block)
        offset = next(r.offset for r in block.registers if r.name == write.register)
        words.append(block.target << 48 | int(write.value) << 16 | offset)
    return words


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(REGISTERS), st.integers(0, 0xFFFFFFFF)), min_size=1, max_size=20),
                min_size=1, max_size=4))
def test_accepted_tasks_encode_to_the_isa_words(tasks):
    chain = Chain(tuple(Task(tuple(RegisterWrite(b, r, v) for (b, r), v in writes), ENABLE) for writes in tasks))
    encoded = encode_chain(chain, MAP, base_addr=0x1000)
    words = list(struct.unpack(f"<{len(encoded.data) // 8}Q", encoded.data))
    start = 0
    for task in chain.tasks:
        assert words[start:start + len(task.writes)] == _reference_body(task)
        start += segment_words(len(task.writes))


def _message(call) -> str:
    with pytest.raises(EncodingError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("bad", [
    RegisterWrite("CNA", "CONV_CON1", 1 << 32), RegisterWrite("CNA", "CONV_CON1", -1),
    RegisterWrite("CNA", "CONV_CON1", True), RegisterWrite("CNA", "CONV_CON1", 1.0),
    RegisterWrite("CNA", "NO_SUCH", 1), RegisterWrite("NO_BLOCK", "X", 1), ("CNA", "CONV_CON1", 1)])
def test_a_refused_write_gives_check_tasks_message(bad):
    task = Task((GOOD, GOOD, bad), ENABLE)
    expected = _message(lambda: check_task(task, MAP, "task 1"))
    assert _message(lambda: encode_chain(Chain((Task((GOOD,), ENABLE), task)), MAP)) == expected


@pytest.mark.parametrize("fields", [{"enable_mask": 1 << 20}, {"enable_mask": None}, {"enable_mask": -1},
                                    {"amount_hi16": 1 << 16}, {"amount_hi16": True}])
def test_a_refused_tail_field_gives_check_tasks_message(fields):
    task = Task((GOOD,), **{"enable_mask": ENABLE, **fields})
    assert _message(lambda: encode_chain(Chain((task,)), MAP)) == _message(lambda: check_task(task, MAP, "task 0"))


def test_the_first_refused_task_is_reported_before_any_size_limit():
    too_long = Task((GOOD,) * 200_000, ENABLE)  # more writes than PC_DATA_AMOUNT counts
    bad = Task((GOOD, RegisterWrite("CNA", "CONV_CON1", -3)), ENABLE)
    assert "task 1 write 1" in _message(lambda: encode_chain(Chain((too_long, bad)), MAP))
    assert "PC_DATA_AMOUNT" in _message(lambda: encode_chain(Chain((too_long,)), MAP))


def test_int_subclasses_check_task_accepts_still_encode():
    plain = encode_chain(Chain((Task((RegisterWrite("CNA", "CONV_CON1", 5),), ENABLE, amount_hi16=1),)), MAP)
    subclass = encode_chain(Chain((Task((RegisterWrite("CNA", "CONV_CON1", Small.FIVE),), ENABLE,
                                        amount_hi16=Small.FIVE - 4),)), MAP)
    assert subclass.data == plain.data
