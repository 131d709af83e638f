"""DecodedWord's own __init__ (issue 20: one per distinct word of every decoded chain) keeps the
frozen dataclass's behaviour: positional and keyword fields with their defaults, equality and
hash by value, repr, replace, and no assignment after construction."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.isa.words import DecodedWord, WordKind

TEXT = st.none() | st.text(max_size=8)


@given(st.integers(0, 2 ** 64 - 1), st.sampled_from(list(WordKind)), st.integers(0, 2 ** 16 - 1),
       st.integers(0, 2 ** 32 - 1), st.integers(0, 2 ** 16 - 1), TEXT, TEXT, TEXT)
def test_fields_equality_hash_repr_replace(raw, kind, target, value, offset, block, register, problem):
    word = DecodedWord(raw, kind, target, value, offset, block, register, problem)
    named = DecodedWord(raw=raw, kind=kind, target=target, value=value, offset=offset, block=block,
                        register=register, problem=problem)
    assert word == named and hash(word) == hash(named)
    assert dataclasses.astuple(word) == (raw, kind, target, value, offset, block, register, problem)
    assert repr(word) == (f"DecodedWord(raw={raw!r}, kind={kind!r}, target={target!r}, value={value!r}, "
                          f"offset={offset!r}, block={block!r}, register={register!r}, problem={problem!r})")
    assert dataclasses.replace(word, value=value ^ 1) != word
    assert dataclasses.replace(word, value=value ^ 1).value == value ^ 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        word.value = 0


def test_defaults():
    word = DecodedWord(0, WordKind.ZERO, 0, 0, 0)
    assert (word.block, word.register, word.problem) == (None, None, None)
    assert [f.name for f in dataclasses.fields(DecodedWord)] == ["raw", "kind", "target", "value", "offset",
                                                                  "block", "register", "problem"]
