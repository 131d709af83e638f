"""``npuemu inspect MODEL``: a readable summary of an npuemu model file (.npu) or a vendor
.rknn file, or the same as JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from npuemu.isa.container import ModelFile, Quantization, Step


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect", help="summarise a model file (.npu, or a vendor .rknn)",
        description="Print the format version, platform, compiler options, sections, tensors, layers, "
        "schedule and memory map of an npuemu model file; for a vendor .rknn file, its container "
        "header and JSON trailer, tensors with native shapes and quantization, layers, task chains "
        "and relocations.",
    )
    parser.add_argument("model", help="path to a .npu model file or a vendor .rknn file")
    parser.add_argument("--json", action="store_true", help="print the JSON trailer instead of the summary")
    parser.add_argument("--no-verify", action="store_true",
                        help="report section checksum mismatches instead of refusing the file "
                        "(exit code 1 if there are any)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.isa.container import ModelFile

    if _is_rknn(args.model):
        return _inspect_rknn(args)
    model = ModelFile.read(args.model, verify_sections=not args.no_verify)
    if args.json:
        json.dump(model.trailer, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        render(model, f"{args.model} ({os.path.getsize(args.model)} bytes)", sys.stdout)
    return 1 if model.checksum_failures else 0


def _is_rknn(path: str) -> bool:
    from npuemu.isa.container_format import RKNN_MAGIC

    try:
        with open(path, "rb") as handle:
            return handle.read(len(RKNN_MAGIC)) == RKNN_MAGIC
    except OSError:
        return False  # let the .npu reader report the problem with its own message


def _inspect_rknn(args: argparse.Namespace) -> int:
    from npuemu.isa.rknn import describe_rknn, format_rknn, load_rknn

    model = load_rknn(args.model)
    if args.json:
        json.dump(describe_rknn(model), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_rknn(model))
    return 0


# --- rendering ------------------------------------------------------------------------------


def table(rows: list[list[str]], header: list[str], out: TextIO, indent: str = "  ") -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        out.write(indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() + "\n")


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _shape(shape: tuple[int, ...] | None) -> str:
    return "-" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"


def _address(value: int | None) -> str:
    return "-" if value is None else f"{value:#x}"


def _quantization(quant: Quantization | None) -> str:
    if quant is None:
        return "-"
    if not quant.per_channel:
        return f"scale={quant.scale[0]:.6g} zp={quant.zero_point[0]}"
    axis = "" if quant.axis is None else f" axis={quant.axis}"
    return (f"per-channel[{len(quant.scale)}]{axis} scale={min(quant.scale):.4g}..{max(quant.scale):.4g} "
            f"zp={min(quant.zero_point)}..{max(quant.zero_point)}")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _layer_ids(ids: tuple[int, ...]) -> str:
    if not ids:
        return "-"
    if list(ids) == list(range(ids[0], ids[0] + len(ids))) and len(ids) > 2:
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(str(i) for i in ids)


def _header_lines(model: ModelFile, label: str, out: TextIO) -> None:
    platform, compiler = model.platform(), model.compiler()
    fmt = model.trailer["format"]
    out.write(f"file:      {label}\n")
    out.write(f"format:    {fmt['name']} {fmt['version']}\n")
    out.write(f"platform:  {platform.chip or '(not recorded)'}\n")
    recorded = model.trailer.get("platform", {})  # the register layout of the tasks (LOWERING.md 39)
    if recorded.get("register_layout"):
        out.write(f"  register layout: {recorded['register_layout']}\n")
    if recorded.get("register_layout_notice"):
        out.write(f"  register layout: {recorded['register_layout_notice']}\n")
    images = recorded.get("image_inputs") or {}
    if not isinstance(images, dict):   # as the runtime refuses it (emulator/runtime.py _image_inputs)
        from npuemu.isa.errors import ModelFileError
        raise ModelFileError("trailer.platform.image_inputs is not an object")
    for name, form in images.items():   # LOWERING.md 52
        if isinstance(form, dict):
            out.write(f"  image input: {name} as {form.get('pixel_bytes')}-byte pixels, rows of "
                      f"{form.get('row_pixels')}, value + {form.get('value_bias')} (the first conv's converter)\n")
    if platform.overrides:
        out.write(f"  overrides: {_compact(platform.overrides)}\n")
    if platform.figures:
        out.write(f"  figures:   {_compact(platform.figures)}\n")
    out.write(f"compiler:  {compiler.version or '(not recorded)'}\n")
    if compiler.options:
        out.write(f"  options:   {_compact(compiler.options)}\n")


def _sections(model: ModelFile, out: TextIO) -> None:
    out.write(f"\nsections ({len(model.sections)}):\n")
    if not model.sections:
        out.write("  (none)\n")
        return
    rows = [
        [str(index), s.kind.name.lower(), s.name, str(s.size), s.region.name.lower(),
         "-" if not s.region else f"{s.load_address:#x}", str(s.alignment), f"{s.crc32:#010x}",
         "MISMATCH" if s.name in model.checksum_failures else "ok"]
        for index, s in enumerate(model.sections)
    ]
    table(rows, ["#", "kind", "name", "size", "region", "load address", "align", "crc32", "checksum"], out)


def _tensors(model: ModelFile, out: TextIO) -> None:
    tensors = model.tensors()
    out.write(f"\ntensors ({len(tensors)}):\n")
    if not tensors:
        out.write("  (none)\n")
        return
    rows = [
        [t.name, _shape(t.shape), t.dtype or "-",
         (t.layout or "-") + (f" C2={t.c2}" if t.c2 is not None else ""), _shape(t.native_shape),
         _quantization(t.quantization), t.region or "-", _address(t.address), "-" if t.size is None else str(t.size)]
        for t in tensors
    ]
    table(rows, ["name", "shape", "dtype", "layout", "native shape", "quantization", "region", "address", "size"], out)
    _readouts(model, out)
    _readins(model, out)


def _readins(model: ModelFile, out: TextIO) -> None:
    """Graph inputs the runtime takes permuted (isa/CONTAINER.md 3.3 ``readin``, compiler/LOWERING.md
    33.4), as :func:`_readouts`: none when no tensor has one."""
    _permuted(model, "readin", "taken as -> transposed by perm -> stored shape", True, out)


def _readouts(model: ModelFile, out: TextIO) -> None:
    """Graph outputs the runtime hands out permuted (isa/CONTAINER.md 3.3 ``readout``, LOWERING.md
    25): read from the raw trailer, one line each, none when no tensor has one."""
    _permuted(model, "readout", "stored shape -> transposed by perm -> handed out as", False, out)


def _permuted(model: ModelFile, key: str, header: str, stored_last: bool, out: TextIO) -> None:
    """One line per tensor record holding ``key``: the caller's shape, the perm and the stored
    shape, in the order the runtime goes through them."""
    found = [(t["name"], t.get("shape"), t[key]) for t in model.trailer.get("tensors", ()) if t.get(key) is not None]
    if not found:
        return
    out.write(f"  {key} ({len(found)}): {header}\n")
    for name, shape, record in found:
        stored = _shape(None if shape is None else tuple(shape))
        given = _shape(tuple(record.get("shape", ())))
        perm = f"perm [{','.join(str(a) for a in record.get('perm', ()))}]"
        first, last = (given, stored) if stored_last else (stored, given)
        out.write(f"    {name}: {first} -> {perm} -> {last}\n")


def _layers(model: ModelFile, out: TextIO) -> None:
    graph = model.graph()
    out.write(f"\nlayers ({len(graph.layers)}):\n")
    if graph.inputs or graph.outputs:
        out.write(f"  inputs: {', '.join(graph.inputs) or '-'}; outputs: {', '.join(graph.outputs) or '-'}\n")
    if not graph.layers:
        out.write("  (none)\n")
        return
    rows = [[str(layer.id), layer.op_type or "-", layer.name or "-", layer.target or "-",
             str(layer.task_count) if layer.tasks else "-"]
            for layer in graph.layers]
    table(rows, ["id", "op_type", "name", "target", "tasks"], out)


def _step_line(index: int, step: Step) -> list[str]:
    if step.kind == "npu":
        chain = step.chain
        what = (f"core {step.core}: {_count(chain.tasks, 'task')} from {chain.section}+{chain.offset:#x} "
                f"(first amount {chain.first_amount})")
    else:
        what = f"{step.op}({', '.join(step.inputs)}) -> {', '.join(step.outputs)}"
        if step.params:
            what += f" {_compact(step.params)}"
    return [str(index), step.kind, what, _layer_ids(step.layers)]


def _schedule(model: ModelFile, out: TextIO) -> None:
    steps = model.schedule()
    out.write(f"\nschedule ({_count(len(steps), 'step')}):\n")
    if not steps:
        out.write("  (none)\n")
        return
    table([_step_line(index, step) for index, step in enumerate(steps)], ["#", "kind", "what", "layers"], out)
    per_core: dict[int, list[int]] = {}
    for step in steps:
        if step.kind == "npu":
            per_core.setdefault(step.core, []).append(step.chain.tasks)
    for core, chains in sorted(per_core.items()):
        out.write(f"  core {core}: {_count(len(chains), 'chain')}, {_count(sum(chains), 'task')}\n")
    cpu = sum(1 for step in steps if step.kind == "cpu")
    if cpu:
        out.write(f"  cpu: {_count(cpu, 'op')}\n")


def _memory_map(model: ModelFile, out: TextIO) -> None:
    memory = model.memory_map()
    out.write("\nmemory map:\n")
    if not memory.regions and not memory.areas:
        out.write("  (not recorded)\n")
        return
    if memory.regions:
        table([[r.name, f"{r.base:#x}", str(r.size)] for r in memory.regions], ["region", "base", "size"], out)
    if memory.areas:
        table([[a.name, a.region or "-", _address(a.base), str(a.size)] for a in memory.areas],
              ["area", "region", "base", "size"], out)


def render(model: ModelFile, label: str, out: TextIO) -> None:
    """The whole summary; ``label`` names the file on the first line."""
    _header_lines(model, label, out)
    _sections(model, out)
    _tensors(model, out)
    _layers(model, out)
    _schedule(model, out)
    _memory_map(model, out)
    if model.checksum_failures:
        out.write(f"\nWARNING: checksum mismatch in {_count(len(model.checksum_failures), 'section')}: "
                  f"{', '.join(model.checksum_failures)}\n")
