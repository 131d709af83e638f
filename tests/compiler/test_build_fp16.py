"""float16 and hybrid builds on the emulated NPU: fp16 convs (fp32 bias blob, fp16 leaky slope),
element-wise and pooling layers against onnxruntime float; hybrid int8/float16 graphs with
DataConvert DPU tasks against fake-quant (NUMERICS.md 4.6 for the fp operand encodings)."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.quant import calibrate, quantize_graph
from npuemu.compiler.quant.fake_quant import fake_quant_evaluate
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import MODELS, cosine, onnxruntime_float
from tests.compiler.test_lower_lut import _fused


def _run(graph, x):
    model = build_graph(graph)
    runtime = Runtime(model)
    runtime.set_input("x", x)
    runtime.run()
    return model, runtime.output(graph.outputs[0])


@pytest.mark.parametrize("case", MODELS)
def test_float16_build_matches_onnxruntime(case) -> None:
    model, shape = MODELS[case]()
    graph = prepare(model, "rk3588", CompileOptions(precision="fp16")).graph
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    built, got = _run(graph, x)
    want = onnxruntime_float(model, x)
    assert all(t.dtype == "float16" for t in built.tensors()), [t.dtype for t in built.tensors()]
    assert [step.kind for step in built.schedule()] == ["npu"]
    # fp16 storage between layers: about 2^-11 relative per layer (measured <= 8.3e-4 of the peak)
    assert cosine(got, want) >= 0.99999
    assert float(np.abs(got - want).max()) <= 2e-3 * float(np.abs(want).max())


def test_float16_lut_activation_runs_on_the_npu() -> None:
    """The fp16 DPU LUT (NUMERICS.md 5.1): no host step (it was one before the fp16 LUT)."""
    model, shape = _fused("Elu")()
    graph = prepare(model, "rk3588", CompileOptions(precision="fp16")).graph
    x = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    built, got = _run(graph, x)
    assert [step.kind for step in built.schedule()] == ["npu"]
    assert cosine(got, onnxruntime_float(model, x)) >= 0.99999


@pytest.mark.parametrize("case", ["small_cnn", "pools_add", "classifier"])
def test_hybrid_build_matches_fake_quant(case) -> None:
    model, shape = MODELS[case]()
    # the driver's hybrid build reads its layer dtypes from a quant config file: passes by the
    # driver (precision "float": imported and fused only), the in-memory layer dtypes by hand
    graph = prepare(model, "rk3588", CompileOptions(precision="float")).graph
    rng = np.random.default_rng(0)
    samples = [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(4)]
    quantize_graph(graph, calibrate(graph, samples, progress=False).ranges,
                   layer_dtypes={node.name: "float16" for node in graph.nodes[:2]})
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    built, got = _run(graph, x)
    # the DataConverts are DPU tasks (LOWERING.md 26): one NPU step, no host step
    assert [step.kind for step in built.schedule()] == ["npu"]
    assert {t.dtype for t in built.tensors()} == {"int8", "float16"}
    predicted = fake_quant_evaluate(graph, {"x": x})[graph.outputs[0]]
    assert cosine(got, predicted) >= 0.99999
    assert cosine(got, onnxruntime_float(model, x)) >= 0.9999
