"""``npuemu mem MODEL [--json]``: static memory report (weights, internal tensors, other, total,
model file size) of a ``.npu`` or ``.rknn`` model, in the vendor's eval_memory layout. No run."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mem", help="memory report of a model (.npu or .rknn): weights, internal, other, total",
        description="Print the model's memory needs as the vendor's memory report does: Weight Memory, "
        "Internal Tensor Memory, Other Memory (register commands, I/O tensors), Total Memory and the "
        "model file size. Read from the model file only; nothing is run.",
    )
    parser.add_argument("model", help="path to an npuemu .npu model file or a vendor .rknn file")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.emulator.timing.memory_report import memory_npu, memory_rknn
    from npuemu.isa.errors import ModelFileError
    from npuemu.tools.cmd_run import _model_kind

    kind = _model_kind(args.model)
    if kind == "rknn":
        from npuemu.isa.rknn import load_rknn
        report = memory_rknn(load_rknn(args.model), args.model)
    elif kind == "npu":
        from npuemu.isa.container import ModelFile
        report = memory_npu(ModelFile.read(args.model), args.model)
    else:
        raise ModelFileError(f"{args.model}: not a .rknn file (no 'RKNN' magic) and not a .npu model file")
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(report.format_text() + "\n")
    return 0
