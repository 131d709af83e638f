"""Assemble regcmd assembly text (see :mod:`npuemu.isa.asm_syntax`) into a buffer.

Errors are EncodingErrors naming ``source:line``, the offending text and, for an unknown
name, the closest known ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from npuemu.isa import asm_syntax as syn
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import EncodingError, NpuemuError
from npuemu.isa.regmap import REGISTER_MASK, RegisterMap, close_matches
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain, RegisterWrite, Task
from npuemu.isa.words import MARKER_WORD, WORD_BYTES, WORD_MASK, encode_write, op_enable_word

DEFAULT_MAP = "rk3588"
#: the largest ``.align`` boundary: the largest section alignment of a model file (CONTAINER.md 1.2)
MAX_ALIGN = 1 << 16
#: the largest buffer ``.zero`` / ``.align`` may grow the output to; a real regcmd buffer is well
#: under a MiB, and a few characters of text must not ask for gigabytes
MAX_BUFFER_BYTES = 64 << 20


@dataclass
class _State:
    regmap: RegisterMap | None
    out: bytearray = field(default_factory=bytearray)
    chain_mode: bool = False
    chain_base: int = 0
    scale: int | None = None
    tasks: list[tuple[int, int, list[RegisterWrite]]] = field(default_factory=list)


def assemble(text: str, regmap: RegisterMap | None = None, source: str = "<input>") -> bytes:
    """Bytes of the program in ``text``.

    ``regmap`` None: the map named by a ``.map`` directive, else rk3588. A ``.map`` that
    names another family than a given ``regmap`` is an error.
    """
    state = _State(regmap)
    for number, line in enumerate(text.splitlines(), start=1):
        code = line.split(syn.COMMENT, 1)[0].strip()
        if not code:
            continue
        try:
            _assemble_line(code, state)
        except NpuemuError as error:
            raise EncodingError(f"{source}:{number}: {error}\n    {line.strip()}") from None
        except ValueError as error:
            raise EncodingError(f"{source}:{number}: bad number ({error})\n    {line.strip()}") from None
    if state.chain_mode:
        return _finish_chain(state, source)
    return bytes(state.out)


def _assemble_line(code: str, state: _State) -> None:
    tokens = _tokens(code)
    head = tokens[0].lower() if tokens[0].startswith(".") else tokens[0].upper()
    if head.startswith("."):
        _directive(head, tokens[1:], state)
        return
    if state.chain_mode and head in (syn.TAIL, syn.ZERO, syn.MARKER, syn.OP_EN):
        raise EncodingError("chain mode lays out the tails itself; write register writes only")
    if head == syn.TAIL:
        tokens = tokens[1:]
        if not tokens:
            raise EncodingError("TAIL must be followed by a word")
        head = tokens[0].upper()
    regmap = _regmap(state)
    if state.chain_mode:
        _chain_write(tokens, state, regmap)
        return
    if head == syn.ZERO:
        _no_operands(tokens)
        _emit(state, 0)
    elif head == syn.MARKER:
        _no_operands(tokens)
        _emit(state, MARKER_WORD)
    elif head == syn.OP_EN:
        _emit(state, op_enable_word(_enable_mask(tokens[1:], regmap)))
    else:
        block, register, value = _write(tokens, regmap)
        _emit(state, encode_write(regmap, block, register, value))


def _tokens(code: str) -> list[str]:
    """Tokens with ``=`` as its own token: ``A=1 B = 2`` -> A = 1 B = 2."""
    return [t for t in re.split(r"\s+|,", code.replace("=", " = ")) if t]


def _directive(name: str, args: list[str], state: _State) -> None:
    if name == ".map":
        _set_map(args, state)
    elif name == ".base":
        _one_arg(name, args)
        if state.chain_mode:
            state.chain_base = syn.parse_int(args[0])
    elif name == ".chain":
        _start_chain(args, state)
    elif name == ".task":
        if state.chain_mode:
            _start_task(args, state)
    elif state.chain_mode:
        raise EncodingError(f"{name} is not allowed in chain mode (the assembler pads the tasks)")
    elif name == ".align":
        _align(args, state)
    elif name == ".zero":
        _one_arg(name, args)
        count = syn.parse_int(args[0])
        if count < 0:
            raise EncodingError(f".zero needs a word count >= 0, got {count}")
        _pad(state, count * WORD_BYTES, ".zero")
    elif name == ".word":
        for arg in args or [""]:
            value = syn.parse_int(arg)
            if not 0 <= value <= WORD_MASK:
                raise EncodingError(f".word {arg} is not a 64-bit unsigned value")
            state.out += value.to_bytes(WORD_BYTES, "little")
    elif name == ".byte":
        values = [syn.parse_int(a) for a in args]
        if not values or not all(0 <= v <= 0xFF for v in values):
            raise EncodingError(".byte needs values 0..255")
        state.out += bytes(values)
    else:
        raise EncodingError(f"unknown directive {name}; known: {', '.join(syn.DIRECTIVES)}")


def _set_map(args: list[str], state: _State) -> None:
    _one_arg(".map", args)
    named = load_regmap(args[0])
    if state.regmap is not None and named.family != state.regmap.family:
        raise EncodingError(f".map {args[0]} conflicts with the map in use, {state.regmap.family}")
    state.regmap = named


def _regmap(state: _State) -> RegisterMap:
    if state.regmap is None:
        state.regmap = load_regmap(DEFAULT_MAP)
    return state.regmap


def _align(args: list[str], state: _State) -> None:
    _one_arg(".align", args)
    boundary = syn.parse_int(args[0])
    if boundary <= 0 or boundary % WORD_BYTES or boundary > MAX_ALIGN:
        raise EncodingError(f".align needs a positive multiple of {WORD_BYTES} bytes, at most {MAX_ALIGN}, "
                            f"got {boundary}")
    _pad(state, -len(state.out) % boundary, ".align")


def _pad(state: _State, count: int, directive: str) -> None:
    """Append ``count`` zero bytes, within :data:`MAX_BUFFER_BYTES` of output."""
    if len(state.out) + count > MAX_BUFFER_BYTES:
        raise EncodingError(f"{directive} would grow the buffer to {len(state.out) + count} bytes, more than the "
                            f"limit of {MAX_BUFFER_BYTES} bytes")
    state.out += bytes(count)


def _emit(state: _State, word: int) -> None:
    state.out += word.to_bytes(WORD_BYTES, "little")


def _write(tokens: list[str], regmap: RegisterMap) -> tuple[str, str, int]:
    """``BLOCK REGISTER = VALUE`` or ``BLOCK REGISTER FIELD=VALUE ...``."""
    if len(tokens) < 2:
        known = [b.name for b in regmap.blocks] + [syn.ZERO, syn.MARKER, syn.OP_EN]
        raise EncodingError(
            f"expected 'BLOCK REGISTER = VALUE', ZERO, MARKER, OP_EN or a directive; "
            f"got {tokens[0]!r} ({close_matches(tokens[0], known)})"
        )
    block, name = tokens[0].upper(), tokens[1].upper()
    register = regmap.register(block, name)
    rest = tokens[2:]
    if rest[:1] == ["="]:
        if len(rest) != 2:
            raise EncodingError(f"{register.qualified_name}: expected one value after '='")
        value = syn.parse_int(rest[1])
        if not -(1 << 31) <= value <= REGISTER_MASK:
            raise EncodingError(f"{register.qualified_name}: value {rest[1]} does not fit 32 bits")
        return block, name, value & REGISTER_MASK
    if len(rest) % 3 or any(rest[i + 1] != "=" for i in range(0, len(rest), 3)):
        raise EncodingError(f"{register.qualified_name}: expected '= VALUE' or FIELD=VALUE pairs")
    fields = {rest[i].upper(): syn.parse_int(rest[i + 2]) for i in range(0, len(rest), 3)}
    return block, name, register.pack(fields)


def _enable_mask(args: list[str], regmap: RegisterMap) -> int:
    if args[:1] == ["="]:
        if len(args) != 2:
            raise EncodingError("OP_EN: expected one value after '='")
        mask = syn.parse_int(args[1])
        if not 0 <= mask <= REGISTER_MASK:
            raise EncodingError(f"OP_EN value {args[1]} is not a 32-bit unsigned value")
        regmap.op_enable_names(mask)
        return mask
    return regmap.op_enable_mask(a.upper() for a in args)


def _no_operands(tokens: list[str]) -> None:
    if len(tokens) > 1:
        raise EncodingError(f"{tokens[0].upper()} takes no operands")


def _one_arg(name: str, args: list[str]) -> None:
    if len(args) != 1:
        raise EncodingError(f"{name} takes exactly one argument")


# -- chain mode --------------------------------------------------------------------------
def _options(args: list[str], allowed: set[str], name: str) -> dict[str, str]:
    if len(args) % 3 or any(args[i + 1] != "=" for i in range(0, len(args), 3)):
        raise EncodingError(f"{name}: expected KEY=VALUE options ({', '.join(sorted(allowed))})")
    options = {args[i].lower(): args[i + 2] for i in range(0, len(args), 3)}
    unknown = set(options) - allowed
    if unknown:
        raise EncodingError(f"{name}: unknown options {', '.join(sorted(unknown))}")
    return options


def _start_chain(args: list[str], state: _State) -> None:
    if state.out or state.chain_mode:
        raise EncodingError(".chain must come once, before any word")
    options = _options(args, {"base", "scale"}, ".chain")
    state.chain_mode = True
    state.chain_base = syn.parse_int(options.get("base", "0"))
    state.scale = syn.parse_int(options["scale"]) if "scale" in options else None


def _start_task(args: list[str], state: _State) -> None:
    # The enable list may be comma separated: enable=CNA,CORE splits into several tokens.
    if len(args) >= 3 and args[0].lower() == "enable" and args[1] == "=":
        values, rest = [args[2]], args[3:]
        while rest and rest[0] != "=" and (len(rest) < 2 or rest[1] != "="):
            values.append(rest.pop(0))
    else:
        raise EncodingError(".task in chain mode needs enable=MASK or enable=BLOCK,BLOCK")
    options = _options(rest, {"hi16"}, ".task")
    regmap = _regmap(state)
    if len(values) == 1 and values[0][:1].isdigit():
        mask = syn.parse_int(values[0])
        regmap.op_enable_names(mask)
    else:
        mask = regmap.op_enable_mask(v.upper() for v in values)
    state.tasks.append((mask, syn.parse_int(options.get("hi16", "0")), []))


def _chain_write(tokens: list[str], state: _State, regmap: RegisterMap) -> None:
    if not state.tasks:
        raise EncodingError("in chain mode, register writes must follow a .task line")
    block, name, value = _write(tokens, regmap)
    state.tasks[-1][2].append(RegisterWrite(block, name, value))


def _finish_chain(state: _State, source: str) -> bytes:
    regmap = _regmap(state)
    tasks = tuple(Task(tuple(writes), mask, amount_hi16=hi16) for mask, hi16, writes in state.tasks)
    try:
        return encode_chain(Chain(tasks), regmap, state.chain_base, state.scale).data
    except EncodingError as error:
        raise EncodingError(f"{source}: {error}") from None
