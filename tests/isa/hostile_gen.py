"""Hostile inputs for every command that reads a user's file (issue 23).

Seeded and deterministic. Model files are mutated at three levels and always re-sealed with
valid CRCs, so each edit reaches the semantic checks instead of stopping at a checksum:

- trailer: every numeric leaf of the trailer of a small valid model set to hostile numbers
  (0, -1, 2^31, 2^40, 2^64-1, fractions, wrong types), every string leaf to a name that
  exists nowhere, keys deleted, known optional keys added;
- header and section table: fields overwritten with hostile values, table and header CRCs
  recomputed;
- register payload: command words of the regcmd section given extreme values, the section's
  CRC recomputed.

Besides model files: ONNX graphs with broken attributes, platform YAML with hostile figures
and assembly text with hostile directives. Each case is ``(label, argv)``: a command line of
``npuemu`` whose files are written into a folder by :func:`write_cases`.
"""

from __future__ import annotations

import copy
import json
import random
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HOSTILE_NUMBERS: tuple[Any, ...] = (0, -1, 1, 3, 255, 2**31, 2**32 + 8, 2**40, 2**63, 2**64 - 1, -(2**63), 0.5,
                                    1e300, "7", None, True, [], {})
HOSTILE_STRINGS: tuple[Any, ...] = ("bogus", "", "ddr", "NC1HWC2", "ND", "int64", 7, None)
#: keys a trailer record may carry but the small model leaves out: each is added with hostile values
OPTIONAL_KEYS = {"tensors": ("surface_stride", "c2", "batch", "quantization", "view_of"),
                 "": ("batch",)}


# --- the base model ---------------------------------------------------------------------------


