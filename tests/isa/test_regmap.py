"""Register maps: loading, field packing with range checks, deltas and YAML validation."""

from __future__ import annotations

import re
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.isa.errors import ConfigError, EncodingError
from npuemu.isa.regmap_loader import available_regmaps, load_regmap

MAPS = ("rk3588", "rk3576", "rk356x")
ALL_FIELDS = [
    (family, register.block, register.name, f.name)
    for family in MAPS
    for register in load_regmap(family).registers()
    for f in register.fields
]


def _field(family, block, register, name):
    return load_regmap(family).register(block, register).field(name)


def test_all_families_load():
    assert set(MAPS) <= set(available_regmaps())
    for family in MAPS:
        regmap = load_regmap(family)
        assert regmap.family == family
        assert regmap.status == ("complete" if family == "rk3588" else "partial")


def test_rk3588_blocks_targets_and_op_enable_bits():
    regmap = load_regmap("rk3588")
    table = {b.name: (b.base, b.target, b.op_enable_bit) for b in regmap.blocks}
    assert table == {
        "PC": (0x0000, 0x0101, None), "CNA": (0x1000, 0x0201, 0), "CORE": (0x3000, 0x0801, 2),
        "DPU": (0x4000, 0x1001, 3), "DPU_RDMA": (0x5000, 0x2001, 4), "PPU": (0x6000, 0x4001, 5),
        "PPU_RDMA": (0x7000, 0x8001, 6),
    }
    # Enable bitmaps seen in RKNN and Mesa streams (docs/rknpu-isa.md 2.1).
    assert regmap.op_enable_names(0x1D) == ["CNA", "CORE", "DPU", "DPU_RDMA"]
    assert regmap.op_enable_names(0x60) == ["PPU", "PPU_RDMA"]
    assert regmap.op_enable_names(0x18) == ["DPU", "DPU_RDMA"]
    assert regmap.op_enable_mask(["CNA", "CORE", "DPU"]) == 0x0D


def test_pc_registers_of_the_isa_doc():
    pc = load_regmap("rk3588").block("PC")
    offsets = {r.name: r.offset for r in pc.registers}
    assert offsets == {
        "VERSION": 0x00, "VERSION_NUM": 0x04, "OPERATION_ENABLE": 0x08, "BASE_ADDRESS": 0x10,
        "REGISTER_AMOUNTS": 0x14, "INTERRUPT_MASK": 0x20, "INTERRUPT_CLEAR": 0x24,
        "INTERRUPT_STATUS": 0x28, "INTERRUPT_RAW_STATUS": 0x2C, "TASK_CON": 0x30,
        "TASK_DMA_BASE_ADDR": 0x34, "TASK_STATUS": 0x3C,
    }
    amounts = pc.register("REGISTER_AMOUNTS")
    assert amounts.unpack(0x2000E) == {"HI16": 2, "PC_DATA_AMOUNT": 14}


def test_conv_con1_example_and_signed_fields():
    regmap = load_regmap("rk3588")
    assert regmap.pack("CNA", "CONV_CON1", CONV_MODE=3, IN_PRECISION=0) == 3
    assert regmap.pack("CNA", "CONV_CON1", NONALIGN_DMA=1, GROUP_LINE_OFF=1, ARGB_IN=10) == 0x6000A000
    assert regmap.unpack("CNA", "PAD_CON1", 0xFFFFFFFE) == {"PAD_VALUE": -2}
    assert regmap.pack("DPU", "OUT_CVT_OFFSET", OUT_CVT_OFFSET=-128) == 0xFFFFFF80
    assert regmap.unpack("DPU", "OUT_CVT_OFFSET", 0xFFFFFF80) == {"OUT_CVT_OFFSET": -128}
    assert regmap.register("CORE", "UNDOC_3030").fields[0].name == "V"
    assert regmap.register("DPU", "UNDOC_40C4").offset == 0x40C4


def test_update_keeps_reserved_bits():
    regmap = load_regmap("rk3588")
    value = regmap.update("CNA", "CONV_CON2", 0x100001D0, FEATURE_GRAINS=38)
    assert value == 0x10000260
    assert regmap.register("CNA", "CONV_CON2").reserved_bits(value) == 0x10000000


ALL_REGISTERS = [(family, r.block, r.name) for family in MAPS for r in load_regmap(family).registers()]


@pytest.mark.parametrize("family, block, register", ALL_REGISTERS)
@settings(max_examples=5)
@given(data=st.data())
def test_every_register_packs_and_unpacks_all_its_fields_property(family, block, register, data):
    regmap = load_regmap(family)
    reg = regmap.register(block, register)
    values = {f.name: data.draw(st.integers(f.minimum, f.maximum), label=f.name) for f in reg.fields}
    packed = regmap.pack(block, register, **values)
    assert 0 <= packed < 2**32 and packed & ~reg.assigned_mask == 0
    assert regmap.unpack(block, register, packed) == values
    # One field alone lands in its own bits and nowhere else.
    name, value = data.draw(st.sampled_from(sorted(values.items())), label="single")
    alone = regmap.pack(block, register, **{name: value})
    assert alone & ~reg.field(name).mask == 0
    assert regmap.unpack(block, register, alone) == {f.name: (value if f.name == name else 0) for f in reg.fields}


