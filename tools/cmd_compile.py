"""``npuemu compile``: ONNX model -> IR (for now: import, clean-up, IR text and per-layer JSON).

Options are added by small ``_add_*_options`` functions, one per group, and the work is a
list of steps run in order; a later stage (passes, lowering, model file) adds a group and a
step without touching the others.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compile",
        help="compile an ONNX model (today: import it and dump the IR / per-layer JSON)",
        description="Import an ONNX model into the compiler's IR: shape inference, dynamic input dims fixed, "
        "constants folded, inference no-ops removed. Put the model path before options that take an "
        "optional value (--dump-ir).",
    )
    for add_options in OPTION_GROUPS:
        add_options(parser)
    parser.set_defaults(func=run)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="the ONNX model file")
    parser.add_argument("-t", "--target", metavar="CHIP", default="rk3588",
                        help="target chip: a platform name or alias (see `npuemu platforms`) or a platform "
                        "YAML file; default rk3588")
    parser.add_argument("--input-shape", metavar="NAME=D0,D1,...", action="append", default=[], type=_shape_spec,
                        help="fix the shape of a graph input (repeat for several inputs; NAME= may be left out "
                        "when the model has one input), e.g. --input-shape x=1,3,224,224")


def _add_dump_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dump-ir", metavar="FILE", nargs="?", const="-", default=None,
                        help="write the IR as text to FILE ('-' or no FILE: standard output)")
    parser.add_argument("--dump-json", metavar="FILE", type=Path, default=None,
                        help="write the per-layer JSON (NPU perf JSON format) to FILE")


#: Functions adding the option groups of ``compile``, in help order.
OPTION_GROUPS: list[Callable[[argparse.ArgumentParser], None]] = [_add_model_options, _add_dump_options]


def _shape_spec(text: str) -> tuple[str | None, list[int]]:
    from npuemu.compiler.onnx_import import parse_shape_spec
    from npuemu.isa.errors import NpuemuError

    try:
        return parse_shape_spec(text)
    except NpuemuError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    context: dict[str, Any] = {}
    for step in STEPS:
        step(args, context)
    return 0


def _platform_step(args: argparse.Namespace, context: dict[str, Any]) -> None:
    from npuemu.platforms import load_platform

    context["platform"] = load_platform(args.target)  # checked first: a typo fails fast


def _import_step(args: argparse.Namespace, context: dict[str, Any]) -> None:
    from npuemu.compiler.onnx_import import import_onnx

    context["graph"] = import_onnx(args.model, _input_shapes(args))


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
    from npuemu.compiler.onnx_import import onnx_input_names
    from npuemu.isa.errors import CompileError

    names = onnx_input_names(path)
    if len(names) != 1:
        raise CompileError(f"{path}: the model has inputs {names}; name the one to shape: --input-shape NAME=...")
    return names[0]


def _dump_ir_step(args: argparse.Namespace, context: dict[str, Any]) -> None:
    if args.dump_ir is None:
        return
    from npuemu.compiler.ir_text import format_graph

    _write(args.dump_ir, format_graph(context["graph"]))


def _dump_json_step(args: argparse.Namespace, context: dict[str, Any]) -> None:
    if args.dump_json is None:
        return
    from npuemu.compiler.perf_json import dumps

    _write(str(args.dump_json), dumps(context["graph"]))


def _summary_step(args: argparse.Namespace, context: dict[str, Any]) -> None:
    if args.dump_ir == "-" or str(args.dump_json) == "-":
        return  # standard output carries a dump
    graph = context["graph"]
    inputs = ", ".join(f"{name}{list(graph.tensors[name].shape)}" for name in graph.inputs)
    print(f"{args.model}: {len(graph.nodes)} layers, inputs {inputs}, {len(graph.constants())} constants")


def _write(destination: str, text: str) -> None:
    from npuemu.isa.errors import CompileError

    if destination == "-":
        sys.stdout.write(text)
        return
    try:
        Path(destination).write_text(text, encoding="utf-8")
    except OSError as error:
        raise CompileError(f"cannot write {destination}: {error.strerror}") from None


#: The work of ``compile``, in order; each step reads args and the shared context.
STEPS: list[Callable[[argparse.Namespace, dict[str, Any]], None]] = [
    _platform_step, _import_step, _dump_ir_step, _dump_json_step, _summary_step,
]
