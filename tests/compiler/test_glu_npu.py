"""The fused Glu (Split into channel halves + Sigmoid + Mul, passes/fuse_glu.py) on the NPU,
int8 and float16 (compiler/passes/lower_glu.py, LOWERING.md 22.1): a DPU LUT task for the gate
and a DPU element-wise Mul reading the gate through the ERDMA, the halves by address - the
vendor's exGlu (rknn-fixtures-ops glu_int8 / glu_fp16).

Checked: the partition (channel axis, halves on 16-channel surfaces, else a host step naming
the limit); int8 builds bit for bit against the testing kit's independent LUT and Mul
references chained through the documented gate quantization (hypothesis over shapes and input
ranges); float16 builds bit for bit against NUMERICS.md 5.1's LUT chain
(tests/emulator/reference/lut_fp16.py) and one fp32 multiply rounded once; a conv-fed Glu
reads its halves by address (no copy task); the vendor fixtures' model.onnx end to end
against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.lower import lut
from npuemu.emulator.runtime import Runtime
from npuemu.tools.testing_reference import LUT_SPAN, LutTables, Quant, reference_activation, reference_eltwise
from tests.compiler.test_build_e2e import cosine
from tests.emulator.reference.lut_fp16 import fp16_chain
from tests.shared_data import RKNN_FIXTURES_OPS

GATE = Quant(1.0 / 255.0, -128)  # LOWERING.md 22.1: sigmoid's [0, 1] over the int8 range


def reference_glu(x: np.ndarray, axis: int = 1) -> np.ndarray:
    """GLU from its definition (float): the first half times the sigmoid of the second."""
    a, b = np.split(np.asarray(x, np.float64), 2, axis=axis)
    return a / (1.0 + np.exp(-b))


def glu_model(shape, conv: bool = False, seed: int = 0):
    """x -> [Conv 1x1 ->] Split(axis 1, halves) -> Sigmoid(second) -> Mul(first, gate) -> y."""
    channels = shape[1]
    nodes, inits, source = [], [], "x"
    if conv:
        rng = np.random.default_rng(seed)
        weight = rng.normal(0, 1 / np.sqrt(channels), (channels, channels, 1, 1)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, "w"))
        nodes.append(helper.make_node("Conv", ["x", "w"], ["c"], name="conv"))
        source = "c"
    half = channels // 2
    inits.append(numpy_helper.from_array(np.array([half, half], np.int64), "sizes"))
    nodes += [helper.make_node("Split", [source, "sizes"], ["a", "b"], axis=1, name="split"),
              helper.make_node("Sigmoid", ["b"], ["g"], name="sigmoid"),
              helper.make_node("Mul", ["a", "g"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "glu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def build(model, precision: str, samples=None):
    options = CompileOptions(precision=precision, dataset=samples) if samples is not None else \
        CompileOptions(precision=precision)
    front = prepare(model, "rk3588", options)
    return front, build_graph(front.graph)


def run(built, x: np.ndarray, output: str = "y", dequantize: bool = True) -> np.ndarray:
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return np.asarray(runtime.output(output, dequantize=dequantize))


def ort_run(model, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def quant_of(graph, name: str) -> Quant:
    q = graph.tensors[name].quant
    return Quant(float(q.scale), int(q.zero_point))


def int8_glu_reference(q_x: np.ndarray, x_quant: Quant, y_quant: Quant) -> np.ndarray:
    """The int8 GLU as the two DPU tasks compute it: the kit's LUT activation of the second
    half into the gate quantization, then the kit's Mul of the first half by the gate."""
    a, b = np.split(q_x, 2, axis=1)
    program, _, _ = lut.lut_program("sigmoid", input_unit=float(x_quant.scale), output_scale=GATE.scale,
                                    output_zero_point=GATE.zero_point)
    tables = LutTables(program.le, program.lo, program.domain / LUT_SPAN, program.output_unit)  # table data only
    gate = reference_activation(b, "sigmoid", input_quant=x_quant, output_quant=GATE, lut=tables)
    return reference_eltwise("mul", a, gate, a_quant=x_quant, b_quant=GATE, output_quant=y_quant)


def fp16_glu_reference(x: np.ndarray) -> np.ndarray:
    """The float16 GLU: NUMERICS.md 5.1's LUT chain for the gate, then fp32 a * gate rounded to
    fp16 once (both operands are fp16 values: the fp32 product is exact)."""
    a, b = np.split(np.asarray(x, np.float16).astype(np.float32), 2, axis=1)
    program = lut.lut_fp16_program("sigmoid")
    gate = fp16_chain(b, program.bn_mul_bits, program.output_unit, program.program).astype(np.float32)
    return (a * gate).astype(np.float16)


# --- partition ----------------------------------------------------------------------------------

