"""``npuemu perf MODEL [--input x.npy ...] [--json]``: run a model on the emulator and print the
per-layer timing table in the vendor's perf-report columns (emulator/TIMING.md).

Works for npuemu ``.npu`` files, vendor ``.rknn`` files and ONNX models. Timing depends only on
the register state and the DMA byte counts, never on data values, so inputs are optional:
without ``--input`` every graph input is zeros of its shape, and the output says so.

``--core-mask``, ``--sram`` and ``--batch-size`` are compiled into a ``.npu`` file (the split
across cores, the SRAM placement, the batch contexts): given with a ``.npu`` they are checked
against what the file was built with, and a mismatch names the build's setting and the compile
command that makes the asked one. Given an ONNX model, perf compiles it in memory with them (the
options of ``npuemu compile``: ``-t``, ``--input-shape``, ``--quantize --dataset`` / ``--fp16`` /
``--quant-config``) and reports that build: a what-if study in one command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "perf", help="per-layer cycles, DDR traffic and time of a model (.npu or .rknn)",
        description="Run the model's register-command program on the emulated NPU and report per layer "
        "the NPU (MAC) cycles of model H1, the DDR bytes the DMA moved and their cycles, and the "
        "time at the platform's NPU clock. Without --input, zero inputs are used (timing does not "
        "depend on values).",
    )
    parser.add_argument("model", help="path to an npuemu .npu model file, a vendor .rknn file or an ONNX model")
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
    parser.add_argument("--roofline", metavar="OUT.png", type=Path, default=None,
                        help="also draw each layer as attained MAC/s vs MACs per DDR byte under the chip's compute "
                        "and DDR roofs (needs the plot extra: matplotlib)")
    _add_build_options(parser)
    from npuemu.tools.cmd_run import add_shape_set_option
    add_shape_set_option(parser, "time")
    parser.set_defaults(func=run)


def _add_build_options(parser: argparse.ArgumentParser) -> None:
    """The compile options: checked against a .npu's build, applied to an ONNX model."""
    from npuemu.tools import cmd_compile

    group = parser.add_argument_group(
        "build (compiled into a .npu: checked against its build; an ONNX model is compiled with them)")
    cmd_compile.add_build_options(group)
    onnx = parser.add_argument_group("ONNX model (compiled in memory as `npuemu compile` would)")
    cmd_compile.add_target_options(onnx)
    cmd_compile.add_set_option(parser)
    cmd_compile.add_precision_options(parser)
    cmd_compile.add_calibration_options(parser)
    # None: not given (a .npu runs as built; an ONNX model gets compile's defaults)
    parser.set_defaults(target=None, core_mask=None, batch_size=None, optimization_level=3)


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
    kind = "onnx" if args.model.lower().endswith(".onnx") else _model_kind(args.model)
    if kind != "onnx":
        _refuse_onnx_options(args, kind)
    if kind == "rknn":
        report = _perf_rknn(args)
    elif kind == "npu":
        report = _perf_npu(args)
    elif kind == "onnx":
        report = _perf_onnx(args)
    else:
        raise ModelFileError(f"{args.model}: not a .rknn file (no 'RKNN' magic), not a .npu model file and "
                             "not an .onnx model")
    if args.profile_layers:
        report.layer_overhead_us = report.host_submit_overhead_us
    if args.roofline is not None:
        from npuemu.tools.sweep_plots import roofline_plot
        print(roofline_plot(report, args.timed_platform, args.roofline), file=sys.stderr)  # stdout: the report
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
    for line in report.header_lines():  # which DDR model, fitted to what, how to get the other; error band
        out.write(line + "\n")
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
    if totals["cpu_time_us"]:  # the timeline's host steps (emulator/timing/timeline.py)
        profiled += f", and {totals['cpu_time_us']:.1f} us in host steps"
    out.write(f"{report.platform} @ {report.npu_mhz:g} MHz: {totals['tasks']} tasks, "
              f"{totals['cycles']} cycles ({totals['time_us']:.1f} us) including "
              f"{totals['cycles'] - totals['max_cycles']} cycles of per-task launch (regcmd fetch and "
              f"dispatch){profiled}; DDR {totals['ddr_read_bytes']} B read, {totals['ddr_write_bytes']} B written\n")
    return 0


def _inputs(args, shapes: list[tuple[str, tuple]], notes: list[str], zeros=None):
    """The --input arrays, else zeros of each input: ``zeros(name)`` when given (a .npu input in
    its stored type, bounded by the bytes the file places it in), else float32 of the shape."""
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
    if zeros is not None:
        return [zeros(name) for name, _ in shapes]
    return [np.zeros(shape, np.float32) for _, shape in shapes]


