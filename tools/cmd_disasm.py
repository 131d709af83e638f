"""``npuemu disasm FILE``: print a raw regcmd buffer, or every regcmd section of a model
file, as assembly text."""

from __future__ import annotations

import argparse
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
    regmap = load_regmap(map_name)
    parts = []
    for section in model.sections_of_kind(SectionKind.REGCMD):
        parts.append(f"; section {section.name!r}: {section.size} bytes at {section.load_address:#x}\n")
        parts.append(disassemble(section.data, regmap, section.load_address))
    return "".join(parts) if parts else "; no regcmd sections\n"


def _disassemble_rknn(data: bytes, name: str, map_name: str | None) -> str:
    from npuemu.isa.disasm import disassemble
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.isa.rknn import load_rknn

    model = load_rknn(data, name=name)
    regcmd = model.program.regcmd
    header = (f"; {name}: stored regcmd blob, {len(regcmd)} words; address registers hold "
              "tensor-relative offsets until relocation\n")
    return header + disassemble(regcmd.astype("<u8").tobytes(), load_regmap(map_name or "rk3588"), 0)
