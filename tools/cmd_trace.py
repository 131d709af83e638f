"""``npuemu trace MODEL [-i x.npy ...] -o trace.json``: run a model and write a Chrome/Perfetto
trace of its timeline (emulator/timing/timeline.py, trace.py): NPU tasks per core, host steps
on their own track, schedule-group barriers and DMA. Open it in
https://ui.perfetto.dev or chrome://tracing. Without --input, zero inputs are used (timing
does not depend on values)."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "trace", help="write a Chrome/Perfetto trace (JSON) of a model run (.npu or .rknn)",
        description="Run the model on the emulated NPU and write a trace of its timeline: one track per core "
        "with one event per task (layer name, enable mask, NPU/DDR cycles, bytes), a host track with the "
        "CPU steps, the schedule groups' barriers and one track per DMA direction; it ends where `npuemu "
        "perf` and `npuemu run` say the frame ends. Without --input, zero inputs are used.",
    )
    parser.add_argument("model", help="path to an npuemu .npu model file or a vendor .rknn file")
    parser.add_argument("--input", "-i", action="append", default=[], metavar="X.npy",
                        help="one .npy array per graph input, in graph order (optional)")
    parser.add_argument("--output", "-o", required=True, metavar="TRACE.json", help="trace file to write")
    parser.add_argument("--platform", default=None,
                        help="platform name or YAML (default: the model's chip, else rk3588)")
    parser.add_argument("--core-mask", default=None, metavar="MASK",
                        help="a vendor .rknn file: trace its program for these cores (as `npuemu run --core-mask`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.emulator.timing.trace import build_trace
    from npuemu.isa.errors import ModelFileError
    from npuemu.tools.cmd_run import _model_kind
    from npuemu.tools.paths import refuse_input_as_output, write_output

    refuse_input_as_output(args.output, [args.model, *args.input])
    kind = _model_kind(args.model)
    notes: list[str] = []
    batch = None  # a batch build's trailer record (compiler/batch.py), for the summary line
    if kind == "rknn":
        timeline, platform = _timeline_rknn(args, notes)
    elif kind == "npu":
        if args.core_mask:
            from npuemu.isa.errors import ConfigError
            raise ConfigError(f"{args.model}: --core-mask picks a program of a vendor .rknn file; a .npu file runs as "
                              "compiled (npuemu compile --core-mask)")
        timeline, platform, batch = _timeline_npu(args, notes)
    else:
        raise ModelFileError(f"{args.model}: not a .rknn file (no 'RKNN' magic) and not a .npu model file")
    trace = build_trace(timeline, platform, model=args.model)
    trace["otherData"]["notes"] = notes
    write_output(args.output, json.dumps(trace), "the trace")
    for note in notes:
        sys.stdout.write(f"note: {note}\n")
    from npuemu.tools.cmd_run import timeline_text

    sys.stdout.write(f"{args.output}: {timeline_text(timeline, platform, batch)}\n")
    return 0


def _timeline_rknn(args, notes):
    from npuemu.emulator.rknn_runner import RknnRunner
    from npuemu.emulator.timing.timeline import timeline_rknn
    from npuemu.isa.rknn import load_rknn
    from npuemu.platforms import load_platform
    from npuemu.tools.cmd_perf import _inputs

    model = load_rknn(args.model)
    from npuemu.tools.cmd_run import rknn_cores

    chip = args.platform or model.target or "rk3588"
    runner = RknnRunner(model, chip, rknn_cores(args, chip))
    arrays = _inputs(args, [(t.name, tuple(t.shape)) for t in runner.input_tensors], notes)
    platform = load_platform(chip)
    return timeline_rknn(model, runner.run(arrays), platform), platform


def _timeline_npu(args, notes):
    from npuemu.emulator.runtime import Runtime
    from npuemu.emulator.timing.timeline import timeline_npu
    from npuemu.isa.container import ModelFile
    from npuemu.tools.cmd_perf import _inputs, input_shapes
    from npuemu.tools.cmd_run import model_platform

    model = ModelFile.read(args.model)
    runtime = Runtime(model, model_platform(model, args.platform, args.model))
    shapes = input_shapes(runtime, args.model)
    for name, array in zip(runtime.inputs, _inputs(args, shapes, notes, runtime.zero_input)):
        runtime.set_input(name, array)
    runtime.run()
    platform = runtime.machine.platform
    return timeline_npu(model, runtime.runs, platform), platform, model.trailer.get("batch")
