"""``npuemu asm FILE.s -o OUT.bin``: assemble regcmd assembly text into a raw buffer."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "asm", help="assemble regcmd text into a raw buffer",
        description="Assemble the text format printed by `npuemu disasm` (or hand-written, "
        "with field assignments and a .chain mode that lays out task tails) into a raw "
        "register-command buffer.",
    )
    parser.add_argument("file", type=Path, help="assembly text")
    parser.add_argument("-o", "--output", type=Path, help="output buffer (default: FILE with .bin)")
    parser.add_argument("--map", help="register map family or YAML path (default: the .map "
                        "directive, else rk3588)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from npuemu.isa.asm import assemble
    from npuemu.isa.errors import InputError
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.tools.paths import refuse_input_as_output, write_output

    output = args.output or args.file.with_suffix(".bin")
    refuse_input_as_output(output, [args.file])  # also `asm x.bin`, whose default output is itself
    try:
        text = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{args.file}: cannot read assembly text: {error}") from None
    regmap = load_regmap(args.map) if args.map else None
    data = assemble(text, regmap, source=str(args.file))
    write_output(output, data, "the regcmd buffer")
    logging.getLogger(__name__).info("wrote %d bytes to %s", len(data), output)
    return 0
