"""The npuemu model file (``.npu``): everything the emulator needs to run a compiled network.

A :class:`ModelFile` is a tuple of :class:`Section` payloads (register commands, weights,
constants, LUTs, initial I/O buffers) and a JSON trailer (platform, compiler options, graph
labels, tensors, memory map, schedule). The byte layout and the trailer schema are specified
in ``CONTAINER.md`` next to this module; ``container_format`` holds the layout constants,
``container_reader``/``container_writer`` the two directions, ``container_trailer`` the
JSON schema and ``container_views`` the typed accessors.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuemu.isa.container_format import (
    FORMAT_NAME, FORMAT_VERSION, MAGIC, MAX_SECTIONS, STATIC_VERSION, MemoryRegion, SectionKind, version_text,
)
from npuemu.isa import container_dynamic as dynamic
from npuemu.isa.container_reader import parse_file
from npuemu.isa.container_section import Section
from npuemu.isa.container_semantics import check_semantics
from npuemu.isa.container_trailer import SchemaViolation, canonical_trailer, validate_trailer
from npuemu.isa.container_writer import build_file, write_atomically
from npuemu.isa.container_views import (
    AreaInfo, ChainRef, CompilerInfo, CpuStep, GraphInfo, LayerInfo, MemoryMap, NpuStep, PlatformInfo, Quantization,
    RegionInfo, Step, TaskRange, TensorInfo, step_from_json,
)
from npuemu.isa.errors import ModelFileError

__all__ = [
    "FORMAT_NAME", "FORMAT_VERSION", "MAGIC", "MAX_SECTIONS", "AreaInfo", "ChainRef", "CompilerInfo", "CpuStep",
    "GraphInfo", "LayerInfo", "MemoryMap", "MemoryRegion", "ModelFile", "NpuStep", "PlatformInfo", "Quantization",
    "RegionInfo", "Section", "SectionKind", "Step", "TaskRange", "TensorInfo",
]


@dataclass(frozen=True)
class ModelFile:
    """Sections plus the trailer dict; validated on construction.

    ``trailer`` is stored in canonical JSON form (a deep copy; tuples become lists) and its
    ``format`` entry always names this format and ``format_version``. ``format_version`` is
    the version the file was read with (the writer always writes :data:`FORMAT_VERSION`);
    ``checksum_failures`` lists sections whose checksum did not match when read with
    ``verify_sections=False``. Neither field takes part in equality, but the version does
    through ``trailer["format"]``: a 1.1 file rewritten by this 1.0 writer is a 1.0 file.
    """

    sections: tuple[Section, ...] = ()
    trailer: dict[str, Any] = field(default_factory=dict)
    format_version: tuple[int, int] | None = field(default=None, compare=False)
    checksum_failures: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        sections = tuple(self.sections)
        _check_sections(sections)
        trailer = canonical_trailer(self.trailer)
        validate_trailer(trailer)
        version = self.format_version or _written_version(trailer)
        fmt = {**trailer.pop("format", {}), "name": FORMAT_NAME, "version": version_text(*version)}
        trailer = {"format": fmt, **trailer}
        _check_references(sections, trailer)
        check_semantics(sections, trailer)
        if dynamic.KEY in trailer:
            _check_shape_sets(sections, trailer, version)
        object.__setattr__(self, "sections", sections)
        object.__setattr__(self, "trailer", trailer)
        object.__setattr__(self, "format_version", version)

    # --- bytes and files --------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        version = _written_version(self.trailer)  # 1.0 unless a 1.1 feature is used: static files unchanged
        fmt = {**self.trailer["format"], "version": version_text(*version)}
        flags = dynamic.FLAG_DYNAMIC_SHAPES if dynamic.KEY in self.trailer else 0
        return build_file(self.sections, {**self.trailer, "format": fmt}, version, flags)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, *, name: str = "<bytes>",
                   verify_sections: bool = True) -> ModelFile:
        """Read a model file; ``name`` labels error messages (usually the path)."""
        parsed = parse_file(data, name, verify_sections=verify_sections)
        if not isinstance(parsed.trailer, dict):
            raise ModelFileError(f"{name}: trailer at offset {parsed.trailer_offset:#x}: expected a JSON object, "
                                 f"got {type(parsed.trailer).__name__}")
        flagged = bool(parsed.flags & dynamic.FLAG_DYNAMIC_SHAPES)
        if flagged != (dynamic.KEY in parsed.trailer):
            raise ModelFileError(f"{name}: header flag bit 1 (dynamic shapes) is {'set' if flagged else 'clear'} but "
                                 f"the trailer {'has no' if flagged else 'has a'} '{dynamic.KEY}' record")
        try:
            return cls(parsed.sections, parsed.trailer, parsed.version, parsed.checksum_failures)
        except ModelFileError as error:
            raise ModelFileError(f"{name}: trailer at offset {parsed.trailer_offset:#x}: {error}") from None

    def write(self, path: str | os.PathLike[str]) -> None:
        data = self.to_bytes()
        try:
            write_atomically(path, data)  # a killed writer leaves the old file, not half a new one
        except OSError as error:
            raise ModelFileError(f"{path}: cannot write the model file: {error.strerror or error}") from None

    @classmethod
    def read(cls, path: str | os.PathLike[str], *, verify_sections: bool = True) -> ModelFile:
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            raise ModelFileError(f"{path}: cannot read the model file: {error.strerror or error}") from None
        return cls.from_bytes(data, name=str(path), verify_sections=verify_sections)

    # --- sections ---------------------------------------------------------------------------

    def section(self, name: str) -> Section:
        for section in self.sections:
            if section.name == name:
                return section
        known = ", ".join(repr(s.name) for s in self.sections) or "none"
        raise ModelFileError(f"no section named {name!r} in the model file (sections: {known})")

    def sections_of_kind(self, kind: SectionKind | str) -> tuple[Section, ...]:
        wanted = SectionKind.parse(kind)
        return tuple(section for section in self.sections if section.kind is wanted)

    # --- typed views of the trailer ---------------------------------------------------------

    def platform(self) -> PlatformInfo:
        return PlatformInfo.from_json(self.trailer.get("platform", {}))

    def compiler(self) -> CompilerInfo:
        return CompilerInfo.from_json(self.trailer.get("compiler", {}))

    def graph(self) -> GraphInfo:
        return GraphInfo.from_json(self.trailer.get("graph", {}))

    def layers(self) -> tuple[LayerInfo, ...]:
        return self.graph().layers

    def tensors(self) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo.from_json(tensor) for tensor in self.trailer.get("tensors", ()))

    def tensor(self, name: str) -> TensorInfo:
        for tensor in self.trailer.get("tensors", ()):
            if tensor["name"] == name:
                return TensorInfo.from_json(tensor)
        raise ModelFileError(f"no tensor named {name!r} in the model file")

    def schedule(self) -> tuple[Step, ...]:
        return tuple(step_from_json(step) for step in self.trailer.get("schedule", ()))

    def memory_map(self) -> MemoryMap:
        return MemoryMap.from_json(self.trailer.get("memory_map", {}))

    @property
    def extra(self) -> dict[str, Any]:
        return self.trailer.get("extra", {})

    # --- dynamic shapes (CONTAINER.md 3.7) ----------------------------------------------------

    def shape_sets(self) -> tuple[dict[str, tuple[int, ...]], ...]:
        """Each input shape set (input name -> shape) of a dynamic-shape file; () for a static one."""
        return dynamic.shape_sets(self.trailer)

    def shape_set(self, index: int) -> ModelFile:
        """The static model of shape set ``index`` (a static file is its own set 0)."""
        if dynamic.KEY not in self.trailer:
            if index != 0:
                raise ModelFileError(f"the model has one input shape set; there is no set {index}")
            return self
        sets = self.trailer[dynamic.KEY]["sets"]
        if not 0 <= index < len(sets):
            raise ModelFileError(f"shape set {index}: the model has {len(sets)} (0..{len(sets) - 1})")
        sections, trailer = dynamic.view(self.sections, self.trailer, index)
        return ModelFile(sections, trailer)

    def for_input_shapes(self, shapes: Mapping[str, Any]) -> ModelFile:
        """The static model whose inputs have ``shapes`` (name -> shape); an InputError naming the
        allowed sets when none has them. A static file is returned as it is (the runtime checks)."""
        if dynamic.KEY not in self.trailer:
            return self
        return self.shape_set(dynamic.pick(self.shape_sets(), shapes))


def _written_version(trailer: Mapping[str, Any]) -> tuple[int, int]:
    return dynamic.DYNAMIC_VERSION if dynamic.KEY in trailer else STATIC_VERSION


def _check_shape_sets(sections: tuple[Section, ...], trailer: dict[str, Any], version: tuple[int, int]) -> None:
    """The ``dynamic`` record's own bounds, then every set's view as a model file of its own
    (types, references and bounds as for a static file) with inputs of the set's shapes."""
    if version < dynamic.DYNAMIC_VERSION:
        raise SchemaViolation(f"trailer.{dynamic.KEY}: needs format 1.1, the file is {version_text(*version)}")
    dynamic.check_dynamic(sections, trailer)
    for index, shapes in enumerate(dynamic.shape_sets(trailer)):
        view_sections, view_trailer = dynamic.view(sections, trailer, index)
        try:
            model = ModelFile(view_sections, view_trailer)
        except ModelFileError as error:
            raise SchemaViolation(f"trailer.{dynamic.KEY}.sets[{index}]: {error}") from None
        stored = {tensor["name"]: tensor.get("shape") for tensor in model.trailer.get("tensors", ())}
        for name, shape in shapes.items():
            if name in stored and stored[name] is not None and tuple(stored[name]) != shape:
                raise SchemaViolation(f"trailer.{dynamic.KEY}.sets[{index}].shapes: input {name!r} is "
                                      f"{list(shape)} but its tensor record says {stored[name]}")


