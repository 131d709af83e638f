"""npuemu packs direct-conv weights in the vendor's blocking (LOWERING.md 34): the partial input
group rounded up to 1, 2 or 4 atoms, and fp16's last output group unpadded.

The vendor facts below are WEIGHT_SIZE0 (bytes), WEIGHT_SIZE1 (bytes per kernel) and
WEIGHT_SIZE2.WEIGHT_KERNELS of single-conv builds made with rknn-toolkit2 2.5.0 (helper R2's
builds, /tmp/R/work/<name>/model.rknn, read with ``npuemu disasm``; the ONNX weight shape is the
key). RK3576 builds are listed by WEIGHT_SIZE0 alone (its map stores the kernel count minus 1).
The stored channel counts of fp16 IC 3..120 are REGISTER_SEMANTICS.md 34's (13 rk3588 builds).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler import weight_pack
from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.lower import ConvLayer, layer_constants, lower_layer
from npuemu.compiler.lower.conv_geometry import kernels_per_pass
from npuemu.emulator.runtime import Runtime
from npuemu.isa import weight_layout
from npuemu.platforms import load_platform
from tests.compiler.test_lower_emit import PLATFORM, REGMAP, conv, place, regs

# (dtype, (OC, IC, KH, KW)) -> (WEIGHT_BYTES, WEIGHT_BYTES_PER_KERNEL, WEIGHT_KERNELS), rk3588
VENDOR_RK3588 = {
    ("float16", (17, 5, 3, 2)): (1632, 96, 17),      # f16odd_88: 17 kernels stored as 17
    ("float16", (40, 24, 3, 5)): (38400, 960, 40),   # a16_88: 24 channels stored as 32
    ("float16", (32, 16, 3, 3)): (9216, 288, 32),    # f16relu_88
    ("float16", (16, 16, 1, 3)): (1536, 96, 16),     # t_fp16_rk3588
    ("int8", (17, 5, 3, 2)): (1728, 96, 18),         # odd_88: int8 keeps the even kernel tail
    ("int8", (40, 24, 3, 5)): (19200, 480, 40),      # a_88
    ("int8", (48, 40, 3, 3)): (20736, 432, 48),      # big_88: 40 -> 32 + 16
    ("int8", (20, 6, 3, 2)): (1920, 96, 20),         # t_relu2_rk3588
}
# (dtype, (OC, IC, KH, KW)) -> WEIGHT_BYTES, rk3576 (the same rule for direct convs)
VENDOR_RK3576 = {
    ("float16", (17, 5, 3, 2)): 1632, ("float16", (40, 24, 3, 5)): 38400,  # f16odd, a16
    ("float16", (24, 16, 3, 2)): 4608, ("float16", (16, 32, 1, 3)): 3072,  # f2, f16sx
    ("int8", (17, 5, 3, 2)): 1728, ("int8", (48, 40, 3, 3)): 20736,       # odd, big
}
# fp16 input channels -> channels stored per kernel position (REGISTER_SEMANTICS.md 34)
VENDOR_FP16_CHANNELS = {3: 8, 12: 16, 20: 32, 24: 32, 40: 40, 48: 48, 56: 64, 120: 128}


def _layer(dtype: str, shape: tuple[int, int, int, int]) -> ConvLayer:
    out_channels, in_channels, kernel_h, kernel_w = shape
    layer = conv((in_channels, 9, 9), out_channels, 1, dtype=dtype)
    rng = np.random.default_rng(1)
    weights = rng.integers(-3, 4, shape).astype(np.float16 if dtype == "float16" else np.int8)
    return ConvLayer("c", "in", "out", (in_channels, 9, 9), weights, bias=layer.bias, groups=1, dtype=dtype,
                     **({} if dtype == "float16" else dict(weight_scale=layer.weight_scale,
                                                           weight_zero_point=layer.weight_zero_point,
                                                           input_quant=layer.input_quant,
                                                           output_quant=layer.output_quant)))


@pytest.mark.parametrize("channels, stored", sorted(VENDOR_FP16_CHANNELS.items()))
def test_fp16_partial_group_is_1_2_or_4_atoms(channels, stored):
    assert weight_pack.conv_blocking("float16").stored_channels(channels) == stored


@pytest.mark.parametrize("key", sorted(VENDOR_RK3588))
def test_rk3588_weight_registers_equal_the_vendors(key):
    dtype, shape = key
    layer = _layer(dtype, shape)
    r = regs(lower_layer(layer, place(layer), PLATFORM, REGMAP).tasks[0])
    written = (r["CNA.WEIGHT_SIZE0"]["WEIGHT_BYTES"], r["CNA.WEIGHT_SIZE1"]["WEIGHT_BYTES_PER_KERNEL"],
               r["CNA.WEIGHT_SIZE2"]["WEIGHT_KERNELS"])
    assert written == VENDOR_RK3588[key]
    assert len(layer_constants(layer, PLATFORM)["c:weights"]) == VENDOR_RK3588[key][0]


@pytest.mark.parametrize("key", sorted(VENDOR_RK3576))
def test_rk3576_weight_blob_sizes_equal_the_vendors(key):
    dtype, shape = key
    platform = load_platform("rk3576")
    layer = _layer(dtype, shape)
    assert len(layer_constants(layer, platform)["c:weights"]) == VENDOR_RK3576[key]


def test_chips_with_other_kernel_groups_keep_npuemus_own_rule():
    # RK356x / RK3562 fp16 (8 kernels a pass): no vendor stream of theirs shows the power-of-two
    # rule, so they keep IC to whole atoms and the kernel tail even (LOWERING.md 34)
    layer = _layer("float16", (17, 20, 3, 3))
    for chip in ("rk3568", "rk3562"):
        platform = load_platform(chip)
        blocking = weight_pack.conv_blocking("float16", kernels_per_pass(layer, platform))
        assert (blocking.stored_kernels(17), blocking.stored_channels(20)) == (18, 24)
    rk3588 = weight_pack.conv_blocking("float16", kernels_per_pass(layer, PLATFORM))
    assert (rk3588.stored_kernels(17), rk3588.stored_channels(20)) == (17, 32)


def _conv_model(weights: np.ndarray, bias: np.ndarray, shape: tuple) -> onnx.ModelProto:
    kernel = list(weights.shape[2:])
    node = helper.make_node("Conv", ["x", "W", "B"], ["y"], name="c", kernel_shape=kernel,
                            pads=[k // 2 for k in kernel] * 2)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(bias, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _reference(x: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Direct float64 convolution (stride 1, 'same' padding for odd kernels): every value here is
    a small integer, so float16 storage and float32 sums are exact and the NPU must match bit
    for bit."""
    out_channels, _, kernel_h, kernel_w = weights.shape
    _, _, height, width = x.shape
    padded = np.pad(x[0].astype(np.float64), ((0, 0), (kernel_h // 2,) * 2, (kernel_w // 2,) * 2))
    out = np.zeros((out_channels, height, width))
    for dy in range(kernel_h):
        for dx in range(kernel_w):
            window = padded[:, dy:dy + height, dx:dx + width]
            out += np.einsum("oc,chw->ohw", weights[:, :, dy, dx].astype(np.float64), window)
    return (out + bias[:, None, None])[None]


def _run_fp16(model: onnx.ModelProto, x: np.ndarray):
    built = build_graph(prepare(model, "rk3588", CompileOptions(precision="fp16")).graph)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return built, runtime.output("y")


@pytest.mark.parametrize("in_channels, out_channels", [(20, 17), (24, 19), (40, 16), (56, 33)])
def test_fp16_conv_in_the_vendor_blocking_is_exact(in_channels, out_channels, monkeypatch):
    rng = np.random.default_rng(in_channels * 100 + out_channels)
    weights = rng.integers(-3, 4, (out_channels, in_channels, 3, 3)).astype(np.float32)
    bias = rng.integers(-8, 9, out_channels).astype(np.float32)
    shape = (1, in_channels, 6, 7)
    x = rng.integers(-3, 4, shape).astype(np.float32)
    model = _conv_model(weights, bias, shape)
    want = _reference(x, weights, bias)
    built, got = _run_fp16(model, x)
    assert np.array_equal(got.astype(np.float64), want)
    # npuemu's builds before LOWERING.md 34 (IC to whole atoms, the tail even) still run: the
    # emulator reads either form by WEIGHT_SIZE0/1
    monkeypatch.setattr(weight_pack, "FP16_CONV", weight_layout.FP16_CONV_V1)
    old, got_old = _run_fp16(model, x)
    stored = VENDOR_FP16_CHANNELS.get(in_channels, in_channels)
    grew = out_channels * stored - (out_channels + out_channels % 2) * -(-in_channels // 8) * 8
    sizes = [len(b.section("weights").data) for b in (built, old)]
    assert (sizes[0] > sizes[1]) == (grew > 0) and (sizes[0] == sizes[1]) == (grew == 0)
    assert np.array_equal(got_old.astype(np.float64), want)
