"""Hand-built .rknn files: the FlatBuffer reader's checks, the container checks and each of the
loader's consistency checks, one damaged field at a time.

The files are written by a tiny FlatBuffer builder in this module (back to front, as the
FlatBuffers library does), from a plain dict spec, so each test changes exactly one fact.
"""

from __future__ import annotations

import json
import logging
import struct

import pytest

from npuemu.isa.errors import ModelFileError
from npuemu.isa.rknn import describe_rknn, format_rknn, load_rknn, plan_memory, relocate
from npuemu.isa.rknn.flatbuffer import FlatBuffer

# --- a minimal FlatBuffer builder --------------------------------------------------------------

_FORMATS = {"u8": "<B", "u16": "<H", "u32": "<I", "i32": "<i", "u64": "<Q", "f32": "<f"}


class Builder:
    """Objects are prepended; an object is named by its distance from the end of the buffer."""

    def __init__(self) -> None:
        self.data = bytearray()

    def _put(self, raw: bytes) -> int:
        self.data[0:0] = raw
        return len(self.data)

    def vector(self, kind: str, values) -> int:
        fmt = _FORMATS[kind][1]
        return self._put(struct.pack(f"<I{len(values)}{fmt}", len(values), *values))

    def structs(self, layout: str, records) -> int:
        return self._put(struct.pack("<I", len(records)) + b"".join(struct.pack(layout, *r) for r in records))

    def raw(self, payload: bytes) -> int:
        return self._put(struct.pack("<I", len(payload)) + payload)

    def string(self, text: str) -> int:
        encoded = text.encode()
        return self._put(struct.pack("<I", len(encoded)) + encoded + b"\0")

    def refs(self, targets: list[int]) -> int:
        end = len(self.data) + 4 + 4 * len(targets)
        return self._put(struct.pack(f"<I{len(targets)}I", len(targets),
                                     *[(end - 4 - 4 * i) - target for i, target in enumerate(targets)]))

    def table(self, fields: dict[int, tuple[str, object]]) -> int:
        body, offsets, links = bytearray(), {}, []
        for slot, (kind, value) in sorted(fields.items()):
            offsets[slot] = 4 + len(body)
            if kind == "ref":
                links.append((4 + len(body), value))
                body += bytes(4)
            else:
                body += struct.pack(_FORMATS[kind], value)
        end = len(self.data) + 4 + len(body)
        for offset, target in links:
            struct.pack_into("<I", body, offset - 4, end - offset - target)
        count = max(fields) + 1 if fields else 0
        vtable = struct.pack(f"<HH{count}H", 4 + 2 * count, 4 + len(body), *[offsets.get(i, 0) for i in range(count)])
        self._put(struct.pack("<i", len(vtable)) + bytes(body))
        self._put(vtable)
        return end

    def finish(self, root: int, identifier: bytes = b"RKNN") -> bytes:
        return struct.pack("<I", len(self.data) + 8 - root) + identifier + bytes(self.data)


def container(flatbuffer: bytes, trailer: bytes = b'{"target_platform": ["rk3588"], "version": "2.5.0"}',
              version: int = 6) -> bytes:
    header = b"RKNN" + struct.pack("<IQQ", 0, version, len(flatbuffer)) + bytes(40)
    return header + flatbuffer + struct.pack("<Q", len(trailer)) + trailer


# --- a small valid model, as a spec --------------------------------------------------------------


def word(target: int, register: int, value: int = 0) -> int:
    return (target << 48) | (value << 16) | register


