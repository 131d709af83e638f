"""A small, schema-less, validating FlatBuffers reader.

The vendor's ``.rknn`` payload is a FlatBuffer whose public schemas stop after the first few
fields, so the loader addresses fields by vtable slot number and states each field's type
itself. Every offset, vtable, length and string is checked against the buffer before it is
used, and every refusal is a :class:`ModelFileError` that names the file, the table/slot path
(``graphs[0].tensors[3].slot 18``) and the file offset.

Two guards keep a hostile buffer from costing more than the buffer itself:

- a *decode budget*: every vector, string or table that is read charges its bytes, and the
  total may not exceed a small multiple of the buffer size. Honest files read each byte
  about once; overlapping vectors (one shape vector referenced by a million tensors) run
  out of budget instead of allocating a million copies.
- a *depth limit* on nested tables. The loader follows a fixed schema, so depth is bounded
  anyway; the limit keeps that true if the schema walk ever becomes data-driven.

Byte vectors are returned as zero-copy ``memoryview`` slices of the buffer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from npuemu.isa.errors import ModelFileError

MAX_DEPTH = 32
BUDGET_FACTOR = 4
BUDGET_SLACK = 1 << 16
"""Decoded bytes allowed: BUDGET_FACTOR x buffer size + BUDGET_SLACK (shared empty vectors etc.)."""

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")

SCALAR_FORMATS = {
    "u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i",
    "u64": "<Q", "i64": "<q", "f32": "<f", "f64": "<d", "bool": "<?",
}
"""FlatBuffers scalar types by the short names the loader uses."""


class FlatBuffer:
    """A bounds-checked view of one FlatBuffer inside a file.

    ``file_offset`` is where the buffer starts in the file, so that messages give offsets a
    user can find with a hex dump.
    """

    def __init__(self, data: bytes | bytearray | memoryview, source: str, file_offset: int = 0) -> None:
        self.data = memoryview(data).cast("B")
        self.size = len(self.data)
        self.source = source
        self.file_offset = file_offset
        self.budget = BUDGET_FACTOR * self.size + BUDGET_SLACK

    # --- errors and accounting -----------------------------------------------------------

    def error(self, where: str, problem: str, position: int | None = None) -> ModelFileError:
        at = "" if position is None else f" (file offset {self.file_offset + position:#x})"
        return ModelFileError(f"{self.source}: FlatBuffer {where}{at}: {problem}")

    def charge(self, nbytes: int, where: str, position: int) -> None:
        """Count decoded bytes against the budget (see the module docstring)."""
        self.budget -= nbytes
        if self.budget < 0:
            raise self.error(where, f"decoding needs more than {BUDGET_FACTOR}x the buffer's "
                             f"{self.size} bytes: tables or vectors overlap implausibly", position)

    # --- primitive reads -----------------------------------------------------------------

    def need(self, position: int, length: int, where: str, what: str, referrer: int | None = None) -> None:
        """Check ``length`` bytes at ``position``; ``referrer`` is where the claim was read, for the message."""
        if position < 0 or length < 0 or position + length > self.size:
            at = referrer if referrer is not None else (position if 0 <= position < self.size else None)
            raise self.error(where, f"{what} ({length} bytes at buffer offset {position:#x}) lies outside "
                             f"the {self.size}-byte buffer", at)

    def u32(self, position: int, where: str, what: str) -> int:
        self.need(position, 4, where, what)
        return _U32.unpack_from(self.data, position)[0]

    def follow(self, position: int, where: str, what: str) -> int:
        """Resolve the uoffset stored at ``position``; the target must leave room for 4 bytes."""
        target = position + self.u32(position, where, what)
        self.need(target, 4, where, f"target of {what}", position)
        return target

    # --- entry point ---------------------------------------------------------------------

    def root(self, identifier: bytes | None, name: str) -> Table:
        """The root table, after checking the 4-byte file identifier if one is given."""
        self.need(0, 8, name, "root offset and file identifier")
        if identifier is not None and bytes(self.data[4:8]) != identifier:
            raise self.error(name, f"file identifier is {bytes(self.data[4:8])!r}, expected {identifier!r}", 4)
        return self.table_at(self.follow(0, name, "root offset"), name, 0)

    def table_at(self, position: int, path: str, depth: int) -> Table:
        if depth > MAX_DEPTH:
            raise self.error(path, f"tables nested deeper than {MAX_DEPTH}", position)
        self.need(position, 4, path, "table")
        vtable = position - _I32.unpack_from(self.data, position)[0]
        self.need(vtable, 4, path, "vtable", position)
        vtable_size, table_size = _U16.unpack_from(self.data, vtable)[0], _U16.unpack_from(self.data, vtable + 2)[0]
        if vtable_size < 4 or vtable_size % 2:
            raise self.error(path, f"vtable size {vtable_size} is not an even number >= 4", vtable)
        if table_size < 4:
            raise self.error(path, f"table size {table_size} is smaller than its 4-byte vtable offset", position)
        self.need(vtable, vtable_size, path, "vtable", position)
        self.need(position, table_size, path, "table")
        self.charge(vtable_size + table_size, path, position)
        return Table(self, position, path, depth, vtable, vtable_size, table_size)


@dataclass(frozen=True)
class Table:
    """One FlatBuffer table. Accessors take a vtable slot number; absent fields give defaults."""

    buffer: FlatBuffer = field(repr=False)
    position: int
    path: str
    depth: int
    vtable: int
    vtable_size: int
    table_size: int

    def where(self, slot: int) -> str:
        return f"{self.path}.slot {slot}"

    def field_offset(self, slot: int, width: int) -> int:
        """Offset of the field inside the table, 0 when absent; checks it fits the table."""
        entry = 4 + 2 * slot
        if slot < 0 or entry + 2 > self.vtable_size:
            return 0
        offset = _U16.unpack_from(self.buffer.data, self.vtable + entry)[0]
        if offset and (offset < 4 or offset + width > self.table_size):
            raise self.buffer.error(self.where(slot), f"field at table offset {offset} (+{width} bytes) lies "
                                    f"outside the {self.table_size}-byte table", self.position)
        return offset

    def has(self, slot: int) -> bool:
        return self.field_offset(slot, 0) != 0

    def slots(self) -> tuple[int, ...]:
        """The slot numbers present in this table (for schema-less dumps)."""
        count = (self.vtable_size - 4) // 2
        return tuple(slot for slot in range(count) if self.field_offset(slot, 0))

    # --- scalars -------------------------------------------------------------------------

    def scalar(self, slot: int, kind: str, default: int | float | None = 0) -> int | float | None:
        fmt = SCALAR_FORMATS[kind]
        offset = self.field_offset(slot, struct.calcsize(fmt))
        if not offset:
            return default
        return struct.unpack_from(fmt, self.buffer.data, self.position + offset)[0]

    # --- references ----------------------------------------------------------------------

    def _target(self, slot: int, what: str) -> int | None:
        offset = self.field_offset(slot, 4)
        if not offset:
            return None
        return self.buffer.follow(self.position + offset, self.where(slot), what)

    def _vector(self, slot: int, element_size: int, what: str) -> tuple[int, int] | None:
        """(start of elements, count) after checking the vector fits the buffer."""
        start = self._target(slot, what)
        if start is None:
            return None
        count = self.buffer.u32(start, self.where(slot), f"{what} length")
        available = self.buffer.size - (start + 4)
        if count * element_size > available:
            raise self.buffer.error(self.where(slot), f"{what} claims {count} elements of {element_size} bytes, "
                                    f"but only {available} bytes follow", start)
        self.buffer.charge(4 + count * element_size, self.where(slot), start)
        return start + 4, count

    def string(self, slot: int, default: str | None = None) -> str | None:
        found = self._vector(slot, 1, "string")
        if found is None:
            return default
        start, length = found
        where = self.where(slot)
        self.buffer.need(start + length, 1, where, "string terminator")
        if self.buffer.data[start + length] != 0:
            raise self.buffer.error(where, f"string of {length} bytes is not NUL-terminated", start + length)
        try:
            return bytes(self.buffer.data[start:start + length]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.buffer.error(where, f"string is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                                    start + exc.start) from None

    def byte_vector(self, slot: int) -> memoryview | None:
        """A ``[ubyte]`` vector as a zero-copy view (None when absent)."""
        found = self.byte_vector_at(slot)
        return None if found is None else found[1]

    def byte_vector_at(self, slot: int) -> tuple[int, memoryview] | None:
        """The file offset of a ``[ubyte]`` vector's first byte, and the bytes (None when absent)."""
        found = self._vector(slot, 1, "byte vector")
        if found is None:
            return None
        start, count = found
        return self.buffer.file_offset + start, self.buffer.data[start:start + count]

    def scalars(self, slot: int, kind: str) -> tuple | None:
        """A vector of scalars as a tuple (None when absent)."""
        fmt = SCALAR_FORMATS[kind]
        size = struct.calcsize(fmt)
        found = self._vector(slot, size, f"[{kind}] vector")
        if found is None:
            return None
        start, count = found
        return struct.unpack_from(f"<{count}{fmt[1]}", self.buffer.data, start)

    def structs(self, slot: int, layout: str) -> tuple[tuple, ...] | None:
        """A vector of fixed-size structs, each unpacked with the ``struct`` layout given."""
        record = struct.Struct(layout)
        found = self._vector(slot, record.size, f"struct({layout}) vector")
        if found is None:
            return None
        start, count = found
        return tuple(record.unpack_from(self.buffer.data, start + i * record.size) for i in range(count))

    def table(self, slot: int, name: str) -> Table | None:
        target = self._target(slot, "table offset")
        if target is None:
            return None
        return self.buffer.table_at(target, f"{self.path}.{name}", self.depth + 1)

    def tables(self, slot: int, name: str) -> tuple[Table, ...] | None:
        """A vector of tables; element i's path is ``<path>.<name>[i]``."""
        found = self._vector(slot, 4, "table vector")
        if found is None:
            return None
        start, count = found
        prefix = f"{self.path}.{name}" if self.path else name
        return tuple(
            self.buffer.table_at(self.buffer.follow(start + 4 * i, self.where(slot), f"element {i}"),
                                 f"{prefix}[{i}]", self.depth + 1)
            for i in range(count)
        )
