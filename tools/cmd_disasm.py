"""``npuemu disasm FILE``: print a raw regcmd buffer, or every regcmd section of a model
file, as assembly text."""

from __future__ import annotations

import argparse
import re
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "disasm", help="disassemble a model file (.npu, .rknn) or a raw regcmd buffer",
        description="Print a raw register-command buffer (little-endian 64-bit words) as "
        "assembly text: one line per word with its decoded fields, task boundaries, tails and "
        "padding. `npuemu asm` turns the text back into the same bytes. Given a model file (.npu), "
        "every regcmd section is disassembled at its load address with the chip's register map; "
        "given a vendor .rknn file, its stored regcmd blob (addresses are tensor-relative offsets "
        "until relocation).",
    )
    parser.add_argument("file", type=Path, help="model file (.npu) or raw regcmd buffer")
    parser.add_argument("--map", default=None,
                        help="register map family or YAML path (default: the model's chip, else rk3588)")
    parser.add_argument("--base-addr", type=lambda text: int(text, 0), default=0,
                        help="address the buffer is mapped at, for the task addresses (default 0)")
    parser.add_argument("-o", "--output", type=Path, help="write the text here instead of stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.isa.disasm import disassemble
    from npuemu.isa.errors import InputError
    from npuemu.isa.container import MAGIC, ModelFile
    from npuemu.isa.container_format import RKNN_MAGIC
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.tools.paths import refuse_input_as_output, write_output

    refuse_input_as_output(args.output, [args.file])
    try:
        data = args.file.read_bytes()
    except OSError as error:
        raise InputError(f"{args.file}: cannot read: {error.strerror}") from None
    if data.startswith(RKNN_MAGIC):
        text = _disassemble_rknn(data, str(args.file), args.map)
    elif data.startswith(MAGIC):
        text = _disassemble_model(ModelFile.from_bytes(data, name=str(args.file)), args.map)
    else:
        text = disassemble(data, load_regmap(args.map or "rk3588"), args.base_addr)
    if args.output:
        write_output(args.output, text, "the assembly text")
    else:
        print(text, end="")
    return 0


def _disassemble_model(model, map_name: str | None) -> str:
    from npuemu.isa.container import SectionKind
    from npuemu.isa.disasm import disassemble
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.platforms import load_platform

    if map_name is None:
        chip = model.platform().chip
        map_name = load_platform(chip).register_map.family if chip else "rk3588"
        map_name = model.trailer.get("platform", {}).get("register_layout", map_name)  # LOWERING.md 39
    regmap = load_regmap(map_name)
    layers = task_layers(model, regmap)
    parts = []
    for section in model.sections_of_kind(SectionKind.REGCMD):
        parts.append(f"; section {section.name!r}: {section.size} bytes at {section.load_address:#x}\n")
        parts.append(_name_tasks(disassemble(section.data, regmap, section.load_address), layers))
    return "".join(parts) if parts else "; no regcmd sections\n"


_TASK_ADDRESS = re.compile(r"^\.task \d+\s+;\s*@(0x[0-9a-fA-F]+)")


def _name_tasks(text: str, layers: dict[int, str]) -> str:
    """Each ``.task`` header with the graph layer(s) its task belongs to (a comment: `asm` reads
    the same bytes back)."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        match = _TASK_ADDRESS.match(line)
        if match and int(match.group(1), 16) in layers:
            lines[index] = f"{line}; {layers[int(match.group(1), 16)]}"
    return "\n".join(lines)


def task_layers(model, regmap) -> dict[int, str]:
    """Task address -> "layer NAME (OpType)" for every task the trailer's graph.layers[].tasks
    ranges claim: each NPU step's chain walked as the PC fetches it (its task addresses), then
    the ranges (step, first, count) looked up in it. A chain that does not walk names nothing:
    the disassembly itself still shows the words."""
    from npuemu.isa.chain import decode_chain
    from npuemu.isa.errors import NpuemuError

    addresses: dict[int, tuple[int, ...]] = {}
    for index, step in enumerate(model.schedule()):
        if step.kind != "npu":
            continue
        try:
            section = model.section(step.chain.section)
            addresses[index] = decode_chain(section.data, regmap, section.load_address,
                                            section.load_address + step.chain.offset, step.chain.first_amount,
                                            regmap.pc_amount_scale).task_addresses
        except (NpuemuError, KeyError):
            continue
    names: dict[int, list[str]] = {}
    for layer in (model.trailer.get("graph") or {}).get("layers", ()):
        label = f"layer {layer.get('name')} ({layer.get('op_type')})"
        for claim in layer.get("tasks", ()):
            chain = addresses.get(int(claim.get("step", -1)), ())
            for position in range(int(claim.get("first", 0)), int(claim.get("first", 0)) + int(claim.get("count", 0))):
                if 0 <= position < len(chain) and label not in names.setdefault(chain[position], []):
                    names[chain[position]].append(label)
    return {address: ", ".join(labels) for address, labels in names.items()}


def _disassemble_rknn(data: bytes, name: str, map_name: str | None) -> str:
    from npuemu.isa.disasm import disassemble
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.isa.rknn import load_rknn

    model = load_rknn(data, name=name)
    regcmd = model.program.regcmd
    family = map_name or _rknn_family(model.target)
    header = (f"; {name}: stored regcmd blob, {len(regcmd)} words, target {model.target or '?'}, "
              f"register map {family}; address registers hold tensor-relative offsets until relocation\n")
    return header + disassemble(regcmd.astype("<u8").tobytes(), load_regmap(family), 0)


_CHIP_NAME = re.compile(r"[a-z]{2}[0-9]{3,5}[a-z]?")


def _rknn_family(target: str | None) -> str:
    """The register map of the file's target chip (model slot 8), as for a .npu file's chip (the
    vendor's own layout for rk3576, which npuemu's rk3576 builds do not use); rk3588
    when the target is absent or unknown. Only a plain chip name is looked up: the slot is file data,
    and a platform name may also be a YAML path."""
    from npuemu.isa.errors import ConfigError
    from npuemu.platforms import load_platform

    if not target or not _CHIP_NAME.fullmatch(target):
        return "rk3588"
    if target == "rk3576":  # the vendor writes its own rk3576 layout (emulator/REGISTER_SEMANTICS.md 10.3)
        from npuemu.isa.rknn.rk3576_layout import VENDOR_FAMILY
        return VENDOR_FAMILY
    try:
        return load_platform(target).register_map.family
    except ConfigError:
        return "rk3588"