def default_spec() -> dict:
    # task 0: words 0..2 and tail 3..6 (continues at byte 64), pad word 7; task 1: words 8..9, tail 10..13 (end)
    regcmd = [
        word(0x0201, 0x1070, 0), word(0x0201, 0x1110, 0), word(0x1001, 0x4020, 0x10),
        word(0x0101, 0x0010, 64), word(0x0101, 0x0014, 2), word(0x0041, 0), word(0x0081, 0x0008, 0x1D), 0,
        word(0x1001, 0x4020, 0x20), word(0x0201, 0x1040, 0x84),
        0, word(0x0101, 0x0014, 0), word(0x0041, 0), word(0x0081, 0x0008, 0x18),
    ]
    return {
        "regions": {0: 128, 1: 64, 2: 0},
        "blobs": [None, bytes(range(64)), bytes(range(16)),
                  b"".join(struct.pack("<Q", w) for w in regcmd),
                  struct.pack("<8IQ", 0, 1, 0x1D, 0x300, 0x1FFFF, 0, 3, 0, 0)
                  + struct.pack("<8IQ", 0, 1, 0x18, 0x300, 0x1FFFF, 0, 2, 0, 64)],
        "tensors": [
            {},
            {"name": "w", "kind": 4, "dtype": 3, "layout": 65, "shape": [4, 16], "native": [4, 16], "size": 64,
             "blob": 1},
            {"name": "b", "kind": 4, "dtype": 6, "shape": [4], "native": [4], "size": 16, "blob": 2},
            {"name": "in0", "kind": 1, "dtype": 3, "layout": 64, "shape": [1, 4, 2, 2], "native": [1, 1, 2, 2, 16],
             "size": 32, "scale": [0.5], "zp": [1], "qmethod": "layer", "qtype": "int8"},
            {"name": "out", "kind": 2, "dtype": 3, "layout": 64, "shape": [1, 4, 2, 2], "native": [1, 1, 2, 2, 16],
             "size": 32, "offset": 32, "scale": [0.25], "zp": [-3]},
            {"name": "regcmd", "kind": 9, "dtype": 13, "blob": 3},
            {"name": "task", "kind": 10, "dtype": 13, "blob": 4},
        ],
        "nodes": [{"op": "InputOperator", "name": "InputOperator:in0", "outputs": [3], "tasks": [0]},
                  {"op": "ConvAdd", "name": "Conv:c", "unit": 2, "inputs": [3, 1, 2], "outputs": [4], "tasks": [2]}],
        "inputs": [3], "outputs": [4],
        "relocations": [
            {"name": "in0", "pairs": [(0, 0)], "cores": [(1, 0)]},
            {"name": "out", "pairs": [(0x10, 2), (0x20, 8)], "cores": [(1, 0), (1, 0)]},
            {"name": "w", "pairs": [(0, 1)], "cores": [(1, 0)]},
        ],
    }


def build(spec: dict) -> bytes:
    return container(build_flatbuffer(spec))


def build_flatbuffer(spec: dict) -> bytes:
    b = Builder()
    blobs = [b.table({} if blob is None else {0: ("ref", b.raw(blob))}) for blob in spec["blobs"]]
    tensors = [_tensor(b, t) for t in spec["tensors"]]
    nodes = [_node(b, n) for n in spec["nodes"]]
    relocs = [_reloc(b, r) for r in spec["relocations"]]
    norm = b.table({0: ("ref", b.vector("f32", [0.0])), 1: ("ref", b.vector("f32", [1.0])),
                    2: ("ref", b.vector("u32", [0]))})
    graph_fields = {0: ("ref", b.refs(tensors)), 1: ("ref", b.refs(nodes)),
                    2: ("ref", b.vector("u32", spec["inputs"])), 3: ("ref", b.vector("u32", spec["outputs"])),
                    4: ("ref", b.refs([norm])), 7: ("ref", b.refs(relocs))}
    graphs = [b.table(graph_fields)] if spec.get("graphs", 1) else []
    regions = b.table({slot: ("u64", size) for slot, size in spec["regions"].items()})
    root = b.table({1: ("ref", b.string("RKNPU v2")), 2: ("ref", b.refs(graphs)), 7: ("ref", b.string("2.5.0")),
                    8: ("ref", b.string("rk3588")), 9: ("ref", b.string("ONNX")),
                    16: ("ref", b.string("static_shape")), 19: ("ref", regions), 20: ("ref", b.refs(blobs))})
    return b.finish(root)


