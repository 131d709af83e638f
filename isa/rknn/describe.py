"""What ``npuemu inspect model.rknn`` shows: a JSON-ready summary and its text rendering.

``describe_rknn`` gathers the facts (container, model strings, JSON trailer, regions, tensors
with native shapes, placements and quantisation, vendor layers, chains, relocation counts);
``format_rknn`` lays the same facts out as text. The CLI only prints one or the other.
"""

from __future__ import annotations

import json
from typing import Any

from npuemu.isa.rknn.model import (
    REGCMD_WORD_BYTES, TASK_RECORD, Region, RknnLayer, RknnModel, RknnTensor, TaskRecord, TensorKind,
)
from npuemu.isa.rknn.relocate import Placement, plan_memory

TRAILER_FIELDS = ("name", "version", "target_platform", "network_platform", "ori_network_platform",
                  "input_num", "output_num", "node_num", "norm_tensor_num")
"""Trailer keys worth a line of their own; the rest are graph bookkeeping repeated in the FlatBuffer."""


def describe_rknn(model: RknnModel) -> dict[str, Any]:
    plan = plan_memory(model)
    placements = plan.by_name()
    return {
        "file": model.source,
        "container": _container(model),
        "model": {"platform": model.platform, "target": model.target, "compiler_version": model.compiler_version,
                  "source_framework": model.source_framework, "shape_mode": model.shape_mode,
                  "input_formats": _json_or_text(model.input_formats),
                  "output_formats": _json_or_text(model.output_formats)},
        "trailer": {key: model.trailer[key] for key in TRAILER_FIELDS if key in model.trailer},
        "regions": {"weight": model.regions.weight, "internal": model.regions.internal, "misc": model.regions.misc,
                    "lut": plan.sizes[Region.LUT]},
        "inputs": [model.tensors[i].name for i in model.inputs],
        "outputs": [model.tensors[i].name for i in model.outputs],
        "normalization": [{"mean": list(n.mean), "std": list(n.std), "channel_order": list(n.channel_order)}
                          for n in model.normalization],
        "tensors": [_tensor(model, tensor, placements.get(tensor.name))
                    for tensor in model.tensors if not _placeholder(tensor)],
        "layers": [_layer(model, layer) for layer in model.layers],
        "program": _program(model),
        "relocation": {"tensors": len(model.relocations),
                       "entries": sum(len(entry.pairs) for entry in model.relocations),
                       "pc_tails": sum(1 for tail in model.program.tails if not tail.ends_chain)},
    }


def _container(model: RknnModel) -> dict[str, int]:
    c = model.container
    return {"format_version": c.format_version, "file_bytes": c.file_size, "header_bytes": c.header_size,
            "flatbuffer_offset": c.flatbuffer_offset, "flatbuffer_bytes": c.flatbuffer_size,
            "json_offset": c.json_offset, "json_bytes": c.json_size}


