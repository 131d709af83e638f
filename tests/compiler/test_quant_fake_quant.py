"""Fake quant (compiler/quant/fake_quant.py) against integer arithmetic.

One int8 convolution is computed three ways: the compiler's fake quant (float), an integer
reference with the *exact* requantization factor (Python fractions), and an integer
reference with the registers the compiler derives (quant_regs: per-channel BS MUL with shift
14, OUT_CVT scale/shift, rounded as NUMERICS.md sections 1 and 4 say). Fake quant equals the
exact integer path, and the register path differs from it by at most one LSB, only where the
fixed-point factor moves a value across a rounding boundary. Then checks that the compiler's
roundings agree with the emulator's (tests may import both), and, where fake quant stops (the
realised registers), that the built model's output is the testing kit's independent reference
(reference_model) bit for bit.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from onnx import helper

from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.ir import FusedOp
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.quant.affine import Range, quantize, round_to_float16
from npuemu.compiler.quant.fake_quant import fake_quant_evaluate
from npuemu.compiler.quant.quantize import bias_values, float16_graph, quantize_graph, stored_values
from npuemu.compiler.quant.roles import BIAS, constant_roles
from npuemu.compiler.quant_regs import conv_requant
from npuemu.tools import testing


def round_shift(value: int, shift: int, mode: str) -> int:
    """Python-integer ``value / 2^shift`` rounded half away or half even (NUMERICS.md 1)."""
    if shift <= 0:
        return value
    floor, remainder = value >> shift, value & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if remainder > half or (remainder == half and (mode == "away" and value > 0 or mode == "even" and floor & 1)):
        return floor + 1
    return floor


def round_fraction(value: Fraction) -> int:
    """Nearest integer, ties to even (OUT_CVT CVT_ROUND = 0)."""
    floor = value.numerator // value.denominator
    rest = value - floor
    return floor + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2) else 0)


def padded(x_q: np.ndarray, zp_in: int, pad: int) -> np.ndarray:
    return np.pad(x_q.astype(np.int64), [(0, 0), (0, 0), (pad, pad), (pad, pad)], constant_values=zp_in)[0]


def correlate(planes: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum over c, ky, kx of w[o, c, ky, kx] * planes[c, y + ky, x + kx]``, exact in int64."""
    out_c, _, kh, kw = w.shape
    height, width = planes.shape[1] - kh + 1, planes.shape[2] - kw + 1
    result = np.zeros((out_c, height, width), dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            result += np.einsum("oc,chw->ohw", w[:, :, ky, kx].astype(np.int64), planes[:, ky:ky + height, kx:kx + width])
    return result


def accumulators(x_q: np.ndarray, w_q: np.ndarray, zp_in: int, zp_w: np.ndarray, pad: int) -> np.ndarray:
    """The ideal accumulator ``sum((w_q - zp_w)(x_q - zp_in))`` (padding holds zp_in, i.e. 0)."""
    return correlate(padded(x_q, zp_in, pad) - zp_in, w_q.astype(np.int64) - zp_w[:, None, None, None])


def register_path(x_q: np.ndarray, w_q: np.ndarray, regs, zp_in: int, pad: int) -> np.ndarray:
    """The DPU as NUMERICS.md 3.4, 4.1 and 4.5 state it, on the hardware's own terms: the raw MAC
    sum of w_q * x_q (padding at zp_in), + CPEND * window sum + ALU, * MUL >> 14 (half away),
    * OUT_CVT SCALE >> SHIFT (half even) + OFFSET, saturated to int8."""
    planes = padded(x_q, zp_in, pad)
    raw = correlate(planes, w_q)
    windows = correlate(planes, np.ones((1,) + w_q.shape[1:], dtype=np.int64))[0]
    out = np.zeros(raw.shape, dtype=np.int64)
    for index in np.ndindex(*raw.shape):
        channel = index[0]
        value = int(raw[index]) + int(regs.cpend[channel]) * int(windows[index[1:]]) + int(regs.alu[channel])
        value = round_shift(value * int(regs.mul[channel]), regs.mul_shift, "away")
        value = round_shift(value * regs.out_cvt.scale, regs.out_cvt.shift, "even") + regs.out_offset
        out[index] = min(max(value, -128), 127)
    return out


def conv_graph(onnx_case, relu: bool):
    """A 16 -> 8 channel 3x3 conv with padding; with ``relu``, a fused Relu (one output)."""
    rng = np.random.default_rng(21)
    w = (rng.normal(0, 0.2, (8, 16, 3, 3)) * rng.uniform(0.5, 2, (8, 1, 1, 1))).astype(np.float32)
    b = rng.normal(0, 0.3, 8).astype(np.float32)
    graph = import_onnx(onnx_case.model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                                        {"x": [1, 16, 12, 12]}, ["y"], {"w": w, "b": b}))
    if relu:
        graph.nodes[0].fused.append(FusedOp("Relu"))
    return graph


