"""Softmax over the channel axis on the NPU in float16 builds (compiler/passes/lower_softmax.py,
LOWERING.md 22.2): a tree of pairwise log-sum-exps (1x1 convs with the Softplus LUT fused, DPU
Adds), x - L by a conv with x as its residual, e^d as 1 + Elu(d) (the Elu LUT, then an
identity conv with bias 1).

Checked: the partition (float16 builds, the channel axis, up to 512 channels here; int8 builds,
other axes and opset-12 flattening stay host steps naming the limit); the whole layer bit for
bit against a reference written here from the task list with the LUT arithmetic of
NUMERICS.md 5.1 (tests/emulator/reference/lut_fp16.py), hypothesis over channel counts (odd,
powers of two, one) and input spreads; onnxruntime within cosine 0.9999 and 2e-3 absolute,
also with large logits; the vendor fixture's last-axis Softmax stays a host step."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.lower import lut
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine
from tests.emulator.reference.lut_fp16 import fp16_chain
from tests.shared_data import RKNN_FIXTURES_OPS

F32 = np.float32


def softmax_model(shape, axis: int = 1, opset: int = 13):
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=axis, name="softmax")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def build(model, precision: str = "fp16"):
    front = prepare(model, "rk3588", CompileOptions(precision=precision, dataset=None if precision == "fp16" else
                                                    [{"x": np.random.default_rng(0).normal(0, 1, _shape(model))
                                                      .astype(np.float32)}]))
    return front, build_graph(front.graph)


def _shape(model) -> tuple[int, ...]:
    return tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)


def run(built, x: np.ndarray) -> np.ndarray:
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return np.asarray(runtime.output("y"))


def _lut_layer(values: np.ndarray, kind: str, alpha=None) -> np.ndarray:
    """fp32 values (bias already added) through a float16 LUT layer: fp16 results."""
    program = lut.lut_fp16_program(kind, alpha)
    return fp16_chain(values, program.bn_mul_bits, program.output_unit, program.program)


def reference_softmax_npu(x: np.ndarray) -> np.ndarray:
    """The task list of LOWERING.md 22.2 in numpy float32, one rounding per operation: the CNA
    sums of +-1 weights are exact in fp32 (two non-zero terms), the DPU adds round to fp32 and
    every stored tensor to fp16 (round to nearest even)."""
    values = np.asarray(x, np.float16)[0].astype(F32)  # [C, H, W]
    channels = values.shape[0]
    steps = math.ceil(math.log2(channels)) if channels > 1 else 0

    def pairs(running: np.ndarray, width: int) -> np.ndarray:
        partner = np.full_like(running, -1.0e4)  # no partner: zero weights, bias -1e4
        partner[:channels - width] = running[width:] - running[:channels - width]
        return partner

    def fp16(v: np.ndarray) -> np.ndarray:
        return v.astype(np.float16).astype(F32)

    running = values
    for k in range(steps):  # the maximum: conv, Relu, + the running map
        running = fp16(np.maximum(pairs(running, 1 << k), F32(0.0)) + running)
    centred = fp16(-running[0:1] + values)  # conv -m (channel 0), residual x
    running = centred
    for k in range(steps):  # log-sum-exp: conv + Softplus, then Add
        running = fp16(running + _lut_layer(pairs(running, 1 << k), "softplus").astype(F32))
    shifted = fp16(-running[0:1] + centred)
    gated = _lut_layer(shifted, "elu", 1.0).astype(F32)
    return (gated + F32(1.0)).astype(np.float16)[None]


# --- partition ----------------------------------------------------------------------------------

def test_channel_softmax_is_one_npu_layer_in_float16() -> None:
    front, built = build(softmax_model((1, 40, 2, 4)))
    assert [(node.op_type, node.target) for node in front.graph.nodes] == [("Softmax", "NPU")]
    assert [step.kind for step in built.schedule()] == ["npu"]
    tasks = sum(r.count for layer in built.layers() for r in layer.tasks)
    assert tasks == 3 * 6 + 4  # ceil(log2 40) = 6: max steps, shift, lse steps (conv + Add), shift, Elu, plus one


@pytest.mark.parametrize("shape, axis, opset, precision, reason", [
    ((1, 8, 40, 40), -1, 13, "fp16", "axis 3 of [1, 8, 40, 40]"),
    ((1, 16, 2, 2), 1, 11, "fp16", "opset < 13 Softmax over the flattened C*H*W of [1, 16, 2, 2]"),
])  # over 512 channels: LOWERING.md 25 (test_softmax_wide.py)
def test_other_softmaxes_stay_on_the_host_and_say_why(shape, axis, opset, precision, reason) -> None:
    front, built = build(softmax_model(shape, axis, opset), precision)
    decision = front.partition.by_node()["softmax"]
    assert decision.target == "CPU" and decision.reason.endswith(": " + reason)
    assert [step.kind for step in built.schedule()][-1] == "cpu"


# --- bit exactness and accuracy -----------------------------------------------------------------

@settings(max_examples=5, deadline=None)
@given(channels=st.sampled_from([1, 2, 3, 8, 17, 40, 64]), height=st.integers(1, 3), width=st.integers(1, 4),
       spread=st.floats(0.05, 12), seed=st.integers(0, 2**16))
def test_fp16_softmax_is_bit_exact_against_the_task_reference(channels, height, width, spread, seed) -> None:
    shape = (1, channels, height, width)
    x = np.random.default_rng(seed).normal(0, spread, shape).astype(np.float16).astype(F32)
    front, built = build(softmax_model(shape))
    assert all(node.target == "NPU" for node in front.graph.nodes)  # an identity conv first where H*W % 4
    got = run(built, x).astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), reference_softmax_npu(x).view(np.uint16))


@pytest.mark.parametrize("shape, spread, offset", [((1, 40, 5, 8), 2.0, 0.0), ((1, 64, 3, 3), 6.0, 30.0),
                                                   ((1, 7, 4, 4), 1.0, -50.0), ((1, 256, 2, 2), 3.0, 0.0)])
def test_fp16_softmax_matches_onnxruntime(shape, spread, offset) -> None:
    model = softmax_model(shape)
    x = (np.random.default_rng(5).normal(offset, spread, shape)).astype(np.float16).astype(F32)
    _, built = build(model)
    got = run(built, x)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert cosine(got, want) >= 0.9999  # e^z as 1 + Elu(z): about 5e-4 absolute (LOWERING.md 22.2)
    assert np.abs(got - want).max() <= 4e-3
    # each log-sum-exp step stores softplus in fp16 (up to 2e-3 off) and 1 + Elu flushes
    # probabilities below ~2.5e-4 to 0: the sums fall short by up to ~2 % at C = 256 (LOWERING.md 22.2)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=5e-3 * math.ceil(math.log2(shape[1])))


@pytest.mark.skipif(not RKNN_FIXTURES_OPS.exists(), reason="vendor fixtures not present")
def test_vendor_last_axis_softmax_fixture_stays_a_host_step() -> None:
    """softmax_last_fp16 normalises the last axis of [1, 8, 40, 40]: not the channel axis, so
    (until a Transpose puts it there) the host runs it, exactly as onnxruntime."""
    model = onnx.load(RKNN_FIXTURES_OPS / "softmax_last_fp16" / "model.onnx")
    front, built = build(model)
    assert [node.target for node in front.graph.nodes] == ["CPU"]
    x = np.random.default_rng(2).normal(0, 2, (1, 8, 40, 40)).astype(np.float16).astype(F32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert cosine(run(built, x), want) >= 0.99999


def test_softmax_between_convs_runs_on_the_npu_end_to_end() -> None:
    """conv -> channel Softmax -> conv: one NPU chain (no host step), against onnxruntime."""
    from onnx import numpy_helper

    rng = np.random.default_rng(11)
    w1 = rng.normal(0, 0.5, (24, 8, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.5, (16, 24, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Softmax", ["a"], ["p"], axis=1, name="softmax"),
             helper.make_node("Conv", ["p", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    front, built = build(model)
    assert [node.target for node in front.graph.nodes] == ["NPU"] * 3
    assert [step.kind for step in built.schedule()] == ["npu"]
    x = rng.normal(0, 1, (1, 8, 6, 10)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert cosine(run(built, x), want) >= 0.9999
