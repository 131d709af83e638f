"""Build stage 9: the model file (isa/CONTAINER.md) - a ``regcmd`` and a ``weights`` section,
the tensor records (address, NC1HWC2 geometry or ND layout, int8 quantization), the memory
map, the schedule and the graph layers that label reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from npuemu.compiler.build_adapt import Alias, CpuOp
from npuemu.compiler.layer_records import Records, reads
from npuemu.compiler.schedule import REGCMD_SECTION, Schedule
from npuemu.compiler.tensor_plan import TensorPlan
from npuemu.isa.container import MemoryRegion, ModelFile, Section, SectionKind

WEIGHTS_SECTION = "weights"


def package(records: Records, tensors: TensorPlan, plan, placements, schedule: Schedule, spec, *,
            name: str | None, options: Mapping[str, Any] | None) -> ModelFile:
    """The model file of a built graph."""
    graph = records.graph
    trailer = {
        "platform": {"chip": spec.name},
        "compiler": {"version": "npuemu", "options": dict(options or {})},
        "graph": {"name": name or getattr(graph, "name", "") or "model", "inputs": list(graph.inputs),
                  "outputs": list(graph.outputs), "layers": _graph_layers(records, schedule)},
        "tensors": _tensor_records(records, tensors, plan, placements),
        "memory_map": _memory_map(plan, tensors.sram_plan),
        "schedule": schedule.steps,
    }
    return ModelFile(tuple(_sections(tensors, plan, schedule)), trailer)


def _sections(tensors: TensorPlan, plan, schedule: Schedule) -> list[Section]:
    weights_area = plan.area("weights")
    image = bytearray(weights_area.size)
    for tensor, blob in tensors.constants.items():
        offset = plan[tensor].address - weights_area.base
        image[offset:offset + len(blob)] = blob
    return [
        Section(SectionKind.REGCMD, REGCMD_SECTION, bytes(schedule.regcmd), MemoryRegion.DDR, plan["regcmd"].address),
        Section(SectionKind.WEIGHTS, WEIGHTS_SECTION, bytes(image), MemoryRegion.DDR, weights_area.base),
    ]


def _tensor_records(records: Records, tensors: TensorPlan, plan, placements) -> list[dict]:
    out = [_feature_record(records, tensors, plan, placements, tensor, storage)
           for tensor, storage in [(t, t) for t in tensors.shapes] + list(records.aliases.items())]
    sram = tensors.sram_plan
    for tensor, record in tensors.host.items():
        in_sram = sram is not None and tensor in sram.addresses
        out.append(record | {"region": "sram" if in_sram else plan.region,
                             "address": sram.addresses[tensor] if in_sram else plan.address(tensor)})
    return out


def _feature_record(records: Records, tensors: TensorPlan, plan, placements, tensor: str, storage: str) -> dict:
    """An NC1HWC2 tensor (or an alias viewing one: ``storage`` holds its bytes)."""
    placement = placements[storage]
    source = records.graph.tensor(tensor)
    logical = list(source.shape)
    shape = logical if tensor in records.aliases or len(logical) != 4 else [1, *tensors.shapes[tensor]]
    record = {
        "name": tensor, "shape": shape, "dtype": tensors.dtypes[storage], "layout": "NC1HWC2",
        "native_shape": list(placement.native_shape), "c2": placement.c2,
        "surface_stride": placement.surface_stride,
        "region": "sram" if tensors.in_sram(storage) else plan.region,
        "address": placement.address, "size": placement.size,
    }
    if tensors.dtypes[storage] == "int8":
        record["quantization"] = {"scale": float(source.quant.scale), "zero_point": int(source.quant.zero_point)}
    if storage in tensors.roots:  # stored inside another tensor: a no-copy Concat input or Split output
        record["view_of"] = tensors.roots[storage][0]
    return record


def _graph_layers(records: Records, schedule: Schedule) -> list[dict]:
    """One entry per record: name, op type, the ONNX nodes fused into it, target, tensors and
    task ranges (none for a view, a host step or an elided copy)."""
    layers, npu_index = [], 0
    for index, (node, record) in enumerate(zip(records.nodes, records.records)):
        entry = {"id": index, "name": node.layer_name, "op_type": node.display_op.replace("+", ""),
                 "fused": [node.name, *(part.source for part in node.fused if part.source)],
                 "target": "CPU" if isinstance(record, CpuOp) else "NPU"}
        elided = id(record) in records.elided
        no_task = isinstance(record, (Alias, CpuOp)) or elided
        layers.append(entry | {"inputs": list(reads(record)), "outputs": [record.output],
                               "tasks": [] if no_task else schedule.ranges[npu_index]}
                      | ({"no_copy": True} if elided else {}))
        npu_index += not no_task
    return layers


def _memory_map(plan, sram_plan) -> dict:
    trailer = plan.trailer()
    if sram_plan is not None and sram_plan.size:
        trailer["regions"].append(sram_plan.trailer_region())
        trailer["areas"].append({"name": "sram_internal", "size": sram_plan.size, "region": "sram",
                                 "base": sram_plan.base})
    return trailer


__all__ = ["WEIGHTS_SECTION", "package"]