def _tensor(b: Builder, t: dict) -> int:
    fields: dict[int, tuple[str, object]] = {}
    for slot, key, kind in ((0, "dtype", "u8"), (1, "layout", "u8"), (2, "kind", "u8"), (12, "size", "u32"),
                            (13, "offset", "u32"), (18, "blob", "u32")):
        if key in t:
            fields[slot] = (kind, t[key])
    for slot, key, kind in ((3, "native", "i32"), (4, "shape", "i32"), (10, "scale", "f32"), (11, "zp", "i32")):
        if key in t:
            fields[slot] = ("ref", b.vector(kind, t[key]))
    for slot, key in ((5, "name"), (6, "qmethod"), (7, "qtype")):
        if key in t:
            fields[slot] = ("ref", b.string(t[key]))
    return b.table(fields)


def _node(b: Builder, n: dict) -> int:
    fields = {1: ("ref", b.string(n["op"])), 2: ("ref", b.string(n["name"])),
              4: ("ref", b.vector("u32", n.get("inputs", []))), 5: ("ref", b.vector("u32", n.get("outputs", []))),
              10: ("ref", b.vector("u32", n["tasks"]))}
    if "unit" in n:
        fields[3] = ("u8", n["unit"])
    return b.table(fields)


def _reloc(b: Builder, r: dict) -> int:
    fields = {0: ("ref", b.string(r["name"])), 1: ("ref", b.structs("<II", r["pairs"]))}
    if r.get("cores") is not None:
        fields[2] = ("ref", b.structs("<II", r["cores"]))
    return b.table(fields)


def load_spec(change=None, name: str = "synthetic.rknn"):
    spec = default_spec()
    if change:
        change(spec)
    return load_rknn(build(spec), name=name)


