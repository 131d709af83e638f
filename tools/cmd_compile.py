"""``npuemu compile``: ONNX model -> model file through the compiler driver (compiler/driver.py),
with the IR text, per-layer JSON and partition report on request.

Options are added by small ``_add_*_options`` functions, one per group; ``compile_options``
turns them into the driver's CompileOptions, and the steps after the driver's front half (the
model file, the dumps, the summary) run in order.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compile",
        help="compile an ONNX model into a model file for one chip (-o), or dump its IR / per-layer JSON",
        description="Compile an ONNX model for one chip through the compiler driver (compiler/driver.py): "
        "import (shape inference, dynamic input dims fixed, constants folded), graph passes and the NPU/CPU "
        "partition, quantization (--quantize --dataset, --fp16 or --quant-config), then with -o lowering, "
        "memory plan, schedule and the model file. Put the model path before options that take an optional "
        "value (--dump-ir).",
    )
    for add_options in OPTION_GROUPS:
        add_options(parser)
    parser.set_defaults(func=run)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="the ONNX model file (or an MNN .mnn file)")
    add_target_options(parser)
    add_set_option(parser)
    parser.add_argument("--custom-op", dest="custom_ops", action="append", default=[], metavar="MODULE:CLASS",
                        help="register a custom op: a Python class with op_type, shape_infer() and compute() "
                        "(guide 5.5, compiler/ops/custom.py); its nodes run as host steps, and the module must be "
                        "importable where the model file runs (repeatable)")
    _add_surgery_options(parser)


def _add_surgery_options(parser: argparse.ArgumentParser) -> None:
    """Model surgery before import (compiler/passes/surgery.py), as the vendor's load_onnx offers."""
    group = parser.add_argument_group("model surgery")
    group.add_argument("--outputs", metavar="NAME,...", type=_names, default=None,
                       help="cut the graph: these tensors are the model's outputs (load_onnx(outputs=))")
    group.add_argument("--inputs", metavar="NAME,...", type=_names, default=None,
                       help="cut the graph: these tensors are the model's inputs (load_onnx(inputs=))")
    group.add_argument("--freeze", metavar="NAME=VALUE", action="append", default=[], type=_freeze_spec,
                       help="fix an input to a constant (one value fills its shape, or V0,V1,...), so shape "
                       "arithmetic, Where and If on it fold at compile time (repeatable)")


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME,... (tensor names)")
    return names


def _freeze_spec(text: str) -> tuple[str, list[float]]:
    from npuemu.compiler.passes.surgery import parse_freeze_spec
    from npuemu.isa.errors import NpuemuError

    try:
        return parse_freeze_spec(text)
    except NpuemuError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """The chip and fixed input shapes (shared with ``perf``, which compiles an ONNX model in memory)."""
    parser.add_argument("-t", "--target", metavar="CHIP", default="rk3588",
                        help="target chip: a platform name or alias (see `npuemu platforms`) or a platform "
                        "YAML file; default rk3588")
    parser.add_argument("--input-shape", metavar="NAME=D0,D1,...", action="append", default=[], type=_shape_spec,
                        help="fix the shape of a graph input (repeat for several inputs; NAME= may be left out "
                        "when the model has one input), e.g. --input-shape x=1,3,224,224")
    parser.add_argument("--dynamic-input", metavar="SETS", default=None,
                        help="dynamic shapes (guide 5.4): one model file with a chain set per input shape set, the "
                        "weights stored once and one quantization (calibrated at the first set). Sets are separated "
                        "by ';', the inputs of a set by spaces or '&', each NAME=D0,D1,... with every graph input in "
                        "every set: \"x=1,3,224,224;x=1,3,160,160\" or \"a=1,3,64,64 & b=1,8;a=1,3,32,32 & b=1,8\". "
                        "`run` picks the set by the input shapes; `perf`/`mem` take --shape-set N")


