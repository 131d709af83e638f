"""``npuemu perf MODEL [--input x.npy ...] [--json]``: run a model on the emulator and print the
per-layer timing table in the vendor's perf-report columns (emulator/TIMING.md).

Works for npuemu ``.npu`` files and vendor ``.rknn`` files. Timing depends only on the
register state and the DMA byte counts, never on data values, so inputs are optional: without
``--input`` every graph input is zeros of its shape, and the output says so.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "perf", help="per-layer cycles, DDR traffic and time of a model (.npu or .rknn)",
        description="Run the model's register-command program on the emulated NPU and report per layer "
        "the NPU (MAC) cycles of model H1, the DDR bytes the DMA moved and their cycles, and the "
        "time at the platform's NPU clock. Without --input, zero inputs are used (timing does not "
        "depend on values).",
    )
    parser.add_argument("model", help="path to an npuemu .npu model file or a vendor .rknn file")
    parser.add_argument("--input", "-i", action="append", default=[], metavar="X.npy",
                        help="one .npy array per graph input, in graph order (optional)")
    parser.add_argument("--json", action="store_true", help="print raw figures as JSON instead of the table")
    parser.add_argument("--csv", action="store_true",
                        help="print the layers' raw figures as CSV (the JSON's names, emulator/TIMING.md)")
    parser.add_argument("--ddr-model", choices=("board", "vendor"), default="board",
                        help="board (default): DDR cycles from the bytes the DMA moved at the board-fitted rates; "
                        "vendor: librknnc's static estimate (its byte count at its assumed rate, "
                        "conv-type layers only, Time = max(DDR, NPU))")
    parser.add_argument("--profile-layers", action="store_true",
                        help="add the platform's per-layer host submit overhead (launch.host_submit_overhead_us) "
                        "to each NPU layer's time, as a board measures with per-layer profiling on")
    parser.add_argument("--platform", default=None,
                        help="platform name or YAML (default: the model's chip, else rk3588)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.isa.errors import ModelFileError
    from npuemu.tools.cmd_run import _model_kind

    if args.profile_layers and args.ddr_model == "vendor":
        from npuemu.isa.errors import ConfigError
        raise ConfigError("--profile-layers adds the board's per-layer host overhead; --ddr-model vendor "
                          "reproduces the vendor's static estimate, which has none: use one of them")
    if args.json and args.csv:
        from npuemu.isa.errors import ConfigError
        raise ConfigError("--json and --csv are two formats of the same figures: give one of them")
    kind = _model_kind(args.model)
    if kind == "rknn":
        report = _perf_rknn(args)
    elif kind == "npu":
        report = _perf_npu(args)
    else:
        raise ModelFileError(f"{args.model}: not a .rknn file (no 'RKNN' magic) and not a .npu model file")
    if args.profile_layers:
        report.layer_overhead_us = report.host_submit_overhead_us
    out = sys.stdout
    if args.json:
        json.dump(report.to_json(), out, indent=1)
        out.write("\n")
        return 0
    if args.csv:
        out.write(report.to_csv())
        return 0
    for note in report.notes:
        out.write(f"note: {note}\n")
    out.write(report.format_table() + "\n")
    if report.unassigned:
        out.write(f"{len(report.unassigned)} task(s) belong to no layer; counted in the totals only\n")
    totals = report.totals()
    if report.ddr_model == "vendor":
        out.write(f"{report.platform}: the vendor's static estimate (DDR at its assumed rate, no launch "
                  f"overhead): {totals['cycles']} cycles ({totals['time_us']:.1f} us)\n")
        return 0
    profiled = (f" and {report.layer_overhead_us:g} us of host submit per NPU layer (--profile-layers)"
                if report.layer_overhead_us else "")
    out.write(f"{report.platform} @ {report.npu_mhz:g} MHz: {totals['tasks']} tasks, "
              f"{totals['cycles']} cycles ({totals['time_us']:.1f} us) including "
              f"{totals['cycles'] - totals['max_cycles']} cycles of per-task launch (regcmd fetch and "
              f"dispatch){profiled}; DDR {totals['ddr_read_bytes']} B read, {totals['ddr_write_bytes']} B written\n")
    return 0


def _inputs(args, shapes: list[tuple[str, tuple]], notes: list[str]):
    import numpy as np

    from npuemu.emulator.rknn_runner import load_input_arrays
    from npuemu.isa.errors import InputError

    if args.input:
        arrays = load_input_arrays(args.input)
        if len(arrays) != len(shapes):
            raise InputError(f"{args.model}: {len(arrays)} --input file(s) given; the model takes "
                             f"{len(shapes)}: {', '.join(f'{n} {list(s)}' for n, s in shapes)} (in that order)")
        return arrays
    notes.append("no --input given: all inputs are zeros of their shapes "
                 f"({', '.join(f'{n} {list(s)}' for n, s in shapes)}); timing does not depend on values")
    return [np.zeros(shape, np.float32) for _, shape in shapes]


def _perf_rknn(args):
    from npuemu.emulator.rknn_runner import RknnRunner
    from npuemu.emulator.timing.report import report_rknn
    from npuemu.isa.rknn import load_rknn
    from npuemu.platforms import load_platform

    model = load_rknn(args.model)
    chip = args.platform or model.target or "rk3588"
    runner = RknnRunner(model, chip)
    notes: list[str] = []
    arrays = _inputs(args, [(t.name, tuple(t.shape)) for t in runner.input_tensors], notes)
    result = runner.run(arrays)
    report = report_rknn(model, result, load_platform(chip), args.ddr_model)
    report.model = args.model
    report.notes = notes
    return report


def _perf_npu(args):
    from npuemu.emulator.runtime import Runtime
    from npuemu.emulator.timing.report import report_npu
    from npuemu.isa.container import ModelFile
    from npuemu.isa.errors import ModelFileError

    model = ModelFile.read(args.model)
    runtime = Runtime(model, args.platform)
    shapes = []
    for name in runtime.inputs:
        shape = model.tensor(name).shape
        if shape is None:
            raise ModelFileError(f"{args.model}: input tensor {name!r} has no shape in the model file")
        shapes.append((name, tuple(shape)))
    notes: list[str] = []
    for name, array in zip(runtime.inputs, _inputs(args, shapes, notes)):
        runtime.set_input(name, array)
    runtime.run()
    report = report_npu(model, runtime.runs, runtime.machine.platform, args.ddr_model)
    report.model = args.model
    report.notes = notes + report.notes
    return report
