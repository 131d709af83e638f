"""``npuemu run MODEL --input x.npy [...]``: execute a model on the emulator and print or save
its outputs.

npuemu's own ``.npu`` files (from ``npuemu compile -o``) run through
:mod:`npuemu.emulator.runtime` (:func:`run_npu`); vendor ``.rknn`` files through
:mod:`npuemu.emulator.rknn_runner` (:func:`run_rknn`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TextIO


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="run a model file (.npu or vendor .rknn) on the emulator",
        description="Load a model, quantise the float inputs as the file says (mean/std included), "
        "run its register-command program on the emulated NPU (chain 0, core 0), execute the "
        "host-side layers, and print the dequantised outputs; --output-dir saves them as .npy.",
    )
    parser.add_argument("model", help="path to an npuemu .npu model file or a vendor .rknn file")
    parser.add_argument("--input", "-i", action="append", default=[], metavar="X.npy|IMG.png",
                        help="one .npy array or image (PNG; JPEG with the images extra) per graph input, in graph "
                        "order (repeat the option); float arrays are quantised, int8 arrays are taken as already "
                        "quantised; images get the mean/std the model was compiled with")
    parser.add_argument("--output-dir", "-o", metavar="DIR",
                        help="write each output to DIR/<output name>.npy")
    parser.add_argument("--raw", action="store_true",
                        help="save/print the int8 output values instead of dequantised float32")
    parser.add_argument("--platform", default=None,
                        help="platform name or YAML (default: the model's chip, else rk3588); a .npu file runs on "
                        "the chip it was compiled for, so a different chip is an error")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.isa.errors import ModelFileError

    from npuemu.tools.paths import output_directory

    kind = _model_kind(args.model)
    if args.output_dir:  # before the run: a bad folder must not cost the run's outputs
        output_directory(args.output_dir)
    if kind == "rknn":
        return run_rknn(args, sys.stdout)
    if kind == "npu":
        return run_npu(args, sys.stdout)
    raise ModelFileError(f"{args.model}: not a .rknn file (no 'RKNN' magic) and not a .npu model file")


def run_npu(args: argparse.Namespace, out: TextIO) -> int:
    from npuemu.emulator.rknn_runner import load_input_arrays
    from npuemu.emulator.runtime import Runtime
    from npuemu.isa.container import ModelFile
    from npuemu.isa.errors import InputError

    model = ModelFile.read(args.model)
    runtime = Runtime(model, model_platform(model, args.platform, args.model))
    if len(args.input) != len(runtime.inputs):
        raise InputError(f"{args.model}: {len(args.input)} --input file(s) given; the model takes "
                         f"{len(runtime.inputs)}: {', '.join(runtime.inputs)} (in that order)")
    arrays = _npu_inputs(runtime, args.input) if any(not str(p).lower().endswith(".npy") for p in args.input) \
        else load_input_arrays(args.input)
    stored = {tensor.name for tensor in model.tensors()}
    for name, array in zip(runtime.inputs, arrays):
        runtime.set_input(name, array)
        if name not in stored:  # the reader allows it only when nothing reads the input
            out.write(f"note: input {name!r} is read by no step of the model (e.g. a folded Shape); its value "
                      "is not used\n")
    runtime.run()
    npu_steps = sum(1 for step in runtime.model.schedule() if step.kind == "npu")
    out.write(f"{args.model}: {npu_steps} NPU chain(s) run\n")
    from npuemu.emulator.timing.timeline import timeline_npu

    platform = runtime.machine.platform
    out.write(f"timing: {timeline_text(timeline_npu(runtime.model, runtime.runs, platform), platform)}\n")
    _report_outputs(args, {name: runtime.output(name, not args.raw) for name in runtime.outputs}, out)
    return 0


def _npu_inputs(runtime, paths: list[str]) -> list:
    """Inputs given as files: .npy arrays as they are; images (PNG, JPEG with the ``images``
    extra) as NCHW pixel values, preprocessed with the mean/std/BGR the model was calibrated
    with (recorded by `npuemu compile` in the model file's compiler options)."""
    from npuemu.compiler.quant.dataset import load_input_file
    from npuemu.compiler.quant.preprocess import preprocess_from_plain

    recorded = (runtime.model.trailer.get("compiler", {}).get("options", {}) or {}).get("preprocess", {})
    arrays = []
    for name, path in zip(runtime.inputs, paths):
        shape = tuple(runtime.model.tensor(name).shape)
        array, is_image = load_input_file(path, shape, name)
        if is_image and name in recorded:
            array = preprocess_from_plain(recorded[name], f"model preprocess of {name}").apply(array, is_image=True)
        arrays.append(array)
    return arrays


def run_rknn(args: argparse.Namespace, out: TextIO) -> int:
    import numpy as np

    from npuemu.emulator.rknn_runner import RknnRunner, load_input_arrays
    from npuemu.isa.errors import InputError
    from npuemu.isa.rknn import load_rknn

    model = load_rknn(args.model)
    runner = RknnRunner(model, args.platform or "rk3588")
    if not args.input:
        expected = ", ".join(f"{t.name!r} {list(t.shape)}" for t in runner.input_tensors)
        raise InputError(f"{args.model}: no --input given; the model takes {len(runner.input_tensors)} "
                         f"input(s): {expected}")
    result = runner.run(load_input_arrays(args.input))

    chain = result.chain
    out.write(f"{args.model}: {len(chain.tasks)} NPU tasks on core {chain.core}, "
              f"{chain.read_bytes} bytes read, {chain.write_bytes} written\n")
    if result.host_layers:
        out.write(f"host layers: {', '.join(result.host_layers)}\n")
    from npuemu.emulator.timing.timeline import timeline_rknn
    from npuemu.platforms import load_platform

    platform = load_platform(args.platform or "rk3588")
    out.write(f"timing: {timeline_text(timeline_rknn(model, result, platform), platform)}\n")
    _report_outputs(args, result.quantized if args.raw else result.outputs, out)
    return 0


def timeline_text(timeline, platform) -> str:
    """The frame's time from the run's timeline (emulator/timing/timeline.py), as ``perf`` and
    ``trace`` report it: NPU cycles on the critical path and, when the schedule has host steps,
    their time and the total. Read from the records the run already produced; the timing model
    never changes numerical results."""
    tasks, cycles, mhz = len(timeline.task_spans()), timeline.npu_cycles, timeline.mhz
    where = f"at {mhz:g} MHz ({platform.name})"
    if not timeline.host_steps():
        return f"{tasks} tasks, {cycles} cycles = {timeline.total_us:.1f} us {where}"
    return (f"{tasks} tasks, {cycles} cycles = {cycles / mhz:.1f} us on the NPU + {timeline.host_us:.1f} us in "
            f"{timeline.host_steps()} host step(s) = {timeline.total_us:.1f} us {where}")


def _report_outputs(args: argparse.Namespace, values: dict, out: TextIO) -> None:
    """One line per output (shape, range, top-5 for a [1, N] vector); saved with --output-dir."""
    import numpy as np

    for name, array in values.items():
        line = (f"output {name!r}: shape {list(array.shape)} {array.dtype}, "
                f"min {array.min():.6g}, max {array.max():.6g}")
        if array.ndim == 2 and array.shape[0] == 1:
            top = np.argsort(-array[0], kind="stable")[:5]
            line += f", top-5 {[int(i) for i in top]}"
        if args.output_dir:
            path = os.path.join(args.output_dir, _file_name(name) + ".npy")
            _save_npy(path, array)
            line += f" -> {path}"
        out.write(line + "\n")


def model_platform(model, asked: str | None, path: str):
    """The platform a .npu file runs on: its own chip; ``--platform`` may name that chip (or a
    YAML describing it, e.g. with overrides) but not another one, whose layout and register
    figures the file was not compiled for."""
    from npuemu.isa.errors import ConfigError
    from npuemu.platforms import load_platform

    if asked is None:
        return None
    spec = load_platform(asked)
    chip = model.platform().chip or "rk3588"
    if spec.name != load_platform(chip).name:
        raise ConfigError(f"{path} was compiled for {chip}; --platform {asked} is {spec.name}: a model file runs on "
                          f"the chip it was compiled for (compile the ONNX model with -t {spec.name})")
    return spec


def _save_npy(path: str, array) -> None:
    import io

    import numpy as np

    from npuemu.tools.paths import write_output

    buffer = io.BytesIO()
    np.save(buffer, array)
    write_output(path, buffer.getvalue(), "the output array")


def _model_kind(path: str) -> str:
    from npuemu.isa.container_format import RKNN_MAGIC
    from npuemu.isa.errors import ModelFileError

    try:
        with open(path, "rb") as handle:
            head = handle.read(len(RKNN_MAGIC))
    except OSError as error:
        raise ModelFileError(f"{path}: cannot read the model file: {error.strerror or error}") from None
    if head == RKNN_MAGIC:
        return "rknn"
    if path.lower().endswith(".npu") or head[:3] == b"NPU":
        return "npu"
    return "unknown"


def _file_name(tensor_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", tensor_name) or "output"
