"""Lowering: one fused, quantized (or fp16) layer -> typed task descriptions -> register writes.

Read ``LOWERING.md`` next to this package. Entry points:

- ``layer_constants(layer, platform)`` -> {name: bytes}: the blobs the memory plan places;
- ``output_align(layer, platform)``: channel multiple for the layer's output allocation;
- ``lower_layer(layer, placements, platform, regmap)`` -> ``LoweredLayer`` with
  ``descriptions`` (ConvTask / DpuTask / PpuTask) and ``tasks`` (npuemu.isa.task.Task).
"""

from .descriptions import ConvTask, DpuTask, PpuTask, TaskDescription
from .driver import LoweredLayer, describe_layer, emit, layer_constants, lower_layer, output_align
from .layers import (
    NO_ACTIVATION, Activation, ActivationLayer, ConcatLayer, ConvLayer, SliceLayer, EltwiseLayer, FcLayer, Layer, PoolLayer, Quant, Residual,
)
from .placement import ConstPlacement, Placement, TensorPlacement, feature_bytes, feature_placement, surface_atoms

__all__ = [
    "Activation", "ActivationLayer", "ConcatLayer", "ConstPlacement", "SliceLayer", "ConvLayer", "ConvTask", "DpuTask", "EltwiseLayer", "FcLayer", "Layer",
    "LoweredLayer", "NO_ACTIVATION", "Placement", "PoolLayer", "PpuTask", "Quant", "Residual", "TaskDescription",
    "TensorPlacement", "describe_layer", "emit", "feature_bytes", "feature_placement", "layer_constants",
    "lower_layer", "output_align", "surface_atoms",
]
