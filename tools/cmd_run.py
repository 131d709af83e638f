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
                        "order (repeat the option); float arrays are the model's input values and are quantised; "
                        "uint8 arrays are pixel values like an image's and get the mean/std the model was compiled "
                        "with; int8 arrays need --raw-input")
    parser.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw",
                        help="axis order of 4-D .npy inputs (default nchw, the ONNX model's own order; the vendor's "
                        "toolkit feeds nhwc); images are always read as pixels, so this does not apply to them")
    parser.add_argument("--raw-input", action="store_true",
                        help="the .npy inputs hold the model's stored values (int8, already quantised with the "
                        "input's scale/zero point; float16 for an fp16 input): written as they are")
    parser.add_argument("--output-dir", "-o", metavar="DIR",
                        help="write each output to DIR/<output name>.npy")
    parser.add_argument("--raw", action="store_true",
                        help="save/print the stored output values (int8) instead of dequantised float32; "
                        "for stored input values see --raw-input")
    parser.add_argument("--platform", default=None,
                        help="platform name or YAML (default: the model's chip, else rk3588); a .npu file runs on "
                        "the chip it was compiled for, so a different chip is an error")
    parser.add_argument("--core-mask", default=None, metavar="MASK",
                        help="a vendor .rknn file: run its program for these cores (auto/0: the single-core "
                        "chain 0, the default; 0_1, 0_1_2, all: its multi-core programs; 1: rk3576's core-1 copy); "
                        "a .npu file runs as compiled (npuemu compile --core-mask)")
    add_shape_set_option(parser, "run")
    parser.set_defaults(func=run)


def add_shape_set_option(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--shape-set", type=int, default=None, metavar="N",
                        help=f"a dynamic-shape .npu (compile --dynamic-input): {verb} its shape set N (0 = the "
                        "first); default: the set the .npy --input shapes match (an input of another shape is "
                        "refused, naming the sets), else set 0")


def dynamic_shape_set(model, args: argparse.Namespace) -> tuple:
    """(the static model to run, notes) of a .npu file: a dynamic-shape file's set chosen by
    --shape-set, else by the shapes of the .npy --input arrays (NCHW after --layout), else set 0."""
    from npuemu.isa.container_dynamic import pick, set_note
    from npuemu.isa.errors import ConfigError

    sets = model.shape_sets()
    index = getattr(args, "shape_set", None)
    if not sets:
        if index not in (None, 0):
            raise ConfigError(f"{args.model}: --shape-set {index}: the model has one input shape set (not built "
                              "with --dynamic-input)")
        return model, []
    if index is not None and not 0 <= index < len(sets):
        raise ConfigError(f"{args.model}: --shape-set {index}: the model has {len(sets)} shape sets (0..{len(sets) - 1})")
    if index is None:
        index = pick(sets, _npy_shapes(sets[0], getattr(args, "input", []), getattr(args, "layout", "nchw")))
    return model.shape_set(index), [set_note(sets, index)]


def _npy_shapes(first: dict, paths, layout: str) -> dict:
    import numpy as np

    shapes = {}
    for (name, rank), path in zip(((n, len(s)) for n, s in first.items()), paths):
        if str(path).lower().endswith(".npy"):
            shape = tuple(np.load(path, mmap_mode="r", allow_pickle=False).shape)
            if layout == "nhwc" and len(shape) in (3, 4):
                shape = (*shape[:-3], shape[-1], *shape[-3:-1])
            shapes[name] = (1, *shape) if len(shape) == rank - 1 else shape
    return shapes


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

    model, notes = dynamic_shape_set(ModelFile.read(args.model), args)
    for note in notes:
        out.write(f"note: {note}\n")
    runtime = Runtime(model, model_platform(model, args.platform, args.model))
    if len(args.input) != len(runtime.inputs):
        raise InputError(f"{args.model}: {len(args.input)} --input file(s) given; the model takes "
                         f"{len(runtime.inputs)}: {', '.join(runtime.inputs)} (in that order)")
    arrays = _npu_inputs(runtime, args)
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
    timeline = timeline_npu(runtime.model, runtime.runs, platform)
    out.write(f"timing: {timeline_text(timeline, platform, runtime.model.trailer.get('batch'))}\n")
    _report_outputs(args, {name: runtime.output(name, not args.raw) for name in runtime.outputs}, out)
    return 0