@pytest.mark.parametrize("relu", [False, True])
def test_conv_fake_quant_matches_integer_arithmetic(onnx_case, relu):
    graph = conv_graph(onnx_case, relu)
    x = np.random.default_rng(5).uniform(-1.3, 2.1, (1, 16, 12, 12)).astype(np.float32)
    out = evaluate(graph, {"x": x})["y"]
    ranges = {"x": Range(-1.3, 2.1), "y": Range(float(out.min()), float(out.max()))}
    quantize_graph(graph, ranges)
    node = graph.nodes[0]
    s_in, zp_in = float(graph.tensors["x"].quant.scale), int(graph.tensors["x"].quant.zero_point)
    w_quant, y_quant = graph.tensors["w"].quant, graph.tensors["y"].quant
    s_out, zp_out = float(y_quant.scale), int(y_quant.zero_point)

    simulated = fake_quant_evaluate(graph, {"x": x})["y"]
    q_simulated = np.rint(simulated.astype(np.float64) / s_out).astype(np.int64) + zp_out

    x_q = quantize(x, s_in, zp_in)
    w_q = stored_values(graph.tensors["w"]).astype(np.int64)
    zp_w = w_quant.zero_point.astype(np.int64)
    bias_role = next(role for role in constant_roles(graph, node) if role.kind == BIAS)
    acc = accumulators(x_q, w_q, zp_in, zp_w, pad=1) + bias_values(graph, node, bias_role)[:, None, None]

    # integer path with the exact factor s_in s_w[c] / s_out (float32 parameters as exact rationals)
    factors = [Fraction(s_in) * Fraction(float(s)) / Fraction(s_out) for s in w_quant.scale]
    exact = np.array([[[min(max(round_fraction(int(v) * factors[c]) + zp_out, -128), 127) for v in row]
                       for row in acc[c]] for c in range(acc.shape[0])])
    assert np.array_equal(exact, q_simulated[0])

    # integer path with the registers quant_regs derives (fixed-point factor)
    regs = conv_requant(input_scale=s_in, input_zero_point=zp_in, weights=w_q, weight_scale=w_quant.scale,
                        weight_zero_point=zp_w, bias=graph.tensors["b"].data, output_scale=s_out,
                        output_zero_point=zp_out)
    hardware = register_path(x_q, w_q, regs, zp_in, pad=1)
    difference = np.abs(hardware - q_simulated[0])
    assert difference.max() <= 1
    assert np.mean(difference == 0) >= 0.99
    if relu:
        assert hardware.min() == -128 == zp_out  # ReLU by saturation at the output zero point
    # every disagreement sits where the fixed-point factor crosses a rounding boundary: the
    # exact value is within (realised/ideal - 1) * |value| of a half-integer
    realised = regs.realised_factor()
    for index in zip(*np.nonzero(difference)):
        channel = index[0]
        ideal_value = int(acc[index]) * factors[channel]
        distance = abs(float(ideal_value) - (np.floor(float(ideal_value)) + 0.5))
        assert distance <= abs(realised[channel] / float(factors[channel]) - 1) * abs(float(ideal_value)) + 1.0


def test_float16_mode_simulates_storage_rounding(onnx_case):
    graph = conv_graph(onnx_case, relu=False)
    x = np.random.default_rng(8).normal(0, 3, (1, 16, 12, 12)).astype(np.float32)
    w, b = graph.tensors["w"].data, graph.tensors["b"].data
    float16_graph(graph)
    simulated = fake_quant_evaluate(graph, {"x": x})["y"]
    x16, w16 = x.astype(np.float16).astype(np.float64), w.astype(np.float16).astype(np.float64)
    padded = np.pad(x16, [(0, 0), (0, 0), (1, 1), (1, 1)])
    expected = np.zeros((8, 12, 12))
    for ky in range(3):
        for kx in range(3):
            expected += np.einsum("oc,chw->ohw", w16[:, :, ky, kx], padded[0, :, ky:ky + 12, kx:kx + 12])
    expected = (expected + b[:, None, None]).astype(np.float32).astype(np.float16)
    assert np.array_equal(simulated[0].astype(np.float16), expected)
    assert not np.array_equal(simulated, evaluate(graph, {"x": x})["y"])  # the rounding is visible


# ---- agreement with the emulator's numerics (NUMERICS.md 1, 4.5, 7) ---------------------------

def test_fp16_storage_matches_the_emulator_conversion():
    from npuemu.emulator import numerics

    rng = np.random.default_rng(3)
    values = np.concatenate([rng.normal(0, 10, 2000), rng.normal(0, 1e-5, 500), [65504, 65519.9, 65520, 1e6, -7e-8],
                             1 + (np.arange(20) + 0.5) * 2.0 ** -10]).astype(np.float32)
    ours = round_to_float16(values).astype(np.float16).view(np.uint16)
    theirs = np.array([numerics.fp32_bits_to_fp16_bits(int(bits)) for bits in values.view(np.uint32)], dtype=np.uint16)
    assert np.array_equal(ours, theirs)


