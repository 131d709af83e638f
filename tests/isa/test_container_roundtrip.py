"""Model file round trips, the byte layout as CONTAINER.md states it, and the typed views."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.isa.container import (
    ChainRef, CpuStep, MemoryRegion, ModelFile, NpuStep, Quantization, Section, SectionKind, TaskRange,
)
from npuemu.isa.errors import ModelFileError

SCHEMA_KEYS = {"format", "platform", "compiler", "graph", "tensors", "memory_map", "schedule", "extra"}


def sample_model() -> ModelFile:
    regcmd = bytes(range(256)) * 4
    sections = (
        Section(SectionKind.REGCMD, "regcmd", regcmd, MemoryRegion.DDR, 0x1000_0000),
        Section(SectionKind.WEIGHTS, "weights", b"\x01\x02" * 500, MemoryRegion.DDR, 0x1010_0000, 4096),
        Section(SectionKind.LUT, "lut.sigmoid", b"\x7f" * 129, MemoryRegion.SRAM, 0x40),
        Section(SectionKind.OTHER, "notes", b"not placed"),
    )
    trailer = {
        "platform": {"chip": "rk3588", "overrides": {"npu.clock_mhz": 800}, "figures": {"cores": 3}},
        "compiler": {"version": "0.1.0", "options": {"quantize": "w8a8"}},
        "graph": {
            "name": "tiny", "inputs": ["x"], "outputs": ["y"],
            "layers": [
                {"id": 0, "name": "conv1", "op_type": "ConvRelu", "fused": ["conv1", "relu1"], "target": "NPU",
                 "inputs": ["x"], "outputs": ["t"], "tasks": [{"step": 0, "first": 0, "count": 2}]},
                {"id": 1, "name": "softmax", "op_type": "Softmax", "target": "CPU", "inputs": ["t"], "outputs": ["y"]},
            ],
        },
        "tensors": [
            {"name": "x", "shape": [1, 3, 8, 8], "dtype": "int8", "layout": "NC1HWC2", "c2": 8,
             "native_shape": [1, 1, 8, 8, 8], "quantization": {"scale": 0.5, "zero_point": -3},
             "region": "ddr", "address": 0x1020_0000, "size": 512},
            {"name": "w", "shape": [4, 3, 3, 3], "dtype": "int8",
             "quantization": {"scale": [0.1, 0.2, 0.3, 0.4], "zero_point": [0, 0, 0, 0], "axis": 0}},
            {"name": "t"}, {"name": "y"},
        ],
        "memory_map": {
            "regions": [{"name": "ddr", "base": 0x1000_0000, "size": 0x100_0000},
                        {"name": "sram", "base": 0, "size": 0xE_F000}],
            "areas": [{"name": "weights", "region": "ddr", "base": 0x1010_0000, "size": 1000},
                      {"name": "internal", "size": 4096}],
        },
        "schedule": [
            {"kind": "npu", "core": 0, "chain": {"section": "regcmd", "offset": 0, "first_amount": 55, "tasks": 2},
             "layers": [0]},
            {"kind": "cpu", "op": "Softmax", "inputs": ["t"], "outputs": ["y"], "params": {"axis": 1}, "layers": [1]},
        ],
        "extra": {"note": "sample"},
    }
    return ModelFile(sections, trailer)


# --- strategies -----------------------------------------------------------------------------

CONTROL_CHARACTERS = "".join(map(chr, [*range(0x20), *range(0x7F, 0xA0)]))
names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters=CONTROL_CHARACTERS), min_size=1, max_size=20
).filter(lambda name: len(name.encode()) <= 56)
json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def sections(draw) -> tuple[Section, ...]:
    chosen = draw(st.lists(names, max_size=6, unique=True))
    result = []
    for name in chosen:
        region = draw(st.sampled_from(MemoryRegion))
        data = draw(st.binary(max_size=300))
        address = 0 if region is MemoryRegion.NONE else draw(st.integers(0, 2**64 - 1 - len(data)))
        alignment = draw(st.sampled_from([64, 128, 256, 4096, 65536]))
        result.append(Section(draw(st.sampled_from(SectionKind)), name, data, region, address, alignment))
    return tuple(result)


trailers = st.fixed_dictionaries(
    {}, optional={"extra": st.dictionaries(st.text(max_size=8), json_values, max_size=4)}
).flatmap(
    lambda base: st.dictionaries(st.text(max_size=10).filter(lambda k: k not in SCHEMA_KEYS), json_values,
                                 max_size=3).map(lambda more: {**base, **more})
)


# --- round trips ----------------------------------------------------------------------------


@given(sections(), trailers)
def test_write_then_read_gives_the_same_model(file_sections, trailer):
    model = ModelFile(file_sections, trailer)
    data = model.to_bytes()
    again = ModelFile.from_bytes(data, name="random.npu")
    assert again == model
    assert again.sections == file_sections
    assert {k: v for k, v in again.trailer.items() if k != "format"} == trailer
    assert again.to_bytes() == data  # the writer is deterministic


@given(sections())
def test_layout_follows_the_spec(file_sections):
    data = ModelFile(file_sections, {}).to_bytes()
    magic, major, minor, flags, header_size, count, table_offset, file_size = struct.unpack_from("<8sHHIIIQQ", data)
    trailer_offset, trailer_size, trailer_crc, table_crc, header_crc = struct.unpack_from("<QIIII", data, 40)
    assert (magic, major, minor, flags, header_size) == (b"NPUEMU\x1a\n", 1, 0, 0, 64)
    assert (count, table_offset, file_size) == (len(file_sections), 64, len(data))
    assert header_crc == zlib.crc32(data[:60])
    assert table_crc == zlib.crc32(data[64:64 + 96 * count])
    assert trailer_offset % 64 == 0 and trailer_offset + trailer_size == len(data)
    assert trailer_crc == zlib.crc32(data[trailer_offset:])
    for index, section in enumerate(file_sections):
        entry = data[64 + 96 * index:64 + 96 * (index + 1)]
        kind, region, name_length, alignment, offset, size, address, crc, reserved = struct.unpack_from(
            "<HBBIQQQII", entry)
        assert (kind, region, alignment, size, address, reserved) == (
            section.kind, section.region, section.alignment, section.size, section.load_address, 0)
        assert entry[40:40 + name_length].decode() == section.name
        assert offset % alignment == 0 and data[offset:offset + size] == section.data
        assert crc == zlib.crc32(section.data)


def test_sample_round_trips_through_a_file(tmp_path):
    model = sample_model()
    path = tmp_path / "sample.npu"
    model.write(path)
    assert ModelFile.read(path) == model
    assert ModelFile.read(str(path)).trailer["format"] == {"name": "npuemu", "version": "1.0"}


def test_minimal_model_has_only_the_format_entry():
    model = ModelFile.from_bytes(ModelFile().to_bytes())
    assert model.sections == () and model.trailer == {"format": {"name": "npuemu", "version": "1.0"}}
    assert model.tensors() == () and model.layers() == () and model.schedule() == ()
    assert model.platform().chip is None and model.memory_map().regions == () and model.extra == {}


def test_trailer_is_stored_in_canonical_json_form():
    source = {"extra": {"pair": (1, 2)}}
    model = ModelFile((), source)
    assert model.trailer["extra"] == {"pair": [1, 2]}
    source["extra"]["pair"] = "changed later"
    assert model.trailer["extra"] == {"pair": [1, 2]}  # a copy, not a view


def test_newer_minor_version_and_optional_flags_are_read():
    data = bytearray(sample_model().to_bytes())
    struct.pack_into("<HI", data, 10, 7, 0x0000_0001)  # minor 7, an optional flag bit
    struct.pack_into("<I", data, 60, zlib.crc32(data[:60]))
    model = ModelFile.from_bytes(bytes(data))
    assert model.format_version == (1, 7) and model.trailer["format"]["version"] == "1.7"
    expected = sample_model()
    assert model.sections == expected.sections
    assert {**model.trailer, "format": None} == {**expected.trailer, "format": None}
    assert ModelFile.from_bytes(model.to_bytes()).format_version == (1, 0)  # written as what we know


def test_newer_minor_version_with_a_longer_header_is_read():
    """A later 1.x may append header fields (raising header_size); this reader skips them."""
    sample = sample_model()
    aligned_64 = tuple(Section(s.kind, s.name, s.data, s.region, s.load_address) for s in sample.sections)
    original = ModelFile(aligned_64, sample.trailer).to_bytes()  # so that moving payloads by 64 keeps them aligned
    count = struct.unpack_from("<I", original, 20)[0]
    data = bytearray(original[:64] + b"\xee" * 64 + original[64:])
    struct.pack_into("<HIIIQQQ", data, 10, 1, 0, 128, count, 128, len(data), struct.unpack_from("<Q", data, 40)[0] + 64)
    for index in range(count):
        entry = 128 + 96 * index
        struct.pack_into("<Q", data, entry + 8, struct.unpack_from("<Q", data, entry + 8)[0] + 64)
    struct.pack_into("<I", data, 56, zlib.crc32(data[128:128 + 96 * count]))
    struct.pack_into("<I", data, 60, zlib.crc32(data[:60]))
    model = ModelFile.from_bytes(bytes(data))
    assert model.format_version == (1, 1) and model.sections == aligned_64


# --- access ---------------------------------------------------------------------------------


def test_section_lookup():
    model = sample_model()
    assert model.section("weights").alignment == 4096
    assert [s.name for s in model.sections_of_kind("regcmd")] == ["regcmd"]
    assert model.sections_of_kind(SectionKind.IO) == ()
    with pytest.raises(ModelFileError, match="no section named 'nope'.*'regcmd'"):
        model.section("nope")
    with pytest.raises(ModelFileError, match="unknown section kind 'code'"):
        model.sections_of_kind("code")


def test_typed_views():
    model = sample_model()
    assert model.platform().chip == "rk3588" and model.platform().figures == {"cores": 3}
    assert model.compiler().options == {"quantize": "w8a8"}
    x = model.tensor("x")
    assert (x.shape, x.native_shape, x.c2, x.layout) == ((1, 3, 8, 8), (1, 1, 8, 8, 8), 8, "NC1HWC2")
    assert x.quantization == Quantization((0.5,), (-3,), None, False)
    w = model.tensor("w").quantization
    assert w.per_channel and w.scale == (0.1, 0.2, 0.3, 0.4) and w.axis == 0
    conv = model.layers()[0]
    assert conv.fused == ("conv1", "relu1") and conv.tasks == (TaskRange(0, 0, 2),) and conv.task_count == 2
    npu, cpu = model.schedule()
    assert npu == NpuStep(0, ChainRef("regcmd", 0, 55, 2), (0,))
    assert isinstance(cpu, CpuStep) and cpu.op == "Softmax" and cpu.params == {"axis": 1}
    memory = model.memory_map()
    assert [r.name for r in memory.regions] == ["ddr", "sram"] and memory.areas[1].region is None
    with pytest.raises(ModelFileError, match="no tensor named 'q'"):
        model.tensor("q")


def test_section_repr_does_not_dump_the_payload():
    text = repr(Section("weights", "w", b"\0" * 100_000))
    assert "size=100000" in text and len(text) < 200


# --- construction errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("regcmd", "", b""), "section name '' is empty"),
        (("regcmd", "x" * 57, b""), "57 bytes of UTF-8; the limit is 56"),
        (("regcmd", "a\nb", b""), "contains a control character"),
        (("regcmd", "\ud800", b""), "not encodable as UTF-8"),
        (("regcmd", "a", b"", "ddr", 0, 100), "alignment 100 must be a power of two from 64 to 65536"),
        (("regcmd", "a", b"", "ddr", 0, 32), "alignment 32"),
        (("regcmd", "a", b"", "none", 0x40), "load address 0x40 given but region is none"),
        (("regcmd", "a", b"ab", "ddr", 2**64 - 1), "ends past 2\\*\\*64"),
        (("regcmd", "a", b"", "dram"), "unknown memory region 'dram'; expected one of: none, ddr, sram"),
        (("code", "a", b""), "unknown section kind 'code'"),
        (("regcmd", "a", 5), "data must be bytes-like"),
    ],
)
def test_bad_sections_are_refused(arguments, message):
    with pytest.raises(ModelFileError, match=message):
        Section(*arguments)


def _step(**changes):
    step = {"kind": "npu", "core": 0, "chain": {"section": "regcmd", "offset": 0, "first_amount": 1, "tasks": 2}}
    return {**step, **changes}


@pytest.mark.parametrize(
    ("trailer", "message"),
    [
        ({"extra": {"x": object()}}, "cannot be stored as JSON"),
        ({"extra": {"x": float("nan")}}, "cannot be stored as JSON"),
        ({"tensors": {}}, r"trailer.tensors: expected an array, got an object"),
        ({"tensors": [{"shape": [1]}]}, r"trailer.tensors\[0\]: missing required key 'name'"),
        ({"tensors": [{"name": "a"}, {"name": "a"}]}, r"trailer.tensors\[1\].name: duplicate name 'a'"),
        ({"tensors": [{"name": "a", "shape": [1, -2]}]}, r"shape\[1\]: expected a non-negative integer, got"),
        ({"tensors": [{"name": "a", "quantization": {"scale": "big"}}]}, r"scale: expected a number or an array"),
        ({"tensors": [{"name": "a", "quantization": {"scale": [1.0], "zero_point": [0, 0]}}]},
         "per-channel scale has 1 entries but zero_point has 2"),
        ({"graph": {"layers": [{"id": True}]}}, r"layers\[0\].id: expected an integer, got a boolean True"),
        ({"schedule": [{"core": 0}]}, r"schedule\[0\]: missing required key 'kind'"),
        ({"schedule": [{"kind": "gpu"}]}, r"schedule\[0\].kind: expected \"npu\" or \"cpu\", got a string 'gpu'"),
        ({"schedule": [{"kind": ["npu"]}]}, r"schedule\[0\].kind: expected \"npu\" or \"cpu\", got an array"),
        ({"schedule": [{"kind": "npu", "core": 0}]}, r"schedule\[0\]: missing required key 'chain'"),
        ({"schedule": [_step(chain={"section": "regcmd", "offset": 0, "tasks": 1})]},
         r"schedule\[0\].chain: missing required key 'first_amount'"),
        ({"schedule": [{"kind": "cpu", "op": "Softmax", "inputs": ["a"]}]}, "missing required key 'outputs'"),
        ({"schedule": [{"kind": "cpu", "op": "S", "inputs": [], "outputs": [], "params": []}]},
         r"params: expected an object"),
        ({"schedule": [_step(chain={"section": "nope", "offset": 0, "first_amount": 1, "tasks": 1})]},
         "chain.section: no section named 'nope'"),
        ({"schedule": [_step(chain={"section": "weights", "offset": 0, "first_amount": 1, "tasks": 1})]},
         "section 'weights' is weights, expected a regcmd section"),
        ({"schedule": [_step(chain={"section": "regcmd", "offset": 64, "first_amount": 1, "tasks": 1})]},
         r"chain.offset: 0x40 is outside section 'regcmd' \(64 bytes\)"),
        ({"schedule": [_step()], "graph": {"layers": [{"id": 0, "tasks": [{"step": 1, "first": 0, "count": 1}]}]}},
         r"layers\[0\].tasks\[0\].step: 1 is not an NPU step"),
        ({"schedule": [_step()], "graph": {"layers": [{"id": 0, "tasks": [{"step": 0, "first": 1, "count": 2}]}]}},
         "exceed the 2 tasks of step 0"),
        ({"memory_map": {"regions": [{"name": "ddr", "base": 0}]}}, r"regions\[0\]: missing required key 'size'"),
        ({"extra": []}, "trailer.extra: expected an object"),
        ({"format": "npuemu"}, "trailer.format: expected an object"),
        ({"platform": {"chip": 3588}}, "trailer.platform.chip: expected a string"),
    ],
)
def test_bad_trailers_are_refused(trailer, message):
    sections = (Section("regcmd", "regcmd", b"\0" * 64, "ddr", 0), Section("weights", "weights", b""))
    with pytest.raises(ModelFileError, match=message):
        ModelFile(sections, trailer)


def test_trailer_must_be_an_object():
    with pytest.raises(ModelFileError, match="trailer must be a JSON object, got an array"):
        ModelFile((), [1, 2])


def test_duplicate_section_names_are_refused():
    with pytest.raises(ModelFileError, match="two sections are named 'a'"):
        ModelFile((Section("lut", "a", b""), Section("io", "a", b"")), {})
