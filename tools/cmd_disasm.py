"""``npuemu disasm FILE``: print a raw regcmd buffer as assembly text."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "disasm", help="disassemble a raw regcmd buffer",
        description="Print a raw register-command buffer (little-endian 64-bit words) as "
        "assembly text: one line per word with its decoded fields, task boundaries, tails and "
        "padding. `npuemu asm` turns the text back into the same bytes.",
    )
    parser.add_argument("file", type=Path, help="raw regcmd buffer")
    parser.add_argument("--map", default="rk3588", help="register map family or YAML path (default rk3588)")
    parser.add_argument("--base-addr", type=lambda text: int(text, 0), default=0,
                        help="address the buffer is mapped at, for the task addresses (default 0)")
    parser.add_argument("-o", "--output", type=Path, help="write the text here instead of stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.isa.disasm import disassemble
    from npuemu.isa.errors import InputError
    from npuemu.isa.regmap_loader import load_regmap

    try:
        data = args.file.read_bytes()
    except OSError as error:
        raise InputError(f"{args.file}: cannot read: {error.strerror}") from None
    text = disassemble(data, load_regmap(args.map), args.base_addr)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0
