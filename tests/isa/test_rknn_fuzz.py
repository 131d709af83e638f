"""Damaged vendor files end in a ModelFileError: never another exception, a hang, or an
allocation far larger than the file.

Mutations are aimed mostly at the FlatBuffer's tables (outside the big weight/regcmd blobs,
where a changed byte is just different data), as single bytes and as whole 32-bit words,
since offsets and lengths are 32-bit fields.
"""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.isa.errors import ModelFileError
from npuemu.isa.rknn import Region, describe_rknn, format_rknn, load_rknn, plan_memory, region_image, relocate
from npuemu.isa.rknn.flatbuffer import FlatBuffer

FIXTURES = Path(__file__).parents[2] / ".." / "shared" / "rknn-fixtures"
SMALL = ["rep07_maxpool_k3s2p1_64_112", "rep10_sigmoid_64_56", "rep11_fc_512to1000", "rep12_resblock_convadd_3x3_64_56"]
SECONDS_PER_FILE = 2.0
_CACHE: dict[str, tuple[bytes, list[int]]] = {}


def fixture(name: str) -> tuple[bytes, list[int]]:
    """The file's bytes and the offsets worth mutating: everything outside blobs larger than 64 bytes."""
    if name not in _CACHE:
        path = FIXTURES / name / "model.rknn"
        if not path.is_file():
            pytest.fail(f"fixture {path} is missing (the shared folder must sit next to the repository)")
        data = path.read_bytes()
        model = load_rknn(data, name=name)
        inside = bytearray(len(data))
        for offset, blob in zip(model.blob_offsets, model.blobs):
            if len(blob) > 64:
                inside[offset:offset + len(blob)] = b"\1" * len(blob)
        _CACHE[name] = (data, [i for i, flag in enumerate(inside) if not flag])
    return _CACHE[name]


def exercise(data: bytes, name: str) -> None:
    """Everything a user of a loaded model does with it; only ModelFileError may escape."""
    started = time.perf_counter()
    try:
        model = load_rknn(data, name=name)
        plan = plan_memory(model)
        relocate(model, plan)
        for region in (Region.WEIGHT, Region.MISC, Region.LUT):
            region_image(model, plan, region)
        describe_rknn(model)
        format_rknn(model)
    except ModelFileError as exc:
        assert str(exc).startswith(f"{name}: "), exc
    assert time.perf_counter() - started < SECONDS_PER_FILE


edits = st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), min_size=1, max_size=8)
word_edits = st.lists(st.tuples(st.integers(0, 1 << 30), st.sampled_from(
    [0, 1, 4, 0x7F, 0x80, 0xFFFF, 0x10000, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFF0, 0xFFFF_FFFF])
    | st.integers(0, 0xFFFF_FFFF)), min_size=1, max_size=4)


@settings(max_examples=150)
@given(name=st.sampled_from(SMALL), changes=edits)
def test_byte_mutations_end_in_model_file_error(name, changes):
    data, targets = fixture(name)
    damaged = bytearray(data)
    for where, value in changes:
        damaged[targets[where % len(targets)]] = value
    exercise(bytes(damaged), name)


@settings(max_examples=150)
@given(name=st.sampled_from(SMALL), changes=word_edits)
def test_word_mutations_end_in_model_file_error(name, changes):
    data, targets = fixture(name)
    damaged = bytearray(data)
    for where, value in changes:
        at = min(targets[where % len(targets)] & ~3, len(data) - 4)
        struct.pack_into("<I", damaged, at, value)
    exercise(bytes(damaged), name)


@settings(max_examples=60)
@given(name=st.sampled_from(SMALL), keep=st.floats(0.0, 1.0, exclude_max=True))
def test_truncations_are_refused(name, keep):
    data, _ = fixture(name)
    with pytest.raises(ModelFileError, match=f"^{name}: "):
        load_rknn(data[:int(len(data) * keep)], name=name)


def test_every_cut_in_the_header_and_trailer_is_refused():
    data, _ = fixture("rep07_maxpool_k3s2p1_64_112")
    for cut in [*range(0, 80), *range(len(data) - 1100, len(data))]:
        with pytest.raises(ModelFileError):
            load_rknn(data[:cut], name="cut.rknn")


# --- claims of huge sizes allocate nothing --------------------------------------------------------


def _positions(data: bytes) -> dict[str, int]:
    """File offsets of a few size and length fields, found by walking the fixture's tables."""
    buffer = FlatBuffer(data[64:], "x", 64)
    root = buffer.root(b"RKNN", "model")
    graph = root.tables(2, "graphs")[0]
    regions = root.table(19, "regions")
    tensors = graph.tables(0, "tensors")
    output = next(t for t in tensors if t.scalar(2, "u8") == 2)

    def vector_length(table, slot):
        field = table.position + table.field_offset(slot, 4)
        return 64 + field + struct.unpack_from("<I", data, 64 + field)[0]

    blob_table = root.tables(20, "blobs")[1]   # blob 0 is the empty one
    return {
        "tensor count": vector_length(graph, 0),
        "relocation count": vector_length(graph, 7),
        "first blob length": vector_length(blob_table, 0),
        "internal region": 64 + regions.position + regions.field_offset(1, 8),
        "output size": 64 + output.position + output.field_offset(12, 4),
        "output offset": 64 + output.position + output.field_offset(13, 4),
    }


@pytest.mark.parametrize("field, value, width", [
    ("data length", 1 << 62, 8),
    ("json length", 1 << 62, 8),
    ("tensor count", 0x3FFF_FFFF, 4),
    ("relocation count", 0x3FFF_FFFF, 4),
    ("first blob length", 0xFFFF_FFF0, 4),
    ("internal region", 1 << 60, 8),
    ("internal region", 0xFFFF_F000, 8),
    ("output size", 0xFFFF_FFF0, 4),
    ("output offset", 0xFFFF_FF00, 4),
])
def test_huge_size_claims_allocate_nothing(field, value, width):
    name = "rep12_resblock_convadd_3x3_64_56"
    data, _ = fixture(name)
    positions = {"data length": 16, "json length": 64 + struct.unpack_from("<Q", data, 16)[0], **_positions(data)}
    damaged = bytearray(data)
    damaged[positions[field]:positions[field] + width] = value.to_bytes(width, "little")
    damaged = bytes(damaged)
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError):
            model = load_rknn(damaged, name=name)
            relocate(model, plan_memory(model))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(data) + (1 << 20), f"{field}: peak {peak} bytes for a {len(data)}-byte file"
