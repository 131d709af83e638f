"""The 64-bit register-command word and its classification against a register map.

Word layout (docs/rknpu-isa.md 2.1, from Mesa rkt_regcmd.c, mtx512 npu_hw.h and the TRM):
``target[63:48] | value[47:16] | register offset[15:0]``, stored little-endian.

Targets: a block's write-target code (0x0101 PC, 0x0201 CNA, ...), ``0x0041`` the marker the
TRM requires before the op-enable word, ``0x0081`` the op-enable word (register 0x0008,
value = bitmap of the blocks to start). An all-zero word is padding (or the first tail word
of a chain's last task).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from npuemu.isa.errors import EncodingError

if TYPE_CHECKING:
    from npuemu.isa.regmap import RegisterMap

WORD_BYTES = 8
WORD_MASK = (1 << 64) - 1
TARGET_MARKER = 0x0041
TARGET_OP_ENABLE = 0x0081
OP_ENABLE_OFFSET = 0x0008  # PC OPERATION_ENABLE, written by the op-enable word
MARKER_WORD = TARGET_MARKER << 48


class WordKind(enum.Enum):
    WRITE = "write"  # a register write to a block of the map
    ZERO = "zero"  # all-zero word: padding, or the tail's first word at a chain end
    MARKER = "marker"  # target 0x0041, required before the op-enable word
    OP_ENABLE = "op_enable"  # target 0x0081: start the blocks in the value's bitmap
    UNKNOWN = "unknown"  # anything else; ``problem`` says why


@dataclass(frozen=True)
class DecodedWord:
    raw: int
    kind: WordKind
    target: int
    value: int
    offset: int
    block: str | None = None  # WRITE only
    register: str | None = None  # WRITE only
    problem: str | None = None  # UNKNOWN only

    def __init__(self, raw: int, kind: WordKind, target: int, value: int, offset: int, block: str | None = None,
                 register: str | None = None, problem: str | None = None) -> None:
        # the frozen dataclass __init__ sets each field through object.__setattr__, ~3x this: one
        # per distinct word of every decoded chain (issue 20: 10,000 on ppocr_cls's first run)
        fields = self.__dict__
        fields["raw"], fields["kind"], fields["target"], fields["value"] = raw, kind, target, value
        fields["offset"], fields["block"], fields["register"], fields["problem"] = offset, block, register, problem

    @property
    def is_tail_base(self) -> bool:
        return self.kind is WordKind.WRITE and (self.block, self.register) == ("PC", "BASE_ADDRESS")

    @property
    def is_tail_amounts(self) -> bool:
        return self.kind is WordKind.WRITE and (self.block, self.register) == ("PC", "REGISTER_AMOUNTS")


def encode_word(target: int, value: int, offset: int) -> int:
    """Pack one command word; each part is range-checked."""
    for name, part, bits in (("target", target, 16), ("value", value, 32), ("register offset", offset, 16)):
        if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < (1 << bits):
            raise EncodingError(f"command word {name} {part!r} is not a {bits}-bit unsigned value")
    return (target << 48) | (value << 16) | offset


def split_word(word: int) -> tuple[int, int, int]:
    """``(target, value, offset)`` of a 64-bit word."""
    if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word <= WORD_MASK:
        raise EncodingError(f"command word {word!r} is not a 64-bit unsigned value")
    return word >> 48, (word >> 16) & 0xFFFFFFFF, word & 0xFFFF


def op_enable_word(mask: int) -> int:
    return encode_word(TARGET_OP_ENABLE, mask, OP_ENABLE_OFFSET)


def encode_write(regmap: RegisterMap, block: str, register: str, value: int) -> int:
    """The word writing ``value`` to ``block.register``."""
    reg = regmap.register(block, register)
    return encode_word(regmap.block(block).target, value, reg.offset)


def decode_word(word: int, regmap: RegisterMap) -> DecodedWord:
    """Classify a word. Never raises for a 64-bit value: what is not understood is UNKNOWN."""
    target, value, offset = split_word(word)
    if word == 0:
        return DecodedWord(word, WordKind.ZERO, 0, 0, 0)
    if target == TARGET_MARKER:
        return DecodedWord(word, WordKind.MARKER, target, value, offset)
    if target == TARGET_OP_ENABLE:
        return _decode_op_enable(word, value, offset, regmap)
    block = regmap.block_for_target(target)
    if block is None:
        problem = f"unknown target {target:#06x} (map {regmap.family})"
        return DecodedWord(word, WordKind.UNKNOWN, target, value, offset, problem=problem)
    register = block.register_at(offset)
    if register is None:
        problem = f"block {block.name} has no register at offset {offset:#06x} (map {regmap.family})"
        return DecodedWord(word, WordKind.UNKNOWN, target, value, offset, block=block.name, problem=problem)
    return DecodedWord(word, WordKind.WRITE, target, value, offset, block.name, register.name)


def _decode_op_enable(word: int, value: int, offset: int, regmap: RegisterMap) -> DecodedWord:
    problem = None
    if offset != OP_ENABLE_OFFSET:
        problem = f"op-enable word with register offset {offset:#06x}, expected {OP_ENABLE_OFFSET:#06x}"
    elif value & ~regmap.op_enable_mask_known:
        problem = (f"op-enable bits {value & ~regmap.op_enable_mask_known:#x} select no block of "
                   f"map {regmap.family}")
    kind = WordKind.UNKNOWN if problem else WordKind.OP_ENABLE
    return DecodedWord(word, kind, TARGET_OP_ENABLE, value, offset, problem=problem)


def words_from_bytes(data: bytes) -> list[int]:
    """Little-endian 64-bit words; the length must be a multiple of 8."""
    left_over = len(data) % WORD_BYTES
    if left_over:
        raise EncodingError(
            f"regcmd buffer of {len(data)} bytes is not a whole number of 8-byte words "
            f"({left_over} bytes left over at byte offset {len(data) - left_over:#x})"
        )
    return [int.from_bytes(data[i:i + WORD_BYTES], "little") for i in range(0, len(data), WORD_BYTES)]


def words_to_bytes(words: list[int]) -> bytes:
    if all(type(word) is int for word in words):  # fast path; struct refuses what is out of range
        try:
            return struct.pack(f"<{len(words)}Q", *words)
        except struct.error:
            pass
    for index, word in enumerate(words):
        if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word <= WORD_MASK:
            raise EncodingError(f"word {index}: {word!r} is not a 64-bit unsigned value")
    return b"".join(w.to_bytes(WORD_BYTES, "little") for w in words)
