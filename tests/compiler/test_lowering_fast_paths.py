"""Issue 20's compile-time fast paths give what the plain formulations give:

- ``RegisterBuilder.write`` checks fields only after ``Register.pack`` refuses a write: an accepted
  write packs to the value an independent bit packer gives, and a refused one raises the error of
  the first field out of its range (named for the layer), else of the raw value, as before.
- ``match.readers`` scans ``Node.inputs`` and the fused parts' inputs without building
  ``Node.all_inputs`` lists: the same nodes in the same order.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.compiler.ir import FusedOp, Graph, Node
from npuemu.compiler.lower.fields import RegisterBuilder
from npuemu.compiler.passes import match
from npuemu.isa.errors import CompileError, EncodingError
from npuemu.isa.regmap_loader import load_regmap

REGMAP = load_regmap("rk3588")
REGISTERS = [reg for reg in REGMAP.registers() if reg.fields]


def packed(raw: int, fields: dict, reg) -> int:
    """``raw`` with each named field's bits replaced, bit by bit (the test's own packer)."""
    value = raw
    for name, field_value in fields.items():
        found = next(f for f in reg.fields if f.name == name)
        for bit in range(found.msb - found.lsb + 1):
            value &= ~(1 << (found.lsb + bit))
            value |= ((field_value >> bit) & 1) << (found.lsb + bit)
    return value


@st.composite
def writes(draw):
    reg = draw(st.sampled_from(REGISTERS))
    names = draw(st.lists(st.sampled_from([f.name for f in reg.fields]), unique=True, max_size=4))
    fields = {}
    for name in names:
        found = next(f for f in reg.fields if f.name == name)
        low, high = (-(1 << (found.msb - found.lsb)), (1 << (found.msb - found.lsb)) - 1) if found.signed else \
            (0, (1 << (found.msb - found.lsb + 1)) - 1)
        fields[name] = draw(st.one_of(st.integers(low, high), st.integers(low - 3, high + 3)))
    raw = draw(st.one_of(st.integers(0, 0xFFFFFFFF), st.sampled_from([-1, 1 << 32])))
    return reg, fields, raw


def in_range(reg, name: str, value: int) -> bool:
    found = next(f for f in reg.fields if f.name == name)
    width = found.msb - found.lsb + 1
    return (-(1 << (width - 1)) <= value < (1 << (width - 1))) if found.signed else 0 <= value < (1 << width)


@settings(max_examples=400, deadline=None)
@given(writes())
def test_a_write_packs_or_refuses_as_the_field_by_field_checks(case) -> None:
    reg, fields, raw = case
    builder = RegisterBuilder(REGMAP, "conv7")
    bad = [name for name, value in fields.items() if not in_range(reg, name, value)]
    if bad or not 0 <= raw <= 0xFFFFFFFF:
        with pytest.raises(CompileError) as error:
            builder.write(reg.block, reg.name, raw, **fields)
        text = str(error.value)
        assert text.startswith("layer conv7: ")
        # the first field out of range is named, before any raw-value problem
        assert f"{reg.block} {reg.name}.{bad[0]} (" in text if bad else "raw value" in text
        assert builder.done() == ()
        return
    builder.write(reg.block, reg.name, raw, **fields)
    (write,) = builder.done()
    assert (write.block, write.register) == (reg.block, reg.name)
    assert write.value == packed(raw, {name: value & ((1 << 32) - 1) for name, value in fields.items()}, reg)


def test_an_unknown_field_or_a_non_integer_is_refused_as_before() -> None:
    builder = RegisterBuilder(REGMAP, "c")
    with pytest.raises(EncodingError, match="has no field 'NO_SUCH'"):
        builder.write("CNA", "CONV_CON1", NO_SUCH=1)
    with pytest.raises(CompileError, match=r"^layer c: .*expected an integer"):
        builder.write("CNA", "CONV_CON1", CONV_MODE=1.0)
    with pytest.raises(CompileError, match=r"^layer c: .*kernel width 33 exceeds CNA"):
        builder.write("CNA", "WEIGHT_SIZE2", 0, WEIGHT_WIDTH=33, NO_SUCH=1)  # checked in order: the width first
    assert builder.done() == ()


@st.composite
def graphs(draw):
    names = [f"t{i}" for i in range(6)]
    nodes = []
    for index in range(draw(st.integers(1, 8))):
        parts = [FusedOp("Add", inputs=draw(st.lists(st.sampled_from(names), max_size=2)))
                 for _ in range(draw(st.integers(0, 2)))]
        nodes.append(Node(f"n{index}", "Relu", draw(st.lists(st.sampled_from(names), max_size=3)), [f"o{index}"],
                          fused=parts))
    return Graph(name="g", nodes=nodes, inputs=[], outputs=[], tensors={}), names


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_readers_are_the_nodes_whose_inputs_hold_the_name(case) -> None:
    graph, names = case
    for name in names:
        expected = [node for node in graph.nodes if name in node.all_inputs]
        found = match.readers(graph, name)
        assert [id(node) for node in found] == [id(node) for node in expected]


def test_a_refused_field_is_reported_on_its_own() -> None:
    """The layer's error is raised after pack's refusal, not chained to it (as before the fast path)."""
    with pytest.raises(CompileError) as error:
        RegisterBuilder(REGMAP, "c").write("CNA", "WEIGHT_SIZE2", 0, WEIGHT_WIDTH=33)
    assert error.value.__context__ is None and error.value.__cause__ is None