def _json_or_text(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _placeholder(tensor: RknnTensor) -> bool:
    return tensor.kind == TensorKind.NONE and not tensor.name


def _tensor(model: RknnModel, tensor: RknnTensor, placement: Placement | None) -> dict[str, Any]:
    blob = model.blob(tensor)
    return {
        "index": tensor.index, "name": tensor.name, "kind": tensor.kind_name, "dtype": tensor.dtype_name,
        "shape": list(tensor.shape), "native_shape": list(tensor.native_shape),
        "size": tensor.size if tensor.size is not None else (len(blob) if blob is not None else None),
        "region": placement.region.value if placement else tensor.region.value,
        "offset": placement.offset if placement else None,
        "scale": list(tensor.scales), "zero_point": list(tensor.zero_points),
        "blob": tensor.blob_index,
    }


def _layer(model: RknnModel, layer: RknnLayer) -> dict[str, Any]:
    return {"index": layer.index, "op_type": layer.op_type, "name": layer.name, "unit": layer.unit,
            "inputs": [model.tensors[i].name for i in layer.inputs],
            "outputs": [model.tensors[i].name for i in layer.outputs],
            "tasks_per_chain": list(layer.tasks_per_chain)}


def _program(model: RknnModel) -> dict[str, Any]:
    program = model.program
    return {
        "regcmd_words": program.regcmd_words, "regcmd_bytes": program.regcmd_words * REGCMD_WORD_BYTES,
        "task_records": len(program.tasks), "task_bytes": len(program.tasks) * TASK_RECORD.size,
        "chains": [{"index": chain.index, "first_task": chain.first_task, "tasks": chain.task_count,
                    "regcfg_words": program.chain_regcfg_words(chain),
                    "enable_masks": sorted({f"{program.tasks[i].enable_mask:#x}" for i in chain.tasks}),
                    "linked": program.is_linked(chain)}
                   for chain in program.chains],
        "chain0_tasks": [_task(model, program.tasks[i]) for i in (program.chains[0].tasks if program.chains else ())],
    }


def _task(model: RknnModel, task: TaskRecord) -> dict[str, Any]:
    # op_idx is the index of the vendor layer (graph node) the task belongs to
    layer = model.layers[task.op_idx].name if task.op_idx < len(model.layers) else None
    return {"index": task.index, "op_idx": task.op_idx, "layer": layer, "enable_mask": task.enable_mask,
            "regcfg_amount": task.regcfg_amount, "regcmd_addr": task.regcmd_addr}


# --- text --------------------------------------------------------------------------------------


def format_rknn(model: RknnModel) -> str:
    facts = describe_rknn(model)
    lines: list[str] = []
    _header(facts, lines)
    _tensors(facts, lines)
    _layers(facts, lines)
    _chains(facts, lines)
    _chain0(facts, lines)
    return "\n".join(lines) + "\n"


def _header(facts: dict[str, Any], lines: list[str]) -> None:
    c, m, r, p, rel = facts["container"], facts["model"], facts["regions"], facts["program"], facts["relocation"]
    lines.append(f"{facts['file']}: vendor RKNN model, format {c['format_version']}, {c['file_bytes']} bytes")
    lines.append(f"  target {m['target']} ({m['platform']}), compiler {m['compiler_version']}, "
                 f"from {m['source_framework']}, {m['shape_mode']}")
    lines.append(f"  container: header {c['header_bytes']} B, FlatBuffer {c['flatbuffer_bytes']} B at "
                 f"{c['flatbuffer_offset']:#x}, JSON trailer {c['json_bytes']} B at {c['json_offset']:#x}")
    trailer = ", ".join(f"{key} {_compact(value)}" for key, value in facts["trailer"].items())
    lines.append(f"  trailer: {trailer or '-'}")
    lines.append(f"  inputs: {', '.join(facts['inputs']) or '-'}; outputs: {', '.join(facts['outputs']) or '-'}")
    for name, norm in zip(facts["inputs"], facts["normalization"]):
        lines.append(f"  normalisation of {name}: mean {_compact(norm['mean'])} std {_compact(norm['std'])}")
    lines.append(f"  regions: weight {r['weight']} B, internal {r['internal']} B, misc {r['misc']} B, "
                 f"LUT programs {r['lut']} B")
    lines.append(f"  program: {p['regcmd_words']} regcmd words ({p['regcmd_bytes']} B), {p['task_records']} task "
                 f"records in {len(p['chains'])} chains; relocation: {rel['tensors']} tensors, "
                 f"{rel['entries']} entries, {rel['pc_tails']} PC tails")


def _tensors(facts: dict[str, Any], lines: list[str]) -> None:
    rows = [[str(t["index"]), t["name"], t["kind"], t["dtype"], _shape(t["shape"]), _shape(t["native_shape"]),
             _text(t["size"]), t["region"], "-" if t["offset"] is None else f"{t['offset']:#x}",
             _numbers(t["scale"]), _numbers(t["zero_point"])] for t in facts["tensors"]]
    lines.append("tensors:")
    _table(rows, ["#", "name", "kind", "dtype", "shape", "native", "bytes", "region", "offset", "scale", "zp"], lines)


def _layers(facts: dict[str, Any], lines: list[str]) -> None:
    rows = [[str(layer["index"]), layer["op_type"], layer["unit"], layer["name"], ",".join(layer["inputs"]) or "-",
             ",".join(layer["outputs"]) or "-", "/".join(str(n) for n in layer["tasks_per_chain"]) or "-"]
            for layer in facts["layers"]]
    lines.append("layers:")
    _table(rows, ["#", "op", "unit", "name", "inputs", "outputs", "tasks per chain"], lines)


def _chains(facts: dict[str, Any], lines: list[str]) -> None:
    rows = [[str(c["index"]), str(c["first_task"]), str(c["tasks"]), str(c["regcfg_words"]),
             ",".join(c["enable_masks"]), "single-core program" if c["index"] == 0 else "multi-core variant"]
            for c in facts["program"]["chains"]]
    lines.append("chains:")
    _table(rows, ["chain", "first task", "tasks", "regcfg words", "enable masks", "role"], lines)


def _chain0(facts: dict[str, Any], lines: list[str]) -> None:
    rows = [[str(t["index"]), t["layer"] or f"op {t['op_idx']}", f"{t['enable_mask']:#x}", str(t["regcfg_amount"]),
             f"{t['regcmd_addr']:#x}"] for t in facts["program"]["chain0_tasks"]]
    lines.append("chain 0 tasks:")
    _table(rows, ["task", "layer", "enable", "regcfg words", "regcmd offset"], lines)


def _table(rows: list[list[str]], header: list[str], lines: list[str]) -> None:
    if not rows:
        lines.append("  (none)")
        return
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def _shape(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]" if shape else "-"


def _numbers(values: list) -> str:
    if not values:
        return "-"
    shown = ",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values[:4])
    return shown + (f",... ({len(values)})" if len(values) > 4 else "")


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
