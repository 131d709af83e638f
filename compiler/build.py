"""Build: a fused, quantized, partitioned graph -> an npuemu model file (isa/CONTAINER.md).

    model = build_model(graph)          # ModelFile
    model.write("model.npu")

Steps: every node -> lowering record (build_adapt) -> constants + memory plan (internal
tensors reused by lifetime) -> lower every layer with the planned placements -> task chains
in the regcmd area -> ModelFile with a ``regcmd`` and a ``weights`` section, the tensors
(address, NC1HWC2 geometry, int8 quantization), the memory map, the schedule, the graph layers.

Schedule: consecutive NPU layers form one chain (one ``npu`` step on core 0, chains laid out one
after another in the regcmd section). A layer the partition sends to the CPU ends the current
chain and becomes a ``cpu`` step (op, inputs, outputs, params = the node's attributes); the
following NPU layers start a new chain. Tensors crossing the boundary live in memory as int8
NC1HWC2 with their quantization recorded; the runtime dequantizes, runs the float op and
requantizes (emulator/cpu_ops.py), as the fake-quant evaluation models it. Tensors only host
steps touch are stored row-major in their ONNX shape and element type (layout ``ND``,
compiler/build_host.py, isa/CONTAINER.md 3.3). A CPU op the runtime does not have, or a layer
lowering cannot do, raises an error naming the layer. ``batch`` > 1 copies the single-batch
build per slice (compiler/batch.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import copy
import dataclasses

from npuemu.compiler.build_adapt import (
    ELTWISE_OPS, Alias, CpuOp, alias_from_node, chw, concat_fits_surfaces, constant_outputs, cpu_from_node,
    host_tensors, lane_broadcast_operand, lanes_tensor, layer_from_node, layer_quant, split_channels,
    split_conv_transpose, split_lut_activation, stored_dtype,
)
from npuemu.compiler.lower.broadcast_lanes import lanes_aligns
from npuemu.compiler.lower.lut import ONNX_LUT_KINDS
from npuemu.compiler.ir import Graph, Tensor
from npuemu.compiler.lower import (
    ConcatLayer, ConvLayer, EltwiseLayer, feature_bytes, feature_placement, layer_constants, lower_layer, output_align,
)
from npuemu.compiler.lower.driver import copy_views
from npuemu.compiler.memory_plan import (
    TensorView, fold_views, lifetimes_from_steps, plan_memory, plan_sram, regcmd_bytes, view_roots,
)
from npuemu.isa.chain import encode_chain
from npuemu.isa.container import MemoryRegion, ModelFile, Section, SectionKind
from npuemu.isa.errors import CompileError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain
from npuemu.platforms import load_platform

REGCMD_SECTION = "regcmd"
WEIGHTS_SECTION = "weights"


def _reads(layer) -> tuple[str, ...]:
    if isinstance(layer, CpuOp):
        return tuple(layer.inputs)
    if isinstance(layer, ConvLayer):
        return (layer.input,) + ((layer.residual.tensor,) if layer.residual else ())
    if isinstance(layer, (EltwiseLayer, ConcatLayer)):
        return tuple(layer.inputs)
    return (layer.input,)


def _writes(layer) -> tuple[str, ...]:
    """The output, and the lanes tensor a broadcasting element-wise layer writes and reads."""
    broadcast = getattr(layer, "broadcast", None)
    return (layer.output,) + ((broadcast.tensor,) if broadcast is not None else ())


def _packed_inputs(inputs, work, shapes, dtypes) -> set[str]:
    """Graph inputs stored as a packed image (C2 = C, 1 to 4 int8 channels, the vendor's
    first-layer format, rknpu-isa.md 4): those read only as the feature input of int8 direct
    convolutions, which fetch them in ARGB mode (lower_conv.packed_image). Any other reader
    (depthwise, element-wise, pooling, a host step, a residual) keeps NC1HWC2."""
    packed = set()
    for name in inputs:
        if name not in shapes or dtypes[name] != "int8" or not 1 <= shapes[name][0] <= 4:
            continue
        readers = [record for record in work if name in _reads(record)]
        if readers and all(isinstance(r, ConvLayer) and r.input == name and not r.depthwise and r.dtype == "int8"
                           and (r.residual is None or r.residual.tensor != name) for r in readers):
            packed.add(name)
    return packed


def _shapes(layer) -> dict[str, tuple[int, int, int]]:
    if isinstance(layer, ConvLayer):
        shapes = {layer.input: layer.input_shape, layer.output: layer.output_shape}
        if layer.residual:
            shapes[layer.residual.tensor] = layer.output_shape
        return shapes
    if isinstance(layer, EltwiseLayer):
        return layer.shapes
    if isinstance(layer, ConcatLayer):
        return dict(zip(layer.inputs, layer.shapes)) | {layer.output: layer.output_shape}
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
    if isinstance(layer, (EltwiseLayer, ConcatLayer, CpuOp)):
        return dataclasses.replace(layer, inputs=tuple(aliases.get(name, name) for name in layer.inputs))
    return dataclasses.replace(layer, input=aliases.get(layer.input, layer.input))


def _lut_split(graph: Graph, node) -> tuple[list, Tensor] | None:
    """([conv, host activation], the pre-activation tensor to add) for a conv whose LUT
    activation the build runs on the host (build_adapt.split_lut_activation), else None."""
    split = split_lut_activation(graph, node)
    if split is None:
        return None
    conv, activation, quant = split
    source = graph.tensor(activation.outputs[0])
    return [conv, activation], Tensor(conv.outputs[0], tuple(source.shape), source.dtype, quant=quant)


def _memory_map(plan, sram_plan) -> dict:
    trailer = plan.trailer()
    if sram_plan is not None and sram_plan.size:
        trailer["regions"].append(sram_plan.trailer_region())
        trailer["areas"].append({"name": "sram_internal", "size": sram_plan.size, "region": "sram",
                                 "base": sram_plan.base})
    return trailer


def _host_step(graph: Graph, node, spec) -> bool:
    """NPU-partitioned nodes the build runs as CPU steps: int8 <-> float16 conversions
    (DataConvert), element-wise ops with a constant operand, channel Concats whose slices do
    not start on C2 surfaces, and float16 LUT activations and standalone ReLU/Clip/LeakyRelu
    (the fp16 DPU path has no LUT; fp16 standalone activations are not lowered)."""
    if node.op_type == "DataConvert":
        return True
    if node.op_type in ELTWISE_OPS and any(graph.tensor(name).is_const for name in node.inputs[:2]):
        return True  # a constant operand that no fusion folded: not lowered (layer_from_node)
    half = stored_dtype(graph, node.outputs[0]) == "float16"
    if node.op_type == "Concat":
        return not concat_fits_surfaces(graph, node, spec)
    return half and (node.op_type in ONNX_LUT_KINDS or node.op_type in ("Relu", "Clip", "LeakyRelu"))


def _broadcasting_eltwise(graph: Graph, node) -> bool:
    """An element-wise NPU node with broadcasting feature-map operands that the NPU does not run
    (e.g. the SE block's [1, C, 1, 1] x [1, C, H, W] Mul): a CPU step. A [1, 1, H, W] operand is
    replicated across lanes on the NPU (build_adapt.lane_broadcast_operand)."""
    if node.op_type not in ELTWISE_OPS or node.fused or len(node.inputs) < 2:
        return False
    operands = [graph.tensor(name) for name in node.inputs[:2]]
    if any(t.is_const for t in operands):
        return False
    return tuple(operands[0].shape) != tuple(operands[1].shape) and lane_broadcast_operand(graph, node) is None


def build_model(graph: Graph, platform="rk3588", *, name: str | None = None,
                options: Mapping[str, Any] | None = None, cores: Sequence[int] = (0,),
                sram: bool = False, batch: int = 1, elide_copies: bool = True,
                pack_inputs: bool = True) -> ModelFile:
    """The model file of ``graph`` (after ``passes.optimize`` and quantization); convolutions are
    split across ``cores`` (physical core indices, lower/multicore.py) where worth it; with
    ``sram`` internal tensors go to the chip's SRAM as far as it goes (memory_plan.plan_sram);
    ``batch`` > 1 builds that many slices from the single-batch build (compiler/batch.py);
    ``elide_copies`` stores Concat inputs and Split outputs inside their neighbour where the
    layout allows (no task, LOWERING.md 10.1; False keeps every DPU copy); ``pack_inputs``
    stores a 1-4 channel int8 graph input read only by direct convs as a packed image (C2 = C,
    the vendor's first-layer format; False keeps NC1HWC2)."""
    spec = load_platform(platform) if isinstance(platform, str) else platform
    if batch != 1:
        from npuemu.compiler.batch import build_batched
        return build_batched(build_model, graph, spec, batch, sram=sram, name=name, options=options, cores=cores,
                             elide_copies=elide_copies, pack_inputs=pack_inputs)
    cores = tuple(int(c) for c in cores)
    if not cores or len(set(cores)) != len(cores) or any(not 0 <= c < spec.cores.count for c in cores):
        raise CompileError(f"cores {list(cores)}: {spec.name} has {spec.cores.count} core(s), numbered "
                           f"0..{spec.cores.count - 1}; give each at most once")
    regmap = load_regmap(spec.register_map.family)
    nodes = constant_outputs(graph)  # graph outputs the import folded to constants: host steps writing them
    if not graph.nodes and not nodes:
        raise CompileError("the graph has no layers to build")
    # the built layers; a conv with a fused LUT activation becomes conv + CPU step (interim)
    copied = False
    for node in graph.nodes:
        slices = split_channels(graph, node)
        if slices is not None:
            nodes += slices
            continue
        transposed = split_conv_transpose(graph, node)
        if transposed is not None:
            if not copied:  # new tensors go into a copy, never into the caller's graph
                graph, copied = copy.deepcopy(graph), True
            tensors, conv, moves = transposed
            for tensor in tensors:
                graph.add_tensor(tensor)
            split = _lut_split(graph, conv)  # an fp16 sigmoid head goes to the host too
            if split is not None:
                graph.add_tensor(split[1])
            nodes += [*(split[0] if split else [conv]), *moves]
            continue
        lanes = lanes_tensor(graph, node, spec)  # a broadcast operand's replicated copy (build_adapt)
        if lanes is not None:
            if not copied:
                graph, copied = copy.deepcopy(graph), True
            graph.add_tensor(lanes)
        split = _lut_split(graph, node)
        if split is None:
            nodes.append(node)
            continue
        if not copied:  # the pre-activation tensors are added to a copy, never to the caller's graph
            graph, copied = copy.deepcopy(graph), True
        graph.add_tensor(split[1])
        nodes += split[0]
    aliases: dict[str, str] = {}  # alias tensor -> the tensor whose bytes it views
    records = []
    for node in nodes:
        record = alias_from_node(graph, node) if node.target == "NPU" else None
        if record is not None:
            aliases[record.output] = aliases.get(record.input, record.input)
            records.append(record)
        elif node.target == "CPU" or _broadcasting_eltwise(graph, node) or _host_step(graph, node, spec):
            records.append(_resolve(cpu_from_node(graph, node), aliases))
        else:
            records.append(_resolve(layer_from_node(graph, node, spec), aliases))
    work = [record for record in records if not isinstance(record, Alias)]  # NPU layers and CPU steps, in order
    layers = [record for record in work if not isinstance(record, CpuOp)]
    cpu_ops = [record for record in work if isinstance(record, CpuOp)]
    produced = {layer.output for layer in work} | set(aliases)
    for tensor in graph.inputs:
        if tensor in produced:
            raise CompileError(f"graph input {tensor!r} is also produced by a layer")

    constants: dict[str, bytes] = {}
    for layer in layers:
        constants.update(layer_constants(layer, spec))
    aligns = {layer.output: output_align(layer, spec) for layer in layers} | lanes_aligns(layers, spec)
    shapes: dict[str, tuple[int, int, int]] = {}
    for layer in layers:
        for tensor, shape in _shapes(layer).items():
            if shapes.setdefault(tensor, shape) != shape:
                raise CompileError(f"tensor {tensor!r} is used with shapes {shapes[tensor]} and {shape}")
    # tensors only host steps touch: ND records (build_host); the others NC1HWC2 like NPU feature maps
    host = host_tensors(graph, cpu_ops, set(shapes) | set(aliases.values()))
    for op in cpu_ops:
        node = next(n for n in nodes if n.layer_name == op.name)
        for tensor in (*op.inputs, op.output):
            if tensor in host:
                continue
            layer_quant(graph, tensor, node)
            shape = chw(graph, tensor, node)
            if shapes.setdefault(tensor, shape) != shape:
                raise CompileError(f"tensor {tensor!r} is used with shapes {shapes[tensor]} and {shape}")
    # a residual read by a conv's EW unit uses the conv output geometry
    for layer in layers:
        if isinstance(layer, ConvLayer) and layer.residual is not None:
            wanted = output_align(layer, spec)
            have = aligns.get(layer.residual.tensor, 1)
            aligns[layer.residual.tensor] = max(wanted, have)
    dtypes = {n: stored_dtype(graph, n) for n in shapes}
    packed = _packed_inputs(graph.inputs, work, shapes, dtypes) if pack_inputs else set()
    sizes = {n: feature_bytes(s, dtypes[n], spec, channel_align=aligns.get(n, 1), packed=n in packed)
             for n, s in shapes.items()}
    sizes |= {n: record["size"] for n, record in host.items()}
    steps = [(_reads(layer), _writes(layer)) for layer in work]
    for output in graph.outputs:
        if output not in produced:
            raise CompileError(f"graph output {output!r} is not produced by a layer")
    lifetimes = lifetimes_from_steps(steps, sizes, graph.inputs, [aliases.get(o, o) for o in graph.outputs])
    views, elided = {}, set()  # no-copy Concat/Split: tensor -> (tensor holding it, byte offset)
    if elide_copies:
        internal = {t.name for t in lifetimes if t.kind == "internal"}
        views, skipped = copy_views(layers, shapes, dtypes, aligns, internal, spec)
        elided = {id(layer) for layer in skipped}
        layers = [layer for layer in layers if id(layer) not in elided]
        work = [record for record in work if id(record) not in elided]
    tensor_views = [TensorView(n, parent, offset, sizes[n]) for n, (parent, offset) in views.items()]
    lifetimes = fold_views(lifetimes, tensor_views)  # a root lives and extends over its views
    roots = view_roots(tensor_views)
    constant_sizes = {n: len(blob) for n, blob in constants.items()}
    sram_plan = None
    if sram:
        if spec.sram.kind == "none" or not spec.sram.size_bytes:
            raise CompileError(f"--sram: {spec.name} has no NPU-usable SRAM (platform sram.kind {spec.sram.kind!r})")
        sram_plan = plan_sram(lifetimes, spec.sram.size_bytes, spec.sram.granule_bytes)
        lifetimes = [t for t in lifetimes if t.name not in sram_plan.addresses]

    def feature(plan, n):
        """A feature map's placement: its own allocation, or (a view) inside its root's, in DDR or SRAM."""
        root, offset = roots.get(n, (n, 0))
        in_sram = sram_plan is not None and root in sram_plan.addresses
        if not in_sram and n not in roots:
            return plan.feature(n, shapes[n], dtypes[n], spec, channel_align=aligns.get(n, 1), packed=n in packed)
        base = sram_plan.addresses[root] if in_sram else plan.address(root)
        return feature_placement(n, base + offset, shapes[n], dtypes[n], spec, channel_align=aligns.get(n, 1))

    def lower_all(plan):
        placements = {n: plan.constant(n) for n in constants}
        placements |= {n: feature(plan, n) for n in shapes}
        lowered = [lower_layer(layer, placements, spec, regmap, op_idx=i, cores=len(cores))
                   for i, layer in enumerate(layers)]
        return placements, lowered

    _, first = lower_all(plan_memory(constant_sizes, lifetimes))
    # the schedule: runs of consecutive single-core NPU layers form one chain each (on the first
    # core of the mask); a layer split across cores gets one chain per core, the steps sharing a
    # group; a CPU layer ends the current chain and becomes a cpu step between chains
    segments: list = []  # ("npu", [layer indices]), ("split", [layer index]) or ("cpu", CpuOp)
    npu_index = 0
    for record in work:
        if isinstance(record, CpuOp):
            segments.append(("cpu", record))
            continue
        if len(set(first[npu_index].cores)) > 1:
            segments.append(("split", [npu_index]))
        elif segments and segments[-1][0] == "npu":
            segments[-1][1].append(npu_index)
        else:
            segments.append(("npu", [npu_index]))
        npu_index += 1

    def chains(lowered_items, kind, members):
        """(logical core, [(layer index, first task index in the layer, tasks)]) per chain."""
        if kind == "npu":
            return [(0, [(i, 0, list(lowered_items[i].tasks)) for i in members])]
        (i,) = members
        item = lowered_items[i]
        out = []
        for core in sorted(set(item.cores)):
            picked = [k for k, c in enumerate(item.cores) if c == core]
            out.append((core, [(i, picked[0], [item.tasks[k] for k in picked])]))
        return out

    all_tasks = []
    for kind, members in segments:
        if kind == "cpu":
            continue
        for _, parts in chains(first, kind, members):
            chain = [task for _, _, tasks in parts for task in tasks]
            if len(chain) > spec.pc.max_tasks_per_submit:
                raise CompileError(f"{len(chain)} tasks exceed the {spec.pc.max_tasks_per_submit} tasks of one "
                                   "submit; splitting a chain into several NPU steps is not built yet")
            all_tasks += chain
    plan = plan_memory(constant_sizes, lifetimes, regcmd_bytes(all_tasks))
    placements, lowered = lower_all(plan)
    regcmd = plan["regcmd"]
    encoded_data = bytearray()
    schedule = []
    ranges: dict[int, list[dict]] = {}  # layer index -> its task ranges (step, first, count)
    layer_ids = {id(record): index for index, record in enumerate(records)}
    group = 0
    for kind, members in segments:
        if kind == "cpu":
            schedule.append({"kind": "cpu", "op": members.op, "inputs": list(members.inputs),
                             "outputs": [members.output], "params": dict(members.params),
                             "layers": [layer_ids[id(members)]]})
            continue
        for core, parts in chains(lowered, kind, members):
            offset = len(encoded_data)
            chain = [task for _, _, tasks in parts for task in tasks]
            encoded = encode_chain(Chain(chain), regmap, base_addr=regcmd.address + offset,
                                   scale=spec.pc.data_amount_scale)
            encoded_data += bytes(encoded.data)
            position = 0
            for i, _, tasks in parts:
                ranges.setdefault(i, []).append({"step": len(schedule), "first": position, "count": len(tasks)})
                position += len(tasks)
            step = {"kind": "npu", "core": cores[core],
                    "chain": {"section": REGCMD_SECTION, "offset": offset, "first_amount": encoded.first_amount,
                              "tasks": len(chain)},
                    "layers": [layer_ids[id(layers[i])] for i, _, _ in parts]}
            if kind == "split":
                step["group"] = group
            schedule.append(step)
        group += kind == "split"

    weights_area = plan.area("weights")
    image = bytearray(weights_area.size)
    for tensor, blob in constants.items():
        offset = plan[tensor].address - weights_area.base
        image[offset:offset + len(blob)] = blob
    sections = [
        Section(SectionKind.REGCMD, REGCMD_SECTION, bytes(encoded_data), MemoryRegion.DDR, regcmd.address),
        Section(SectionKind.WEIGHTS, WEIGHTS_SECTION, bytes(image), MemoryRegion.DDR, weights_area.base),
    ]

    tensors = []
    named = [(tensor, tensor) for tensor in shapes] + list(aliases.items())
    for tensor, storage in named:
        placement = placements[storage]
        quant = graph.tensor(tensor).quant
        logical = list(graph.tensor(tensor).shape)
        shape = logical if tensor in aliases or len(logical) != 4 else [1, *shapes[tensor]]
        record = {
            "name": tensor, "shape": shape, "dtype": dtypes[storage], "layout": "NC1HWC2",
            "native_shape": list(placement.native_shape), "c2": placement.c2,
            "surface_stride": placement.surface_stride,
            "region": "sram" if sram_plan is not None and roots.get(storage, (storage,))[0] in sram_plan.addresses
            else plan.region,
            "address": placement.address, "size": placement.size,
        }
        if dtypes[storage] == "int8":
            record["quantization"] = {"scale": float(quant.scale), "zero_point": int(quant.zero_point)}
        if storage in roots:  # stored inside another tensor: a no-copy Concat input or Split output
            record["view_of"] = roots[storage][0]
        tensors.append(record)
    for tensor, record in host.items():
        in_sram = sram_plan is not None and tensor in sram_plan.addresses
        tensors.append(record | {"region": "sram" if in_sram else plan.region,
                                 "address": sram_plan.addresses[tensor] if in_sram else plan.address(tensor)})
    graph_layers, npu_index = [], 0
    for index, (node, record) in enumerate(zip(nodes, records)):
        entry = {"id": index, "name": node.layer_name, "op_type": node.display_op.replace("+", ""),
                 "fused": [node.name, *(part.source for part in node.fused if part.source)],
                 "target": "CPU" if isinstance(record, CpuOp) else "NPU"}
        no_task = isinstance(record, (Alias, CpuOp)) or id(record) in elided  # a view, a host step, an elided copy
        graph_layers.append(entry | {"inputs": list(_reads(record)), "outputs": [record.output],
                                     "tasks": [] if no_task else ranges[npu_index]}
                            | ({"no_copy": True} if id(record) in elided else {}))
        npu_index += not no_task
    trailer = {
        "platform": {"chip": spec.name},
        "compiler": {"version": "npuemu", "options": dict(options or {})},
        "graph": {"name": name or getattr(graph, "name", "") or "model", "inputs": list(graph.inputs),
                  "outputs": list(graph.outputs), "layers": graph_layers},
        "tensors": tensors,
        "memory_map": _memory_map(plan, sram_plan),
        "schedule": schedule,
    }
    return ModelFile(tuple(sections), trailer)


__all__ = ["build_model"]
