"""Build: a fused, quantized, partitioned graph -> an npuemu model file (isa/CONTAINER.md).

    model = build_model(graph)          # ModelFile
    model.write("model.npu")

Steps: every node -> lowering record (build_adapt) -> constants + memory plan (internal
tensors reused by lifetime) -> lower every layer with the planned placements -> one task chain
in the regcmd area -> ModelFile with a ``regcmd`` and a ``weights`` section, the tensors
(address, NC1HWC2 geometry, int8 quantization), the memory map, one NPU step, the graph layers.

This first slice builds int8 NPU-only graphs; a node the partition sends to the CPU or that
lowering cannot do raises a CompileError naming the layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dataclasses

from npuemu.compiler.build_adapt import Alias, alias_from_node, layer_from_node
from npuemu.compiler.ir import Graph
from npuemu.compiler.lower import (
    ConvLayer, EltwiseLayer, feature_bytes, layer_constants, lower_layer, output_align,
)
from npuemu.compiler.memory_plan import lifetimes_from_steps, plan_memory, regcmd_bytes
from npuemu.isa.chain import encode_chain
from npuemu.isa.container import MemoryRegion, ModelFile, Section, SectionKind
from npuemu.isa.errors import CompileError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain
from npuemu.platforms import load_platform

REGCMD_SECTION = "regcmd"
WEIGHTS_SECTION = "weights"


def _reads(layer) -> tuple[str, ...]:
    if isinstance(layer, ConvLayer):
        return (layer.input,) + ((layer.residual.tensor,) if layer.residual else ())
    if isinstance(layer, EltwiseLayer):
        return tuple(layer.inputs)
    return (layer.input,)


def _shapes(layer) -> dict[str, tuple[int, int, int]]:
    if isinstance(layer, ConvLayer):
        shapes = {layer.input: layer.input_shape, layer.output: layer.output_shape}
        if layer.residual:
            shapes[layer.residual.tensor] = layer.output_shape
        return shapes
    if isinstance(layer, EltwiseLayer):
        return {layer.inputs[0]: layer.shape, layer.inputs[1]: layer.shape, layer.output: layer.shape}
    return {layer.input: layer.input_shape, layer.output: layer.output_shape}


def _resolve(layer, aliases: Mapping[str, str]):
    """The layer reading the stored tensors of any alias it reads."""
    if not aliases:
        return layer
    if isinstance(layer, ConvLayer):
        residual = layer.residual
        if residual is not None and residual.tensor in aliases:
            residual = dataclasses.replace(residual, tensor=aliases[residual.tensor])
        return dataclasses.replace(layer, input=aliases.get(layer.input, layer.input), residual=residual)
    if isinstance(layer, EltwiseLayer):
        return dataclasses.replace(layer, inputs=tuple(aliases.get(name, name) for name in layer.inputs))
    return dataclasses.replace(layer, input=aliases.get(layer.input, layer.input))


def build_model(graph: Graph, platform="rk3588", *, name: str | None = None,
                options: Mapping[str, Any] | None = None) -> ModelFile:
    """The model file of ``graph`` (after ``passes.optimize`` and int8 quantization)."""
    spec = load_platform(platform) if isinstance(platform, str) else platform
    regmap = load_regmap(spec.register_map.family)
    nodes = list(graph.nodes)
    if not nodes:
        raise CompileError("the graph has no layers to build")
    aliases: dict[str, str] = {}  # alias tensor -> the tensor whose bytes it views
    records = []
    for node in nodes:
        record = alias_from_node(graph, node) if node.target == "NPU" else None
        if record is not None:
            aliases[record.output] = aliases.get(record.input, record.input)
            records.append(record)
        else:
            records.append(_resolve(layer_from_node(graph, node), aliases))
    layers = [record for record in records if not isinstance(record, Alias)]
    produced = {layer.output for layer in layers} | set(aliases)
    for tensor in graph.inputs:
        if tensor in produced:
            raise CompileError(f"graph input {tensor!r} is also produced by a layer")

    constants: dict[str, bytes] = {}
    for layer in layers:
        constants.update(layer_constants(layer, spec))
    aligns = {layer.output: output_align(layer, spec) for layer in layers}
    shapes: dict[str, tuple[int, int, int]] = {}
    for layer in layers:
        for tensor, shape in _shapes(layer).items():
            if shapes.setdefault(tensor, shape) != shape:
                raise CompileError(f"tensor {tensor!r} is used with shapes {shapes[tensor]} and {shape}")
    # a residual read by a conv's EW unit uses the conv output geometry
    for layer in layers:
        if isinstance(layer, ConvLayer) and layer.residual is not None:
            wanted = output_align(layer, spec)
            have = aligns.get(layer.residual.tensor, 1)
            aligns[layer.residual.tensor] = max(wanted, have)
    sizes = {n: feature_bytes(s, "int8", spec, channel_align=aligns.get(n, 1)) for n, s in shapes.items()}
    steps = [(_reads(layer), (layer.output,)) for layer in layers]
    for output in graph.outputs:
        if output not in produced:
            raise CompileError(f"graph output {output!r} is not produced by an NPU layer")
    lifetimes = lifetimes_from_steps(steps, sizes, graph.inputs, [aliases.get(o, o) for o in graph.outputs])
    constant_sizes = {n: len(blob) for n, blob in constants.items()}

    def lower_all(plan):
        placements = {n: plan.constant(n) for n in constants}
        placements |= {n: plan.feature(n, shapes[n], "int8", spec, channel_align=aligns.get(n, 1)) for n in shapes}
        lowered = [lower_layer(layer, placements, spec, regmap, op_idx=i) for i, layer in enumerate(layers)]
        return placements, lowered

    _, first = lower_all(plan_memory(constant_sizes, lifetimes))
    tasks = [task for item in first for task in item.tasks]
    if len(tasks) > spec.pc.max_tasks_per_submit:
        raise CompileError(f"{len(tasks)} tasks exceed the {spec.pc.max_tasks_per_submit} tasks of one submit; "
                           "splitting into several NPU steps is not built yet")
    plan = plan_memory(constant_sizes, lifetimes, regcmd_bytes(tasks))
    placements, lowered = lower_all(plan)
    tasks = [task for item in lowered for task in item.tasks]
    regcmd = plan["regcmd"]
    encoded = encode_chain(Chain(tasks), regmap, base_addr=regcmd.address, scale=spec.pc.data_amount_scale)

    weights_area = plan.area("weights")
    image = bytearray(weights_area.size)
    for tensor, blob in constants.items():
        offset = plan[tensor].address - weights_area.base
        image[offset:offset + len(blob)] = blob
    sections = [
        Section(SectionKind.REGCMD, REGCMD_SECTION, bytes(encoded.data), MemoryRegion.DDR, regcmd.address),
        Section(SectionKind.WEIGHTS, WEIGHTS_SECTION, bytes(image), MemoryRegion.DDR, weights_area.base),
    ]

    tensors = []
    named = [(tensor, tensor) for tensor in shapes] + list(aliases.items())
    for tensor, storage in named:
        placement = placements[storage]
        quant = graph.tensor(tensor).quant
        shape = list(graph.tensor(tensor).shape) if tensor in aliases else [1, *shapes[tensor]]
        tensors.append({
            "name": tensor, "shape": shape, "dtype": "int8", "layout": "NC1HWC2",
            "native_shape": list(placement.native_shape), "c2": placement.c2,
            "surface_stride": placement.surface_stride,
            "quantization": {"scale": float(quant.scale), "zero_point": int(quant.zero_point)},
            "region": plan.region, "address": placement.address, "size": placement.size,
        })
    graph_layers, first_task, lowered_items = [], 0, iter(lowered)
    for index, (node, record) in enumerate(zip(nodes, records)):
        entry = {"id": index, "name": node.layer_name, "op_type": node.display_op.replace("+", ""),
                 "fused": [node.name, *(part.source for part in node.fused if part.source)], "target": "NPU"}
        if isinstance(record, Alias):  # a view: no task, no bytes moved
            graph_layers.append(entry | {"inputs": [record.input], "outputs": [record.output], "tasks": []})
            continue
        item = next(lowered_items)
        graph_layers.append(entry | {"inputs": list(_reads(record)), "outputs": [record.output],
                                     "tasks": [{"step": 0, "first": first_task, "count": len(item.tasks)}]})
        first_task += len(item.tasks)
    trailer = {
        "platform": {"chip": spec.name},
        "compiler": {"version": "npuemu", "options": dict(options or {})},
        "graph": {"name": name or getattr(graph, "name", "") or "model", "inputs": list(graph.inputs),
                  "outputs": list(graph.outputs), "layers": graph_layers},
        "tensors": tensors,
        "memory_map": plan.trailer(),
        "schedule": [{"kind": "npu", "core": 0,
                      "chain": {"section": REGCMD_SECTION, "offset": 0, "first_amount": encoded.first_amount,
                                "tasks": len(tasks)},
                      "layers": list(range(len(nodes)))}],
    }
    return ModelFile(tuple(sections), trailer)


__all__ = ["build_model"]