def tiny_onnx():
    """Conv+Relu+MaxPool on a [1, 3, 8, 8] input: one chain of two tasks."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.RandomState(0).randn(8, 3, 3, 3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def base_model(precision: str = "fp16"):
    from npuemu.compiler.driver import CompileOptions, compile_model

    return compile_model(tiny_onnx(), "rk3588", CompileOptions(precision=precision))


def rebuild(model, trailer: Any = None, sections=None) -> bytes:
    """A file with valid CRCs everywhere, whatever the trailer says (no schema check)."""
    from npuemu.isa.container_writer import build_file

    return build_file(model.sections if sections is None else sections,
                      model.trailer if trailer is None else trailer)


def reseal(data: bytearray) -> bytes:
    """Recompute the section table and header CRCs (CONTAINER.md 1.1)."""
    count, table_offset = struct.unpack_from("<IQ", data, 20)
    if table_offset + 96 * count <= len(data):
        struct.pack_into("<I", data, 56, zlib.crc32(data[table_offset:table_offset + 96 * count]))
    struct.pack_into("<I", data, 60, zlib.crc32(data[:60]))
    return bytes(data)


# --- trailer mutations ------------------------------------------------------------------------


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list) and value and not all(isinstance(v, (int, float)) for v in value):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path, value


def _set(trailer: dict, path: tuple, value: Any, delete: bool = False) -> dict:
    result = copy.deepcopy(trailer)
    target = result
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return result


def trailer_mutations(trailer: dict, rng: random.Random, per_leaf: int = 3) -> Iterator[tuple[str, dict]]:
    for path, value in _leaves(trailer):
        if path[:1] == ("format",):
            continue  # the writer rewrites it from the header
        label = ".".join(map(str, path))
        if isinstance(value, list):  # a shape-like list of numbers: each entry, and the list itself
            for index in range(len(value)):
                for hostile in rng.sample(HOSTILE_NUMBERS, per_leaf):
                    yield f"{label}[{index}]={hostile!r}", _set(trailer, (*path, index), hostile)
            yield f"{label}=[]", _set(trailer, path, [])
        pool = HOSTILE_STRINGS if isinstance(value, str) else HOSTILE_NUMBERS
        for hostile in rng.sample(pool, per_leaf):
            yield f"{label}={hostile!r}", _set(trailer, path, hostile)
        if isinstance(path[-1], str):
            yield f"del {label}", _set(trailer, path, None, delete=True)
    for index, _ in enumerate(trailer.get("tensors", ())):
        for key in OPTIONAL_KEYS["tensors"]:
            for hostile in rng.sample(HOSTILE_NUMBERS, per_leaf):
                yield f"tensors.{index}.{key}={hostile!r}", _set(trailer, ("tensors", index, key), hostile)
    for hostile in ({"size": 1, "contexts": 0}, {"size": 0, "contexts": 0}, {"size": 2**40, "contexts": 2**40},
                    {"size": 3, "contexts": 5}):
        yield f"batch={hostile}", _set(trailer, ("batch",), hostile)


# --- binary mutations -------------------------------------------------------------------------

#: (offset, struct format) of every header field after the magic
HEADER_FIELDS = ((8, "<H"), (10, "<H"), (12, "<I"), (16, "<I"), (20, "<I"), (24, "<Q"), (32, "<Q"), (40, "<Q"),
                 (48, "<I"))
#: (offset inside an entry, struct format) of every section-table field
ENTRY_FIELDS = ((0, "<H"), (2, "<B"), (3, "<B"), (4, "<I"), (8, "<Q"), (16, "<Q"), (24, "<Q"), (36, "<I"))
_LIMITS = {"<B": 0xFF, "<H": 0xFFFF, "<I": 0xFFFF_FFFF, "<Q": 2**64 - 1}


def _field_values(fmt: str, rng: random.Random) -> list[int]:
    top = _LIMITS[fmt]
    return sorted({0, 1, top, top // 2 + 1, rng.randrange(top + 1), min(top, 64), min(top, 4096)})


def binary_mutations(data: bytes, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    for offset, fmt in HEADER_FIELDS:
        for value in _field_values(fmt, rng):
            buffer = bytearray(data)
            struct.pack_into(fmt, buffer, offset, value)
            yield f"header+{offset}={value}", reseal(buffer)
    count = struct.unpack_from("<I", data, 20)[0]
    for index in range(count):
        for offset, fmt in ENTRY_FIELDS:
            for value in rng.sample(_field_values(fmt, rng), 3):
                buffer = bytearray(data)
                struct.pack_into(fmt, buffer, 64 + 96 * index + offset, value)
                yield f"entry{index}+{offset}={value}", reseal(buffer)


def payload_mutations(model, rng: random.Random, count: int = 60) -> Iterator[tuple[str, bytes]]:
    """Register words of the regcmd section given extreme 32-bit values (register kept)."""
    from npuemu.isa.container import Section, SectionKind

    index = next(i for i, s in enumerate(model.sections) if s.kind is SectionKind.REGCMD)
    regcmd = model.sections[index]
    words = np.frombuffer(regcmd.data, "<u8").copy()
    for _ in range(count):
        position = rng.randrange(len(words))
        value = rng.choice((0, 1, 0xFFFF_FFFF, 0x8000_0000, 0xFFFF, rng.randrange(1 << 32)))
        edited = words.copy()
        edited[position] = (int(words[position]) & ~(0xFFFF_FFFF << 16) & (2**64 - 1)) | (value << 16)
        sections = list(model.sections)
        sections[index] = Section(regcmd.kind, regcmd.name, edited.tobytes(), regcmd.region, regcmd.load_address,
                                  regcmd.alignment)
        yield f"regcmd word {position} value={value:#x}", rebuild(model, sections=sections)


# --- other inputs -----------------------------------------------------------------------------


def onnx_cases() -> Iterator[tuple[str, Any]]:
    """(label, ModelProto) with a broken attribute or a huge constant to fold."""
    from onnx import TensorProto, helper, numpy_helper

    def graph(nodes, inits=(), shape=(1, 3, 8, 8)):
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
        outputs = [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)]
        return helper.make_model(helper.make_graph(nodes, "hostile", inputs, outputs, list(inits)),
                                 opset_imports=[helper.make_opsetid("", 13)])

    weight = numpy_helper.from_array(np.ones((8, 3, 3, 3), np.float32), "w")
    empty = numpy_helper.from_array(np.ones((0, 3, 3, 3), np.float32), "w")
    yield "conv 0 output channels", graph([helper.make_node("Conv", ["x", "w"], ["y"])], [empty])
    for attrs in ({"strides": [0, 1]}, {"strides": [-1, 1]}, {"dilations": [0, 0]}, {"pads": [-1, 0, 0, 0]},
                  {"kernel_shape": [0, 3]}, {"pads": [1, 1]}, {"group": 0}, {"pads": [50, 50, -120, -120]}):
        yield f"conv {attrs}", graph([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], [weight])
    for attrs in ({"kernel_shape": [9, 9]}, {"kernel_shape": [2, 2], "strides": [0, 0]},
                  {"kernel_shape": [2, 2], "pads": [-1, -1, 0, 0]}, {"kernel_shape": [2]},
                  {"kernel_shape": [2, 2], "dilations": [9, 9]}):
        for op in ("MaxPool", "AveragePool"):
            yield f"{op} {attrs}", graph([helper.make_node(op, ["x"], ["y"], **attrs)])
    for dims in ((1 << 20, 1 << 20), (1 << 15, 1 << 15)):  # 8 TiB and 8 GiB of float64: over the fold cap
        shape = numpy_helper.from_array(np.array(dims, np.int64), "s")
        fill = helper.make_tensor("v", TensorProto.DOUBLE, [1], [1.0])
        nodes = [helper.make_node("ConstantOfShape", ["s"], ["k"], value=fill),
                 helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
                 helper.make_node("ReduceSum", ["kf"], ["r"], keepdims=1),
                 helper.make_node("Add", ["x", "r"], ["y"])]
        yield f"fold {dims}", graph(nodes, [shape])


def yaml_cases(rng: random.Random, count: int = 40) -> Iterator[tuple[str, str]]:
    """The shipped RK3588 YAML with one numeric figure set to a hostile value."""
    import yaml

    from npuemu.platforms import loader

    source = Path(loader.__file__).parent / "rk3588.yaml"
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    leaves = [(path, value) for path, value in _leaves(data) if isinstance(value, (int, float))
              and not isinstance(value, bool)]
    for path, _ in rng.sample(leaves, min(count, len(leaves))):
        hostile = rng.choice((0, -1, 2**40, 2**64, 0.5, 1e300, "x", None, []))
        yield f"yaml {'.'.join(map(str, path))}={hostile!r}", yaml.safe_dump(_set(data, path, hostile))


ASM_CASES = (".align 1099511627776", ".align 268435456", ".align 0", ".align -8", ".zero 1099511627776",
             ".zero 100000000", ".zero -1", ".word 18446744073709551616", ".byte 256", ".base 99999999999999999999",
             ".chain base=-1\n.task enable=CNA\n", ".chain scale=0\n.task enable=CNA\nCNA CONV_CON1 = 1",
             ".map nowhere", "CNA CONV_CON1 = 0x1ffffffff", ".task 99999999999999999999999",
             "\n".join([".zero 8000000"] * 10))


# --- writing the cases ------------------------------------------------------------------------


def _model_commands(name: str, folder: Path) -> list[list[str]]:
    path = str(folder / name)
    return [["run", path, "-i", str(folder / "x.npy")], ["perf", path],
            ["trace", path, "-o", str(folder / (name + ".trace.json"))], ["mem", path], ["inspect", path]]


def write_cases(folder: Path, seed: int = 23) -> list[tuple[str, list[str]]]:
    """Write every hostile file into ``folder``; the ``npuemu`` command lines that read them."""
    import onnx

    rng = random.Random(seed)
    model = base_model()
    np.save(folder / "x.npy", np.random.RandomState(1).rand(1, 3, 8, 8).astype(np.float32))
    cases: list[tuple[str, list[str]]] = []
    files: list[tuple[str, bytes]] = [(label, rebuild(model, trailer)) for label, trailer in
                                      trailer_mutations(model.trailer, rng)]
    files += list(binary_mutations(rebuild(model), rng)) + list(payload_mutations(model, rng))
    for number, (label, data) in enumerate(files):
        name = f"m{number}.npu"
        (folder / name).write_bytes(data)
        commands = _model_commands(name, folder)
        for argv in rng.sample(commands, 2) if number % 4 else commands:  # every command sees many files
            cases.append((label, argv))
    for number, (label, proto) in enumerate(onnx_cases()):
        path = folder / f"o{number}.onnx"
        onnx.save(proto, str(path))
        cases.append((label, ["compile", str(path), "--fp16"]))
    for number, (label, text) in enumerate(yaml_cases(rng)):
        path = folder / f"p{number}.yaml"
        path.write_text(text, encoding="utf-8")
        cases.append((label, ["platforms", "--file", str(path)]))
    for number, text in enumerate(ASM_CASES):
        path = folder / f"a{number}.s"
        path.write_text(text + "\n", encoding="utf-8")
        cases.append((f"asm {text[:40]!r}", ["asm", str(path), "-o", str(folder / f"a{number}.bin")]))
    (folder / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    return cases