def _perf_rknn(args):
    from npuemu.emulator.rknn_runner import RknnRunner
    from npuemu.emulator.timing.report import report_rknn
    from npuemu.isa.rknn import load_rknn
    from npuemu.platforms import load_platform

    from npuemu.tools.cmd_run import rknn_shape_set

    model, notes = rknn_shape_set(args)  # a dynamic-shape .rknn: one graph per report
    from npuemu.tools.cmd_run import rknn_cores

    chip = args.platform or model.target or "rk3588"
    runner = RknnRunner(model, chip, rknn_cores(args, chip))
    arrays = _inputs(args, [(t.name, tuple(t.shape)) for t in runner.input_tensors], notes)
    result = runner.run(arrays)
    if len(result.cores) > 1:
        notes.append(f"the file's {runner.core_program.label} program on cores {'_'.join(map(str, result.cores))}: "
                     f"{len(result.pieces)} pieces, barrier phases side by side")
    args.timed_platform = _rknn_platform(args, load_platform(chip))
    report = report_rknn(model, result, args.timed_platform, args.ddr_model)
    report.model = args.model
    report.notes = notes
    return report


def _perf_npu(args):
    from npuemu.isa.container import ModelFile

    from npuemu.tools.cmd_run import dynamic_shape_set

    model, notes = dynamic_shape_set(ModelFile.read(args.model), args)  # one shape set per report (guide 5.4)
    _check_build(model, args)
    report = _perf_model_file(args, model)
    report.notes = notes + report.notes
    return report


def _perf_onnx(args):
    from npuemu.isa.errors import ConfigError
    from npuemu.tools import cmd_compile

    if args.platform:
        raise ConfigError(f"{args.model}: an ONNX model is compiled for the chip given with -t CHIP; --platform "
                          "applies to .npu and .rknn files")
    if not (args.quantize or args.dataset or args.fp16 or args.quant_config):
        raise ConfigError(f"{args.model}: perf compiles an ONNX model before it runs it, which needs a precision: "
                          "--quantize --dataset ds.txt, --fp16 or --quant-config FILE (as npuemu compile)")
    build = argparse.Namespace(**vars(args))
    build.model, build.target = Path(args.model), args.target or "rk3588"
    build.core_mask, build.batch_size = args.core_mask or "auto", args.batch_size or 1
    from npuemu.tools.cmd_run import dynamic_shape_set

    model, notes = dynamic_shape_set(cmd_compile.compile_in_memory(build), args)
    report = _perf_model_file(args, model)
    report.notes = notes + report.notes
    built = _describe(_mask_cores(build.core_mask, model), build.sram, build.batch_size, build.core_mask)
    report.notes = [f"compiled in memory for {build.target} with {built} (nothing written; "
                    "`npuemu compile ... -o FILE` keeps the build)", *report.notes]
    return report


# --- what a .npu file compiles in ------------------------------------------------------------

#: options of `npuemu compile` that only make sense for an ONNX model: (attribute, "not given")
_ONNX_ONLY = (("target", None), ("input_shape", []), ("dynamic_input", None), ("quantize", False), ("fp16", False), ("quant_config", None),
              ("dataset", None), ("algorithm", "normal"), ("mean", []), ("std", []), ("bgr", False),
              ("per_channel", True))


def _refuse_onnx_options(args, kind: str) -> None:
    from npuemu.isa.errors import ConfigError

    given = [name for name, unset in _ONNX_ONLY if getattr(args, name) != unset]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") if name != "per_channel" else "--per-layer" for name in given)
        raise ConfigError(f"{args.model}: {flags}: options for compiling an ONNX model, and this file is already "
                          "compiled (give perf the .onnx model to study another build)")
    if kind == "rknn" and (args.sram or args.batch_size):
        raise ConfigError(f"{args.model}: --sram and --batch-size apply to .npu files and ONNX models; "
                          "a vendor .rknn file runs as built (--core-mask picks one of its programs)")


def _mask_cores(mask: str, model) -> tuple[int, ...]:
    from npuemu.platforms import load_platform
    from npuemu.compiler.core_mask import parse_core_mask

    chip = model.platform().chip
    return parse_core_mask(mask, load_platform(chip).cores.count, chip)


def _built_with(model) -> tuple[str, tuple[int, ...], bool, int]:
    """(core mask, its cores, SRAM on, batch size) of a model file's build: the compiler options
    in its trailer, else (a file built through the Python API) what its schedule and memory map say."""
    options = model.compiler().options
    if "core_mask" in options:
        mask = options["core_mask"]
        cores = _mask_cores(mask, model)
    else:
        cores = tuple(sorted({step.core for step in model.schedule() if step.kind == "npu"})) or (0,)
        mask = "_".join(map(str, cores)) if cores != (0,) else "auto"
    sram = options["sram"] if "sram" in options else any(area.region == "sram" for area in model.memory_map().areas)
    return mask, cores, bool(sram), int(options.get("batch_size", 1))


def _describe(cores: tuple[int, ...], sram: bool, batch: int, mask: str) -> str:
    core_text = f"core {cores[0]}" if len(cores) == 1 else "cores " + ", ".join(map(str, cores))
    return (f"--core-mask {mask} ({core_text}), {'with' if sram else 'without'} --sram"
            + (f", --batch-size {batch}" if batch != 1 else ""))


