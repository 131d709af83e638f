"""LUT activations (compiler/lower/lut.py): the programs the compiler writes, checked through an
independent evaluation of the DPU arithmetic (tests/emulator/reference, NUMERICS.md 4.2, 4.5,
5) against the float function; the registers against the vendor's rep10; and whole layers on
the emulator against exact float rounding (standalone, every int8 input) and fake-quant
(fused into convolutions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.lower import lut
from npuemu.emulator.runtime import Runtime
from npuemu.isa.chain import decode_chain
from npuemu.isa.regmap_loader import load_regmap
from tests.compiler.test_build_e2e import compare
from tests.emulator.reference.arithmetic import INT8, lut as reference_lut
from tests.emulator.reference.arithmetic import clamp, round_shift

KINDS = tuple(kind for kind in lut.LUT_KINDS if kind != "rsqrt")  # 1/sqrt's own table span: test_rsqrt_npu.py


def float_function(kind: str, alpha=None, beta=None):
    """The activations written out again from their ONNX definitions (not lut.lut_function)."""
    def one(x: float) -> float:
        if kind == "sigmoid":
            return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0
        if kind == "tanh":
            return math.tanh(x)
        if kind == "hard_sigmoid":
            return max(0.0, min(1.0, (0.2 if alpha is None else alpha) * x + (0.5 if beta is None else beta)))
        if kind == "hard_swish":
            return x * max(0.0, min(1.0, x / 6.0 + 0.5))
        if kind == "silu":
            return x / (1.0 + math.exp(-x)) if x > -700 else 0.0
        if kind == "elu":
            return x if x >= 0 else (1.0 if alpha is None else alpha) * (math.exp(x) - 1.0)
        if kind == "gelu":
            return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))
        if kind == "softplus":
            return math.log1p(math.exp(-abs(x))) + max(x, 0.0)
        raise AssertionError(kind)
    return one


def lut_config(program: lut.LutProgram) -> dict:
    le = (program.le_start, program.le_end, program.index_select, 0, 0, 0, 0)
    lo = (program.lo_start, program.lo_end, program.index_select, 0, 0, 0, 0)
    return {"le": le, "lo": lo, "hybrid_priority": 1, "oflow_priority": 1, "uflow_priority": 0}


def evaluate(program, to_lut, out_cvt, zero_point: int, values: list[int], bn_alu: int = 0) -> list[int]:
    """BN (mul, alu, shift half-away) -> LUT -> OUT_CVT (half-even, CVT_ROUND 0) per element."""
    config = lut_config(program)
    out = []
    for v in values:
        x = round_shift(v * to_lut.scale + bn_alu, to_lut.shift, "half_away")
        y = reference_lut(x, program.le.tolist(), program.lo.tolist(), config)
        out.append(clamp(round_shift(y * out_cvt.scale, out_cvt.shift, "half_even") + zero_point, INT8))
    return out


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(KINDS), scale=st.floats(0.002, 0.2), zero_point=st.integers(-128, 127),
       unit_exp=st.floats(-5.0, -1.0), alpha=st.floats(0.05, 2.0), beta=st.floats(0.0, 1.0))
def test_lut_program_computes_the_activation(kind, scale, zero_point, unit_exp, alpha, beta) -> None:
    """Over the whole input range a stage can deliver, the programmed BN -> LUT -> OUT_CVT is the
    activation rounded to the output grid, within 1 LSB, and exact for almost every input."""
    alpha = alpha if kind in ("elu", "hard_sigmoid") else None
    beta = beta if kind == "hard_sigmoid" else None
    input_unit = 10.0 ** unit_exp
    program, to_lut, out_cvt = lut.lut_program(kind, input_unit=input_unit, output_scale=scale,
                                               output_zero_point=zero_point, alpha=alpha, beta=beta)
    assert program.le.shape == program.lo.shape == (513,)
    f = float_function(kind, alpha, beta)
    span = max(3.0 * program.domain, 10.0 * scale)
    reals = np.concatenate([np.linspace(-span, span, 1500), [-1e4, 1e4]])
    values = [int(round(r / input_unit)) for r in reals]
    got = np.array(evaluate(program, to_lut, out_cvt, zero_point, values))
    ideal = np.array([f(v * input_unit) / scale for v in values])
    want = np.clip(np.rint(ideal) + zero_point, *INT8)
    error = np.abs(got - want)
    assert error.max() <= 1, (kind, int(np.argmax(error)), reals[int(np.argmax(error))])
    # away from rounding ties (the table's end values and entries are within 1/64 of a step,
    # so a tie can go either way) the result is the exactly rounded function
    clear = np.abs(ideal - np.floor(ideal) - 0.5) > 1 / 32
    assert np.mean(error[clear] == 0) >= 0.97, np.mean(error[clear] == 0)


def test_out_of_range_stage_values_saturate_like_the_function() -> None:
    program, to_lut, out_cvt = lut.lut_program("sigmoid", input_unit=1e-3, output_scale=1 / 255,
                                               output_zero_point=-128)
    low, high = evaluate(program, to_lut, out_cvt, -128, [-(2**30), 2**30])
    assert (low, high) == (-128, 127)


def _sigmoid_conv_model(height: int = 6):
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Sigmoid", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, height, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), (1, 4, height, 8)


def test_conv_with_sigmoid_programs_the_lut_as_rep10(tmp_path) -> None:
    """The body's LUT registers carry rep10's constants (vendor-corpus
    regcmd/rep10_sigmoid_64_56.txt words 1146-1151: LUT_CFG 0x68, LUT_INFO 0x50500, LE
    [-16384, 0], LO [0, 16384]) and the first task uploads 2 x 513 entries after the body."""
    from npuemu.compiler.driver import build
    from tests.compiler.test_build_e2e import compile_front

    model, shape = _sigmoid_conv_model()
    built = build(compile_front(model, shape))
    regmap = load_regmap("rk3588")
    section = built.section("regcmd")
    step = built.schedule()[0]
    decoded = decode_chain(section.data, regmap, section.load_address, section.load_address + step.chain.offset,
                           step.chain.first_amount)
    writes = [(w.block, w.register, w.value) for w in decoded.chain.tasks[0].writes]
    values = {(block, register): value for block, register, value in writes}
    assert values[("DPU", "LUT_CFG")] == 0x68 and values[("DPU", "LUT_INFO")] == 0x50500
    assert values[("DPU", "LUT_LE_START")] == 0xFFFFC000 and values[("DPU", "LUT_LE_END")] == 0
    assert values[("DPU", "LUT_LO_START")] == 0 and values[("DPU", "LUT_LO_END")] == 0x4000
    data = [v for block, register, v in writes if register == "LUT_ACCESS_DATA" and v]
    configs = [v for block, register, v in writes if register == "LUT_ACCESS_CFG" and v]
    assert configs == [0x20000, 0x30000] and len(data) >= 1000
    assert values[("DPU", "EW_CFG")] & (1 << 7) == 0, "EW_LUT_BYPASS must be 0"


@pytest.mark.parametrize("kind", ["Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Softplus", "Gelu"])
def test_standalone_activation_on_every_int8_input(kind) -> None:
    """A standalone activation layer (DPU-only task, rep10's shape) over all 256 stored input
    values: the emulator's output is f(input) rounded to the output grid, within 1 LSB."""
    from npuemu.compiler.driver import CompileOptions, build, prepare

    shape = (1, 16, 4, 4)
    attrs = {"alpha": 0.3, "beta": 0.4} if kind == "HardSigmoid" else {"alpha": 0.8} if kind == "Elu" else {}
    graph_proto = helper.make_graph(
        [helper.make_node(kind, ["x"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 20)])
    rng = np.random.default_rng(5)
    samples = [{"x": rng.uniform(-7, 5, shape).astype(np.float32)} for _ in range(3)]
    front = prepare(model, "rk3588", CompileOptions(dataset=samples))
    assert [node.target for node in front.graph.nodes] == ["NPU"]
    runtime = Runtime(build(front))
    stored = np.arange(-128, 128, dtype=np.int8).reshape(shape)
    runtime.set_input("x", stored)
    runtime.run()
    got = runtime.output("y", dequantize=False).astype(np.int64)
    s_in, zp_in = runtime.quantization("x")
    s_out, zp_out = runtime.quantization("y")
    f = float_function({"HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish"}.get(kind, kind.lower()),
                       attrs.get("alpha"), attrs.get("beta"))
    ideal = np.array([f(s_in * (q - zp_in)) / s_out for q in stored.ravel().tolist()])
    error = np.abs(got.ravel() - np.clip(np.rint(ideal) + zp_out, *INT8))
    clear = np.abs(ideal - np.floor(ideal) - 0.5) > 1 / 32  # not at a rounding tie (Tanh's +-1 lands on one)
    assert error.max() <= 1 and np.mean(error[clear] == 0) >= 0.97, (error.max(), np.mean(error[clear] == 0))


def _fused(kind: str):
    """conv -> conv + kind (SiLU as x * Sigmoid(x), the exported form the compiler fuses)."""
    def make():
        rng = np.random.default_rng(7)
        w1 = numpy_helper.from_array(rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32), "w1")
        w2 = numpy_helper.from_array(rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "w2")
        b2 = numpy_helper.from_array(rng.normal(0, 0.3, (8,)).astype(np.float32), "b2")
        nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
                 helper.make_node("Conv", ["a", "w2", "b2"], ["b"], pads=[1, 1, 1, 1])]
        if kind == "Silu":
            nodes += [helper.make_node("Sigmoid", ["b"], ["g"]), helper.make_node("Mul", ["b", "g"], ["y"])]
        else:
            nodes.append(helper.make_node(kind, ["b"], ["y"]))
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 12])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, w2, b2])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), (1, 3, 10, 12)
    return make