def _npu_inputs(runtime, args: argparse.Namespace) -> list:
    """Inputs given as files, each made what the runtime stores: .npy arrays in --layout order;
    images (PNG, JPEG with the ``images`` extra) and uint8 arrays as NCHW pixel values,
    preprocessed with the mean/std/BGR the model was calibrated with (recorded by `npuemu
    compile` in the model file's compiler options); int8 only with --raw-input. (The compiler's
    modules are imported only for an image or a uint8 array: running a model on float .npy
    inputs imports neither the compiler nor onnx, tests/test_import_cost.py.)"""
    from npuemu.emulator.rknn_runner import load_input_arrays

    recorded = (runtime.model.trailer.get("compiler", {}).get("options", {}) or {}).get("preprocess", {})
    arrays = []
    for name, path in zip(runtime.inputs, args.input):
        shape = runtime.input_shape(name)  # a readin input: the caller's shape (isa/CONTAINER.md 3.3)
        if str(path).lower().endswith(".npy"):
            array, is_image = load_input_arrays([path])[0], False
            array = _in_layout(array, args.layout, shape, name, path)
        else:
            from npuemu.compiler.quant.dataset import load_input_file

            array, is_image = load_input_file(path, shape, name)
        arrays.append(_npu_input_values(runtime, name, array, is_image, recorded.get(name), args.raw_input, path))
    return arrays


def _in_layout(array, layout: str, shape: tuple, name: str, path: str):
    """A 4-D (or 3-D, batch dimension left out) .npy array in NCHW order. An NHWC array given
    without --layout nhwc is refused by name: its values would otherwise land on the wrong axes."""
    import numpy as np

    from npuemu.isa.errors import InputError

    if layout == "nhwc" and array.ndim in (3, 4):
        return np.ascontiguousarray(np.moveaxis(array, -1, -3))
    if layout == "nhwc":
        raise InputError(f"{path}: --layout nhwc applies to 4-D (or 3-D) arrays; input {name!r} is "
                         f"{array.ndim}-D {list(array.shape)} - drop --layout")
    if len(shape) == 4 and array.ndim in (3, 4) and tuple(array.shape) not in (shape, shape[1:]):
        nhwc = (shape[0], shape[2], shape[3], shape[1])
        if tuple(array.shape) in (nhwc, nhwc[1:]):
            raise InputError(f"{path}: shape {list(array.shape)} is input {name!r} {list(shape)} in NHWC order "
                             "(the vendor's default); .npy inputs are read as NCHW unless you pass --layout nhwc")
    return array


def _npu_input_values(runtime, name: str, array, is_image: bool, recorded: dict | None, raw: bool, path: str):
    """The array ``Runtime.set_input`` takes for one input, by its element type:
    float -> real values (quantised by the runtime); uint8 / image -> pixels, preprocessed;
    int8 -> stored values, only with --raw-input (an int8 array is too easily a pixel buffer)."""
    import numpy as np

    from npuemu.emulator.cpu_ops_tensors import is_nd

    info = runtime.tensor_info(name) if name in runtime._tensors else {}
    if not info or (is_nd(info) and "quantization" not in info):
        return array  # a host tensor of its own element type (int64 indices, bool masks...): as given
    stored = runtime.dtype(name)
    if raw:
        return _raw_input(array, stored, name, path)
    if array.dtype == np.uint8 or is_image:
        array = array.astype(np.float32)
        if recorded:
            from npuemu.compiler.quant.preprocess import preprocess_from_plain

            array = preprocess_from_plain(recorded, f"model preprocess of {name}").apply(array, is_image=True)
        return array
    return _check_real(array, stored, name, path)


