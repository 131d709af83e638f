"""The lowering step's table of contents: one layer -> constant blobs -> tasks -> register writes.

A build step calls, per layer, ``layer_constants`` (blobs to place, before addresses exist),
then - once the memory plan has given every tensor and constant an address -
``lower_layer``, which returns the typed task descriptions and the :class:`Task` objects that
``npuemu.isa.chain.encode_chain`` turns into a regcmd buffer (the PC tail is added there).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from npuemu.isa.errors import CompileError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task
from npuemu.platforms.model import Platform

from .broadcast_lanes import lanes_constants
from .conv_geometry import output_channel_align
from .descriptions import ConvTask, DpuTask, PpuTask, TaskDescription
from .emit_conv import emit_conv_task
from .emit_dpu import emit_dpu_task
from .emit_ppu import emit_ppu_task
from .layers import ActivationLayer, ConcatLayer, ConvLayer, SliceLayer, EltwiseLayer, FcLayer, Layer, PoolLayer, ResizeLayer
from .lower_conv import ConvConstants, conv_constants, lower_conv
from .lower_convert import ConvertLayer, lower_convert
from .lower_eltwise import lower_activation, lower_concat, lower_eltwise, lower_slice
from .lower_flat_concat import FlatConcatLayer, lower_flat_concat
from .lower_transpose import TransposeLayer, TransposeTask, emit_transpose_task, lower_transpose
from .lower_pool import lower_pool
from .lower_resize import UnpoolTask, emit_unpool_task, lower_resize
from .placement import Placement, feature_placement


@dataclass(frozen=True, eq=False)
class LoweredLayer:
    layer: str
    descriptions: tuple[TaskDescription, ...]
    tasks: tuple[Task, ...]

    @property
    def cores(self) -> tuple[int, ...]:
        """The core that runs each task (0 unless the layer was split, multicore.py)."""
        return tuple(getattr(d, "core", 0) for d in self.descriptions)


def as_conv(layer: Layer) -> Layer:
    """FC layers are 1x1 convolutions on [1, K, 1, 1] (vendor-corpus README 3.3)."""
    return layer.as_conv() if isinstance(layer, FcLayer) else layer


def layer_constants(layer: Layer, platform: Platform) -> dict[str, bytes]:
    """Constant blobs ``layer`` needs, by name (conv/FC: packed weights and BS operands; an
    element-wise layer with a broadcast map: its lane-replicating conv's, broadcast_lanes.py)."""
    constants = cached_conv_constants(layer, platform)
    layer = as_conv(layer)
    if constants is not None:
        if layer.weight_source:  # the weights are a feature map's bytes (LOWERING.md 22.3)
            return {layer.bias_tensor: constants.bias}
        return {layer.weight_tensor: constants.weights, layer.bias_tensor: constants.bias}
    return lanes_constants(layer, platform)


#: layer object -> (platform, its ConvConstants): the tensor plan needs the blobs' sizes and
#: every lowering of the layer the same bytes; layers are frozen, so they cannot go stale
_CONV_CONSTANTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_conv_constants(layer: Layer, platform: Platform) -> ConvConstants | None:
    """``conv_constants`` of a conv or FC layer, packed once per layer object and platform
    (issue 20: compile time); None for other layers."""
    if not isinstance(layer, (ConvLayer, FcLayer)):
        return None
    known = _CONV_CONSTANTS.get(layer)
    if known is not None and known[0] is platform:
        return known[1]
    constants = conv_constants(as_conv(layer), platform)
    _CONV_CONSTANTS[layer] = (platform, constants)
    return constants


def output_align(layer: Layer, platform: Platform) -> int:
    """Channel multiple the layer's output tensor must be allocated with (feature_placement's
    ``channel_align``): conv 32, depthwise 64 on RK3588 int8; 1 for other layers."""
    layer = as_conv(layer)
    return output_channel_align(layer, platform) if isinstance(layer, ConvLayer) else 1


def describe_layer(layer: Layer, placements: Mapping[str, Placement], platform: Platform,
                   constants: ConvConstants | None = None, cores: int = 1) -> tuple[TaskDescription, ...]:
    layer = as_conv(layer)
    if isinstance(layer, ConvLayer):
        return lower_conv(layer, placements, platform, constants, cores)
    if isinstance(layer, EltwiseLayer):
        return lower_eltwise(layer, placements, platform)
    if isinstance(layer, PoolLayer):
        return lower_pool(layer, placements, platform)
    if isinstance(layer, ActivationLayer):
        return lower_activation(layer, placements, platform)
    if isinstance(layer, ConcatLayer):
        return lower_concat(layer, placements, platform)
    if isinstance(layer, SliceLayer):
        return lower_slice(layer, placements, platform)
    if isinstance(layer, FlatConcatLayer):  # LOWERING.md 29
        return lower_flat_concat(layer, placements, platform)
    if isinstance(layer, ResizeLayer):
        return lower_resize(layer, placements, platform)
    if isinstance(layer, ConvertLayer):  # int8 <-> fp16 storage (LOWERING.md 26)
        return lower_convert(layer, placements, platform)
    if isinstance(layer, TransposeLayer):  # H <-> W as DPU copies (LOWERING.md 35)
        return lower_transpose(layer, placements, platform)
    raise CompileError(f"no NPU lowering for {type(layer).__name__}")


def emit(description: TaskDescription, regmap: RegisterMap, op_idx: int | None = None) -> Task:
    if isinstance(description, ConvTask):
        return emit_conv_task(description, regmap, op_idx)
    if isinstance(description, DpuTask):
        return emit_dpu_task(description, regmap, op_idx)
    if isinstance(description, PpuTask):
        return emit_ppu_task(description, regmap, op_idx)
    if isinstance(description, UnpoolTask):
        return emit_unpool_task(description, regmap, op_idx)
    if isinstance(description, TransposeTask):
        return emit_transpose_task(description, regmap, op_idx)
    raise CompileError(f"no register emission for {type(description).__name__}")


def lower_layer(layer: Layer, placements: Mapping[str, Placement], platform: Platform, regmap: RegisterMap,
                *, op_idx: int | None = None, constants: ConvConstants | None = None,
                cores: int = 1) -> LoweredLayer:
    """Lower one layer on ``platform`` to full-register-set tasks for ``regmap`` (convolutions
    split across ``cores`` cores where worth it, multicore.py)."""
    if regmap.family != platform.register_map.family:
        raise CompileError(f"register map {regmap.family!r} does not belong to platform {platform.name} "
                           f"(expects {platform.register_map.family!r})")
    descriptions = describe_layer(layer, placements, platform, constants or cached_conv_constants(layer, platform),
                                  cores)
    limit = platform.pc.max_tasks_per_submit
    if len(descriptions) > limit:
        raise CompileError(f"layer {layer.name}: {len(descriptions)} tasks exceed the {limit} tasks of one "
                           f"submit on {platform.name} (pc.max_tasks_per_submit)")
    return LoweredLayer(layer.name, descriptions, tuple(emit(d, regmap, op_idx) for d in descriptions))


def copy_views(layers, shapes: Mapping[str, tuple[int, int, int]], dtypes: Mapping[str, str],
               aligns: Mapping[str, int], internal: set[str],
               platform: Platform) -> tuple[dict[str, tuple[str, int]], list[Layer]]:
    """No-copy Concat and Split (LOWERING.md 10.1): ``views`` maps a tensor stored inside another
    to (that tensor, byte offset), and ``elided`` lists the Concat/Split layers that thereby
    need no task. ``layers`` in execution order; ``internal``: tensors of the internal area
    (not graph inputs/outputs: each is written by an NPU layer or a host step of the build,
    both through its placement). Any layer whose conditions fail keeps its copy."""
    views: dict[str, tuple[str, int]] = {}
    elided: list[Layer] = []

    def geometry(name):
        return feature_placement(name, 0, shapes[name], dtypes[name], platform, channel_align=aligns.get(name, 1))

    def free(name):  # may become a view: internal and not already stored inside another tensor
        return name in internal and name not in views

    def extent(name):  # bytes from the tensor's start that it and the views inside it may touch
        inner = [offset + extent(child) for child, (parent, offset) in views.items() if parent == name]
        return max([geometry(name).size, *inner])

    for layer in layers:
        if isinstance(layer, ConcatLayer):
            found = _concat_views(layer, geometry, free, dtypes, extent)
        elif isinstance(layer, SliceLayer):
            found = _slice_view(layer, geometry, free, internal)
        else:
            continue
        if found:
            views.update(found)
            elided.append(layer)
    return views, elided


def _concat_views(layer: ConcatLayer, geometry, free, dtypes, extent) -> dict[str, tuple[str, int]]:
    """Each input at its channel slice of the output, when every input is a free tensor of the
    output's dtype and quantization and all but the last fill exactly their C2 surfaces: a
    producer's channel-rounded write - or that of a view inside the input (a nested Concat's
    last input) - must not reach into the next input's surfaces."""
    out = layer.output
    if not free(out) or len(set(layer.inputs)) != len(layer.inputs):
        return {}
    target = geometry(out)
    found, start = {}, 0
    for index, (name, shape, quant) in enumerate(zip(layer.inputs, layer.shapes, layer.input_quants)):
        if not free(name) or dtypes[name] != dtypes[out] or quant != layer.output_quant:
            return {}
        last = index == len(layer.inputs) - 1
        if not last and (shape[0] % target.c2 or extent(name) > shape[0] // target.c2 * target.surface_bytes):
            return {}
        found[name] = (out, start // target.c2 * target.surface_bytes)
        start += shape[0]
    return found


def _slice_view(layer: SliceLayer, geometry, free, internal) -> dict[str, tuple[str, int]]:
    """The output at the input's surface of its first channel, when both are internal, the
    quantization is kept and the slice starts on a C2 surface."""
    if layer.input not in internal or not free(layer.output) or layer.input_quant != layer.output_quant:
        return {}
    source = geometry(layer.input)
    if layer.start % source.c2:
        return {}
    return {layer.output: (layer.input, layer.start // source.c2 * source.surface_bytes)}