def refused(change, *fragments: str) -> str:
    with pytest.raises(ModelFileError) as info:
        model = load_spec(change)
        relocate(model, plan_memory(model))
    message = str(info.value)
    assert message.startswith("synthetic.rknn: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- the valid model -------------------------------------------------------------------------------


def test_valid_synthetic_model_loads_and_relocates():
    model = load_spec()
    assert [t.name for t in model.tensors] == ["", "w", "b", "in0", "out", "regcmd", "task"]
    assert model.tensor("out").memory_offset == 32 and model.tensor("in0").memory_offset == 0
    assert model.tensor("in0").scales == (0.5,) and model.tensor("out").zero_points == (-3,)
    assert model.tensor("w").dtype_name == "int8" and model.tensor("b").dtype_name == "int32"
    assert [c.task_count for c in model.program.chains] == [2]
    assert model.program.is_linked(model.program.chains[0])
    assert [(layer.op_type, layer.unit) for layer in model.layers] == [("InputOperator", "CPU"), ("ConvAdd", "NPU")]
    plan = plan_memory(model)
    placements = plan.by_name()
    assert (placements["w"].offset, placements["b"].offset) == (0, 64)
    result = relocate(model, plan)
    words = [int(w) for w in result.regcmd]
    weight, internal, regcmd = result.bases.weight, result.bases.internal, result.bases.regcmd
    assert words[0] == word(0x0201, 0x1070, internal)
    assert words[1] == word(0x0201, 0x1110, weight)
    assert words[2] == word(0x1001, 0x4020, internal + 32 + 0x10)
    assert words[8] == word(0x1001, 0x4020, internal + 32 + 0x20)
    assert words[3] == word(0x0101, 0x0010, regcmd + 64)
    assert words[10] == 0 and words[11] == word(0x0101, 0x0014, 0)
    assert [t.regcmd_addr for t in result.tasks] == [regcmd, regcmd + 64]
    json.dumps(describe_rknn(model))
    assert "ConvAdd" in format_rknn(model)


def test_model_without_npu_program_loads():
    def change(spec):
        spec["tensors"] = spec["tensors"][:5]
        spec["relocations"] = []
    model = load_spec(change)
    assert model.program.chains == () and model.program.regcmd_words == 0
    assert relocate(model).regcmd.size == 0


# --- FlatBuffer reader --------------------------------------------------------------------------


def test_reader_reports_path_and_offset_of_a_bad_vector():
    b = Builder()
    root = b.table({0: ("ref", b.vector("u32", [1, 2, 3]))})
    data = bytearray(b.finish(root))
    vector_at = data.index(struct.pack("<4I", 3, 1, 2, 3))
    struct.pack_into("<I", data, vector_at, 1_000_000)
    table = FlatBuffer(data, "f.bin", 100).root(b"RKNN", "model")
    with pytest.raises(ModelFileError, match=rf"f\.bin: FlatBuffer model\.slot 0 \(file offset {100 + vector_at:#x}\): "
                                             r"\[u32\] vector claims 1000000 elements"):
        table.scalars(0, "u32")


def test_reader_checks_vtables_fields_and_strings():
    b = Builder()
    child = b.table({0: ("u32", 7)})
    root = b.table({0: ("ref", b.string("abc")), 1: ("ref", child), 2: ("u32", 5)})
    good = b.finish(root)
    table = FlatBuffer(good, "f.bin").root(b"RKNN", "model")
    assert (table.string(0), table.table(1, "child").scalar(0, "u32"), table.scalar(2, "u32")) == ("abc", 7, 5)
    assert table.scalar(9, "u32", 42) == 42 and table.string(9) is None and table.slots() == (0, 1, 2)

    unterminated = bytearray(good)
    unterminated[unterminated.index(b"abc\0") + 3] = ord("x")
    with pytest.raises(ModelFileError, match="not NUL-terminated"):
        FlatBuffer(unterminated, "f.bin").root(b"RKNN", "model").string(0)

    root_at = struct.unpack_from("<I", good, 0)[0]
    far_vtable = bytearray(good)
    struct.pack_into("<i", far_vtable, root_at, -10_000)
    with pytest.raises(ModelFileError, match=r"model \(file offset 0x[0-9a-f]+\): vtable .* outside"):
        FlatBuffer(far_vtable, "f.bin").root(b"RKNN", "model")

    vtable_at = root_at - struct.unpack_from("<i", good, root_at)[0]
    big_field = bytearray(good)
    struct.pack_into("<H", big_field, vtable_at + 4 + 2 * 2, 200)
    with pytest.raises(ModelFileError, match=r"model\.slot 2 \(file offset 0x[0-9a-f]+\): field at table offset 200"):
        FlatBuffer(big_field, "f.bin").root(b"RKNN", "model").scalar(2, "u32")

    with pytest.raises(ModelFileError, match="file identifier"):
        FlatBuffer(good, "f.bin").root(b"XXXX", "model")
    with pytest.raises(ModelFileError, match="outside"):
        FlatBuffer(good[:6], "f.bin").root(b"RKNN", "model")


def test_reader_limits_nesting_depth():
    b = Builder()
    inner = b.table({})
    for _ in range(40):
        inner = b.table({0: ("ref", inner)})
    table = FlatBuffer(b.finish(inner), "f.bin").root(None, "model")
    with pytest.raises(ModelFileError, match="nested deeper than 32"):
        while table is not None:
            table = table.table(0, "next")


def test_overlapping_vectors_exhaust_the_decode_budget():
    """A tensor list that references one table with a large shape 2000 times is refused, not expanded."""
    def change(spec):
        spec["tensors"][1]["shape"] = list(range(2000))
    spec = default_spec()
    change(spec)
    b = Builder()
    shared = _tensor(b, spec["tensors"][1])
    tensors = b.refs([shared] * 2000)
    graph = b.table({0: ("ref", tensors)})
    root = b.table({2: ("ref", b.refs([graph]))})
    with pytest.raises(ModelFileError, match="overlap implausibly"):
        load_rknn(container(b.finish(root)), name="synthetic.rknn")


def test_invalid_utf8_string_is_refused():
    data = bytearray(build(default_spec()))
    data[data.index(b"RKNPU v2")] = 0xFF
    with pytest.raises(ModelFileError, match=r"model\.slot 1 \(file offset 0x[0-9a-f]+\): string is not valid UTF-8"):
        load_rknn(bytes(data), name="synthetic.rknn")


# --- container -------------------------------------------------------------------------------------


VALID = build(default_spec())


@pytest.mark.parametrize("damage, fragment", [
    (lambda d: d[:10], "too short"),
    (lambda d: b"RKNX" + d[4:], "magic is b'RKNX'"),
    (lambda d: d[:8] + struct.pack("<Q", 0x1004) + d[16:], "RV1106/RV1103 builds) is not supported"),
    (lambda d: d[:8] + struct.pack("<Q", 5) + d[16:], "unsupported .rknn format version 0x5"),
    (lambda d: d[:16] + struct.pack("<Q", 1 << 62) + d[24:], "offset 16 claims"),
    (lambda d: d + b"\0", "JSON length"),
    (lambda d: d[:-1], "JSON length"),
    (lambda d: d[:-2] + b"!}", "not valid JSON"),
    (lambda d: d[:64] + d[64:68] + b"ABCD" + d[72:], "file identifier is b'ABCD'"),
])
def test_container_damage_is_refused(damage, fragment):
    with pytest.raises(ModelFileError, match="synthetic.rknn") as info:
        load_rknn(damage(VALID), name="synthetic.rknn")
    assert fragment in str(info.value)


@pytest.mark.parametrize("trailer, fragment", [
    (b"[1, 2]", "expected an object"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (b'{"a": "\xff"}', "not UTF-8"),
])
def test_bad_trailers_are_refused(trailer, fragment):
    with pytest.raises(ModelFileError, match=fragment):
        load_rknn(container(build_flatbuffer(default_spec()), trailer), name="synthetic.rknn")


def test_unreadable_path_is_a_model_file_error(tmp_path):
    with pytest.raises(ModelFileError, match="cannot read"):
        load_rknn(tmp_path / "missing.rknn")


def test_nonzero_reserved_header_bytes_only_warn(caplog):
    data = bytearray(VALID)
    data[40] = 1
    with caplog.at_level(logging.WARNING):
        load_rknn(bytes(data), name="synthetic.rknn")
    assert "reserved header bytes" in caplog.text


# --- the loader's consistency checks ------------------------------------------------------------------


def _set(path, value):
    def change(spec):
        target = spec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


CASES = {
    "blob index": (_set(("tensors", 1, "blob"), 9), ("graphs[0].tensors[1].slot 18", "blob index 9")),
    "shared blob": (_set(("tensors", 2, "blob"), 1),
                    ("graphs[0].tensors[2].slot 18", "already the data of tensors[1]")),
    "input id": (_set(("inputs",), [99]), ("graphs[0].slot 2", "names tensor 99")),
    "node output id": (_set(("nodes", 1, "outputs"), [77]), ("graphs[0].nodes[1].slot 5", "tensor 77")),
    "region size": (_set(("regions", 1), 1 << 32), ("model.regions.slot 1", "32-bit")),
    "no graph": (_set(("graphs",), 0), ("model.slot 2", "no graph")),
    "regcmd words": (_set(("blobs", 3), bytes(13)), ("tensors[5]", "not a whole number of 8-byte")),
    "task records": (_set(("blobs", 4), bytes(41)), ("tensors[6]", "40-byte task records")),
    "two regcmd tensors": (_set(("tensors", 2, "kind"), 9), ("all have kind 9",)),
    "task without regcmd": (_set(("tensors", 5, "kind"), 3), ("regcmd (kind 9) tensor is missing",)),
    "regcmd_addr misaligned": (_set(("blobs", 4), struct.pack("<8IQ", 0, 1, 0x1D, 0, 0, 0, 3, 0, 4) * 2),
                               ("task record 0", "not a multiple of 8")),
    "block past blob": (_set(("blobs", 4), struct.pack("<8IQ", 0, 1, 0x1D, 0, 0, 0, 30, 0, 0)),
                        ("task record 0", "past the 14-word regcmd blob")),
    "tail is not a PC word": (_set(("blobs", 4), struct.pack("<8IQ", 0, 1, 0x1D, 0, 0, 0, 2, 0, 0)),
                              ("task record 0", "regcmd word 3", "PC_REGISTER_AMOUNTS")),
    "chain never ends": (_set(("blobs", 4), struct.pack("<8IQ", 0, 1, 0x18, 0, 0, 0, 2, 0, 64)
                               + struct.pack("<8IQ", 0, 1, 0x1D, 0, 0, 0, 3, 0, 0)),
                         ("records 1..1 never reach a tail that ends",)),
    "tail into no block": (_set(("blobs", 4), struct.pack("<8IQ", 0, 1, 0x1D, 0, 0, 0, 3, 0, 0)),
                           ("task record 0", "offset 0x40, which is not the start")),
    "relocated name unknown": (_set(("relocations", 0, "name"), "nope"),
                               ("graphs[0].relocations[0].slot 0", "'nope', which does not exist")),
    "relocated blob": (_set(("relocations", 0, "name"), "regcmd"), ("relocations[0].slot 0", "never relocates")),
    "relocated word past end": (_set(("relocations", 0, "pairs"), [(0, 14)]),
                                ("relocations[0].slot 1", "word index 14 is past")),
    "relocated tail word": (_set(("relocations", 0, "pairs"), [(0, 4)]),
                            ("relocations[0].slot 1", "PC tail word")),
    "relocated twice": (_set(("relocations", 2, "pairs"), [(0, 0)]),
                        ("relocations[2].slot 1", "also relocated by relocations[0]")),
    "core list length": (_set(("relocations", 1, "cores"), [(1, 0)]), ("relocations[1].slot 2", "1 core records")),
    "internal extent": (_set(("tensors", 4, "offset"), 48), ("tensors[4]", "past the internal region")),
    "const size vs blob": (_set(("tensors", 1, "size"), 65), ("tensors[1]", "slot 12 says 65")),
    "relocated tensor without data": (_set(("tensors", 1, "blob"), None), ("'w' (const)", "no place")),
    "address overflow": (_set(("relocations", 0, "pairs"), [(0xFFFF_FFF0, 0)]), ("does not fit the 32-bit",)),
}


def _without_none(change):
    def wrapped(spec):
        change(spec)
        for tensor in spec["tensors"]:
            for key in [k for k, v in tensor.items() if v is None]:
                del tensor[key]
    return wrapped


@pytest.mark.parametrize("case", sorted(CASES))
def test_inconsistent_models_are_refused(case):
    change, fragments = CASES[case]
    refused(_without_none(change), *fragments)


def test_program_errors_give_file_offsets():
    record = struct.pack("<8IQ", 0, 1, 0x1D, 0, 0, 0, 2, 0, 0)
    data = build(_apply(_set(("blobs", 4), record)))
    tail_word = struct.pack("<Q", word(0x0101, 0x0010, 64))
    with pytest.raises(ModelFileError) as info:
        load_rknn(data, name="synthetic.rknn")
    assert f"task record 0 (file offset {data.index(record):#x})" in str(info.value)
    assert f"regcmd word 3 (file offset {data.index(tail_word):#x})" in str(info.value)


def _apply(change) -> dict:
    spec = default_spec()
    change(spec)
    return spec


def test_empty_core_list_means_absent():
    model = load_spec(_set(("relocations", 0, "cores"), []))
    assert model.relocations[0].cores is None and model.relocations[1].cores == ((1, 0), (1, 0))