@given(data=st.data())
def test_out_of_range_values_are_rejected_property(data):
    family, block, register, name = data.draw(st.sampled_from(ALL_FIELDS))
    f = _field(family, block, register, name)
    value = data.draw(st.one_of(st.integers(max_value=f.minimum - 1), st.integers(min_value=f.maximum + 1)))
    with pytest.raises(EncodingError) as error:
        load_regmap(family).pack(block, register, **{name: value})
    message = str(error.value)
    assert f"{block}.{register}.{name}" in message and f.bit_range in message and str(value) in message


@pytest.mark.parametrize("family", MAPS)
def test_every_field_accepts_its_limits_and_rejects_one_past(family):
    regmap = load_regmap(family)
    for register in regmap.registers():
        for f in register.fields:
            for good in (f.minimum, f.maximum, 0):
                assert register.unpack(register.pack({f.name: good}))[f.name] == good
            for bad in (f.minimum - 1, f.maximum + 1):
                with pytest.raises(EncodingError, match=re.escape(f"{register.qualified_name}.{f.name}")):
                    register.pack({f.name: bad})


@pytest.mark.parametrize("family", MAPS)
def test_every_field_and_register_has_a_known_source(family):
    regmap = load_regmap(family)
    for register in regmap.registers():
        for item in (register, *register.fields):
            key = re.match(r"[A-Za-z0-9_]+", item.source).group(0)
            assert key in regmap.sources, (register.qualified_name, item.source)


@given(value=st.integers(0, 2**32 - 1))
def test_unpack_then_pack_keeps_every_assigned_bit(value):
    regmap = load_regmap("rk3588")
    for block, register in (("CNA", "CONV_CON3"), ("DPU", "EW_CFG"), ("DPU", "DATA_FORMAT"), ("PPU", "MISC_CTRL")):
        reg = regmap.register(block, register)
        assert reg.pack(reg.unpack(value)) == value & reg.assigned_mask


def test_unknown_names_list_close_matches():
    regmap = load_regmap("rk3588")
    with pytest.raises(EncodingError, match=r"no register 'CONV_CON9'.*CONV_CON1"):
        regmap.pack("CNA", "CONV_CON9", CONV_MODE=1)
    with pytest.raises(EncodingError, match=r"CNA.CONV_CON1 has no field 'CONV_MOD'.*CONV_MODE"):
        regmap.pack("CNA", "CONV_CON1", CONV_MOD=1)
    with pytest.raises(EncodingError, match=r"no block 'DPU_RDAM'.*DPU_RDMA"):
        regmap.pack("DPU_RDAM", "WEIGHT")


def test_bad_values_and_masks():
    regmap = load_regmap("rk3588")
    with pytest.raises(EncodingError, match="expected an integer"):
        regmap.pack("CNA", "CONV_CON1", CONV_MODE="3")
    with pytest.raises(EncodingError, match="32-bit"):
        regmap.unpack("CNA", "CONV_CON1", 1 << 32)
    with pytest.raises(EncodingError, match=r"bits 0x2 select no block"):
        regmap.op_enable_names(0x1F)
    assert load_regmap("rk356x").op_enable_names(0x1F) == ["CNA", "BLOCK_2000", "CORE", "DPU", "DPU_RDMA"]


def test_rk3576_delta():
    rk3576, rk3588 = load_regmap("rk3576"), load_regmap("rk3588")
    assert rk3576.pc_amount_scale == 2
    assert rk3576.register("CNA", "FEATURE_DATA_ADDR").offset == 0x1088
    assert rk3576.block("CNA").register_at(0x1070) is None
    assert [rk3576.register("DPU", n).offset for n in ("OUT_CVT_OFFSET", "OUT_CVT_SCALE", "OUT_CVT_SHIFT")] == [
        0x40AC, 0x40B0, 0x40B4]
    assert rk3576.register("DPU", "DST_BASE_ADDR").offset == 0x4018
    assert rk3576.register("PC", "TASK_STATUS").offset == 0x48
    assert rk3576.register("PC", "TASK_CON").field("TASK_NUMBER").width == 16
    with pytest.raises(EncodingError):
        rk3576.register("DPU", "EW_OP_VALUE_7")
    # Unchanged registers are the base map's.
    assert rk3576.register("CNA", "CONV_CON1") == rk3588.register("CNA", "CONV_CON1")


def test_rk356x_delta():
    rk356x = load_regmap("rk356x")
    assert rk356x.pc_amount_scale == 1
    block = rk356x.block("BLOCK_2000")
    assert (block.base, block.target, block.op_enable_bit) == (0x2000, 0x0401, 1)
    assert block.register_at(0x2004).name == "S_POINTER"


