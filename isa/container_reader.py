"""The validating reader of model files (CONTAINER.md, "Reading").

Everything the file claims (counts, offsets, sizes) is checked against the real file size
before it is used, and the reader only ever slices a memoryview of the input, so a hostile
header cannot make it loop long or allocate more than the file's own size. Any changed byte
is caught: the header, section table, every payload and the trailer carry a CRC-32, and the
gaps between them must be zero. Every refusal is a :class:`ModelFileError` that names the
file, the offset or section, and what was expected.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any

from npuemu.isa.container_format import (
    ENTRY_SIZE, FORMAT_VERSION, HEADER_CRC_SPAN, HEADER_SIZE, KNOWN_FLAGS, MAGIC, MAX_ALIGNMENT, MAX_SECTIONS,
    MIN_ALIGNMENT, NAME_CAPACITY, REQUIRED_FLAGS_MASK, RKNN_MAGIC, Entry, Header, MemoryRegion, SectionKind,
    crc32, is_power_of_two, version_text,
)
from npuemu.isa.container_section import ADDRESS_LIMIT, Section, name_problem
from npuemu.isa.container_trailer import decode_trailer
from npuemu.isa.errors import ModelFileError

logger = logging.getLogger(__name__)

_GAP_CHUNK = 1 << 16


@dataclass(frozen=True)
class ParsedFile:
    """What the binary layer found; the trailer is decoded JSON, not yet schema-checked."""

    version: tuple[int, int]
    sections: tuple[Section, ...]
    trailer: Any
    trailer_offset: int
    checksum_failures: tuple[str, ...]
    flags: int = 0  # the header's flags (bit 1: dynamic shapes, CONTAINER.md 3.7)


@dataclass(frozen=True)
class _Placement:
    """A section-table entry after its own checks, before its payload is copied."""

    index: int
    kind: SectionKind
    region: MemoryRegion
    name: str
    alignment: int
    offset: int
    size: int
    load_address: int
    crc32: int


class _Reader:
    def __init__(self, data: bytes | bytearray | memoryview, name: str) -> None:
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        self.view = view
        self.size = view.nbytes
        self.name = name

    def fail(self, message: str) -> ModelFileError:
        return ModelFileError(f"{self.name}: {message}")

    # --- header -----------------------------------------------------------------------------

    def check_magic(self) -> None:
        head = self.view[:len(MAGIC)].tobytes()
        if head.startswith(RKNN_MAGIC):
            raise self.fail(
                'this is a vendor .rknn model (magic "RKNN" at offset 0); .rknn files are not yet '
                "readable by this command, which reads npuemu .npu model files"
            )
        if not head:
            raise self.fail("the file is empty; expected an npuemu model file")
        if head != MAGIC[:len(head)]:
            raise self.fail(f"not an npuemu model file: expected magic {MAGIC!r} at offset 0, found {head!r}")

    def truncated(self, needed: int, what: str) -> ModelFileError:
        return self.fail(f"truncated: the file is {self.size} bytes, shorter than the {needed} bytes of {what}")

    def check_version(self) -> tuple[int, int]:
        if self.size < 12:
            raise self.truncated(12, "the magic and format version")
        major, minor = struct.unpack_from("<HH", self.view, 8)
        supported = version_text(*FORMAT_VERSION)
        if major > FORMAT_VERSION[0]:
            raise self.fail(
                f"format version {version_text(major, minor)} (offset 8) is newer than this reader "
                f"supports ({FORMAT_VERSION[0]}.x, up to {supported}); update npuemu to read it"
            )
        if major < 1:
            raise self.fail(f"format version {version_text(major, minor)} at offset 8 is not valid; expected 1.x")
        if minor > FORMAT_VERSION[1]:
            logger.info("%s: format %s is newer than %s; reading the parts this version knows",
                        self.name, version_text(major, minor), supported)
        return major, minor

    def read_header(self) -> Header:
        if self.size < HEADER_SIZE:
            raise self.truncated(HEADER_SIZE, "the header")
        header, stored = Header.unpack(self.view[:HEADER_SIZE])
        actual = crc32(self.view[:HEADER_CRC_SPAN])
        if actual != stored:
            raise self.fail(
                f"header checksum mismatch: CRC-32 of bytes 0..{HEADER_CRC_SPAN} is {actual:#010x}, "
                f"the header (offset {HEADER_CRC_SPAN}) says {stored:#010x}; the file is corrupted"
            )
        unknown = header.flags & REQUIRED_FLAGS_MASK & ~KNOWN_FLAGS
        if unknown:
            raise self.fail(f"header flags {header.flags:#010x} (offset 12) require features this reader "
                            f"does not know (bits {unknown:#010x})")
        if header.file_size != self.size:
            what = "truncated" if header.file_size > self.size else "has extra bytes at the end"
            raise self.fail(f"{what}: the header (offset 32) says the file is {header.file_size} bytes, "
                            f"it is {self.size}")
        if not HEADER_SIZE <= header.header_size <= self.size:
            raise self.fail(f"header size {header.header_size} (offset 16) must be between {HEADER_SIZE} "
                            f"and the file size {self.size}")
        return header

    # --- section table ----------------------------------------------------------------------

    def read_table(self, header: Header) -> memoryview:
        count, offset = header.section_count, header.section_table_offset
        if count > MAX_SECTIONS:
            raise self.fail(f"section count {count} (offset 20) exceeds the limit of {MAX_SECTIONS}")
        end = offset + count * ENTRY_SIZE
        if offset < header.header_size or end > self.size:
            raise self.fail(
                f"section table at offset {offset:#x} with {count} entries ({count * ENTRY_SIZE} bytes) does "
                f"not lie between the header's end ({header.header_size:#x}) and the file's end ({self.size:#x})"
            )
        table = self.view[offset:end]
        actual = crc32(table)
        if actual != header.section_table_crc32:
            raise self.fail(f"section table checksum mismatch at offset {offset:#x}: CRC-32 is {actual:#010x}, "
                            f"the header says {header.section_table_crc32:#010x}")
        return table

    def placement(self, index: int, raw: Entry, where: str) -> _Placement:
        try:
            kind = SectionKind(raw.kind)
        except ValueError:
            known = ", ".join(f"{k.value} ({k.name.lower()})" for k in SectionKind)
            raise self.fail(f"{where}: unknown section kind {raw.kind}; expected one of {known}") from None
        try:
            region = MemoryRegion(raw.region)
        except ValueError:
            known = ", ".join(f"{r.value} ({r.name.lower()})" for r in MemoryRegion)
            raise self.fail(f"{where}: unknown memory region {raw.region}; expected one of {known}") from None
        name = self.entry_name(raw, where)
        where = f"{where} (section {name!r})"
        if raw.reserved:
            raise self.fail(f"{where}: reserved field is {raw.reserved:#x}; expected 0")
        if not (is_power_of_two(raw.alignment) and MIN_ALIGNMENT <= raw.alignment <= MAX_ALIGNMENT):
            raise self.fail(f"{where}: alignment {raw.alignment} must be a power of two from "
                            f"{MIN_ALIGNMENT} to {MAX_ALIGNMENT}")
        if raw.offset % raw.alignment:
            raise self.fail(f"{where}: payload offset {raw.offset:#x} is not a multiple of its "
                            f"alignment {raw.alignment}")
        if raw.offset + raw.size > self.size:
            raise self.fail(f"{where}: payload at offset {raw.offset:#x} of {raw.size} bytes ends past the "
                            f"end of the file ({self.size:#x})")
        if region is MemoryRegion.NONE and raw.load_address:
            raise self.fail(f"{where}: load address {raw.load_address:#x} given but region is none")
        if raw.load_address + raw.size > ADDRESS_LIMIT:
            raise self.fail(f"{where}: placed at {raw.load_address:#x} the payload ends past 2**64")
        return _Placement(index, kind, region, name, raw.alignment, raw.offset, raw.size, raw.load_address, raw.crc32)

    def entry_name(self, raw: Entry, where: str) -> str:
        length = raw.name_length
        if not 1 <= length <= NAME_CAPACITY:
            raise self.fail(f"{where}: name length {length} must be from 1 to {NAME_CAPACITY}")
        if raw.name_field[length:].strip(b"\0"):
            raise self.fail(f"{where}: bytes after the {length}-byte name must be zero")
        try:
            name = raw.name_field[:length].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{where}: name {raw.name_field[:length]!r} is not valid UTF-8") from None
        problem = name_problem(name)
        if problem:
            raise self.fail(f"{where}: section name {name!r} {problem}")
        return name

    def placements(self, header: Header, table: memoryview) -> list[_Placement]:
        result: list[_Placement] = []
        seen: dict[str, int] = {}
        for index in range(header.section_count):
            start = index * ENTRY_SIZE
            where = f"section table entry {index} at offset {header.section_table_offset + start:#x}"
            placed = self.placement(index, Entry.unpack(table[start:start + ENTRY_SIZE]), where)
            if placed.name in seen:
                raise self.fail(f"{where}: section name {placed.name!r} is already used by entry {seen[placed.name]}")
            seen[placed.name] = index
            result.append(placed)
        return result

    # --- layout as a whole ------------------------------------------------------------------

    def check_layout(self, header: Header, placements: list[_Placement]) -> None:
        """No two parts overlap, and every byte outside them is zero."""
        if header.trailer_offset < header.header_size or header.trailer_offset + header.trailer_size != self.size:
            raise self.fail(
                f"trailer at offset {header.trailer_offset:#x} of {header.trailer_size} bytes (header offsets "
                f"40, 48) must end exactly at the end of the file ({self.size:#x})"
            )
        parts = [(0, header.header_size, "the header"),
                 (header.section_table_offset, header.section_count * ENTRY_SIZE, "the section table"),
                 (header.trailer_offset, header.trailer_size, "the trailer")]
        parts += [(p.offset, p.size, f"section {p.index} {p.name!r}") for p in placements]
        parts.sort(key=lambda part: (part[0], part[1]))
        cursor, previous = 0, "the start of the file"
        for offset, size, label in parts:
            if offset < cursor and size:
                raise self.fail(f"{label} at offset {offset:#x} ({size} bytes) overlaps {previous}, "
                                f"which ends at {cursor:#x}")
            self.check_zero_gap(cursor, offset, previous, label)
            if size:
                cursor, previous = offset + size, label
        self.check_zero_gap(cursor, self.size, previous, "the end of the file")

    def check_zero_gap(self, start: int, end: int, after: str, before: str) -> None:
        end = min(end, self.size)  # parts are bounds-checked already; this keeps the loop finite regardless
        for chunk_start in range(start, end, _GAP_CHUNK):
            chunk = self.view[chunk_start:min(end, chunk_start + _GAP_CHUNK)].tobytes()
            rest = chunk.lstrip(b"\0")
            if rest:
                where = chunk_start + len(chunk) - len(rest)
                raise self.fail(f"non-zero byte at offset {where:#x} in the padding between {after} and {before}; "
                                "padding must be zero")

    def payloads(self, placements: list[_Placement], verify: bool) -> tuple[tuple[Section, ...], tuple[str, ...]]:
        failures = []
        for placed in placements:
            payload = self.view[placed.offset:placed.offset + placed.size]
            actual = crc32(payload)
            if actual != placed.crc32:
                message = (f"section {placed.index} {placed.name!r} at offset {placed.offset:#x}: checksum mismatch, "
                           f"CRC-32 of its {placed.size} bytes is {actual:#010x}, the table says {placed.crc32:#010x}")
                if verify:
                    raise self.fail(message)
                logger.warning("%s: %s", self.name, message)
                failures.append(placed.name)
        sections = tuple(
            Section(p.kind, p.name, self.view[p.offset:p.offset + p.size].tobytes(), p.region, p.load_address,
                    p.alignment)
            for p in placements
        )
        return sections, tuple(failures)

    def trailer(self, header: Header) -> Any:
        raw = self.view[header.trailer_offset:header.trailer_offset + header.trailer_size]
        actual = crc32(raw)
        if actual != header.trailer_crc32:
            raise self.fail(f"trailer checksum mismatch at offset {header.trailer_offset:#x}: CRC-32 is "
                            f"{actual:#010x}, the header (offset 52) says {header.trailer_crc32:#010x}")
        try:
            return decode_trailer(raw)
        except ModelFileError as error:
            raise self.fail(f"trailer at offset {header.trailer_offset:#x}: {error}") from None


def parse_file(data: bytes | bytearray | memoryview, name: str, *, verify_sections: bool = True) -> ParsedFile:
    """Check and decode a whole model file. With ``verify_sections`` False, payload checksum
    mismatches are logged and listed in ``checksum_failures`` instead of raising."""
    reader = _Reader(data, name)
    reader.check_magic()
    version = reader.check_version()
    header = reader.read_header()
    table = reader.read_table(header)
    placements = reader.placements(header, table)
    reader.check_layout(header, placements)
    trailer = reader.trailer(header)
    sections, failures = reader.payloads(placements, verify_sections)
    return ParsedFile(version, sections, trailer, header.trailer_offset, failures, header.flags)