def _check_sections(sections: Iterable[Any]) -> None:
    seen: set[str] = set()
    count = 0
    for count, section in enumerate(sections, 1):
        if not isinstance(section, Section):
            raise ModelFileError(f"model file sections must be Section objects, got {type(section).__name__}")
        if section.name in seen:
            raise ModelFileError(f"two sections are named {section.name!r}; section names must be unique")
        seen.add(section.name)
    if count > MAX_SECTIONS:
        raise ModelFileError(f"{count} sections; a model file holds at most {MAX_SECTIONS}")


def _check_references(sections: tuple[Section, ...], trailer: Mapping[str, Any]) -> None:
    """Schedule chains must point into regcmd sections, layer task ranges into NPU steps."""
    by_name = {section.name: section for section in sections}
    schedule = trailer.get("schedule", [])
    for index, step in enumerate(schedule):
        if step["kind"] != "npu":
            continue
        chain, path = step["chain"], f"trailer.schedule[{index}].chain"
        section = by_name.get(chain["section"])
        if section is None:
            raise SchemaViolation(f"{path}.section: no section named {chain['section']!r}")
        if section.kind is not SectionKind.REGCMD:
            raise SchemaViolation(f"{path}.section: section {section.name!r} is {section.kind.name.lower()}, "
                                  "expected a regcmd section")
        if chain["offset"] >= section.size:
            raise SchemaViolation(f"{path}.offset: {chain['offset']:#x} is outside section {section.name!r} "
                                  f"({section.size} bytes)")
    for layer_index, layer in enumerate(trailer.get("graph", {}).get("layers", [])):
        for range_index, task_range in enumerate(layer.get("tasks", [])):
            path = f"trailer.graph.layers[{layer_index}].tasks[{range_index}]"
            step = task_range["step"]
            if step >= len(schedule) or schedule[step]["kind"] != "npu":
                raise SchemaViolation(f"{path}.step: {step} is not an NPU step of the schedule "
                                      f"({len(schedule)} steps)")
            tasks = schedule[step]["chain"]["tasks"]
            if task_range["first"] + task_range["count"] > tasks:
                raise SchemaViolation(f"{path}: tasks {task_range['first']}..+{task_range['count']} exceed the "
                                      f"{tasks} tasks of step {step}")
