"""Entry point of the ``npuemu`` command.

Each sub-command lives in its own module ``tools/cmd_<name>.py`` exposing
``register(subparsers)``, which adds its parser and sets ``func`` (called with the parsed
arguments, returning an exit code or None). Modules are discovered, so adding a command
never touches this file. Command modules import heavy packages (numba, onnx) inside their
``func`` only, so ``npuemu --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from npuemu.isa.errors import NpuemuError

from npuemu import tools as _tools_pkg


def _command_modules():
    names = sorted(
        info.name for info in pkgutil.iter_modules(_tools_pkg.__path__) if info.name.startswith("cmd_")
    )
    return [importlib.import_module(f"npuemu.tools.{name}") for name in names]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npuemu",
        description="Rockchip-class NPU emulator: compile ONNX to register commands, run them "
        "bit-exactly, and report cycles and memory traffic.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules():
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = args.func(args)
    except NpuemuError as error:
        print(f"npuemu {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `npuemu disasm x | head`
        return 0
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
