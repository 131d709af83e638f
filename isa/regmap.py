"""Register maps: blocks, registers and bit fields of one register layout family.

A :class:`RegisterMap` is loaded from ``isa/regmaps/<family>.yaml`` by
:func:`npuemu.isa.regmap_loader.load_regmap`. It packs field values into a 32-bit register
value and unpacks them again, always with range checks: a value that does not fit its field
raises :class:`EncodingError` naming ``BLOCK.REGISTER.FIELD``, the bit range and the value.
Nothing here truncates silently.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from npuemu.isa.errors import EncodingError

REGISTER_BITS = 32
REGISTER_MASK = (1 << REGISTER_BITS) - 1


def close_matches(name: str, candidates: Iterable[str]) -> str:
    """A message tail suggesting the nearest names, for unknown-name errors."""
    pool = sorted(set(candidates))
    near = difflib.get_close_matches(name.upper(), pool, n=5, cutoff=0.5)
    if near:
        return f"close matches: {', '.join(near)}"
    shown = ", ".join(pool[:12]) + (", ..." if len(pool) > 12 else "")
    return f"known: {shown}"


@dataclass(frozen=True)
class Field:
    """One bit field ``[msb:lsb]`` of a 32-bit register."""

    name: str
    lsb: int
    msb: int
    signed: bool = False
    doc: str = ""
    source: str = ""
    # Derived once: every emitted register write checks its fields (issue 20: compile time).
    _ones: int = field(init=False, repr=False, compare=False)  # (1 << width) - 1
    _min: int = field(init=False, repr=False, compare=False)
    _max: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        width = self.msb - self.lsb + 1
        object.__setattr__(self, "_ones", (1 << width) - 1)
        object.__setattr__(self, "_min", -(1 << (width - 1)) if self.signed else 0)
        object.__setattr__(self, "_max", (1 << (width - 1)) - 1 if self.signed else (1 << width) - 1)

    @property
    def width(self) -> int:
        return self.msb - self.lsb + 1

    @property
    def mask(self) -> int:
        """The field's bits in place within the register value."""
        return self._ones << self.lsb

    @property
    def minimum(self) -> int:
        return self._min

    @property
    def maximum(self) -> int:
        return self._max

    @property
    def bit_range(self) -> str:
        return f"bit {self.lsb}" if self.width == 1 else f"bits {self.msb}:{self.lsb}"

    def place(self, value: int, where: str) -> int:
        """``value`` shifted into position; ``where`` names the register for the error."""
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
            raise EncodingError(f"{where}.{self.name}: expected an integer, got {value!r}")
        if not self._min <= value <= self._max:
            kind = "signed" if self.signed else "unsigned"
            raise EncodingError(
                f"{where}.{self.name} ({self.bit_range}, {kind} {self.minimum}..{self.maximum}): "
                f"value {value} does not fit"
            )
        return (value & self._ones) << self.lsb

    def extract(self, register_value: int) -> int:
        raw = (register_value >> self.lsb) & self._ones
        if self.signed and raw >> (self.width - 1):
            return raw - (1 << self.width)
        return raw


@dataclass(frozen=True)
class Register:
    """A 32-bit register at a full offset in the core's register window."""

    block: str
    name: str
    offset: int
    fields: tuple[Field, ...]  # most significant first, as the listings print them
    doc: str = ""
    source: str = ""
    _by_name: Mapping[str, Field] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {f.name: f for f in self.fields})

    @property
    def qualified_name(self) -> str:
        return f"{self.block}.{self.name}"

    @property
    def assigned_mask(self) -> int:
        mask = 0
        for f in self.fields:
            mask |= f.mask
        return mask

    def field(self, name: str) -> Field:
        try:
            return self._by_name[name]
        except KeyError:
            raise EncodingError(
                f"{self.qualified_name} has no field {name!r}; {close_matches(name, self._by_name)}"
            ) from None

    def pack(self, values: Mapping[str, int], base: int = 0) -> int:
        """``base`` with the named fields replaced by ``values`` (range-checked)."""
        if type(base) is not int or not 0 <= base <= REGISTER_MASK:
            check_register_value(base, self.qualified_name)
        result = base
        by_name = self._by_name
        for name, value in values.items():
            f = by_name.get(name) or self.field(name)
            if type(value) is int and f._min <= value <= f._max:
                placed = (value & f._ones) << f.lsb
            else:  # place() refuses with the field's message (or accepts an int subclass)
                placed = f.place(value, self.qualified_name)
            result = (result & ~(f._ones << f.lsb)) | placed
        return result

    def unpack(self, value: int) -> dict[str, int]:
        check_register_value(value, self.qualified_name)
        return {f.name: f.extract(value) for f in self.fields}

    def reserved_bits(self, value: int) -> int:
        """Set bits of ``value`` that no field covers (the listings' ``rsv=``)."""
        return value & ~self.assigned_mask & REGISTER_MASK


