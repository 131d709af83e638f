"""Disassemble a raw regcmd buffer into the assembly text of :mod:`npuemu.isa.asm_syntax`.

Never fails on data: a word that does not decode becomes ``.word`` with the reason in its
comment, and a trailing partial word becomes ``.byte``, so that
``assemble(disassemble(data)) == data`` for any bytes.
"""

from __future__ import annotations

from npuemu.isa import asm_syntax as syn
from npuemu.isa.chain import fetch_words
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.regmap_loader import REGMAP_DIR
from npuemu.isa.segments import Segment, scan_buffer
from npuemu.isa.words import MARKER_WORD, WORD_BYTES, DecodedWord, WordKind

ALIGN = 64
_INDENT = "     "  # as wide as "TAIL " so that tail words line up with the body


def disassemble(data: bytes, regmap: RegisterMap, base_addr: int = 0) -> str:
    """The assembly text of ``data``, a regcmd buffer mapped at ``base_addr``."""
    scanned = scan_buffer(bytes(data), regmap)
    lines = [
        f"; npuemu disassembly: map {regmap.family} ({regmap.status}), base {base_addr:#010x}, "
        f"{len(data) // WORD_BYTES} words",
        f".map {_map_reference(regmap)}",
        f".base {base_addr:#010x}",
    ]
    task_number = 0
    for segment in scanned.segments:
        if segment.padding:
            lines.extend(_padding_lines(segment))
            continue
        lines.append(_task_header(segment, task_number, regmap, base_addr))
        task_number += 1
        tail_from = len(segment.words) - 4 if segment.has_tail else len(segment.words)
        for position, word in enumerate(segment.words):
            lines.append(_word_line(word, position >= tail_from, regmap, base_addr, len(data)))
    if scanned.trailing:
        values = ", ".join(f"{b:#04x}" for b in scanned.trailing)
        lines.append(f".byte {values}  ; {len(scanned.trailing)} bytes after the last whole word")
    return "\n".join(lines) + "\n"


def _map_reference(regmap: RegisterMap) -> str:
    packaged = str((REGMAP_DIR / f"{regmap.family}.yaml").resolve())
    return regmap.family if not regmap.path or regmap.path == packaged else regmap.path


def _padding_lines(segment: Segment) -> list[str]:
    count = len(segment.words)
    to_boundary = (-segment.start * WORD_BYTES) % ALIGN // WORD_BYTES
    if 0 < to_boundary <= count:
        lines = [f".align {ALIGN}  ; {to_boundary} zero word(s)"]
        if count > to_boundary:
            lines.append(f".zero {count - to_boundary}")
        return lines
    return [f".zero {count}"]


def _task_header(segment: Segment, number: int, regmap: RegisterMap, base_addr: int) -> str:
    address = base_addr + segment.start * WORD_BYTES
    where = f"@{address:#010x} word {segment.start}"
    if not segment.complete:
        return f".task {number}  ; {where}: {len(segment.words)} words, no op-enable word (incomplete)"
    enable = segment.words[-1].value
    writes = len(segment.words) - (4 if segment.has_tail else 1)
    names = " ".join(regmap.op_enable_names(enable))
    return f".task {number}  ; {where}: {writes} writes, enable {enable:#x} ({names})"


def _word_line(word: DecodedWord, in_tail: bool, regmap: RegisterMap, base_addr: int,
               size: int) -> str:
    prefix = f"{syn.TAIL} " if in_tail else _INDENT
    if word.kind is WordKind.WRITE:
        register = regmap.register(word.block, word.register)
        comment = _fields_comment(register.unpack(word.value), register.reserved_bits(word.value))
        comment += _tail_note(word, regmap, base_addr, size) if in_tail else ""
        return f"{prefix}{word.block:<8} {word.register:<22} = {word.value:#010x}  ; {comment}"
    if word.kind is WordKind.ZERO:
        return f"{prefix}{syn.ZERO}" + ("  ; chain ends after this task" if in_tail else "")
    if word.kind is WordKind.MARKER and word.raw == MARKER_WORD:
        return f"{prefix}{syn.MARKER}"
    if word.kind is WordKind.OP_ENABLE:
        names = " ".join(regmap.op_enable_names(word.value)) or "no block"
        return f"{prefix}{syn.OP_EN} = {word.value:#010x}  ; {names}"
    reason = word.problem or "marker with a non-zero payload"
    return f"{_INDENT}.word {word.raw:#018x}  ; {reason}"


def _fields_comment(fields: dict[str, int], reserved: int) -> str:
    text = " ".join(f"{name}={value}" for name, value in fields.items())
    return text + (f" rsv={reserved:#x}" if reserved else "")


def _tail_note(word: DecodedWord, regmap: RegisterMap, base_addr: int, size: int) -> str:
    if word.is_tail_base:
        offset = word.value - base_addr
        inside = 0 <= offset < size and offset % WORD_BYTES == 0
        return f" -> next task at word {offset // WORD_BYTES}" if inside else " -> outside this buffer"
    if word.is_tail_amounts and word.value & 0xFFFF:
        return f" -> fetches {fetch_words(word.value & 0xFFFF, regmap.pc_amount_scale)} words"
    return ""
