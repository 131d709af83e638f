"""``npuemu platforms``: list the chips, or show one in full with the source of each figure."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "platforms",
        help="list the supported chips, or show one chip's figures with their sources",
        description="Without CHIP: one line per shipped chip with its headline figures. With CHIP "
        "(a name or alias) or --file: every figure of that platform, grouped, with sources.",
    )
    parser.add_argument("chip", nargs="?", help="platform name or alias, e.g. rk3588 or rk3566")
    parser.add_argument("--file", metavar="YAML", help="load this platform YAML instead of a shipped chip")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one figure, e.g. --set ddr.read_bytes_per_cycle=8 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.isa.errors import ConfigError
    from npuemu.platforms import list_platforms, load_platform

    if args.chip and args.file:
        raise ConfigError("give either a chip name or --file, not both")
    if args.chip or args.file:
        platform = load_platform(args.file or args.chip, args.overrides)
        print(json.dumps(_full_json(platform), indent=2) if args.json else _full_text(platform))
        return 0
    platforms = [load_platform(name, args.overrides) for name in list_platforms()]
    rows = [_headline(platform) for platform in platforms]
    print(json.dumps(rows, indent=2) if args.json else _table(rows))
    return 0


# ---- the list -------------------------------------------------------------------------------

def _headline(platform: Any) -> dict[str, Any]:
    """The figures of the list, as numbers (the text table formats them)."""
    return {
        "chip": platform.name,
        "aliases": list(platform.aliases),
        "cores": platform.cores.count,
        "npu_mhz": platform.clock.npu_mhz,
        "int8_macs_per_core": platform.macs_per_cycle("int8"),
        "int8_tops": round(platform.peak_tops("int8"), 3),
        "cbuf_bytes_per_core": platform.cbuf.size_bytes,
        "sram_kind": platform.sram.kind,
        "sram_bytes": platform.sram.size_bytes,
        "ddr_read_bytes_per_cycle": platform.ddr.read_bytes_per_cycle,
        "ddr_write_bytes_per_cycle": platform.ddr.write_bytes_per_cycle,
    }


_COLUMNS = (  # (title, right-aligned, cell text from a headline row)
    ("chip", False, lambda row: row["chip"]),
    ("aliases", False, lambda row: ", ".join(row["aliases"]) or "-"),
    ("cores", True, lambda row: str(row["cores"])),
    ("MHz", True, lambda row: f"{row['npu_mhz']:g}"),
    ("int8 MAC/core", True, lambda row: str(row["int8_macs_per_core"])),
    ("int8 TOPS", True, lambda row: f"{row['int8_tops']:.2f}"),
    ("CBUF/core", True, lambda row: _size(row["cbuf_bytes_per_core"])),
    ("SRAM", False, lambda row: _sram_text(row["sram_kind"], row["sram_bytes"])),
    ("DDR B/cycle", True, lambda row: _ddr_text(row["ddr_read_bytes_per_cycle"], row["ddr_write_bytes_per_cycle"])),
)


def _sram_text(kind: str, size: int) -> str:
    return "-" if kind == "none" else f"{_size(size)} {kind}"


def _ddr_text(read: float, write: float) -> str:
    return f"{read:g}" if read == write else f"{read:g} r / {write:g} w"


def _table(rows: list[dict[str, Any]]) -> str:
    cells = [[title for title, _, _ in _COLUMNS]] + [[cell(row) for _, _, cell in _COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    lines = []
    for line in cells:
        parts = [text.rjust(width) if right else text.ljust(width)
                 for text, width, (_, right, _) in zip(line, widths, _COLUMNS, strict=True)]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _size(value: int) -> str:
    if value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value >> 20} MiB"
    return f"{value / 1024:g} KiB"


# ---- one platform ---------------------------------------------------------------------------

def _derived(platform: Any) -> dict[str, Any]:
    from npuemu.platforms import COMPUTE_DTYPES

    return {
        "cbuf_bytes_per_core": platform.cbuf.size_bytes,
        "peak_tops": {d: round(platform.peak_tops(d), 3) for d in COMPUTE_DTYPES if platform.supports(d)},
        "atom_k": {d: platform.atom_k(d) for d in COMPUTE_DTYPES if platform.supports(d)},
    }


def _full_json(platform: Any) -> dict[str, Any]:
    return {**platform.to_dict(), "derived": _derived(platform)}


def _full_text(platform: Any) -> str:
    lines = [f"{platform.name}: {platform.description}"]
    if platform.aliases:
        lines.append(f"aliases: {', '.join(platform.aliases)}")
    lines.append(f"source: {platform.source}")
    for field in dataclasses.fields(platform):
        value = getattr(platform, field.name)
        if dataclasses.is_dataclass(value):
            lines += [""] + _group_lines(field.name, value, indent="")
    derived = _derived(platform)
    lines += ["", "derived (computed from the figures above):"]
    lines += [f"  {key}: {_inline(value)}" for key, value in derived.items()]
    return "\n".join(lines)


def _group_lines(name: str, group: Any, indent: str) -> list[str]:
    lines = [f"{indent}{name}:", f"{indent}  source: {group.source}"]
    if group.note:
        lines.append(f"{indent}  note: {group.note}")
    figures = [f for f in dataclasses.fields(group) if f.name not in ("source", "note")]
    width = max((len(f.name) for f in figures), default=0)
    for field in figures:
        value = getattr(group, field.name)
        if dataclasses.is_dataclass(value) and hasattr(value, "source"):
            lines += _group_lines(field.name, value, indent + "  ")
        else:
            lines.append(f"{indent}  {field.name.ljust(width)}  {_inline(value)}")
    return lines


def _inline(value: Any) -> str:
    if value is None:
        return "null"
    if dataclasses.is_dataclass(value):
        return " ".join(f"{f.name}={_inline_scalar(getattr(value, f.name))}" for f in dataclasses.fields(value))
    if isinstance(value, dict):
        return " ".join(f"{key}={_inline_scalar(item)}" for key, item in value.items()) or "-"
    if isinstance(value, tuple):
        return ", ".join(str(item) for item in value) or "-"
    return _inline_scalar(value)


def _inline_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
