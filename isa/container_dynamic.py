"""Dynamic-shape model files (CONTAINER.md 3.7, format 1.1): one file, one chain set per input
shape set, the weights stored once.

The top-level trailer describes shape set 0 exactly as a static file does (an older reader runs
that set). The trailer key ``dynamic`` lists the shape sets; every later set carries its own
``graph``, ``tensors``, ``memory_map``, ``schedule`` and the list of sections it places, by
name, with the region and load address they take in that set. A section only later sets use is
stored unplaced (region none), so set 0's memory image is what an older reader loads.

This module holds pure functions on (sections, trailer): the schema and bounds of the
``dynamic`` record, and the static view of one set (``view``); ``container.ModelFile`` checks
every view as a model file of its own and picks one by input shapes (``ModelFile.shape_set``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from npuemu.isa.container_format import FLAG_DYNAMIC_SHAPES, MemoryRegion
from npuemu.isa.container_section import Section, name_problem
from npuemu.isa.container_trailer import SchemaViolation
from npuemu.isa.errors import InputError

KEY = "dynamic"
# FLAG_DYNAMIC_SHAPES (container_format): optional header flag bit 1, the file has more than one
# input shape set (format 1.1); bit 0 stays unassigned (tests use it as the optional bit a reader
# does not know)
#: the first format version with the ``dynamic`` key; static files are still written as 1.0
DYNAMIC_VERSION = (1, 1)
#: shape sets in one file; each is a complete build, so this bounds the work of checking a file
#: ([I] the vendor guide gives no limit; 32 covers its examples of a few resolutions)
MAX_SHAPE_SETS = 32
#: rank of one input shape
MAX_RANK = 8
MAX_DIM = (1 << 31) - 1
MAX_ELEMENTS = 1 << 32
#: the trailer keys a later set replaces; every other top-level key is shared by all sets
SET_KEYS = ("graph", "tensors", "memory_map", "schedule")
PLACED_REGIONS = ("ddr", "sram")


def _fail(path: str, message: str) -> SchemaViolation:
    return SchemaViolation(f"{path}: {message}")


def _uint(value: Any, path: str, limit: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise _fail(path, f"expected an integer 0..{limit}, got {value!r:.60}")
    return value


def _list(value: Any, path: str, low: int, high: int) -> list:
    if not isinstance(value, list) or not low <= len(value) <= high:
        raise _fail(path, f"expected an array of {low}..{high} entries, got "
                          f"{len(value) if isinstance(value, list) else type(value).__name__}")
    return value


def _shape(value: Any, path: str) -> tuple[int, ...]:
    shape = tuple(_uint(dim, f"{path}[{i}]", MAX_DIM) for i, dim in enumerate(_list(value, path, 1, MAX_RANK)))
    if math.prod(shape) > MAX_ELEMENTS:
        raise _fail(path, f"{math.prod(shape)} elements; at most {MAX_ELEMENTS}")
    return shape


def check_dynamic(sections: Sequence[Section], trailer: Mapping[str, Any]) -> None:
    """Schema and bounds of ``trailer['dynamic']`` (CONTAINER.md 3.7) that need no view; each
    set's view is then checked as a whole model file by the caller."""
    record = trailer[KEY]
    if not isinstance(record, dict):
        raise _fail(f"trailer.{KEY}", "expected an object")
    graph_inputs = trailer.get("graph", {}).get("inputs", [])
    inputs = _list(record.get("inputs"), f"trailer.{KEY}.inputs", 1, max(1, len(graph_inputs)))
    if any(not isinstance(name, str) or name not in graph_inputs for name in inputs) or len(set(inputs)) != len(inputs):
        raise _fail(f"trailer.{KEY}.inputs", f"expected distinct graph inputs ({', '.join(graph_inputs) or 'none'})")
    sets = _list(record.get("sets"), f"trailer.{KEY}.sets", 2, MAX_SHAPE_SETS)
    names = {section.name for section in sections}
    seen = set()
    for index, entry in enumerate(sets):
        path = f"trailer.{KEY}.sets[{index}]"
        if not isinstance(entry, dict):
            raise _fail(path, "expected an object")
        shapes = tuple(_shape(shape, f"{path}.shapes[{i}]")
                       for i, shape in enumerate(_list(entry.get("shapes"), f"{path}.shapes", len(inputs), len(inputs))))
        if shapes in seen:
            raise _fail(f"{path}.shapes", "repeats an earlier set's shapes")
        seen.add(shapes)
        if index == 0:
            extra = sorted(set(entry) - {"shapes"})
            if extra:
                raise _fail(path, f"set 0 is the top-level trailer; unexpected key(s) {', '.join(extra)}")
            continue
        missing = [key for key in SET_KEYS if key not in entry]
        if missing:
            raise _fail(path, f"missing key(s) {', '.join(missing)}")
        _check_placements(entry.get("sections"), f"{path}.sections", names)
    _check_set0_sections(sections, sets)


