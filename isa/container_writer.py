"""Serialise sections and a trailer into the bytes of a model file (CONTAINER.md, "Layout").

Order: header, section table, payloads (each at a multiple of its alignment), trailer (at a
multiple of 64). Every gap is zero-filled, which the reader verifies, so any changed byte
of a written file is detected.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from npuemu.isa.container_format import (
    ENTRY_SIZE, HEADER_SIZE, STATIC_VERSION, MAX_SECTIONS, NAME_CAPACITY, PAYLOAD_ALIGNMENT, Entry, Header,
    align_up, crc32,
)
from npuemu.isa.container_section import Section
from npuemu.isa.container_trailer import encode_trailer
from npuemu.isa.errors import ModelFileError


def _entry(section: Section, offset: int) -> bytes:
    name = section.name.encode("utf-8")
    return Entry(
        kind=int(section.kind), region=int(section.region), name_length=len(name),
        alignment=section.alignment, offset=offset, size=section.size,
        load_address=section.load_address, crc32=section.crc32, reserved=0,
        name_field=name.ljust(NAME_CAPACITY, b"\0"),
    ).pack()


def build_file(sections: Sequence[Section], trailer: Mapping[str, Any], version: tuple[int, int] = STATIC_VERSION,
               flags: int = 0) -> bytes:
    """The complete file as bytes, written as format ``version`` with header ``flags``."""
    if len(sections) > MAX_SECTIONS:
        raise ModelFileError(f"{len(sections)} sections; a model file holds at most {MAX_SECTIONS}")
    table_offset = HEADER_SIZE
    cursor = table_offset + ENTRY_SIZE * len(sections)
    offsets = []
    for section in sections:
        cursor = align_up(cursor, section.alignment)
        offsets.append(cursor)
        cursor += section.size
    trailer_bytes = encode_trailer(trailer)
    if len(trailer_bytes) > 0xFFFF_FFFF:
        raise ModelFileError(f"trailer is {len(trailer_bytes)} bytes; the format allows up to 4 GiB")
    trailer_offset = align_up(cursor, PAYLOAD_ALIGNMENT)
    file_size = trailer_offset + len(trailer_bytes)

    table = b"".join(_entry(section, offset) for section, offset in zip(sections, offsets))
    header = Header(
        major=version[0], minor=version[1], flags=flags, header_size=HEADER_SIZE,
        section_count=len(sections), section_table_offset=table_offset, file_size=file_size,
        trailer_offset=trailer_offset, trailer_size=len(trailer_bytes),
        trailer_crc32=crc32(trailer_bytes), section_table_crc32=crc32(table),
    )
    out = bytearray(file_size)  # zero-filled: gaps stay zero
    out[0:HEADER_SIZE] = header.pack()
    out[table_offset:table_offset + len(table)] = table
    for section, offset in zip(sections, offsets):
        out[offset:offset + section.size] = section.data
    out[trailer_offset:] = trailer_bytes
    return bytes(out)


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary file in ``path``'s folder, then rename it over ``path``: a
    process killed mid-write leaves the old file (or none), never a truncated one. The new file
    gets the old one's permissions, else the umask's default. Raises OSError."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, _mode_for(target))
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _mode_for(target: Path) -> int:
    try:
        return target.stat().st_mode & 0o7777
    except OSError:  # a new file: what open() would have given it
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
