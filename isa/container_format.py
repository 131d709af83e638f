"""Binary layout of the npuemu model file (``.npu``): constants, codes and the two fixed
records (header and section-table entry). The prose specification is ``CONTAINER.md``;
this module is its executable form and holds no I/O and no validation policy.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass

from npuemu.isa.errors import ModelFileError

MAGIC = b"NPUEMU\x1a\n"
"""8 bytes. 0x1A stops a DOS-style ``type``; the LF reveals text-mode line-ending damage."""

RKNN_MAGIC = b"RKNN"
FORMAT_NAME = "npuemu"
FORMAT_VERSION = (1, 1)
"""(major, minor) newest this code writes (1.1: dynamic shapes, CONTAINER.md 3.7). It reads every
minor version of this major version."""
STATIC_VERSION = (1, 0)
"""What a file without a 1.1 feature is written as, so static builds stay byte-identical."""

HEADER_SIZE = 64
ENTRY_SIZE = 96
NAME_CAPACITY = 56
"""Bytes reserved for a section name in its table entry (UTF-8, NUL padded)."""

MIN_ALIGNMENT = 64
MAX_ALIGNMENT = 1 << 16
MAX_SECTIONS = 4096
PAYLOAD_ALIGNMENT = 64
"""The writer starts the trailer at a multiple of this (payloads use their own alignment)."""

REQUIRED_FLAGS_MASK = 0xFFFF_0000
"""Flag bits a reader must understand; unknown bits below this mask may be ignored."""
FLAG_DYNAMIC_SHAPES = 0x2
"""bit 1 (optional): dynamic shapes, the trailer has a ``dynamic`` record (1.1, CONTAINER.md 3.7;
isa/container_dynamic.py)"""
KNOWN_FLAGS = FLAG_DYNAMIC_SHAPES

_HEADER = struct.Struct("<8sHHIIIQQQIIII")
_ENTRY = struct.Struct(f"<HBBIQQQII{NAME_CAPACITY}s")
HEADER_CRC_SPAN = HEADER_SIZE - 4
assert _HEADER.size == HEADER_SIZE and _ENTRY.size == ENTRY_SIZE


class SectionKind(enum.IntEnum):
    """What a section holds; the code is stored in the section table."""

    REGCMD = 1
    WEIGHTS = 2
    CONSTANTS = 3
    LUT = 4
    IO = 5
    OTHER = 6

    @classmethod
    def parse(cls, value: SectionKind | str | int) -> SectionKind:
        return _parse_enum(cls, value, "section kind")


class MemoryRegion(enum.IntEnum):
    """Where the emulator places a section's bytes; NONE means "not placed by the loader"."""

    NONE = 0
    DDR = 1
    SRAM = 2

    @classmethod
    def parse(cls, value: MemoryRegion | str | int) -> MemoryRegion:
        return _parse_enum(cls, value, "memory region")


def _parse_enum(cls, value, what):
    if isinstance(value, cls):
        return value
    try:
        if isinstance(value, str):
            return cls[value.upper()]
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
    except (KeyError, ValueError):
        pass
    names = ", ".join(member.name.lower() for member in cls)
    raise ModelFileError(f"unknown {what} {value!r}; expected one of: {names}")


@dataclass(frozen=True)
class Header:
    """The fixed 64-byte file header, field for field (see CONTAINER.md, "Header")."""

    major: int
    minor: int
    flags: int
    header_size: int
    section_count: int
    section_table_offset: int
    file_size: int
    trailer_offset: int
    trailer_size: int
    trailer_crc32: int
    section_table_crc32: int

    def pack(self) -> bytes:
        body = _HEADER.pack(
            MAGIC, self.major, self.minor, self.flags, self.header_size, self.section_count,
            self.section_table_offset, self.file_size, self.trailer_offset, self.trailer_size,
            self.trailer_crc32, self.section_table_crc32, 0,
        )[:HEADER_CRC_SPAN]
        return body + struct.pack("<I", crc32(body))

    @classmethod
    def unpack(cls, raw: memoryview | bytes) -> tuple[Header, int]:
        """Decode 64 bytes; returns the header and its stored CRC (not checked here)."""
        (_magic, major, minor, flags, header_size, count, table_offset, file_size,
         trailer_offset, trailer_size, trailer_crc, table_crc, header_crc) = _HEADER.unpack(raw)
        header = cls(major, minor, flags, header_size, count, table_offset, file_size,
                     trailer_offset, trailer_size, trailer_crc, table_crc)
        return header, header_crc


@dataclass(frozen=True)
class Entry:
    """One raw 96-byte section-table entry, before any validation."""

    kind: int
    region: int
    name_length: int
    alignment: int
    offset: int
    size: int
    load_address: int
    crc32: int
    reserved: int
    name_field: bytes

    def pack(self) -> bytes:
        return _ENTRY.pack(self.kind, self.region, self.name_length, self.alignment, self.offset,
                           self.size, self.load_address, self.crc32, self.reserved, self.name_field)

    @classmethod
    def unpack(cls, raw: memoryview | bytes) -> Entry:
        return cls(*_ENTRY.unpack(raw))


def crc32(data: bytes | memoryview) -> int:
    """CRC-32 (ISO-HDLC, the zlib/PNG polynomial) as an unsigned 32-bit value."""
    return zlib.crc32(data) & 0xFFFF_FFFF


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def version_text(major: int, minor: int) -> str:
    return f"{major}.{minor}"