def _check_placements(value: Any, path: str, names: set[str]) -> None:
    seen, views = set(), set()
    for index, place in enumerate(_list(value, path, 1, max(1, len(names)))):
        where = f"{path}[{index}]"
        if not isinstance(place, dict) or set(place) != {"name", "as", "region", "load_address"}:
            raise _fail(where, "expected an object with exactly name, as, region, load_address")
        if place["name"] not in names or place["name"] in seen:
            raise _fail(f"{where}.name", f"{place['name']!r:.60} is not a section of the file, or is listed twice")
        seen.add(place["name"])
        problem = name_problem(place["as"]) if isinstance(place["as"], str) else "is not a string"
        if problem or place["as"] in views:
            raise _fail(f"{where}.as", f"the section name in the set {problem or 'is used twice'}")
        views.add(place["as"])
        if place["region"] not in PLACED_REGIONS:
            raise _fail(f"{where}.region", f"expected one of {', '.join(PLACED_REGIONS)}")
        _uint(place["load_address"], f"{where}.load_address", (1 << 32) - 1)


def _check_set0_sections(sections: Sequence[Section], sets: list) -> None:
    """A section stored unplaced must belong to a later set (else it is dead weight a hostile
    file could use to hide bytes no view checks)."""
    listed = {place["name"] for entry in sets[1:] for place in entry["sections"]}
    for section in sections:
        if section.region is MemoryRegion.NONE and section.name not in listed:
            raise _fail(f"trailer.{KEY}.sets", f"section {section.name!r} is unplaced and no shape set places it")


def shape_sets(trailer: Mapping[str, Any]) -> tuple[dict[str, tuple[int, ...]], ...]:
    """Each set's input shapes by input name ((the graph inputs' shapes) for a static file)."""
    record = trailer.get(KEY)
    if record is None:
        return ()
    return tuple(dict(zip(record["inputs"], (tuple(shape) for shape in entry["shapes"])))
                 for entry in record["sets"])


def view(sections: Sequence[Section], trailer: Mapping[str, Any], index: int) -> tuple[tuple[Section, ...], dict]:
    """The static model of set ``index``: its sections placed, its trailer without ``dynamic``."""
    record = trailer[KEY]
    base = {key: value for key, value in trailer.items() if key != KEY}
    listed = {place["name"] for entry in record["sets"][1:] for place in entry["sections"]}
    if index == 0:
        own = tuple(s for s in sections if not (s.region is MemoryRegion.NONE and s.name in listed))
        return own, base
    entry = record["sets"][index]
    by_name = {section.name: section for section in sections}
    own = tuple(dataclasses.replace(by_name[place["name"]], name=place["as"], region=MemoryRegion.parse(place["region"]),
                                    load_address=place["load_address"]) for place in entry["sections"])
    return own, base | {key: entry[key] for key in SET_KEYS}


def describe(sets: Sequence[Mapping[str, Sequence[int]]]) -> str:
    """'x=1,3,224,224; x=1,3,160,160' - the sets as `compile --dynamic-input` takes them."""
    return "; ".join(" ".join(f"{name}={','.join(map(str, shape))}" for name, shape in entry.items())
                     for entry in sets)


def pick(sets: Sequence[Mapping[str, Sequence[int]]], given: Mapping[str, Sequence[int]]) -> int:
    """The index of the set whose shapes equal ``given`` (name -> shape); an InputError naming the
    allowed sets otherwise. Inputs not in ``given`` match any set (a caller checks them later)."""
    for index, entry in enumerate(sets):
        if all(tuple(given[name]) == tuple(shape) for name, shape in entry.items() if name in given):
            return index
    shown = " ".join(f"{name}={','.join(map(str, shape))}" for name, shape in given.items())
    raise InputError(f"input shape(s) {shown} match none of the model's shape sets: {describe(sets)}")


def set_note(sets: Sequence[Mapping[str, Sequence[int]]], index: int) -> str:
    """What a tool says when it runs one set of a dynamic-shape file."""
    others = ", ".join(f"{i}: {describe([entry])}" for i, entry in enumerate(sets) if i != index)
    return (f"dynamic-shape model: shape set {index} of {len(sets)} ({describe([sets[index]])}); "
            f"--shape-set N for another ({others})")


__all__ = ["DYNAMIC_VERSION", "FLAG_DYNAMIC_SHAPES", "KEY", "MAX_SHAPE_SETS", "check_dynamic", "describe", "pick", "set_note",
           "shape_sets", "view"]