@pytest.mark.parametrize("kind", ["Silu", "Elu", "Gelu", "Softplus"])
def test_conv_fused_lut_activation_matches_fake_quant(kind, tmp_path) -> None:
    model, shape = _fused(kind)()
    within, cos, stored, graph = compare(model, shape, tmp_path / "m.npu")
    fused = [part.op_type for node in graph.nodes for part in node.fused]
    if kind in ("Silu", "Elu"):  # the fusion rules take these into the conv; Gelu/Softplus stay layers
        assert fused, [node.op_type for node in graph.nodes]
    assert all(node.target == "NPU" for node in graph.nodes)
    assert within >= 0.98, f"{kind}: only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.999, f"{kind}: cosine {cos:.5f} against onnxruntime float"


def test_fp16_layer_with_a_lut_activation_and_fused_residual_is_refused_by_name() -> None:
    """fp16 LUT activations are lowered (test_lower_lut_fp16.py); with a residual Add in the same
    task they are not (the EW multiplier scales the LUT's result; build_adapt splits the Add)."""
    from npuemu.compiler.lower import Activation, ConvLayer, Residual
    from npuemu.compiler.lower.lower_conv import conv_constants, conv_stages
    from npuemu.isa.errors import CompileError
    from npuemu.platforms import load_platform

    layer = ConvLayer("half", "x", "y", (4, 5, 5), np.zeros((8, 4, 3, 3), np.float16), dtype="float16",
                      activation=Activation("sigmoid"), residual=Residual("r", None, after_activation=True))
    with pytest.raises(CompileError, match="half.*sigmoid.*residual"):
        conv_stages(layer, conv_constants(layer, load_platform("rk3588")))
    plain = ConvLayer("half", "x", "y", (4, 5, 5), np.zeros((8, 4, 3, 3), np.float16), dtype="float16",
                      activation=Activation("sigmoid"))
    assert conv_stages(plain, conv_constants(plain, load_platform("rk3588"))).lut is not None


def test_unknown_lut_kind_is_an_error() -> None:
    from npuemu.isa.errors import CompileError

    with pytest.raises(CompileError, match="unknown LUT activation 'cube'"):
        lut.lut_function("cube")
