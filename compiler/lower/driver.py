"""The lowering step's table of contents: one layer -> constant blobs -> tasks -> register writes.

A build step calls, per layer, ``layer_constants`` (blobs to place, before addresses exist),
then - once the memory plan has given every tensor and constant an address -
``lower_layer``, which returns the typed task descriptions and the :class:`Task` objects that
``npuemu.isa.chain.encode_chain`` turns into a regcmd buffer (the PC tail is added there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from npuemu.isa.errors import CompileError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task
from npuemu.platforms.model import Platform

from .conv_geometry import output_channel_align
from .descriptions import ConvTask, DpuTask, PpuTask, TaskDescription
from .emit_conv import emit_conv_task
from .emit_dpu import emit_dpu_task
from .emit_ppu import emit_ppu_task
from .layers import ActivationLayer, ConcatLayer, ConvLayer, SliceLayer, EltwiseLayer, FcLayer, Layer, PoolLayer
from .lower_conv import ConvConstants, conv_constants, lower_conv
from .lower_eltwise import lower_activation, lower_concat, lower_eltwise, lower_slice
from .lower_pool import lower_pool
from .placement import Placement


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
    """Constant blobs ``layer`` needs, by name (conv/FC: packed weights and BS operands)."""
    layer = as_conv(layer)
    if isinstance(layer, ConvLayer):
        constants = conv_constants(layer, platform)
        return {layer.weight_tensor: constants.weights, layer.bias_tensor: constants.bias}
    return {}


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
    raise CompileError(f"no NPU lowering for {type(layer).__name__}")


def emit(description: TaskDescription, regmap: RegisterMap, op_idx: int | None = None) -> Task:
    if isinstance(description, ConvTask):
        return emit_conv_task(description, regmap, op_idx)
    if isinstance(description, DpuTask):
        return emit_dpu_task(description, regmap, op_idx)
    if isinstance(description, PpuTask):
        return emit_ppu_task(description, regmap, op_idx)
    raise CompileError(f"no register emission for {type(description).__name__}")


def lower_layer(layer: Layer, placements: Mapping[str, Placement], platform: Platform, regmap: RegisterMap,
                *, op_idx: int | None = None, constants: ConvConstants | None = None,
                cores: int = 1) -> LoweredLayer:
    """Lower one layer on ``platform`` to full-register-set tasks for ``regmap`` (convolutions
    split across ``cores`` cores where worth it, multicore.py)."""
    if regmap.family != platform.register_map.family:
        raise CompileError(f"register map {regmap.family!r} does not belong to platform {platform.name} "
                           f"(expects {platform.register_map.family!r})")
    descriptions = describe_layer(layer, placements, platform, constants, cores)
    limit = platform.pc.max_tasks_per_submit
    if len(descriptions) > limit:
        raise CompileError(f"layer {layer.name}: {len(descriptions)} tasks exceed the {limit} tasks of one "
                           f"submit on {platform.name} (pc.max_tasks_per_submit)")
    return LoweredLayer(layer.name, descriptions, tuple(emit(d, regmap, op_idx) for d in descriptions))
