"""Limits a user can hit: CompileError naming the layer, the register field and the limit."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.lower import (
    Activation, ConstPlacement, ConvLayer, EltwiseLayer, PoolLayer, Quant, Residual, feature_placement,
    layer_constants, lower_layer, output_align,
)
from npuemu.isa.errors import CompileError, NpuemuError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform

PLATFORM = load_platform("rk3588")
REGMAP = load_regmap("rk3588")
Q = Quant(0.05, 0)


def conv(name="conv3", shape=(16, 8, 8), out_channels=16, kernel=1, **kwargs) -> ConvLayer:
    groups = kwargs.pop("groups", 1)
    in_per_group = shape[0] // groups
    weights = np.ones((out_channels, in_per_group, kernel, kernel), np.int8)
    return ConvLayer(name, "in", "out", shape, weights, weight_scale=np.full(out_channels, 0.01),
                     weight_zero_point=np.zeros(out_channels, int), input_quant=Q, output_quant=Q, groups=groups, **kwargs)


def placements(layer: ConvLayer, *, out_align: int | None = None, packed: bool = False) -> dict:
    result = {
        "in": feature_placement("in", 0x1000, layer.input_shape, "int8", PLATFORM, packed=packed),
        "out": feature_placement("out", 0x100000, layer.output_shape, "int8", PLATFORM,
                                 channel_align=out_align or output_align(layer, PLATFORM)),
    }
    for index, (name, blob) in enumerate(layer_constants(layer, PLATFORM).items()):
        result[name] = ConstPlacement(name, 0x4000000 + index * 0x800000, len(blob))
    return result


def lower(layer, places=None):
    return lower_layer(layer, places if places is not None else placements(layer), PLATFORM, REGMAP)


@pytest.mark.parametrize("kwargs,message", [
    (dict(shape=(16, 8, 4096)),
     r"layer conv3: input width 4096 exceeds CNA DATA_SIZE0.DATAIN_WIDTH \(11 bits, max 2047\)"),
    (dict(stride=8, shape=(16, 16, 16)),
     r"layer conv3: vertical stride 8 exceeds CNA CONV_CON3.CONV_Y_STRIDE \(3 bits, max 7\)"),
    (dict(kernel=33, shape=(16, 40, 40)),
     r"layer conv3: kernel width 33 exceeds CNA WEIGHT_SIZE2.WEIGHT_WIDTH \(5 bits, max 31\)"),
    (dict(dilation=40, kernel=3, shape=(16, 100, 100)),
     r"layer conv3: vertical dilation 40 exceeds CNA CONV_CON3.ATROUS_Y_DILATION \(5 bits, max 32\)"),
    (dict(pads=(16, 0, 16, 0), kernel=3, shape=(16, 8, 40)),
     r"layer conv3: top padding 16 exceeds CNA PAD_CON0.PAD_TOP \(4 bits, max 15\)"),
    (dict(out_channels=9000, shape=(16, 2, 2)),
     r"layer conv3: output channels 9000 exceeds DPU DATA_CUBE_CHANNEL.ORIG_CHANNEL \(13 bits, max 8192\)"),
])
def test_register_field_limits(kwargs: dict, message: str) -> None:
    layer = conv(**kwargs)
    with pytest.raises(CompileError, match=message):
        lower(layer)


def test_errors_are_npuemu_errors() -> None:
    assert issubclass(CompileError, NpuemuError)


def test_output_without_channel_padding() -> None:
    layer = conv(out_channels=40)
    with pytest.raises(CompileError, match=r"layer conv3: output out holds 48 channels but the DPU writes 64 "
                                           r"\(output channels rounded up to 32\); allocate it with channel_align=32"):
        lower(layer, placements(layer, out_align=1))


def test_missing_and_mismatched_placements() -> None:
    layer = conv()
    places = placements(layer)
    del places["conv3:bias"]
    with pytest.raises(CompileError, match="layer conv3: no constant placement for 'conv3:bias'"):
        lower(layer, places)
    places = placements(layer)
    places["in"] = feature_placement("in", 0, (16, 9, 8), "int8", PLATFORM)
    with pytest.raises(CompileError, match=r"layer conv3: input in is placed as \(16, 9, 8\), the layer needs \(16, 8, 8\)"):
        lower(layer, places)
    places = placements(layer)
    places["conv3:weights"] = ConstPlacement("conv3:weights", 0, 16)
    with pytest.raises(CompileError, match="constant 'conv3:weights' needs 256 bytes, its placement has 16"):
        lower(layer, places)


def test_addresses_must_be_aligned_32_bit() -> None:
    with pytest.raises(CompileError, match="address 0x1008 is not 16-byte aligned"):
        feature_placement("x", 0x1008, (16, 4, 4), "int8", PLATFORM)
    with pytest.raises(CompileError, match="does not fit the 32-bit NPU address space"):
        ConstPlacement("w", 0xFFFFFF00, 0x200)


def test_unsupported_layer_shapes() -> None:
    with pytest.raises(CompileError, match="layer g: only groups=1 and depthwise"):
        conv("g", shape=(16, 4, 4), groups=2)
    with pytest.raises(CompileError, match="layer p: average pooling with padding and count_include_pad=0"):
        PoolLayer("p", "avg", "a", "b", (16, 8, 8), 3, 1, (1, 1, 1, 1), Q, count_include_pad=False)
    with pytest.raises(CompileError, match="layer e: element-wise op 'pow' is not lowered"):
        EltwiseLayer("e", "pow", ("a", "b"), "c", (16, 4, 4), (Q, Q), Q)
    with pytest.raises(CompileError, match="unsupported fused activation 'swish3'"):
        Activation("swish3")


def test_activation_after_residual_add() -> None:
    layer = conv(residual=Residual("r", Q), activation=Activation("leaky_relu", alpha=0.1))
    places = placements(layer)
    places["r"] = feature_placement("r", 0x200000, layer.output_shape, "int8", PLATFORM)
    with pytest.raises(CompileError, match="layer conv3: residual r holds 16 channels but the residual read "
                                           "covers 32; allocate it with channel_align=32"):
        lower(layer, places)
    places["r"] = feature_placement("r", 0x200000, layer.output_shape, "int8", PLATFORM, channel_align=32)
    with pytest.raises(CompileError, match="layer conv3: after a residual add only relu/relu6/clip"):
        lower(layer, places)


def test_packed_input_needs_direct_int8_conv() -> None:
    layer = conv(shape=(3, 8, 8), out_channels=3, kernel=3, groups=3)
    with pytest.raises(CompileError, match="a packed \\(ARGB\\) input needs an int8 direct convolution"):
        lower(layer, placements(layer, packed=True))


def test_platform_and_register_map_must_agree() -> None:
    layer = conv()
    with pytest.raises(CompileError, match="register map 'rk3576' does not belong to platform rk3588"):
        lower_layer(layer, placements(layer), PLATFORM, load_regmap("rk3576"))
