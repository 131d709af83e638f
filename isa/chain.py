"""Encode a :class:`Chain` into a regcmd buffer, and walk a buffer back into tasks.

Segment layout (docs/rknpu-isa.md 2.2, checked against every task of the 13 RKNN listings
in docs/vendor-corpus/regcmd): a task's register writes, then a 4-word tail

1. ``PC BASE_ADDRESS`` = address of the next task's segment, or an all-zero word when this
   is the chain's last task (RKNN and Mesa both write a literal zero word there);
2. ``PC REGISTER_AMOUNTS`` = ``amount_hi16 << 16 | PC_DATA_AMOUNT`` of the next task
   (``PC_DATA_AMOUNT`` 0 ends the chain);
3. the 0x0041 marker; 4. the 0x0081 op-enable word with the task's enable mask;

then zero words up to the next 64-byte boundary. The PC fetches
``(PC_DATA_AMOUNT + 1) * scale`` words for a task, so
``PC_DATA_AMOUNT = ceil((writes + 4) / scale) - 1`` (vendor driver rknpu_job.c with
RKNPU_PC_DATA_EXTRA_AMOUNT = 4; RKNN's tails: 126 writes -> 0x40 at scale 2). When the
count is not a multiple of the scale, the fetch includes the first padding word.
"""

from __future__ import annotations

import logging
import itertools
import operator
import struct
from dataclasses import dataclass

from npuemu.isa.errors import EncodingError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Chain, RegisterWrite, Task, check_task
from npuemu.isa.words import (
    MARKER_WORD, WORD_BYTES, DecodedWord, WordKind, decode_word, encode_write, op_enable_word,
    words_to_bytes,
)

log = logging.getLogger(__name__)

TAIL_WORDS = 4
SEGMENT_ALIGN = 64  # bytes; every task segment starts on a 64-byte boundary
ADDRESS_ALIGN = 16  # PC_SOURCE_ADDR is bits 31:4
AMOUNT_MAX = 0xFFFF  # PC_DATA_AMOUNT is 16 bits
ADDRESS_LIMIT = 1 << 32  # NPU addresses are 32-bit


