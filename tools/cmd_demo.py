"""`npuemu demo`: the main job on a bundled example, for a first run on a fresh machine.

It writes the bundled network (``tools/demo_network.py``), a calibration dataset and a test
image to a folder, then does what a user does: ``npuemu compile ... --quantize --dataset
... -o demo_cnn.npu`` and ``npuemu run demo_cnn.npu --input image.npy``. It finishes by
comparing the emulated NPU's output with the compiler's float evaluation of the same network.

``npuemu demo --assembler`` shows the foundation instead: it assembles the hand-written
RK3588 task chain ``tools/examples/conv_pool.s``, stores it in a model file, reads it back,
walks the chain the way the PC does and prints the disassembly.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

EXAMPLE = "conv_pool.s"
REGCMD_ADDRESS = 0x0010_0000  # where the example's `.chain base=` puts the stream
CALIBRATION_IMAGES = 8
#: Where the demo keeps its files by default: the commands it prints must still work after it.
DEFAULT_FOLDER = Path("npuemu-demo")
#: Files a demo writes; a non-empty folder holding none of them is someone else's (not reused).
DEMO_FILES = ("demo_cnn.onnx", "demo_cnn.npu", "dataset.txt", "image.npy", "conv_pool.npu")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="compile and run a bundled network on the emulated NPU",
        description="Compile the bundled CNN for rk3588 (int8, calibrated on bundled synthetic "
        "images), run it on the emulator and compare with the float network. --assembler shows "
        "the hand-written register-command example instead.",
    )
    parser.add_argument("-o", "--output-dir", "--keep", type=Path, default=None, metavar="DIR",
                        help=f"keep the files here (default: ./{DEFAULT_FOLDER}); the printed commands use them")
    parser.add_argument("--assembler", action="store_true",
                        help="assemble, save, reload and disassemble the hand-written example chain")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    job = _demo if args.assembler else _compile_and_run
    folder = _demo_folder(args.output_dir)
    code = job(folder)
    if not code:
        where = "" if folder.is_absolute() else " from the current directory"
        print(f"\nthe files are kept in {folder}/, so the commands above can be repeated as printed{where}")
    return code


def _demo_folder(asked: Path | None) -> Path:
    """The folder the demo writes: ``asked``, else ./npuemu-demo - unless that holds files a demo
    did not write, which it must not overwrite or mix with."""
    from npuemu.isa.errors import InputError
    from npuemu.tools.paths import output_directory

    if asked is not None:
        return output_directory(asked)
    folder = DEFAULT_FOLDER
    if folder.is_dir() and any(folder.iterdir()) and not any((folder / name).exists() for name in DEMO_FILES):
        raise InputError(f"./{folder} exists and holds files the demo did not write; give the demo a folder of its "
                         "own with -o DIR")
    return output_directory(folder)


def _compile_and_run(folder: Path) -> int:
    import numpy as np
    import onnx

    from npuemu.compiler.float_eval import evaluate
    from npuemu.compiler.onnx_import import import_onnx
    from npuemu.tools.cli import main
    from npuemu.tools.demo_network import demo_images, demo_network

    model_path, npu_path = folder / "demo_cnn.onnx", folder / "demo_cnn.npu"
    onnx.save(demo_network(), model_path)
    lines = []
    for index, image in enumerate(demo_images(CALIBRATION_IMAGES, seed=100)):
        np.save(folder / f"calib_{index}.npy", image)
        lines.append(f"calib_{index}.npy")
    (folder / "dataset.txt").write_text("\n".join(lines) + "\n")
    image = demo_images(1, seed=7)[0]
    np.save(folder / "image.npy", image)

    commands = [
        ["compile", str(model_path), "-t", "rk3588", "--quantize", "--dataset", str(folder / "dataset.txt"),
         "--no-progress", "-o", str(npu_path)],
        ["run", str(npu_path), "--input", str(folder / "image.npy"), "--output-dir", str(folder / "out")],
    ]
    for command in commands:
        print("$ npuemu " + " ".join(command))
        code = main(command)
        if code:
            return code
    emulated = np.load(folder / "out" / "logits.npy").reshape(-1)
    reference = evaluate(import_onnx(model_path), {"image": image})["logits"].reshape(-1)
    cosine = float(emulated @ reference / (np.linalg.norm(emulated) * np.linalg.norm(reference)))
    print(f"\nemulated int8 NPU vs float network: cosine {cosine:.5f}, top-1 "
          f"{int(emulated.argmax())} vs {int(reference.argmax())}")
    return 0


def _demo(folder: Path) -> int:
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
    return 0


def _first_task(regcmd: bytes, regmap, scale: int) -> tuple[int, int]:
    """The PC's first fetch amount and the task count, read from the assembled stream."""
    from npuemu.isa.chain import fetch_amount
    from npuemu.isa.segments import scan_buffer

    tasks = [segment for segment in scan_buffer(regcmd, regmap).segments if not segment.padding]
    tail_words = 4  # BASE_ADDRESS (or zero), REGISTER_AMOUNTS, marker, op-enable
    return fetch_amount(len(tasks[0].words) - tail_words, scale), len(tasks)
