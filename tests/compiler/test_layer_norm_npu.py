"""LayerNormalization over the channels of a [1, C, 1, T] map as NPU layers
(passes/layer_norm_npu.py, LOWERING.md 21): mean and variance as 1x1 convs to one channel, the
centring and scaling as channel-broadcast element-wise layers (LOWERING.md 16), 1/sqrt as DPU
look-up tables on [1, 1, 1, T] (LOWERING.md 24), gamma/beta as a depthwise 1x1 conv.

Checked against references written here (numpy, not the compiler's or emulator's code): the
float graph equals LayerNorm over the channel axis (hypothesis over C, T, eps, affine); the
float16 build run on the emulator equals, bit for bit, the same chain computed in numpy with
every NPU stage's fp32 result rounded once to fp16 (NUMERICS.md 3.3 / 4.6: products of fp16
exact in fp32, sums to fp32, one rounding to fp16 at the output); int8 against the testing
kit's independent reference of the built model, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.compiler.build import build_model
from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.ir import Graph, Tensor
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.passes.layer_norm_npu import channel_layer_norm
from npuemu.compiler.quant import calibrate, float16_graph, quantize_graph
from npuemu.emulator.runtime import Runtime
from npuemu.tools.testing_reference import reference_model
from tests.compiler.test_rsqrt_npu import reference_rsqrt_fp16


def ln_graph(channels: int, tokens: int, gamma, beta, eps: float) -> Graph:
    graph = Graph("ln", inputs=["x"], outputs=["y"])
    graph.add_tensor(Tensor("x", (1, channels, 1, tokens), "float32"))
    graph.add_tensor(Tensor("y", (1, channels, 1, tokens), "float32"))
    channel_layer_norm(graph, 0, "x", "y", gamma, beta, eps, "ln")
    return graph


def layer_norm_channels(x: np.ndarray, gamma, beta, eps: float) -> np.ndarray:
    """The reference: normalize every pixel over the channel axis (axis 1), in float64."""
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    out = (x - mean) / np.sqrt(var + eps) * np.asarray(gamma).reshape(1, -1, 1, 1)
    return out + (0 if beta is None else np.asarray(beta).reshape(1, -1, 1, 1))


@settings(max_examples=25, deadline=None)
@given(channels=st.integers(2, 70), tokens=st.integers(1, 20), eps=st.sampled_from([1e-5, 1e-6, 1e-3]),
       affine=st.booleans(), seed=st.integers(0, 2**16))
def test_float_graph_is_layer_norm_over_channels(channels, tokens, eps, affine, seed):
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(0.5, 2, channels) if affine else np.ones(channels)
    beta = rng.normal(0, 1, channels) if affine else None
    x = rng.normal(rng.normal(0, 3), rng.uniform(0.1, 4), (1, channels, 1, tokens)).astype(np.float32)
    got = evaluate(ln_graph(channels, tokens, gamma, beta, eps), {"x": x})["y"]
    np.testing.assert_allclose(got, layer_norm_channels(x, gamma, beta, eps), rtol=1e-4, atol=1e-4)


def _fp16(value) -> np.ndarray:
    return np.asarray(value, np.float32).astype(np.float16)


def fp16_chain(x: np.ndarray, gamma, beta, eps: float) -> np.ndarray:
    """The float16 build's arithmetic, stage by stage: each NPU stage's fp32 result rounded to
    fp16 once; the convs' fp16 x fp16 products are exact and summed (here in float64, then to
    fp32); 1/sqrt the look-up-table chain of test_rsqrt_npu (floor eps)."""
    channels = x.shape[1]
    x16 = _fp16(x).astype(np.float64)
    w = float(_fp16(1.0 / channels))

    def channel_sum(values: np.ndarray, bias: float) -> np.ndarray:
        total = (values * w).sum(axis=1, keepdims=True).astype(np.float32)
        return _fp16(total + np.float32(bias)).astype(np.float64)

    mean = channel_sum(x16, 0.0)
    d = _fp16(x16 - mean).astype(np.float64)
    q = _fp16(d * d).astype(np.float64)
    var = channel_sum(q, eps)
    r = reference_rsqrt_fp16(_fp16(var), floor=eps).astype(np.float64)
    n = _fp16(d * r).astype(np.float64)
    g = _fp16(gamma).astype(np.float64).reshape(1, -1, 1, 1)
    b = np.float32(0) if beta is None else np.asarray(beta, np.float32).reshape(1, -1, 1, 1)
    return _fp16((n * g).astype(np.float32) + b)


def _run(graph: Graph, model, x: np.ndarray) -> Runtime:
    runtime = Runtime(model)
    runtime.set_input("x", x)
    runtime.run()
    return runtime


@pytest.mark.parametrize("channels,tokens", [(24, 12), (120, 40), (13, 5)])
def test_float16_build_bit_exact(channels, tokens):
    rng = np.random.default_rng(channels)
    gamma, beta, eps = rng.uniform(0.5, 2, channels), rng.normal(0, 0.5, channels), 1e-5
    graph = ln_graph(channels, tokens, gamma, beta, eps)
    _, split = optimize(graph, PassContext.for_chip("rk3588", 3, element_bytes=2), check_every_pass=True)
    assert dict(split.cpu_ops()) == {}  # 1/sqrt too (LOWERING.md 24)
    float16_graph(graph)
    x = rng.normal(1.5, 2, (1, channels, 1, tokens)).astype(np.float32)
    got = np.asarray(_run(graph, build_model(graph), x).output("y"), np.float16)
    want = fp16_chain(x, gamma, beta, eps)
    assert np.array_equal(got.reshape(-1).view(np.uint16), want.reshape(-1).view(np.uint16))
    np.testing.assert_allclose(got.astype(np.float64), layer_norm_channels(x, gamma, beta, eps), atol=0.02)


def test_int8_build_bit_exact_with_the_kit():
    channels, tokens = 32, 16
    rng = np.random.default_rng(4)
    gamma, beta = rng.uniform(0.5, 2, channels), rng.normal(0, 0.5, channels)
    graph = ln_graph(channels, tokens, gamma, beta, 1e-5)
    optimize(graph, PassContext.for_chip("rk3588", 3), check_every_pass=True)
    samples = [{"x": rng.normal(0, 1, (1, channels, 1, tokens)).astype(np.float32)} for _ in range(4)]
    quantize_graph(graph, calibrate(graph, samples, "normal", progress=False).ranges)
    model = build_model(graph)
    x = rng.normal(0, 1, (1, channels, 1, tokens)).astype(np.float32)
    runtime = _run(graph, model, x)
    stored = np.asarray(runtime.output("y", dequantize=False))
    assert np.array_equal(reference_model(graph, model, {"x": x})["y"].reshape(-1), stored.reshape(-1))
    got = np.asarray(runtime.output("y"), np.float64).ravel()
    want = layer_norm_channels(x, gamma, beta, 1e-5).ravel()
    assert got @ want / np.linalg.norm(got) / np.linalg.norm(want) > 0.98
