"""`npuemu demo`: the main job on a bundled example, for a first run on a fresh machine.

Today the demo shows the foundation end to end: it assembles the bundled hand-written
RK3588 task chain (``tools/examples/conv_pool.s``), stores it in a model file with its
schedule, reads the file back through the validating reader, walks the chain the way the
PC does, and prints the disassembly. When the compiler and emulator land, the demo grows
into compile-and-run of a bundled network.
"""

from __future__ import annotations

import argparse
import tempfile
from importlib import resources
from pathlib import Path

EXAMPLE = "conv_pool.s"
REGCMD_ADDRESS = 0x0010_0000  # where the example's `.chain base=` puts the stream


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the main job on a bundled example",
        description="Assemble the bundled example task chain, save it as a model file, "
        "reload it and disassemble it.",
    )
    parser.add_argument("-o", "--output-dir", type=Path, default=None,
                        help="keep the model file here (default: a temporary folder)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.output_dir is None:
        with tempfile.TemporaryDirectory(prefix="npuemu-demo-") as folder:
            _demo(Path(folder))
    else:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        _demo(args.output_dir)
    return 0


def _demo(folder: Path) -> None:
    from npuemu.isa.asm import assemble
    from npuemu.isa.chain import decode_chain
    from npuemu.isa.container import MemoryRegion, ModelFile, Section, SectionKind
    from npuemu.isa.disasm import disassemble
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.platforms import load_platform

    platform = load_platform("rk3588")
    regmap = load_regmap(platform.register_map.family)
    source = resources.files("npuemu.tools").joinpath("examples", EXAMPLE).read_text()
    regcmd = assemble(source, regmap, source=EXAMPLE)
    first_amount, task_count = _first_task(regcmd, regmap, platform.pc.data_amount_scale)

    model = ModelFile(
        sections=(Section(SectionKind.REGCMD, "regcmd", regcmd, MemoryRegion.DDR, REGCMD_ADDRESS),),
        trailer={
            "platform": {"chip": platform.name},
            "compiler": {"version": "hand-written example", "options": {"source": EXAMPLE}},
            "graph": {"name": "conv_pool", "inputs": [], "outputs": [], "layers": []},
            "schedule": [{
                "kind": "npu", "core": 0,
                "chain": {"section": "regcmd", "offset": 0, "first_amount": first_amount,
                          "tasks": task_count},
            }],
        },
    )
    path = folder / "conv_pool.npu"
    model.write(path)
    loaded = ModelFile.read(path)
    step = loaded.schedule()[0]
    section = loaded.section(step.chain.section)
    chain = decode_chain(section.data, regmap, section.load_address,
                         section.load_address + step.chain.offset, step.chain.first_amount,
                         platform.pc.data_amount_scale)

    print(f"npuemu demo: {EXAMPLE} assembled for {platform.name} "
          f"({len(regcmd)} bytes of register commands)")
    print(f"model file {path.name}: {path.stat().st_size} bytes, read back and verified")
    print(f"chain on core {step.core}: {len(chain.chain.tasks)} tasks at "
          f"{', '.join(hex(a) for a in chain.task_addresses)}, fetch amounts {list(chain.amounts)}\n")
    print(disassemble(section.data, regmap, section.load_address))


def _first_task(regcmd: bytes, regmap, scale: int) -> tuple[int, int]:
    """The PC's first fetch amount and the task count, read from the assembled stream."""
    from npuemu.isa.chain import fetch_amount
    from npuemu.isa.segments import scan_buffer

    tasks = [segment for segment in scan_buffer(regcmd, regmap).segments if not segment.padding]
    tail_words = 4  # BASE_ADDRESS (or zero), REGISTER_AMOUNTS, marker, op-enable
    return fetch_amount(len(tasks[0].words) - tail_words, scale), len(tasks)