def test_activation_rounding_is_the_out_cvt_default():
    from npuemu.emulator import numerics

    assert numerics.out_cvt_round_mode(0) == numerics.ROUND_HALF_EVEN
    odd = np.arange(-41, 41, 2)  # v / 2 is a tie for every odd v
    ours = quantize(odd / 2.0, 1.0, 0, qrange=(-1000, 1000))
    theirs = [numerics.rshift_round(int(v), 1, numerics.out_cvt_round_mode(0)) for v in odd]
    assert ours.tolist() == theirs
    constants = quantize(odd / 2.0, 1.0, 0, qrange=(-1000, 1000), half_even=False)
    assert constants.tolist() == [numerics.rshift_round(int(v), 1, numerics.ROUND_HALF_AWAY) for v in odd]


# --- the exact int8 network: the testing kit's reference on the built model ---------------------
# (tools/testing_reference.reference_model, written from NUMERICS.md; QUANTIZATION.md 7.1)

def _run_both(graph, inputs):
    """(emulator output, the kit's reference) of the graph's first output, both stored int8."""
    from npuemu.compiler.build import build_model
    from npuemu.emulator.runtime import Runtime
    from npuemu.tools.testing_reference import reference_model

    model = build_model(graph)
    runtime = Runtime(model)
    for name, value in inputs.items():
        runtime.set_input(name, value)
    runtime.run()
    output = graph.outputs[0]
    got = runtime.output(output, dequantize=False)
    return got, reference_model(graph, model, inputs)[output].reshape(got.shape)


@pytest.mark.parametrize("activation", ["LeakyRelu", "Clip", "Tanh", "HardSwish", "Sigmoid+Add", "Add+Sigmoid",
                                        "Sigmoid", "MaxPool", "Mul"])
def test_the_reference_of_the_built_model_is_the_emulator_bit_for_bit(activation):
    """Fused and standalone activations (LUT and BN paths), a residual after a LUT activation
    and one before it (the conv with its Add, then a standalone LUT layer), a host step (Max),
    pooling and an element-wise Mul."""
    from onnx import TensorProto, numpy_helper

    from npuemu.compiler.passes import PassContext, optimize
    from npuemu.compiler.quant import calibrate

    rng = np.random.default_rng(7)
    shape = [1, 8, 6, 6]
    weight = numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.normal(0, 0.2, 8).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
    constants = [weight, bias]
    first, *rest = activation.split("+")
    if activation == "Sigmoid":  # standalone: after a max so nothing fuses it
        nodes += [helper.make_node("Max", ["c", "x"], ["m"]), helper.make_node("Sigmoid", ["m"], ["y"])]
    elif activation == "MaxPool":
        nodes.append(helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    elif activation == "Mul":
        nodes.append(helper.make_node("Mul", ["c", "x"], ["y"]))
    elif activation == "Clip":
        constants += [numpy_helper.from_array(np.float32(-0.5), "lo"), numpy_helper.from_array(np.float32(1.5), "hi")]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    elif not rest:
        nodes.append(helper.make_node(first, ["c"], ["y"]))
    else:
        middle = "a"
        nodes.append(helper.make_node(first, ["c", "x"] if first == "Add" else ["c"], [middle]))
        nodes.append(helper.make_node(rest[0], [middle, "x"] if rest[0] == "Add" else [middle], ["y"]))
    graph_proto = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], constants)
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    graph = import_onnx(model)
    optimize(graph, PassContext.for_chip("rk3588", 3))
    samples = [{"x": rng.normal(0.2, 1.0, shape).astype(np.float32)} for _ in range(3)]
    quantize_graph(graph, calibrate(graph, samples, "normal", progress=False).ranges)
    got, predicted = _run_both(graph, {"x": rng.normal(0.2, 1.0, shape).astype(np.float32)})
    assert np.array_equal(got, predicted)
    plain = fake_quant_evaluate(graph, {"x": samples[0]["x"]})["y"]  # the float mode still runs on the same graph
    assert plain.shape == predicted.shape


@settings(max_examples=25, deadline=None, derandomize=True)
@given(testing.layer_configs("rk3588"))
def test_the_reference_of_the_built_model_covers_generated_layers(config):
    """The testing kit's generated conv / depthwise / FC / pool / element-wise layers."""
    graph = testing.quantize_layer(config)
    rng = np.random.default_rng(config.seed)
    inputs = {name: rng.normal(0.0, 1.0, graph.tensors[name].shape).astype(np.float32) for name in graph.inputs}
    got, predicted = _run_both(graph, inputs)
    assert np.array_equal(got, predicted)