def test_glu_is_one_npu_layer_and_odd_halves_stay_on_the_host() -> None:
    front, built = build(glu_model((1, 64, 4, 6)), "fp16")
    assert [(node.op_type, node.target) for node in front.graph.nodes] == [("Glu", "NPU")]
    assert [step.kind for step in built.schedule()] == ["npu"]
    front = prepare(glu_model((1, 40, 4, 6)), "rk3588", CompileOptions(precision="fp16"))
    (decision,) = front.partition.decisions
    assert decision.target == "CPU" and "20 channels per half" in decision.reason


# --- bit exactness --------------------------------------------------------------------------------

@settings(max_examples=4, deadline=None)
@given(halves=st.sampled_from([16, 32, 48]), height=st.integers(1, 5), width=st.integers(1, 9),
       centre=st.floats(-2, 2), spread=st.floats(0.2, 4), seed=st.integers(0, 2**16))
def test_int8_glu_is_bit_exact_against_the_kit(halves, height, width, centre, spread, seed) -> None:
    shape = (1, 2 * halves, height, width)
    rng = np.random.default_rng(seed)
    samples = [{"x": rng.normal(centre, spread, shape).astype(np.float32)} for _ in range(2)]
    front, built = build(glu_model(shape), "int8", samples)
    graph = front.graph
    (glu,) = [node for node in graph.nodes if node.op_type == "Glu"]  # int8 -O3 puts an identity conv before it
    assert all(node.target == "NPU" for node in graph.nodes)
    runtime = Runtime(built)
    runtime.set_input("x", rng.normal(centre, spread, shape).astype(np.float32))
    runtime.run()
    source = np.asarray(runtime.output(glu.inputs[0], dequantize=False))
    got = np.asarray(runtime.output("y", dequantize=False))
    want = int8_glu_reference(source, quant_of(graph, glu.inputs[0]), quant_of(graph, "y"))
    np.testing.assert_array_equal(got, want)


@settings(max_examples=4, deadline=None)
@given(halves=st.sampled_from([16, 32, 64]), height=st.integers(1, 5), width=st.integers(1, 9),
       spread=st.floats(0.1, 30), seed=st.integers(0, 2**16))
def test_fp16_glu_is_bit_exact_against_the_lut_chain(halves, height, width, spread, seed) -> None:
    shape = (1, 2 * halves, height, width)
    x = np.random.default_rng(seed).normal(0, spread, shape).astype(np.float16).astype(np.float32)
    front, built = build(glu_model(shape), "fp16")
    assert all(node.target == "NPU" for node in front.graph.nodes)  # an identity conv first where H*W % 4
    got = run(built, x).astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), fp16_glu_reference(x).view(np.uint16))


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_conv_fed_glu_reads_its_halves_by_address(precision) -> None:
    """After a conv the halves are views of the conv's output: the Glu is two DPU tasks (the
    vendor's exGlu less its LUT-upload task, which ours folds into the LUT task); int8 bit for
    bit against the kit on the conv's stored output, both against onnxruntime."""
    shape = (1, 64, 5, 8)
    model = glu_model(shape, conv=True)
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
    front, built = build(model, precision, samples if precision == "int8" else None)
    assert [node.op_type for node in front.graph.nodes] == ["Conv", "Glu"]
    tasks = {layer.name: sum(r.count for r in layer.tasks) for layer in built.layers()}
    assert tasks == {"conv": 1, "mul_split_0": 0, "mul_split_1": 0, "mul_sigmoid": 1, "mul": 1}
    x = rng.normal(0, 1, shape).astype(np.float32)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    if precision == "int8":
        graph = front.graph
        source = np.asarray(runtime.output("c", dequantize=False))
        want = int8_glu_reference(source, quant_of(graph, "c"), quant_of(graph, "y"))
        np.testing.assert_array_equal(np.asarray(runtime.output("y", dequantize=False)), want)
    assert cosine(np.asarray(runtime.output("y")), ort_run(model, x)) >= (0.999 if precision == "int8" else 0.9999)


# --- the vendor fixtures end to end -----------------------------------------------------------

@pytest.mark.skipif(not RKNN_FIXTURES_OPS.exists(), reason="vendor fixtures not present")
@pytest.mark.parametrize("precision, bound", [("int8", 0.999), ("fp16", 0.99999)])
def test_vendor_glu_fixture_against_onnxruntime(precision, bound) -> None:
    import onnx

    model = onnx.load(RKNN_FIXTURES_OPS / "glu_int8" / "model.onnx")
    rng = np.random.default_rng(7)
    samples = [{"x": rng.normal(0, 1, (1, 256, 20, 20)).astype(np.float32)} for _ in range(2)]
    _, built = build(model, precision, samples if precision == "int8" else None)
    x = rng.normal(0, 1, (1, 256, 20, 20)).astype(np.float32)
    got, want = run(built, x), ort_run(model, x)
    assert cosine(got, want) >= bound
    assert cosine(reference_glu(x), want) >= 0.999999