def add_set_option(parser) -> None:
    """--set KEY=VALUE: one platform figure replaced for this build (shared with ``perf``)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one platform figure for this build, with the keys and checks of "
                        "`npuemu platforms --set`, e.g. --set cbuf.banks=6 (repeatable); recorded in the model file")


def _add_dump_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dump-ir", metavar="FILE", nargs="?", const="-", default=None,
                        help="write the IR as text to FILE ('-' or no FILE: standard output)")
    parser.add_argument("--dump-json", metavar="FILE", type=Path, default=None,
                        help="write the per-layer JSON (NPU perf JSON format) to FILE")


def add_calibration_options(parser: argparse.ArgumentParser) -> None:
    """Dataset, algorithm, preprocessing and weight method (shared with ``quant-config``)."""
    group = parser.add_argument_group("calibration (int8)")
    group.add_argument("--dataset", metavar="FILE", type=Path, default=None,
                       help="calibration dataset: a text file, one sample per line, one .npy/.png/.jpg per model "
                       "input separated by spaces, paths relative to the file (implies --quantize)")
    group.add_argument("--algorithm", choices=("normal", "kl_divergence", "mmse"), default="normal",
                       help="range selection: normal (min/max, default), kl_divergence, mmse")
    group.add_argument("--mean", metavar="[NAME=]V0,V1,...", action="append", default=[],
                       help="per-channel mean subtracted from each sample (pixel units), once per input in input "
                       "order or NAME=...; one value applies to every channel; default 0")
    group.add_argument("--std", metavar="[NAME=]V0,V1,...", action="append", default=[],
                       help="per-channel std the samples are divided by after the mean; default 1")
    group.add_argument("--bgr", "--reorder-channel", dest="bgr", action="store_true",
                       help="reverse the channel order of calibration images (RGB -> BGR) before mean/std; "
                       ".npy samples are used as they are")
    methods = group.add_mutually_exclusive_group()
    methods.add_argument("--per-channel", dest="per_channel", action="store_true", default=True,
                         help="weights quantized per output channel (default)")
    methods.add_argument("--per-layer", dest="per_channel", action="store_false",
                         help="one weight scale per layer")
    group.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")


def _add_quant_mode_options(parser: argparse.ArgumentParser) -> None:
    add_precision_options(parser)
    parser.add_argument("--auto-hybrid", metavar="COS", nargs="?", type=float, const=0.99, default=None,
                        help="int8 with the layers that cost the most accuracy moved to float16 until every "
                        "calibration sample's output cosine to the float model is at least COS (default 0.99; "
                        "needs --dataset); prints the layers moved, the cosines and the NPU cycles it costs "
                        "(compiler/QUANTIZATION.md 12)")
    # The model-file output belongs with the precision modes: quant-config leaves this group out
    # (it has an -o of its own, for the YAML config).
    _add_output_options(parser)


def add_precision_options(parser: argparse.ArgumentParser) -> None:
    """--quantize / --fp16 / --quant-config (shared with ``perf``)."""
    group = parser.add_argument_group("precision")
    modes = group.add_mutually_exclusive_group()
    modes.add_argument("--quantize", action="store_true",
                       help="int8 asymmetric quantization calibrated on --dataset")
    modes.add_argument("--fp16", action="store_true", help="no quantization: every layer in float16")
    modes.add_argument("--quant-config", metavar="FILE", type=Path, default=None,
                       help="build from a per-layer quantization config written by `npuemu quant-config` "
                       "(hybrid int8/float16; no dataset needed)")


def _add_optimization_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("graph passes")
    group.add_argument("-O", "--optimization-level", type=int, choices=(0, 1, 2, 3), default=3,
                       help="0: no fusion (the imported graph); 1: folding and hardware fusions; 2: + clean-up "
                       "merges of Reshape/Transpose/identities; 3: + vendor rewrites (FC as conv, "
                       "GlobalAveragePool as depthwise convs, CBUF channel tiling); default 3")
    group.add_argument("--prune", action="store_true",
                       help="remove conv output channels whose weights and bias are all zero, with the matching "
                       "input channels of the layers reading them (guide 5.8 model pruning; outputs unchanged)")
    group.add_argument("--sparse", action="store_true",
                       help="RK3576 sparse inference (guide 5.11): int8 convs whose weights are 4:2 sparse along "
                       "input or output channels store them compressed (compiler/LOWERING.md 23); the others stay "
                       "dense, with the reason in the compile summary; fp16 builds ignore it")
    group.add_argument("--partition-report", metavar="FILE", nargs="?", const="-", default=None,
                       help="write the NPU/CPU decision and reason of every layer to FILE ('-' or no FILE: "
                       "standard output)")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model file")
    group.add_argument("-o", "--output", metavar="FILE", type=Path, default=None,
                       help="write the compiled model file (.npu) to FILE; needs a quantized graph "
                       "(--quantize --dataset ds.txt, --fp16 or --quant-config)")
    add_build_options(group)


def add_build_options(group) -> None:
    """What the model file compiles in: SRAM, core mask, batch (shared with ``perf``)."""
    group.add_argument("--sram", action="store_true",
                       help="place internal tensors in the chip's SRAM as far as it goes (RK3588: 956 KB); "
                       "`npuemu perf` then reports SRAM hits instead of DDR traffic for them")
    group.add_argument("--core-mask", default="auto", metavar="MASK",
                       help="NPU cores the model file splits convolutions across: auto (one core), 0, 1, 2, "
                       "0_1, 0_1_2 or all (multi-core chips; default auto)")
    group.add_argument("--batch-size", type=int, default=1, metavar="N",
                       help="build N batch slices (guide 5.6): internal memory duplicated per context (at most "
                       "3 on RK3588, 2 on RK3576, each on its own core), weights shared; inputs and outputs [N, ...]")


#: Functions adding the option groups of ``compile``, in help order.
OPTION_GROUPS: list[Callable[[argparse.ArgumentParser], None]] = [
    _add_model_options, _add_dump_options, _add_optimization_options, add_calibration_options,
    _add_quant_mode_options,
]


def _shape_spec(text: str) -> tuple[str | None, list[int]]:
    from npuemu.compiler.onnx_import import parse_shape_spec
    from npuemu.isa.errors import NpuemuError

    try:
        return parse_shape_spec(text)
    except NpuemuError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@contextlib.contextmanager
def _phased(args: argparse.Namespace, options, *, lowering: bool):
    """The compile options with ``on_phase`` set to the command's phase line, inside that line's
    context (progress_cli.compile_phases)."""
    import dataclasses

    from npuemu.tools.progress_cli import compile_phases

    with compile_phases(args, options.precision, lowering=lowering) as line:
        yield dataclasses.replace(options, on_phase=line)


def run(args: argparse.Namespace) -> int:
    from npuemu.compiler.driver import build, prepare

    _refuse_inputs_as_outputs(args)
    with _phased(args, compile_options(args), lowering=args.output is not None) as options:
        front = prepare(args.model, args.target, options)
        if args.output is not None and front.quantization is not None:
            build(front)  # under the phase line; build_step writes it (or says why it cannot)
    for step in STEPS:
        step(args, front)
    return 0


def _refuse_inputs_as_outputs(args: argparse.Namespace) -> None:
    """No output option may name a file compile reads (`compile a.onnx -o a.onnx` loses the model)."""
    from npuemu.tools.paths import refuse_input_as_output

    inputs = [args.model, getattr(args, "dataset", None), getattr(args, "quant_config", None)]
    for option in ("output", "dump_ir", "dump_json", "partition_report"):
        value = getattr(args, option, None)
        if isinstance(value, (str, Path)):
            refuse_input_as_output(value, inputs, "--" + option.replace("_", "-") if option != "output" else "-o")


def compile_options(args: argparse.Namespace, precision: str | None = None):
    """The driver's options from the flags of ``compile`` (``perf``, ``accuracy`` and ``quant-config``
    share them); ``precision`` overrides the one the flags ask for."""
    from npuemu.compiler.driver import CompileOptions, override_map

    asked = precision
    if precision is None:
        precision = ("hybrid" if getattr(args, "quant_config", None) is not None else
                     "fp16" if getattr(args, "fp16", False) else
                     "int8" if getattr(args, "quantize", False) or getattr(args, "dataset", None) is not None
                     else "float")
    calibration = {} if asked == "float" else {
        "dataset": args.dataset, "quant_config": getattr(args, "quant_config", None), "algorithm": args.algorithm,
        "per_channel": args.per_channel, "mean": tuple(args.mean), "std": tuple(args.std), "bgr": args.bgr,
        "progress": not args.no_progress, "auto_hybrid": getattr(args, "auto_hybrid", None)}
    return CompileOptions(precision=precision, input_shapes=_input_shapes(args),
                          optimization_level=args.optimization_level, core_mask=getattr(args, "core_mask", "auto"),
                          sram=bool(getattr(args, "sram", False)), batch_size=getattr(args, "batch_size", 1),
                          name=Path(args.model).stem, platform_overrides=override_map(getattr(args, "overrides", [])),
                          prune=bool(getattr(args, "prune", False)), sparse=bool(getattr(args, "sparse", False)),
                          custom_ops=tuple(getattr(args, "custom_ops", None) or ()),
                          inputs=getattr(args, "inputs", None), outputs=getattr(args, "outputs", None),
                          freeze=dict(getattr(args, "freeze", None) or ()), **calibration,
                          dynamic_input=_dynamic_input(args))


def _dynamic_input(args: argparse.Namespace) -> list:
    from npuemu.compiler.dynamic_shapes import parse_dynamic_input

    text = getattr(args, "dynamic_input", None)
    return parse_dynamic_input(text) if text else []


def prepare_float(args: argparse.Namespace):
    """Import and graph passes as ``compile`` runs them, no quantization (the driver's Front):
    ``quant-config`` and ``accuracy`` calibrate the graph themselves."""
    from npuemu.compiler.driver import prepare

    with _phased(args, compile_options(args, precision="float"), lowering=False) as options:
        return prepare(args.model, args.target, options)


def _input_shapes(args: argparse.Namespace) -> dict[str, list[int]]:
    from npuemu.isa.errors import CompileError

    shapes: dict[str, list[int]] = {}
    for name, shape in args.input_shape:
        if name is None:
            if len(args.input_shape) > 1:
                raise CompileError("--input-shape without NAME= is only allowed once, for a model with one input")
            name = _single_input_name(args.model)
        shapes[name] = shape
    return shapes


def _single_input_name(path: Path) -> str:
    from npuemu.compiler.mnn_import import is_mnn_path, mnn_to_onnx
    from npuemu.compiler.onnx_import import onnx_input_names
    from npuemu.isa.errors import CompileError

    if is_mnn_path(path):  # an MNN file's inputs are those of the graph it holds
        names = onnx_input_names(mnn_to_onnx(path))
    else:
        names = onnx_input_names(path)
    if len(names) != 1:
        raise CompileError(f"{path}: the model has inputs {names}; name the one to shape: --input-shape NAME=...")
    return names[0]


def _dump_ir_step(args: argparse.Namespace, front) -> None:
    if args.dump_ir is None:
        return
    from npuemu.compiler.ir_text import format_graph
    from npuemu.compiler.passes.partition import annotate_ir_text

    text = annotate_ir_text(format_graph(front.graph), front.graph, front.partition)  # CPU layers say why
    _write(args.dump_ir, text)


def _dump_json_step(args: argparse.Namespace, front) -> None:
    if args.dump_json is None:
        return
    import json

    from npuemu.compiler.passes.partition import annotate_layers
    from npuemu.compiler.perf_json import perf_json

    document = annotate_layers(perf_json(front.graph), front.graph, front.partition)
    _write(str(args.dump_json), json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def _partition_report_step(args: argparse.Namespace, front) -> None:
    if args.partition_report is not None:
        _write(args.partition_report, front.partition.report())


def _partition_summary_step(args: argparse.Namespace, front) -> None:
    """One line: the level, layers per unit, and the op types left on the CPU."""
    split = front.partition
    if "-" in (args.dump_ir, str(args.dump_json), args.partition_report):
        return
    cpu = ", ".join(f"{op} x{count}" for op, count in split.cpu_ops().most_common())
    print(f"optimization level {args.optimization_level} for {split.chip}: {split.count('NPU')} layers on the NPU, "
          f"{split.count('CPU')} on the CPU" + (f" ({cpu})" if cpu else "") + _host_layers(front.model))


def _host_layers(model) -> str:
    """What the model file runs on the host: the partition's CPU layers and the NPU layers the
    build could not lower (each a host step, as `npuemu perf` lists them)."""
    if model is None:
        return ""
    from collections import Counter

    host = Counter(info.op_type for info in model.layers() if info.target != "NPU")
    ops = ", ".join(f"{op} x{count}" for op, count in host.most_common())
    return f"; the model file runs {sum(host.values())} layer(s) as host steps" + (f" ({ops})" if ops else "")


def _summary_step(args: argparse.Namespace, front) -> None:
    if args.dump_ir == "-" or str(args.dump_json) == "-":
        return  # standard output carries a dump
    graph = front.graph
    inputs = ", ".join(f"{name}{list(graph.tensors[name].shape)}" for name in graph.inputs)
    print(f"{args.model}: {len(graph.nodes)} layers, inputs {inputs}, {len(graph.constants())} constants")
    if front.quantization is not None:
        print(f"quantized {front.quantization.summary()}")
    _sparse_summary(front)
    if front.auto_hybrid is not None:  # --auto-hybrid: the choice and its cost in cycles
        from npuemu.tools.auto_hybrid_report import summary_lines

        print("\n".join(summary_lines(front)))


def _sparse_summary(front) -> None:
    """--sparse: each quantized conv's weight storage and why (compiler/sparse_weights.py)."""
    if front.sparse_note:
        print(front.sparse_note)
    if not front.platform.sparse.enabled or front.quantization is None:
        return
    from npuemu.compiler.sparse_weights import graph_decisions

    for decision in graph_decisions(front.graph, front.platform):
        print(f"sparse {decision.line()}")


def build_step(args: argparse.Namespace, front) -> None:
    """Lower, plan memory, encode and write the model file when ``-o`` is given."""
    if getattr(args, "output", None) is None:
        return
    from npuemu.compiler.driver import build
    from npuemu.isa.errors import CompileError

    if front.quantization is None:
        raise CompileError("-o needs a quantized graph: add --quantize --dataset ds.txt, --fp16 or --quant-config")
    model = front.model if front.model is not None else build(front)
    model.write(args.output)
    print(f"wrote {args.output}: {len(model.layers())} layers, "
          f"{sum(step.chain.tasks for step in model.schedule() if step.kind == 'npu')} NPU tasks")
    layout = model.trailer.get("platform", {})  # rk3576: the vendor's register layout or why not (LOWERING.md 39)
    if layout.get("register_layout"):
        print(f"register layout: {layout['register_layout']} (the vendor's, as a real chip reads it)")
    if layout.get("register_layout_notice"):
        print(f"note: {layout['register_layout_notice']}")
    if model.shape_sets():  # a dynamic-shape build: the figures above are set 0's
        from npuemu.isa.container_dynamic import describe
        print(f"{len(model.shape_sets())} shape sets (one chain set each, weights stored once): "
              f"{describe(model.shape_sets())}")


def compile_in_memory(args: argparse.Namespace):
    """The model file ``compile -o`` would write, without writing it (``perf MODEL.onnx``)."""
    from npuemu.compiler.driver import compile_model

    with _phased(args, compile_options(args), lowering=True) as options:
        return compile_model(args.model, args.target, options)


def _write(destination: str, text: str) -> None:
    from npuemu.isa.errors import CompileError

    if destination == "-":
        sys.stdout.write(text)
        return
    try:
        Path(destination).write_text(text, encoding="utf-8")
    except OSError as error:
        raise CompileError(f"cannot write {destination}: {error.strerror}") from None


#: The work of ``compile`` after the driver's front half (import, passes, quantization), in order;
#: each step reads args and the driver's Front.
STEPS: list[Callable[[argparse.Namespace, Any], None]] = [
    build_step, _dump_ir_step, _dump_json_step, _partition_report_step, _summary_step, _partition_summary_step,
]
