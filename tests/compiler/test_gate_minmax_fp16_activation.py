"""Max/Min of a map and a per-channel [1, C, 1, 1] gate computed by NPU layers, and float16
standalone ReLU / Clip / LeakyRelu, on the NPU (LOWERING.md 28).

References: int8 gates against the testing kit's reference_model of the built model (bit for
bit); float16 against numpy written here (the fp32 operation on the stored fp16 values, rounded to
fp16 once); end to end against onnxruntime."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.emulator.runtime import Runtime
from npuemu.tools.testing_reference import reference_model


def _model(nodes, inits, shape=(1, 3, 8, 8)):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def gate_model(op: str, gate_first: bool, channels: int = 24):
    """conv -> a; GAP(a) -> 1x1 conv -> g; y = op(a, g) (or op(g, a))."""
    rng = np.random.default_rng(len(op) + gate_first)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (channels, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (channels, channels, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["a"], ["g0"]),
             helper.make_node("Conv", ["g0", "w2"], ["g"]),
             helper.make_node(op, ["g", "a"] if gate_first else ["a", "g"], ["y"])]
    return _model(nodes, inits)


def activation_model(op: str, **attrs):
    """conv -> maxpool -> op: the activation cannot fuse into the pool, so it runs alone."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (20, 3, 3, 3)).astype(np.float32), "w1")]
    inputs = ["p"]
    if op == "Clip":
        inits += [numpy_helper.from_array(np.array(attrs.pop("low"), np.float32), "lo"),
                  numpy_helper.from_array(np.array(attrs.pop("high"), np.float32), "hi")]
        inputs += ["lo", "hi"]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node(op, inputs, ["y"], **attrs)]
    return _model(nodes, inits)


#: calibration samples of the int8 builds (the gate's range varies with the input: several samples)
SAMPLES = [{"x": np.random.default_rng(seed).normal(size=(1, 3, 8, 8)).astype(np.float32)} for seed in range(5, 9)]


def build(model, precision: str, outputs=("y",)):
    options = dict(outputs=tuple(outputs)) if outputs != ("y",) else {}
    if precision == "fp16":
        return compile_model(model, "rk3588", CompileOptions(precision="fp16", **options))
    return compile_model(model, "rk3588", CompileOptions(dataset=SAMPLES, **options))


def run(built, x):
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return runtime


def onnxruntime(model, x):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("gate_first", [False, True])
@pytest.mark.parametrize("op", ["Max", "Min"])
def test_int8_max_min_gate_runs_on_the_npu_bit_exact(op, gate_first):
    from npuemu.compiler.driver import prepare

    model = gate_model(op, gate_first)
    front = prepare(model, "rk3588", CompileOptions(dataset=SAMPLES))
    built = build(model, "int8")
    assert [step.kind for step in built.schedule()] == ["npu"]
    probe = SAMPLES[1]["x"]
    runtime = run(built, probe)
    stored = np.asarray(runtime.output("y", dequantize=False))
    reference = reference_model(front.graph, built, {"x": probe})["y"]
    np.testing.assert_array_equal(reference.reshape(-1), stored.reshape(-1))
    assert cosine(runtime.output("y"), onnxruntime(model, probe)) > 0.999


@pytest.mark.parametrize("gate_first", [False, True])
@pytest.mark.parametrize("op", ["Max", "Min"])
def test_float16_max_min_gate_is_the_operation_rounded_once(op, gate_first):
    model = gate_model(op, gate_first)
    built = build(model, "fp16", outputs=("a", "g", "y"))
    assert [step.kind for step in built.schedule()] == ["npu"]
    x = np.random.default_rng(6).normal(size=(1, 3, 8, 8)).astype(np.float32)
    runtime = run(built, x)
    a, g, y = (np.asarray(runtime.output(name, dequantize=False)) for name in ("a", "g", "y"))
    operation = np.maximum if op == "Max" else np.minimum
    want = operation(a.astype(np.float32), g.reshape(1, -1, 1, 1).astype(np.float32)).astype(np.float16)
    assert y.dtype == np.float16 and np.array_equal(y.reshape(want.shape).view(np.uint16), want.view(np.uint16))
    assert cosine(runtime.output("y"), onnxruntime(model, x)) > 0.9999


def test_same_shape_max_stays_a_host_step_with_its_reason():
    """Only the gate form moved: Max of two same-shape maps is a CPU layer, the partition says why."""
    from npuemu.compiler.driver import prepare

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), name) for name in ("w1", "w2")]
    model = _model([helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
                    helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
                    helper.make_node("Max", ["a", "b"], ["y"])], inits)
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    node = [n for n in front.graph.nodes if n.op_type == "Max"][0]
    assert node.target == "CPU"
    assert "[1,C,1,1] gate" in front.partition.by_node()[node.name].reason


def fp16_activation(kind: str, x: np.ndarray, low: float = 0.0, high: float = 0.0, alpha: float = 0.0) -> np.ndarray:
    """The DPU's fp32 stage on fp16 values, rounded to fp16 once (LeakyRelu's slope stored as fp16)."""
    v = x.astype(np.float32)
    if kind == "Relu":
        v = np.maximum(v, np.float32(0))
    elif kind == "Clip":
        v = np.minimum(np.maximum(v, np.float32(low)), np.float32(high))
    else:
        v = np.where(v < 0, v * np.float32(np.float16(alpha)), v)
    return v.astype(np.float16)


ACTIVATIONS = {"Relu": {}, "Clip": {"low": -0.5, "high": 0.7}, "LeakyRelu": {"alpha": 0.1}}


@functools.lru_cache(maxsize=None)
def _activation_build(kind: str):
    model = activation_model(kind, **dict(ACTIVATIONS[kind]))
    return model, build(model, "fp16", outputs=("p", "y"))


@pytest.mark.parametrize("kind", sorted(ACTIVATIONS))
def test_float16_standalone_activation_runs_on_the_npu(kind):
    model, built = _activation_build(kind)
    assert [step.kind for step in built.schedule()] == ["npu"]
    x = np.random.default_rng(3).normal(size=(1, 3, 8, 8)).astype(np.float32)
    runtime = run(built, x)
    assert cosine(runtime.output("y"), onnxruntime(model, x)) > 0.9999


@settings(max_examples=15, deadline=None)
@given(kind=st.sampled_from(sorted(ACTIVATIONS)), seed=st.integers(0, 2**31 - 1), spread=st.sampled_from([0.5, 4.0, 300.0]))
def test_float16_standalone_activation_is_bit_exact(kind, seed, spread):
    _, built = _activation_build(kind)
    x = (np.random.default_rng(seed).normal(size=(1, 3, 8, 8)) * spread).astype(np.float32)
    runtime = run(built, x)
    p, y = (np.asarray(runtime.output(name, dequantize=False)) for name in ("p", "y"))
    attrs = dict(ACTIVATIONS[kind])
    want = fp16_activation(kind, p, **attrs)
    assert y.dtype == np.float16 and np.array_equal(y.view(np.uint16), want.view(np.uint16))
