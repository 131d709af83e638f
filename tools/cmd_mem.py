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
    parser.add_argument("--sram", action="store_true",
                        help="add the per-layer SRAM table and the predicted internal, weight and SRAM-hit RW "
                        "amounts per frame (guide 5.7.3.4; .npu files)")
    from npuemu.tools.cmd_run import add_shape_set_option
    add_shape_set_option(parser, "report")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.emulator.timing.memory_report import memory_npu, memory_rknn
    from npuemu.isa.errors import ModelFileError
    from npuemu.tools.cmd_run import _model_kind

    kind = _model_kind(args.model)
    sram = None
    if kind == "rknn":
        if args.sram:
            raise ModelFileError(f"{args.model}: --sram reads the SRAM placement of an npuemu .npu build; a vendor "
                                 ".rknn file does not record one")
        from npuemu.isa.rknn import load_rknn
        report = memory_rknn(load_rknn(args.model), args.model)
    elif kind == "npu":
        from npuemu.emulator.timing.sram_report import sram_npu
        from npuemu.isa.container import ModelFile
        from npuemu.tools.cmd_run import dynamic_shape_set
        model, notes = dynamic_shape_set(ModelFile.read(args.model), args)  # one shape set per report
        report = memory_npu(model, args.model)
        for note in notes if not args.json else ():
            sys.stdout.write(f"note: {note}\n")
        sram = sram_npu(model) if args.sram else None
    else:
        raise ModelFileError(f"{args.model}: not a .rknn file (no 'RKNN' magic) and not a .npu model file")
    no_copy = _no_copy(model) if kind == "npu" else None
    if args.json:
        figures = report.to_json() | ({"sram_table": sram.to_json()} if sram else {}) | (
            {"no_copy": no_copy} if no_copy else {})
        json.dump(figures, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(report.format_text() + "\n" + (sram.format_text() + "\n" if sram else ""))
        if no_copy:
            sys.stdout.write(f"No-copy Concat/Split: {no_copy['layers']} layer(s) without a task, "
                             f"{no_copy['view_tensors']} tensor(s) stored inside another ({no_copy['view_bytes']} B "
                             f"neither allocated nor copied; compiler/LOWERING.md 10.1)\n")
    return 0


def _no_copy(model) -> dict | None:
    """The build's elided Concat/Split copies: layers marked ``no_copy`` and the tensors stored as
    views (``view_of``) with their bytes, which a copy would have allocated and moved."""
    layers = sum(1 for layer in model.trailer.get("graph", {}).get("layers", ()) if layer.get("no_copy"))
    views = [t for t in model.trailer.get("tensors", ()) if t.get("view_of") and "#b" not in t["name"]]
    if not layers:
        return None
    return {"layers": layers, "view_tensors": len(views), "view_bytes": sum(int(t["size"]) for t in views)}