def _raw_input(array, stored: str, name: str, path: str):
    import numpy as np

    from npuemu.isa.errors import InputError

    want = np.dtype(np.int8) if stored == "int8" else np.dtype(np.float16)
    if array.dtype != want:
        raise InputError(f"{path}: --raw-input takes input {name!r} as stored {stored} values; the array is "
                         f"{array.dtype} - give {want} values, or drop --raw-input for float values to quantise")
    return array


def _check_real(array, stored: str, name: str, path: str):
    import numpy as np

    from npuemu.isa.errors import InputError

    if np.issubdtype(array.dtype, np.floating):
        return array
    if array.dtype == np.int8:
        raise InputError(f"{path}: input {name!r} is an int8 array: pass --raw-input if it holds the model's "
                         f"stored (already quantised) values; for pixel values save it as uint8, for real values "
                         "as float32")
    raise InputError(f"{path}: input {name!r} is a {array.dtype} array; expected float values (quantised as the "
                     f"model says), uint8 pixel values (preprocessed as the model was compiled), or {stored} stored "
                     "values with --raw-input")


def run_rknn(args: argparse.Namespace, out: TextIO) -> int:
    import numpy as np

    from npuemu.emulator.rknn_runner import RknnRunner
    from npuemu.isa.errors import InputError

    model, notes = rknn_shape_set(args)
    for note in notes:
        out.write(f"note: {note}\n")
    chip = args.platform or model.target or "rk3588"  # the file's own target, as perf and trace take it
    runner = RknnRunner(model, chip, rknn_cores(args, chip))
    if not args.input:
        expected = ", ".join(f"{t.name!r} {list(t.shape)}" for t in runner.input_tensors)
        raise InputError(f"{args.model}: no --input given; the model takes {len(runner.input_tensors)} "
                         f"input(s): {expected}")
    result = runner.run(_rknn_inputs(runner, args))

    chain = result.chain
    where = f"core {chain.core}" if len(result.cores) == 1 else \
        f"cores {'_'.join(map(str, result.cores))} ({runner.core_program.label} program, {len(result.pieces)} pieces)"
    out.write(f"{args.model}: {len(chain.tasks)} NPU tasks on {where}, "
              f"{chain.read_bytes} bytes read, {chain.write_bytes} written\n")
    if result.host_layers:
        out.write(f"host layers: {', '.join(result.host_layers)}\n")
    from npuemu.emulator.timing.timeline import timeline_rknn
    from npuemu.platforms import load_platform

    platform = load_platform(chip)
    out.write(f"timing: {timeline_text(timeline_rknn(model, result, platform), platform)}\n")
    _report_outputs(args, result.quantized if args.raw else result.outputs, out)
    return 0


def rknn_cores(args: argparse.Namespace, chip: str) -> tuple[int, ...] | None:
    """The cores --core-mask names for a vendor file's program (None: auto, its chain 0)."""
    mask = getattr(args, "core_mask", None)
    if mask in (None, "auto"):
        return None
    from npuemu.compiler.core_mask import parse_core_mask
    from npuemu.platforms import load_platform

    return parse_core_mask(mask, load_platform(chip).cores.count, chip)


def rknn_shape_set(args: argparse.Namespace) -> tuple:
    """(the vendor model to run, notes): a dynamic-shape .rknn (one graph per shape set) read at the
    graph --shape-set names, else the one the .npy --input shapes match, else graph 0."""
    from npuemu.emulator.rknn_runner import dynamic_graph
    from npuemu.isa.rknn import load_rknn

    model = load_rknn(args.model)
    asked = getattr(args, "shape_set", None)
    if not model.graph_shapes:
        if asked not in (None, 0):
            dynamic_graph(model, (), asked)  # refused, naming the one set
        return model, []
    first = {t.name: tuple(t.shape) for t in model.input_tensors}
    given = _npy_shapes(first, getattr(args, "input", []), getattr(args, "layout", "nchw"))
    index = dynamic_graph(model, [given.get(name) for name in first], asked)
    model = load_rknn(args.model, graph_index=index) if index else model
    shown = " ".join(",".join(map(str, shape)) for shape in model.graph_shapes[index])
    return model, [f"dynamic-shape .rknn: shape set {index} of {len(model.graph_shapes)} ({shown}); "
                   "--shape-set N for another"]


