"""``npuemu conformance``: the ONNX backend node tests of the ops the compiler knows, compiled
for a chip and run on the emulator (tools/conformance.py; tolerance in its docstring).
Exit 0 when no case fails or errors, 1 otherwise; usage errors exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "conformance",
        help="run the ONNX node tests of the supported ops on the emulator",
        description="Compile each single-node ONNX backend test of an op the compiler knows for the chip, run it "
        "on the emulator and compare with the expected outputs. Every case ends in pass, fail (max error), "
        "unsupported (reason), not applicable or error (a bug). fp16: every case is reported unsupported, the "
        "model-file build lowers int8 layers only.",
    )
    parser.add_argument("--ops", default=None, help="comma-separated op types (default: every op the compiler knows)")
    parser.add_argument("--dtype", choices=("int8", "fp16"), default="int8", help="default int8")
    parser.add_argument("-t", "--target", default="rk3588", help="chip (default rk3588)")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None, help="write the JSON report to FILE")
    parser.add_argument("--list-unsupported", action="store_true",
                        help="also print every unsupported case with its reason")
    parser.add_argument("--show-failures", action="store_true", help="also print every fail/error case")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it is drawn only when stderr is a terminal)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.tools import conformance

    ops = [op.strip() for op in args.ops.split(",") if op.strip()] if args.ops else None
    report = conformance.run_conformance(args.target, args.dtype, ops, bar=not args.no_progress)
    print(conformance.format_table(report))
    bad = [case for case in report.cases if case.status in ("fail", "error")]
    if args.show_failures or bad:
        for case in bad:
            if case.status == "fail":
                detail = f"max error {case.max_error:.4g} > tolerance {case.tolerance:.4g}"
            else:
                detail = case.reason
            print(f"{case.status}: {case.name}: {detail}")
    if args.list_unsupported:
        print(conformance.format_unsupported(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_json(), indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if bad else 0
