"""Weight-scale guards that keep real models buildable (compiler/quant/quantize.py): near-dead
channels get a scale of at least 2^-10 of the layer's largest, and a channel whose bias would
not fit the int32 BS ALU operand in units s_in * s_w[c] gets a larger scale."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from npuemu.compiler.build import build_model
from npuemu.compiler.quant.quantize import MIN_WEIGHT_SCALE_RATIO, weight_params
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import Net, compile_graph


def test_near_dead_channels_get_a_usable_scale() -> None:
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.5, (4, 3, 3, 3))
    weights[2] *= 1e-7
    quant = weight_params(weights, 0)
    scale = np.asarray(quant.scale, np.float64)
    assert scale[2] >= scale.max() * MIN_WEIGHT_SCALE_RATIO * (1 - 1e-6)
    assert np.allclose(scale[[0, 1, 3]], (weights[[0, 1, 3]].reshape(3, -1).max(1) - weights[[0, 1, 3]].reshape(3, -1).min(1)) / 255, rtol=1e-5)
    assert -128 <= int(np.asarray(quant.zero_point)[2]) <= 127


def test_a_dead_channel_with_a_large_bias_builds_and_outputs_its_bias() -> None:
    """Channel 1 has weights ~1e-9 and bias 3.0: in units s_in * s_w[1] the bias would be far
    beyond int32 without the guard; with it the channel computes its bias."""
    net = Net(3)
    rng = np.random.default_rng(1)
    weights = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    weights[1] = rng.normal(0, 1e-9, (3, 3, 3))
    bias = np.zeros(8, np.float32)
    bias[1] = 3.0
    net.inits += [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")]
    net.node("Conv", ["x", "w", "b"], ["y"], "conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    graph = compile_graph(net.model([1, 3, 5, 6], "y"), (1, 3, 5, 6))
    runtime = Runtime(build_model(graph))
    runtime.set_input("x", np.random.default_rng(2).normal(size=(1, 3, 5, 6)).astype(np.float32))
    runtime.run()
    out = runtime.output("y")
    scale, _ = runtime.quantization("y")
    assert np.all(np.abs(out[0, 1] - 3.0) <= scale), out[0, 1]