def _rknn_inputs(runner, args: argparse.Namespace) -> list:
    """A .rknn file's inputs: --layout applied, int8 arrays only with --raw-input (the runner
    takes them as stored values), other numbers (uint8 pixels, floats) normalised with the
    file's mean/std and quantised by the runner."""
    import numpy as np

    from npuemu.emulator.rknn_runner import load_input_arrays
    from npuemu.isa.errors import InputError

    arrays = []
    for tensor, path, array in zip(runner.input_tensors, args.input, load_input_arrays(args.input)):
        array = _in_layout(array, args.layout, tuple(tensor.shape), tensor.name, path)
        if args.raw_input and array.dtype != np.int8:
            raise InputError(f"{path}: --raw-input takes input {tensor.name!r} as stored int8 values; the array is "
                             f"{array.dtype} - drop --raw-input for values to quantise")
        if not args.raw_input and array.dtype == np.int8:
            _check_real(array, "int8", tensor.name, path)  # refused, naming --raw-input
        arrays.append(array)
    return arrays + load_input_arrays(args.input[len(arrays):])  # extra files: the runner names the count


def timeline_text(timeline, platform, batch: dict | None = None) -> str:
    """The frame's time from the run's timeline (emulator/timing/timeline.py), as ``perf`` and
    ``trace`` report it: NPU cycles on the critical path and, when the schedule has host steps,
    their time and the total. Read from the records the run already produced; the timing model
    never changes numerical results. ``batch`` (the trailer's {size, contexts}) states a
    multi-batch build's totals: its slices run side by side, so the elapsed cycles of a batch of
    2 can equal one slice's - the work summed over the contexts says what the batch did."""
    tasks, cycles, mhz = len(timeline.task_spans()), timeline.npu_cycles, timeline.mhz
    where = f"at {mhz:g} MHz ({platform.name})"
    size = int((batch or {}).get("size", 1))
    if size > 1:
        return _batch_text(timeline, size, where)
    if not timeline.host_steps():
        return f"{tasks} tasks, {cycles} cycles = {timeline.total_us:.1f} us {where}"
    return (f"{tasks} tasks, {cycles} cycles = {cycles / mhz:.1f} us on the NPU + {timeline.host_us:.1f} us in "
            f"{timeline.host_steps()} host step(s) = {timeline.total_us:.1f} us {where}")


def _batch_text(timeline, size: int, where: str) -> str:
    cycles, mhz, contexts = timeline.npu_cycles, timeline.mhz, timeline.contexts()
    head = (f"batch of {size}: {size} slices in {contexts} context(s) side by side, {len(timeline.task_spans())} "
            f"tasks, {timeline.busy_cycles()} NPU cycles of work summed over the contexts; elapsed {cycles} cycles")
    if timeline.host_steps():
        head += (f" = {cycles / mhz:.1f} us on the NPU + {timeline.host_us:.1f} us in {timeline.host_steps()} "
                 "host step(s)")
    return f"{head} = {timeline.total_us:.1f} us for the batch ({timeline.total_us / size:.1f} us per slice) {where}"


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
    """The platform a .npu file runs on: its own chip with the figures it was compiled with
    (``compile --set``); ``--platform`` may name that chip (or a YAML describing it, e.g. with
    overrides) but not another one, whose layout and register figures the file was not compiled for."""
    from npuemu.isa.errors import ConfigError
    from npuemu.platforms import load_platform

    chip = model.platform().chip or "rk3588"
    recorded = dict(model.platform().overrides)  # `compile --set` figures the file was built with
    if recorded:  # the compiler's driver (and with it onnx) only for a file built with --set
        from npuemu.compiler.driver import target_platform
    if asked is None:
        return target_platform(chip, recorded) if recorded else None
    spec = load_platform(asked)
    if spec.name != load_platform(chip).name:
        raise ConfigError(f"{path} was compiled for {chip}; --platform {asked} is {spec.name}: a model file runs on "
                          f"the chip it was compiled for (compile the ONNX model with -t {spec.name})")
    return target_platform(spec, recorded) if recorded else spec


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