def check_register_value(value: int, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EncodingError(f"{where}: register value must be an integer, got {value!r}")
    if not 0 <= value <= REGISTER_MASK:
        raise EncodingError(f"{where}: register value {value:#x} is not a 32-bit unsigned value")


@dataclass(frozen=True)
class Block:
    """A hardware block: its register window, write-target code and op-enable bit."""

    name: str
    base: int
    target: int
    op_enable_bit: int | None
    registers: tuple[Register, ...]
    doc: str = ""
    source: str = ""
    _by_name: Mapping[str, Register] = field(init=False, repr=False, compare=False)
    _by_offset: Mapping[int, Register] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {r.name: r for r in self.registers})
        object.__setattr__(self, "_by_offset", {r.offset: r for r in self.registers})

    def has(self, name: str) -> bool:
        """Whether the block has the register (a partial map, e.g. rk3576, lacks some)."""
        return name in self._by_name

    def register(self, name: str) -> Register:
        try:
            return self._by_name[name]
        except KeyError:
            raise EncodingError(
                f"block {self.name} has no register {name!r}; {close_matches(name, self._by_name)}"
            ) from None

    def register_at(self, offset: int) -> Register | None:
        return self._by_offset.get(offset)


@dataclass(frozen=True)
class RegisterMap:
    """All blocks of one register layout family (e.g. ``rk3588``)."""

    family: str
    status: str  # "complete", or "partial" when only the documented deltas are known
    pc_amount_scale: int  # words per PC fetch unit (PC_DATA_AMOUNT counts units - 1)
    blocks: tuple[Block, ...]
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    description: str = ""
    path: str = ""  # the YAML it was loaded from, for messages
    _by_name: Mapping[str, Block] = field(init=False, repr=False, compare=False)
    _by_target: Mapping[int, Block] = field(init=False, repr=False, compare=False)
    #: (block, register) -> Register, one look-up per emitted write (issue 20: compile time)
    _by_pair: Mapping[tuple[str, str], Register] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {b.name: b for b in self.blocks})
        object.__setattr__(self, "_by_target", {b.target: b for b in self.blocks})
        object.__setattr__(self, "_by_pair", {(b.name, r.name): r for b in self.blocks for r in b.registers})

    # -- lookup -------------------------------------------------------------------------
    def block(self, name: str) -> Block:
        try:
            return self._by_name[name]
        except KeyError:
            raise EncodingError(
                f"map {self.family} has no block {name!r}; {close_matches(name, self._by_name)}"
            ) from None

    def block_for_target(self, target: int) -> Block | None:
        return self._by_target.get(target)

    def register(self, block: str, register: str) -> Register:
        found = self._by_pair.get((block, register))
        return found if found is not None else self.block(block).register(register)

    def registers(self) -> Iterable[Register]:
        for b in self.blocks:
            yield from b.registers

    # -- fields -------------------------------------------------------------------------
    def pack(self, block: str, register: str, /, **fields: int) -> int:
        """Register value with the given fields set and every other bit 0."""
        return self.register(block, register).pack(fields)

    def update(self, block: str, register: str, value: int, /, **fields: int) -> int:
        """``value`` with the given fields replaced, other bits (reserved ones too) kept."""
        return self.register(block, register).pack(fields, base=value)

    def unpack(self, block: str, register: str, value: int) -> dict[str, int]:
        return self.register(block, register).unpack(value)

    # -- op-enable bitmap -----------------------------------------------------------------
    @property
    def op_enable_blocks(self) -> dict[int, str]:
        """Op-enable bit -> block name, lowest bit first."""
        bits = {b.op_enable_bit: b.name for b in self.blocks if b.op_enable_bit is not None}
        return dict(sorted(bits.items()))

    @property
    def op_enable_mask_known(self) -> int:
        mask = 0
        for bit in self.op_enable_blocks:
            mask |= 1 << bit
        return mask

    def op_enable_mask(self, block_names: Iterable[str]) -> int:
        mask = 0
        for name in block_names:
            bit = self.block(name).op_enable_bit
            if bit is None:
                raise EncodingError(f"block {name} of map {self.family} has no op-enable bit")
            mask |= 1 << bit
        return mask

    def op_enable_names(self, mask: int) -> list[str]:
        """Blocks selected by ``mask``; bits of no block are an EncodingError."""
        unknown = mask & ~self.op_enable_mask_known
        if unknown:
            raise EncodingError(
                f"op-enable mask {mask:#x}: bits {unknown:#x} select no block of map {self.family} "
                f"(known: {', '.join(f'{n}={bit}' for bit, n in self.op_enable_blocks.items())})"
            )
        return [name for bit, name in self.op_enable_blocks.items() if mask >> bit & 1]
