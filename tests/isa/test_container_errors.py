"""The reader refuses every damaged or hostile file with a ModelFileError that says why.

Files are damaged with the layout of CONTAINER.md written out here (offsets, CRCs), not with
the implementation's own structs, so these tests also check that code and spec agree.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.isa.container import MemoryRegion, ModelFile, Section, SectionKind
from npuemu.isa.errors import ModelFileError

NAME = "damaged.npu"


def small_model() -> ModelFile:
    return ModelFile(
        (Section(SectionKind.REGCMD, "regcmd", bytes(range(200)), MemoryRegion.DDR, 0x1000),
         Section(SectionKind.WEIGHTS, "weights", b"\x55" * 70, MemoryRegion.DDR, 0x2000),
         Section(SectionKind.IO, "io", b"")),
        {"schedule": [{"kind": "npu", "core": 0, "chain": {"section": "regcmd", "offset": 0, "first_amount": 8,
                                                           "tasks": 1}}],
         "tensors": [{"name": "x", "shape": [1, 2]}]},
    )


VALID = small_model().to_bytes()


def reseal(data: bytearray) -> bytes:
    """Recompute the table and header CRCs so that only the intended damage remains."""
    count, table_offset = struct.unpack_from("<IQ", data, 20)
    struct.pack_into("<I", data, 56, zlib.crc32(data[table_offset:table_offset + 96 * count]))
    struct.pack_into("<I", data, 60, zlib.crc32(data[:60]))
    return bytes(data)


def with_entry(index: int, fmt: str, field_offset: int, *values) -> bytes:
    data = bytearray(VALID)
    struct.pack_into(fmt, data, 64 + 96 * index + field_offset, *values)
    return reseal(data)


def rename(data: bytearray, index: int, name: bytes) -> None:
    struct.pack_into("<B", data, 64 + 96 * index + 3, len(name))
    struct.pack_into("<56s", data, 64 + 96 * index + 40, name)


def with_header(fmt: str, offset: int, *values, data: bytes = VALID) -> bytes:
    buffer = bytearray(data)
    struct.pack_into(fmt, buffer, offset, *values)
    return reseal(buffer)


def with_trailer(raw: bytes) -> bytes:
    trailer_offset = struct.unpack_from("<Q", VALID, 40)[0]
    data = bytearray(VALID[:trailer_offset] + raw)
    struct.pack_into("<QQ", data, 32, len(data), trailer_offset)
    struct.pack_into("<II", data, 48, len(raw), zlib.crc32(raw))
    return reseal(data)


def refused(data: bytes | bytearray, match: str | None = None) -> ModelFileError:
    with pytest.raises(ModelFileError, match=match) as caught:
        ModelFile.from_bytes(data, name=NAME)
    assert str(caught.value).startswith(f"{NAME}: ")
    return caught.value


# --- random damage --------------------------------------------------------------------------


@given(st.data())
def test_any_single_byte_change_is_refused(data):
    position = data.draw(st.integers(0, len(VALID) - 1), label="position")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != VALID[position]), label="byte")
    damaged = bytearray(VALID)
    damaged[position] = new
    refused(damaged)


@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), min_size=1, max_size=8))
def test_random_byte_flips_are_refused(flips):
    damaged = bytearray(VALID)
    for position, mask in flips:
        damaged[position] ^= mask
    if damaged != VALID:  # two flips of the same byte can cancel out
        refused(damaged)


@given(st.integers(0, len(VALID) - 1))
def test_truncation_is_refused(length):
    refused(VALID[:length])


@given(st.binary(min_size=1, max_size=100))
def test_appended_bytes_are_refused(tail):
    refused(VALID + tail, "has extra bytes at the end")


@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_refused(junk):
    refused(junk)


@given(st.binary(max_size=100))
def test_arbitrary_bytes_after_a_valid_header_start_are_refused(junk):
    refused(VALID[:16] + junk)


# --- one test per kind of damage ------------------------------------------------------------


def test_empty_file():
    refused(b"", "the file is empty")


def test_bad_magic():
    refused(b"PK\x03\x04" + VALID[4:], r"not an npuemu model file: expected magic b'NPUEMU\\x1a\\n' at offset 0")


def test_rknn_file_gets_its_own_message():
    rknn = b"RKNN" + bytes(4) + struct.pack("<QQ", 6, 0) + bytes(40)
    error = refused(rknn, r"vendor \.rknn model")
    assert ".rknn files are not yet readable by this command" in str(error)
    refused(b"RKNN", r"vendor \.rknn model")


def test_truncated_inside_the_header():
    refused(VALID[:10], "truncated: the file is 10 bytes, shorter than the 12 bytes of the magic and format version")
    refused(VALID[:40], "truncated: the file is 40 bytes, shorter than the 64 bytes of the header")


def test_truncated_body():
    refused(VALID[:-1], f"truncated: the header \\(offset 32\\) says the file is {len(VALID)} bytes, "
                        f"it is {len(VALID) - 1}")


def test_future_major_version():
    error = refused(with_header("<HH", 8, 2, 0), r"format version 2.0 \(offset 8\) is newer than this reader")
    assert "1.x" in str(error)


def test_major_version_zero():
    refused(with_header("<H", 8, 0), "format version 0.0 at offset 8 is not valid; expected 1.x")


def test_header_checksum():
    damaged = bytearray(VALID)
    damaged[20] ^= 1
    refused(damaged, r"header checksum mismatch: CRC-32 of bytes 0..60 is 0x[0-9a-f]{8}, the header \(offset 60\)")


def test_unknown_required_flag():
    refused(with_header("<I", 12, 0x0001_0000), r"header flags 0x00010000 \(offset 12\) require features")


def test_header_size_out_of_range():
    refused(with_header("<I", 16, 32), "header size 32 \\(offset 16\\) must be between 64")


def test_section_table_checksum():
    damaged = bytearray(VALID)
    damaged[64 + 8] ^= 1
    struct.pack_into("<I", damaged, 60, zlib.crc32(damaged[:60]))
    refused(damaged, "section table checksum mismatch at offset 0x40")


def test_section_count_limit():
    refused(with_header("<I", 20, 4097), r"section count 4097 \(offset 20\) exceeds the limit of 4096")


def test_section_table_outside_the_file():
    refused(with_header("<I", 20, 4096), "section table at offset 0x40 with 4096 entries .* does not lie between")
    refused(with_header("<Q", 24, 16), "section table at offset 0x10")


def test_section_checksum():
    offset = struct.unpack_from("<Q", VALID, 64 + 96 + 8)[0]
    damaged = bytearray(VALID)
    damaged[offset + 3] ^= 0xFF
    refused(damaged, f"section 1 'weights' at offset {offset:#x}: checksum mismatch")


def test_section_checksum_can_be_reported_instead():
    offset = struct.unpack_from("<Q", VALID, 64 + 96 + 8)[0]
    damaged = bytearray(VALID)
    damaged[offset] ^= 1
    model = ModelFile.from_bytes(bytes(damaged), verify_sections=False)
    assert model.checksum_failures == ("weights",)
    assert model.section("weights").data[0] == 0x55 ^ 1


def test_trailer_checksum():
    damaged = bytearray(VALID)
    damaged[-2] ^= 1
    refused(damaged, r"trailer checksum mismatch at offset 0x[0-9a-f]+: CRC-32 is .* the header \(offset 52\) says")


def test_unknown_section_kind():
    refused(with_entry(1, "<H", 0, 99), r"section table entry 1 at offset 0xa0: unknown section kind 99; "
                                         r"expected one of 1 \(regcmd\)")


def test_unknown_memory_region():
    refused(with_entry(0, "<B", 2, 7), "entry 0 at offset 0x40: unknown memory region 7")


def test_load_address_without_region():
    refused(with_entry(2, "<Q", 24, 0x100), r"entry 2 .*\(section 'io'\): load address 0x100 given but region is none")


@pytest.mark.parametrize(
    ("fmt", "offset", "values", "message"),
    [
        ("<B", 3, (0,), "name length 0 must be from 1 to 56"),
        ("<B", 3, (57,), "name length 57"),
        ("<B", 41, (ord("x"),), "bytes after the 1-byte name must be zero"),
        ("<B", 40, (0xFF,), "name b'\\\\xff' is not valid UTF-8"),
        ("<B", 40, (7,), "contains a control character"),
        ("<I", 36, (1,), "reserved field is 0x1; expected 0"),
        ("<I", 4, (96,), "alignment 96 must be a power of two"),
    ],
)
def test_bad_entry_fields(fmt, offset, values, message):
    data = bytearray(VALID)
    rename(data, 2, b"i")  # a one-byte name leaves room to damage the padding
    base = reseal(data)
    damaged = bytearray(base)
    struct.pack_into(fmt, damaged, 64 + 96 * 2 + offset, *values)
    refused(reseal(damaged), message)


def test_misaligned_payload():
    offset = struct.unpack_from("<Q", VALID, 64 + 8)[0]
    refused(with_entry(0, "<Q", 8, offset + 8), f"payload offset {offset + 8:#x} is not a multiple of its alignment 64")


def test_payload_past_the_end():
    refused(with_entry(1, "<Q", 16, 2**63), "payload at offset 0x[0-9a-f]+ of 9223372036854775808 bytes ends past")


def test_duplicate_names_in_the_table():
    data = bytearray(VALID)
    rename(data, 2, b"weights")
    refused(reseal(data), "section name 'weights' is already used by entry 1")


def test_overlapping_sections():
    first = struct.unpack_from("<Q", VALID, 64 + 8)[0]
    error = refused(with_entry(1, "<Q", 8, first + 64), "section 1 'weights' at offset .* overlaps section 0 'regcmd'")
    assert f"which ends at {first + 200:#x}" in str(error)


def test_section_overlapping_the_table():
    refused(with_entry(0, "<Q", 8, 64), "overlaps the section table|the section table .* overlaps section 0")


def test_nonzero_padding():
    first = struct.unpack_from("<Q", VALID, 64 + 8)[0]
    damaged = bytearray(VALID)
    damaged[first + 200] = 1  # the byte after regcmd's 200-byte payload
    refused(damaged, f"non-zero byte at offset {first + 200:#x} in the padding between section 0 'regcmd' and")


def test_trailer_must_end_the_file():
    trailer_offset, trailer_size = struct.unpack_from("<QI", VALID, 40)
    refused(with_header("<I", 48, trailer_size - 1), "must end exactly at the end of the file")
    refused(with_header("<Q", 40, 8), "trailer at offset 0x8")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "trailer is not valid JSON: Expecting property name"),
        (b"\xff{}", "trailer is not valid UTF-8"),
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b'{"a": NaN}', "non-finite number NaN"),
        (b'{"a": 1e999}', "out of range"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (b'{"tensors": [{"name": 3}]}', r"trailer.tensors\[0\].name: expected a string, got an integer 3"),
        (b'{"schedule": [{"kind": "cpu", "op": "Softmax"}]}', r"schedule\[0\]: missing required key 'inputs'"),
        (b'{"schedule": [{"kind": "npu", "core": 0, "chain": {"section": "weights", "offset": 0, '
         b'"first_amount": 1, "tasks": 1}}]}', "expected a regcmd section"),
    ],
)
def test_bad_trailer_contents(raw, message):
    error = refused(with_trailer(raw), message)
    assert "trailer" in str(error)


# --- hostile sizes never make the reader allocate ------------------------------------------


def big_file() -> bytes:
    weights = bytes(range(256)) * 1024  # 256 KiB
    return ModelFile((Section("weights", "weights", weights, "ddr", 0),), {}).to_bytes()


BIG = big_file()


@pytest.mark.parametrize(
    ("fmt", "offset", "values"),
    [
        ("<Q", 64 + 16, (2**64 - 1,)),  # entry 0 size
        ("<Q", 64 + 8, (2**63,)),  # entry 0 offset
        ("<I", 20, (4096,)),  # section count
        ("<Q", 32, (2**64 - 1,)),  # file size
        ("<QI", 40, (64, 2**32 - 1)),  # trailer offset and size
        ("<Q", 24, (2**64 - 1,)),  # section table offset
    ],
)
def test_huge_claims_allocate_less_than_the_file(fmt, offset, values):
    hostile = with_header(fmt, offset, *values, data=BIG)
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError):
            ModelFile.from_bytes(hostile, name=NAME)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(BIG) // 4, f"reader allocated {peak} bytes for a {len(BIG)}-byte file"


def test_valid_read_allocates_about_the_file_size():
    tracemalloc.start()
    try:
        ModelFile.from_bytes(BIG)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(BIG)


def test_error_messages_are_json_safe_for_huge_names():
    raw = json.dumps({"tensors": [{"name": "n" * 10_000, "shape": "x"}]}).encode()
    error = refused(with_trailer(raw), "expected an array")
    assert len(str(error)) < 400


@given(st.lists(st.tuples(st.integers(0, 64 + 96 * 3 - 1), st.integers(0, 255)), min_size=1, max_size=6))
def test_resealed_header_and_table_damage_is_refused_or_read(changes):
    """With the CRCs made to match, the structural checks alone must catch what matters:
    the reader either refuses with ModelFileError or returns a consistent model."""
    damaged = bytearray(VALID)
    for position, value in changes:
        damaged[position] = value
    if damaged[:8] != VALID[:8] or damaged[8:10] != VALID[8:10]:
        refused(reseal(damaged))
        return
    try:
        model = ModelFile.from_bytes(reseal(damaged), name=NAME)
    except ModelFileError as error:
        assert str(error).startswith(f"{NAME}: ")
    else:  # e.g. a changed load address, minor version or optional flag: still self-consistent
        again = ModelFile.from_bytes(model.to_bytes())
        assert again.sections == model.sections
        assert {**again.trailer, "format": None} == {**model.trailer, "format": None}