def _check_build(model, args) -> None:
    """A .npu runs as built: the asked --core-mask / --sram / --batch-size must be its own."""
    from npuemu.isa.errors import ConfigError

    mask, cores, sram, batch = _built_with(model)
    asked_mask = args.core_mask or mask
    asked_cores = _mask_cores(asked_mask, model) if args.core_mask else cores
    asked_sram = sram or args.sram
    asked_batch = args.batch_size or batch
    if (asked_cores, asked_sram, asked_batch) == (cores, sram, batch):
        return
    chip = model.platform().chip
    flags = f"-t {chip} --core-mask {asked_mask}" + (" --sram" if asked_sram else "") + \
        (f" --batch-size {asked_batch}" if asked_batch != 1 else "")
    raise ConfigError(
        f"{args.model} was built with {_describe(cores, sram, batch, mask)}; the core split, SRAM placement and "
        f"batch contexts are compiled into the model file, so perf cannot run it with "
        f"{_describe(asked_cores, asked_sram, asked_batch, asked_mask)}. Build that variant with "
        f"`npuemu compile MODEL.onnx {flags} <precision options as before> -o {Path(args.model).stem}_whatif.npu`, "
        f"or study it in one step with `npuemu perf MODEL.onnx {flags} <precision options>`")


def _perf_model_file(args, model):
    from npuemu.emulator.runtime import Runtime
    from npuemu.emulator.timing.report import report_npu
    from npuemu.tools.cmd_run import model_platform

    runtime = Runtime(model, _npu_platform(model, args, model_platform(model, args.platform, args.model)))
    shapes = input_shapes(runtime, args.model)
    notes: list[str] = []
    for name, array in zip(runtime.inputs, _inputs(args, shapes, notes, runtime.zero_input)):
        runtime.set_input(name, array)
    runtime.run()
    args.timed_platform = runtime.machine.platform  # the roofline's figures
    report = report_npu(model, runtime.runs, runtime.machine.platform, args.ddr_model)
    report.model = args.model
    report.notes = notes + report.notes
    return report


def input_shapes(runtime, path: str) -> list[tuple[str, tuple]]:
    """(name, shape) of each graph input of a loaded .npu model, in graph order."""
    from npuemu.isa.errors import ModelFileError

    shapes = []
    for name in runtime.inputs:
        shape = runtime.model.tensor(name).shape
        if shape is not None:
            shape = runtime.input_shape(name)  # a readin input: the caller's shape (isa/CONTAINER.md 3.3)
        if shape is None:
            raise ModelFileError(f"{path}: input tensor {name!r} has no shape in the model file")
        shapes.append((name, tuple(shape)))
    return shapes


# --- platform overrides (--set, and those a .npu file records) --------------------------------

def _rknn_platform(args, platform):
    """A vendor file runs as built: only figures the timing model alone reads may be replaced."""
    from npuemu.compiler.driver import override_map, target_platform, timing_only
    from npuemu.isa.errors import ConfigError

    asked = override_map(args.overrides)
    built = [key for key in asked if not timing_only(key)]
    if built:
        raise ConfigError(f"{args.model}: --set {', '.join(built)}: a figure the compiler reads, and a vendor .rknn "
                          "file is already compiled; only timing figures (ddr.*, clock.*, launch.*, ...) apply here")
    return target_platform(platform, asked) if asked else platform


def _npu_platform(model, args, built):
    """The platform a .npu is timed on: ``built`` (cmd_run.model_platform: its chip with the
    overrides it was compiled with; None for the plain chip), then --set (timing figures freely; a
    figure the compiler reads only with the value the file was built with)."""
    from npuemu.compiler.driver import override_map, target_platform

    asked = override_map(getattr(args, "overrides", []))
    if not asked:
        return built
    built = built or target_platform(model.platform().chip or "rk3588")
    _check_compiled_figures(model, args, built, asked)
    return target_platform(built, asked)


def _check_compiled_figures(model, args, built, asked) -> None:
    from npuemu.compiler.driver import target_platform, timing_only
    from npuemu.isa.errors import ConfigError
    from npuemu.platforms.model import to_plain

    compiled = {key: value for key, value in asked.items() if not timing_only(key)}
    if not compiled:
        return
    wanted = target_platform(built, compiled)
    differ = [key for key in compiled if to_plain(wanted.get(key)) != to_plain(built.get(key))]
    if differ:
        have = ", ".join(f"{key}={to_plain(built.get(key))}" for key in differ)
        raise ConfigError(f"{args.model} was built with {have}; the compiler reads {', '.join(differ)}, so perf "
                          "cannot change it on a built file: study it with `npuemu perf MODEL.onnx --set KEY=VALUE "
                          "<precision options>` or rebuild with `npuemu compile ... --set KEY=VALUE`")
