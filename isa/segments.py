"""Split a raw regcmd buffer into task segments without chain information.

Used by the disassembler: every word is classified leniently (what does not decode is
UNKNOWN, never an error), a segment runs up to and including an op-enable word, and runs of
zero words between segments are padding. A zero word directly followed by a PC
REGISTER_AMOUNTS write is kept as the first tail word of a chain's last task.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa.regmap import RegisterMap
from npuemu.isa.words import WORD_BYTES, DecodedWord, WordKind, decode_word

TAIL_WORDS = 4


@dataclass(frozen=True)
class Segment:
    """Words ``start .. start + len(words) - 1`` of the buffer."""

    start: int
    words: tuple[DecodedWord, ...]
    padding: bool  # True: a run of zero words between tasks

    @property
    def complete(self) -> bool:
        """A task segment that ends with its op-enable word."""
        return not self.padding and bool(self.words) and self.words[-1].kind is WordKind.OP_ENABLE

    @property
    def has_tail(self) -> bool:
        """The last four words are [BASE_ADDRESS | zero | REGISTER_AMOUNTS, REGISTER_AMOUNTS, marker, op-enable].

        The repeated REGISTER_AMOUNTS write is the vendor's exLSTM form, whose BASE_ADDRESS writes
        come just before the tail (lstm_int8 words 11077..11083; isa/RKNN_TAILS.md §2)."""
        if not self.complete or len(self.words) < TAIL_WORDS:
            return False
        link, amounts, marker, _ = self.words[-TAIL_WORDS:]
        repeated = link.is_tail_amounts and link.raw == amounts.raw
        return ((link.is_tail_base or link.kind is WordKind.ZERO or repeated) and amounts.is_tail_amounts
                and marker.kind is WordKind.MARKER)


@dataclass(frozen=True)
class ScannedBuffer:
    segments: tuple[Segment, ...]
    trailing: bytes  # bytes after the last whole word (a truncated buffer)


def scan_buffer(data: bytes, regmap: RegisterMap) -> ScannedBuffer:
    whole = len(data) - len(data) % WORD_BYTES
    words = [decode_word(int.from_bytes(data[i:i + WORD_BYTES], "little"), regmap)
             for i in range(0, whole, WORD_BYTES)]
    return ScannedBuffer(tuple(split_segments(words)), bytes(data[whole:]))


def split_segments(words: list[DecodedWord]) -> list[Segment]:
    segments: list[Segment] = []
    index = 0
    while index < len(words):
        end = index
        while end < len(words) and _is_padding(words, end):
            end += 1
        if end > index:
            segments.append(Segment(index, tuple(words[index:end]), padding=True))
            index = end
            continue
        while end < len(words) and words[end].kind is not WordKind.OP_ENABLE:
            end += 1
        end = min(end + 1, len(words))
        segments.append(Segment(index, tuple(words[index:end]), padding=False))
        index = end
    return segments


def _is_padding(words: list[DecodedWord], index: int) -> bool:
    if words[index].kind is not WordKind.ZERO:
        return False
    return not (index + 1 < len(words) and words[index + 1].is_tail_amounts)