def fetch_amount(write_count: int, scale: int) -> int:
    """PC_DATA_AMOUNT that fetches ``write_count`` writes plus the 4-word tail."""
    _check_scale(scale)
    amount = -(-(write_count + TAIL_WORDS) // scale) - 1
    if amount > AMOUNT_MAX:
        raise EncodingError(
            f"a task of {write_count} register writes needs PC_DATA_AMOUNT {amount}, more than "
            f"the 16-bit field holds ({AMOUNT_MAX}) at fetch scale {scale}"
        )
    return amount


def fetch_words(amount: int, scale: int) -> int:
    """Words the PC fetches for ``PC_DATA_AMOUNT = amount``."""
    return (amount + 1) * scale


def segment_words(write_count: int) -> int:
    """Words a task occupies in the buffer, 64-byte padding included."""
    per_segment = SEGMENT_ALIGN // WORD_BYTES
    return -(-(write_count + TAIL_WORDS) // per_segment) * per_segment


@dataclass(frozen=True)
class EncodedChain:
    """A chain laid out at ``base_addr``: what the driver needs to launch it."""

    data: bytes
    base_addr: int
    task_addresses: tuple[int, ...]  # regcmd_addr of each task
    write_counts: tuple[int, ...]  # regcfg_amount of each task (writes, tail excluded)
    first_amount: int  # PC_DATA_AMOUNT to launch the first task with
    scale: int


@dataclass(frozen=True)
class DecodedChain:
    chain: Chain
    task_addresses: tuple[int, ...]
    amounts: tuple[int, ...]  # the PC_DATA_AMOUNT each task was fetched with


def encode_chain(chain: Chain, regmap: RegisterMap, base_addr: int = 0,
                 scale: int | None = None) -> EncodedChain:
    """Lay out ``chain`` at ``base_addr`` (64-byte aligned) and encode it."""
    scale = regmap.pc_amount_scale if scale is None else scale
    _check_scale(scale)
    if not isinstance(chain, Chain) or not chain.tasks:
        raise EncodingError("a chain needs at least one task")
    if not isinstance(base_addr, int) or base_addr < 0 or base_addr % SEGMENT_ALIGN:
        raise EncodingError(f"chain base address {base_addr!r} is not a 64-byte aligned address")
    bodies = [_body_words(task, regmap, f"task {index}") for index, task in enumerate(chain.tasks)]
    addresses, address = [], base_addr
    for task in chain.tasks:
        addresses.append(address)
        address += segment_words(len(task.writes)) * WORD_BYTES
    if address > ADDRESS_LIMIT:
        raise EncodingError(f"chain at {base_addr:#x} ends at {address:#x}, beyond the 32-bit address space")
    amounts = [fetch_amount(len(task.writes), scale) for task in chain.tasks]
    words: list[int] = []
    for index, task in enumerate(chain.tasks):
        body = bodies[index]
        words += body if body is not None else [encode_write(regmap, w.block, w.register, w.value) for w in task.writes]
        words += _tail_words(task, regmap, addresses, amounts, index)
        words.extend([0] * (segment_words(len(task.writes)) - len(task.writes) - TAIL_WORDS))
    log.debug("encoded %d tasks, %d words at %#x", len(chain.tasks), len(words), base_addr)
    return EncodedChain(words_to_bytes(words), base_addr, tuple(addresses),
                        tuple(len(t.writes) for t in chain.tasks), amounts[0], scale)


def _body_words(task: Task, regmap: RegisterMap, where: str) -> list[int] | None:
    """The words of ``task``'s register writes, checked as :func:`check_task` checks them.

    The fast path takes exact ints of known registers only (one dict look-up and one range
    test per write: a build encodes ~240,000 writes); anything else goes through
    ``check_task`` now and ``encode_write`` later (None), which refuse it with their own
    messages in the order the checks always ran."""
    heads, known = _write_heads(regmap)
    if type(task) is Task and _tail_fields_ok(task, known):
        words = []
        append = words.append
        for write in task.writes:
            value = write.value if type(write) is RegisterWrite else None
            head = heads.get((write.block, write.register)) if type(value) is int else None
            if head is None or not 0 <= value <= 0xFFFFFFFF:
                break
            append(head | value << 16)
        else:
            return words
    check_task(task, regmap, where)
    return None


def _tail_fields_ok(task: Task, known: int) -> bool:
    mask, hi16 = task.enable_mask, task.amount_hi16
    return (type(mask) is int and type(hi16) is int and 0 <= mask <= 0xFFFFFFFF and not mask & ~known
            and 0 <= hi16 <= 0xFFFF)


#: id(regmap) -> (regmap, its write heads, its known op-enable bits)
_HEADS: dict[int, tuple[RegisterMap, dict[tuple[str, str], int], int]] = {}


def _write_heads(regmap: RegisterMap) -> tuple[dict[tuple[str, str], int], int]:
    """Each register's word with value 0 (registers whose target or offset is not 16-bit are
    left out: ``encode_write`` refuses them), and the op-enable bits of the map's blocks."""
    cached = _HEADS.get(id(regmap))
    if cached is not None and cached[0] is regmap:
        return cached[1], cached[2]
    heads = {(block.name, reg.name): encode_write(regmap, block.name, reg.name, 0)
             for block in regmap.blocks for reg in block.registers
             if 0 <= block.target <= 0xFFFF and 0 <= reg.offset <= 0xFFFF
             and regmap.register(block.name, reg.name) is reg}
    if len(_HEADS) >= 32:  # maps built on the fly (tests) do not pile up
        _HEADS.clear()
    _HEADS[id(regmap)] = (regmap, heads, regmap.op_enable_mask_known)
    return heads, regmap.op_enable_mask_known


def _tail_words(task: Task, regmap: RegisterMap, addresses: list[int], amounts: list[int],
                index: int) -> list[int]:
    last = index == len(addresses) - 1
    next_amount = 0 if last else amounts[index + 1]
    link = 0 if last else encode_write(regmap, "PC", "BASE_ADDRESS", addresses[index + 1])
    amounts_value = task.amount_hi16 << 16 | next_amount
    return [link, encode_write(regmap, "PC", "REGISTER_AMOUNTS", amounts_value), MARKER_WORD,
            op_enable_word(task.enable_mask)]


def decode_chain(data: bytes, regmap: RegisterMap, base_addr: int, start_addr: int,
                 first_amount: int, scale: int | None = None) -> DecodedChain:
    """Walk the chain the PC would fetch from ``start_addr`` with ``first_amount``.

    ``data`` is the regcmd buffer mapped at ``base_addr``. Anything malformed is an
    EncodingError naming the word index and byte offset; the walk reads each word at most
    once, so it ends and never allocates more than the buffer holds.
    """
    scale = regmap.pc_amount_scale if scale is None else scale
    _check_scale(scale)
    if not isinstance(base_addr, int) or base_addr < 0 or base_addr % ADDRESS_ALIGN:
        raise EncodingError(f"buffer base address {base_addr!r} is not 16-byte aligned")
    tasks: list[Task] = []
    addresses: list[int] = []
    amounts: list[int] = []
    address, amount = start_addr, first_amount
    # one decoded word and one (frozen) RegisterWrite per distinct word of this buffer: a LUT upload
    # repeats few words many times (ppocr_cls: 39,242 words, 9,974 distinct); bounded by the buffer
    seen: dict[int, tuple[DecodedWord, RegisterWrite | None]] = {}
    while True:
        where = f"task {len(tasks)} at {address:#x}" if isinstance(address, int) else f"task {len(tasks)}"
        offset = _check_fetch(data, base_addr, address, amount, scale, where, set(addresses))
        task, next_address, next_amount = _decode_segment(
            data, offset, fetch_words(amount, scale), scale, regmap, where, seen)
        tasks.append(task)
        addresses.append(address)
        amounts.append(amount)
        if next_amount == 0:
            return DecodedChain(Chain(tuple(tasks)), tuple(addresses), tuple(amounts))
        address, amount = next_address, next_amount


def _check_fetch(data: bytes, base_addr: int, address: int, amount: int, scale: int, where: str,
                 visited: set[int]) -> int:
    if isinstance(address, bool) or not isinstance(address, int) or address % ADDRESS_ALIGN:
        raise EncodingError(f"{where}: address {address!r} is not 16-byte aligned")
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= AMOUNT_MAX:
        raise EncodingError(f"{where}: fetch amount {amount!r} is not a 16-bit PC_DATA_AMOUNT")
    if address in visited:
        raise EncodingError(f"{where}: the chain loops back to a task it already ran")
    offset = address - base_addr
    end = offset + fetch_words(amount, scale) * WORD_BYTES
    if offset < 0 or end > len(data):
        raise EncodingError(
            f"{where}: PC_DATA_AMOUNT {amount} fetches {fetch_words(amount, scale)} words at byte "
            f"offset {offset:#x}, outside the {len(data)}-byte buffer at {base_addr:#x}"
        )
    if fetch_words(amount, scale) < TAIL_WORDS:
        raise EncodingError(f"{where}: PC_DATA_AMOUNT {amount} fetches fewer words than the 4-word tail")
    return offset


def _decode_segment(data: bytes, offset: int, count: int, scale: int, regmap: RegisterMap,
                    where: str, seen: dict | None = None) -> tuple[Task, int, int]:
    first = offset // WORD_BYTES
    seen = {} if seen is None else seen
    raws = struct.unpack_from(f"<{count}Q", data, offset)
    # the words seen before in one pass (issue 20: ~40,000 words per first run of a model, most of
    # them repeats), then the new ones decoded; (a decoded pair is a tuple, never equal to None)
    decoded = list(map(seen.get, raws))
    if None in decoded:
        for index, hit in enumerate(decoded):
            if hit is None:
                raw = raws[index]
                hit = seen.get(raw)
                if hit is None:
                    word = decode_word(raw, regmap)
                    write = RegisterWrite(word.block, word.register, word.value) if word.kind is WordKind.WRITE \
                        else None
                    hit = seen[raw] = (word, write)
                decoded[index] = hit
    end = count
    zero = WordKind.ZERO
    # A fetch rounded up to the scale takes in at most scale - 1 padding words after the tail.
    while end > count - (scale - 1) and decoded[end - 1][0].kind is zero:
        end -= 1
    if end < TAIL_WORDS:
        raise EncodingError(f"{where}: the fetched words hold no 4-word tail")
    link, amounts, marker, enable = (word for word, _ in decoded[end - TAIL_WORDS:end])
    tail_at = first + end - TAIL_WORDS

    def fail(index: int, expected: str, word: DecodedWord) -> EncodingError:
        reason = f" ({word.problem})" if word.problem else ""
        return EncodingError(
            f"{where}: word {first + index} (byte offset {(first + index) * WORD_BYTES:#x}) is "
            f"{word.raw:#018x}{reason}; expected {expected}"
        )

    if enable.kind is not WordKind.OP_ENABLE:
        raise fail(end - 1, "the op-enable word (0x0081) ending the fetched task", enable)
    if marker.kind is not WordKind.MARKER:
        raise fail(end - 2, "the 0x0041 marker before the op-enable word", marker)
    if not amounts.is_tail_amounts:
        raise fail(end - 3, "the tail's PC REGISTER_AMOUNTS write", amounts)
    writes = [write for _, write in decoded[:end - TAIL_WORDS]]
    if any(map(operator.is_, writes, itertools.repeat(None))):  # (C-level identity tests: no __eq__ calls)
        index = next(i for i, write in enumerate(writes) if write is None)
        raise fail(index, "a register write of the task body", decoded[index][0])
    next_amount, hi16 = amounts.value & 0xFFFF, amounts.value >> 16
    next_address = _tail_link(link, next_amount, tail_at, where)
    task = Task(tuple(writes), enable.value, amount_hi16=hi16)
    return task, next_address, next_amount


def _tail_link(link: DecodedWord, next_amount: int, index: int, where: str) -> int:
    """Next segment's address from the tail's first word (a zero word ends the chain)."""
    at = f"{where}: word {index} (byte offset {index * WORD_BYTES:#x})"
    if link.kind is WordKind.ZERO:
        if next_amount:
            raise EncodingError(
                f"{at} is a zero word but the tail's amount {next_amount} continues the chain")
        return 0
    if not link.is_tail_base:
        raise EncodingError(f"{at} is {link.raw:#018x}; expected PC BASE_ADDRESS or a zero word")
    if link.value & 0xF:
        raise EncodingError(
            f"{at}: PC BASE_ADDRESS {link.value:#x} has low bits {link.value & 0xF:#x} set "
            f"(PC_SEL must be 0 to fetch over AXI; bits 3:1 are reserved)"
        )
    return link.value


def _check_scale(scale: int) -> None:
    if isinstance(scale, bool) or scale not in (1, 2, 4, 8):
        raise EncodingError(f"PC fetch scale {scale!r} must be 1, 2, 4 or 8 words")
