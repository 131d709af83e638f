"""One section of a model file: a named, typed block of bytes the loader may place in memory."""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa.container_format import (
    MAX_ALIGNMENT, MIN_ALIGNMENT, NAME_CAPACITY, MemoryRegion, SectionKind, crc32, is_power_of_two,
)
from npuemu.isa.errors import ModelFileError

ADDRESS_LIMIT = 1 << 64


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a section name, or None if it can."""
    if not name:
        return "is empty"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not encodable as UTF-8 (lone surrogate)"
    if len(encoded) > NAME_CAPACITY:
        return f"is {len(encoded)} bytes of UTF-8; the limit is {NAME_CAPACITY}"
    # Control characters would garble `npuemu inspect` output, and NUL is the padding byte.
    if any(ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F for char in name):
        return "contains a control character"
    return None


@dataclass(frozen=True)
class Section:
    """Section payload plus where it goes.

    ``region`` and ``load_address`` say where the emulator's loader copies ``data`` (DDR or
    SRAM image); region NONE means the section is not placed directly (load_address is then
    0). ``alignment`` is the alignment of the payload's offset in the file (a power of two,
    64 to 65536).
    """

    kind: SectionKind
    name: str
    data: bytes
    region: MemoryRegion = MemoryRegion.NONE
    load_address: int = 0
    alignment: int = MIN_ALIGNMENT

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SectionKind.parse(self.kind))
        object.__setattr__(self, "region", MemoryRegion.parse(self.region))
        if not isinstance(self.data, bytes):
            try:
                object.__setattr__(self, "data", bytes(memoryview(self.data).cast("B")))
            except TypeError:
                raise ModelFileError(
                    f"section {self.name!r}: data must be bytes-like, got {type(self.data).__name__}"
                ) from None
        self._check()

    def _check(self) -> None:
        if not isinstance(self.name, str):
            raise ModelFileError(f"section name must be a string, got {type(self.name).__name__}")
        problem = name_problem(self.name)
        if problem:
            raise ModelFileError(f"section name {self.name!r} {problem}")
        if not isinstance(self.alignment, int) or not (
            is_power_of_two(self.alignment) and MIN_ALIGNMENT <= self.alignment <= MAX_ALIGNMENT
        ):
            raise ModelFileError(
                f"section {self.name!r}: alignment {self.alignment!r} must be a power of two "
                f"from {MIN_ALIGNMENT} to {MAX_ALIGNMENT}"
            )
        if not isinstance(self.load_address, int) or not 0 <= self.load_address < ADDRESS_LIMIT:
            raise ModelFileError(f"section {self.name!r}: load address {self.load_address!r} is not a 64-bit address")
        if self.region is MemoryRegion.NONE and self.load_address:
            raise ModelFileError(
                f"section {self.name!r}: load address {self.load_address:#x} given but region is none"
            )
        if self.load_address + len(self.data) > ADDRESS_LIMIT:
            raise ModelFileError(f"section {self.name!r}: placed at {self.load_address:#x} it ends past 2**64")

    def __repr__(self) -> str:  # the payload may be megabytes: show its size and checksum instead
        return (f"Section(kind={self.kind.name.lower()}, name={self.name!r}, size={self.size}, "
                f"crc32={self.crc32:#010x}, region={self.region.name.lower()}, "
                f"load_address={self.load_address:#x}, alignment={self.alignment})")

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def crc32(self) -> int:
        return crc32(self.data)
