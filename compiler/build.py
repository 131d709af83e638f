"""Build: a fused, quantized, partitioned graph -> an npuemu model file (isa/CONTAINER.md).

    model = build_model(graph)          # ModelFile
    model.write("model.npu")

The back half of the compiler driver (driver.py), one stage module per step:
layer_records (nodes -> lowering records and host steps) -> tensor_plan (shapes, sizes,
lifetimes, views, SRAM) -> lower (register tasks, with the planned placements) -> schedule
(chains per core, host steps between them) -> package (sections and trailer).

Tensors crossing an NPU/CPU boundary live in memory as int8 NC1HWC2 with their quantization
recorded; the runtime dequantizes, runs the float op and requantizes (emulator/cpu_ops.py).
Tensors only host steps touch are stored row-major in their ONNX shape and element type
(layout ``ND``, compiler/build_host.py, isa/CONTAINER.md 3.3). A CPU op the runtime does not
have, or a layer lowering cannot do, raises an error naming the layer. ``batch`` > 1 copies the
single-batch build per slice (compiler/batch.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from npuemu.compiler.batch import build_batched
from npuemu.compiler.ir import Graph
from npuemu.compiler.layer_records import layer_records
from npuemu.compiler.lower.lowering_cache import LoweringCache
from npuemu.compiler.lower.emit_rk3576 import SHIFT_TENSOR, choose_layout, to_vendor_layout, vendor_constants
from npuemu.compiler.memory_plan import plan_memory, regcmd_bytes
from npuemu.compiler.package import package
from npuemu.compiler.passes.output_readout import annotate, strip_readouts
from npuemu.compiler.schedule import chain_tasks, encode_schedule, segments
from npuemu.compiler.tensor_plan import plan_tensors
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import CompileError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform


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
        return build_batched(build_model, graph, spec, batch, sram=sram, name=name, options=options, cores=cores,
                             elide_copies=elide_copies, pack_inputs=pack_inputs)
    cores = _check_cores(cores, spec)
    regmap = load_regmap(spec.register_map.family)
    source = graph
    graph, readouts = strip_readouts(graph)  # outputs the runtime permutes as it reads them (LOWERING.md 25)
    records = layer_records(graph, spec)
    tensors = plan_tensors(records, spec, elide_copies=elide_copies, pack_inputs=pack_inputs, sram=sram)
    layers = records.layers
    cache = LoweringCache()

    def lower_all(plan):
        placements = tensors.placements(plan, spec)
        return placements, [cache.lower(layer, placements, spec, regmap, op_idx=i, cores=len(cores))
                            for i, layer in enumerate(layers)]

    # lowered to size the regcmd area, then with the final addresses: the regcmd area is planned
    # last, so no other address moves and the cache hands back the first lowering (lowering_cache.py)
    _, first = lower_all(plan_memory(tensors.constant_sizes, tensors.lifetimes))
    layout = choose_layout(first, regmap, len(cores))  # the vendor rk3576 layout where it fits (LOWERING.md 39)
    layout, vendor_blobs = vendor_constants(layout, layers, first, spec, regmap)   # int8 depthwise (LOWERING.md 45.2)
    if layout.unpack_inputs and pack_inputs:             # only the packed image input had no vendor form (45)
        unpacked = build_model(source, spec, name=name, options=options, cores=cores, sram=sram,
                               elide_copies=elide_copies, pack_inputs=False)
        if "register_layout" in unpacked.trailer["platform"]:
            return unpacked
    if layout.words:
        tensors.constants[SHIFT_TENSOR] = layout.shift_blob
    tensors.constants.update(vendor_blobs)
    plan_steps = segments(records.work, first)
    all_tasks = chain_tasks(to_vendor_layout(first, regmap, layout, 0), plan_steps, spec.pc.max_tasks_per_submit)
    plan = plan_memory(tensors.constant_sizes, tensors.lifetimes, regcmd_bytes(all_tasks))
    placements, lowered = lower_all(plan)
    lowered = to_vendor_layout(lowered, regmap, layout, plan.address(SHIFT_TENSOR) if layout.words else 0)
    layer_ids = {id(record): index for index, record in enumerate(records.records)}
    schedule = encode_schedule(plan_steps, lowered, layer_ids, layers, layout.vendor or regmap,
                               regcmd_base=plan["regcmd"].address, cores=cores, scale=spec.pc.data_amount_scale)
    model = package(records, tensors, plan, placements, schedule, spec, name=name, options=options)
    if layout.trailer():
        model = replace(model, trailer={**model.trailer, "platform": {**model.trailer["platform"], **layout.trailer()}})
    return annotate(model, readouts)


def _check_cores(cores: Sequence[int], spec) -> tuple[int, ...]:
    cores = tuple(int(c) for c in cores)
    if not cores or len(set(cores)) != len(cores) or any(not 0 <= c < spec.cores.count for c in cores):
        raise CompileError(f"cores {list(cores)}: {spec.name} has {spec.cores.count} core(s), numbered "
                           f"0..{spec.cores.count - 1}; give each at most once")
    return cores


__all__ = ["build_model"]