# -- YAML validation ------------------------------------------------------------------------
_MINIMAL = """\
family: tiny
pc_amount_scale: 2
sources: {XML: test}
blocks:
  PC:
    base: 0x0
    target: 0x0101
    source: XML
    registers:
      BASE_ADDRESS: {offset: 0x10, fields: {PC_SOURCE_ADDR: [31, 4], PC_SEL: 0}}
      REGISTER_AMOUNTS: {offset: 0x14, fields: {PC_DATA_AMOUNT: [15, 0]}}
  CNA:
    base: 0x1000
    target: 0x0201
    op_enable_bit: 0
    source: XML
    registers:
      CONV_CON1: {offset: 0x100C, fields: {CONV_MODE: [3, 0]}}
"""


def _write(tmp_path, text, name="tiny.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_minimal_map_loads(tmp_path):
    regmap = load_regmap(_write(tmp_path, _MINIMAL))
    assert regmap.pack("CNA", "CONV_CON1", CONV_MODE=3) == 3


@pytest.mark.parametrize("change, message", [
    (("[3, 0]", "[3, 5]"), r"CONV_MODE\.bits: expected"),
    (("CONV_MODE: [3, 0]", "CONV_MODE: [3, 0], X: [2, 2]"), r"bit 2 is also CONV_MODE's"),
    (("offset: 0x100C", "offset: 0x2000"), r"CONV_CON1\.offset: expected a multiple of 4 in the block window"),
    (("target: 0x0201", "target: 0x0101"), r"CNA\.target: expected a value no other block uses"),
    (("target: 0x0201", "target: 0x0081"), r"CNA\.target: expected a 16-bit write-target code"),
    (("pc_amount_scale: 2", "pc_amount_scale: 3"), r"pc_amount_scale: expected 1, 2, 4 or 8"),
    (("    source: XML\n    registers:\n      CONV", "    source: TRM\n    registers:\n      CONV"),
     r"blocks\.CNA\.source: expected a source starting with one of the keys XML"),
    (("REGISTER_AMOUNTS", "AMOUNTS"), r"PC\.registers\.REGISTER_AMOUNTS: expected present"),
    (("{CONV_MODE: [3, 0]}", "{CONV_MODE: {bits: [3, 0], sign: true}}"), r"unknown: sign"),
    (("{CONV_MODE: [3, 0]}", "{CONV_MODE: {bits: 3, signed: true}}"), r"signed: expected a field of 2 or more bits"),
    (("CONV_CON1:", "conv_con1:"), r"expected an upper-case register name"),
])
def test_invalid_maps_raise_config_error_naming_the_key(tmp_path, change, message):
    old, new = change
    assert old in _MINIMAL
    with pytest.raises(ConfigError, match=message) as error:
        load_regmap(_write(tmp_path, _MINIMAL.replace(old, new, 1)))
    assert "tiny.yaml" in str(error.value)


def test_invalid_yaml_and_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_regmap(_write(tmp_path, "family: [unclosed\n"))
    with pytest.raises(ConfigError, match="no register map named 'rk9999'; available: .*rk3588"):
        load_regmap("rk9999")
    with pytest.raises(ConfigError, match="not found"):
        load_regmap(tmp_path / "absent.yaml")


@pytest.mark.parametrize("delta, message", [
    ("remove: [CNA.NOPE]", r"remove\[0\]: expected a register of the base map"),
    ("remove: [NOPE.CONV_CON1]", r"remove\[0\]: expected a block of the base map"),
    ("add: {CNA.CONV_CON1: {offset: 0x1010, fields: {V: [31, 0]}}}", r"add\.CNA\.CONV_CON1: expected a register the base map lacks"),
    ("change: {CNA.CONV_CON1: {offset: 0x1001}}", r"CONV_CON1\.offset: expected a multiple of 4"),
    ("change: {CNA.CONV_CON1: {size: 4}}", r"unknown: size"),
    ("add: {CNA.OTHER: {offset: 0x100C, fields: {V: [31, 0]}}}", r"0x100c is CONV_CON1's"),
])
def test_invalid_deltas(tmp_path, delta, message):
    _write(tmp_path, _MINIMAL)
    path = _write(tmp_path, f"family: delta\nbase: tiny\n{delta}\n", "delta.yaml")
    with pytest.raises(ConfigError, match=message):
        load_regmap(path)


def test_delta_applies_and_loops_are_caught(tmp_path):
    _write(tmp_path, _MINIMAL)
    path = _write(tmp_path, textwrap.dedent("""\
        family: delta
        base: tiny
        status: partial
        change: {CNA.CONV_CON1: {offset: 0x1010}}
        add: {CNA.EXTRA: {offset: 0x100C, fields: {V: [31, 0]}}}
        """), "delta.yaml")
    regmap = load_regmap(path)
    assert regmap.status == "partial"
    assert regmap.register("CNA", "CONV_CON1").offset == 0x1010
    assert regmap.block("CNA").register_at(0x100C).name == "EXTRA"
    _write(tmp_path, "family: a\nbase: b\n", "a.yaml")
    _write(tmp_path, "family: b\nbase: a\n", "b.yaml")
    with pytest.raises(ConfigError, match="loop"):
        load_regmap(tmp_path / "a.yaml")
