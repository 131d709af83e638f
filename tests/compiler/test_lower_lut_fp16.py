"""float16 LUT activations on the NPU (compiler/lower/lut.py lut_fp16_program,
lower_conv.lut_stages_fp16): the tables against the vendor's words (rknn-fixtures-ops), whole
fp16 builds on the emulator against the reference written from NUMERICS.md 5.1
(tests/emulator/reference/lut_fp16.py) bit for bit, and against onnxruntime float."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler import op_table
from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.lower import lut
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine
from tests.emulator.reference.lut_fp16 import fp16_chain
from tests.shared_data import RKNN_FIXTURES_OPS

FIXTURES = RKNN_FIXTURES_OPS
ONNX_KINDS = {op: kind for op, kind in op_table.onnx_lut_kinds().items()  # every LUT activation of the op table
              if op != "Rsqrt"}  # but 1/sqrt, no ONNX op and pieces of its own (test_rsqrt_npu.py)
ATTRS = {"HardSigmoid": {"alpha": 0.3, "beta": 0.4}, "Elu": {"alpha": 0.8}}


def _vendor_words(fixture: str) -> tuple[list[list[int]], dict[str, int]]:
    """The two uploaded tables (int16) and the first LUT layer's BN_MUL / LO slope registers."""
    text = (FIXTURES / fixture / "regcmd.txt").read_text()
    tables: list[list[int]] = []
    for line in text.splitlines():
        if "LUT_ACCESS_CFG" in line and "LUT_ACCESS_TYPE=1" in line:
            tables.append([])
        elif "LUT_ACCESS_DATA" in line and tables and len(tables[-1]) < 513:
            word = int(line.split("=")[1].split(";")[0], 16) & 0xFFFF
            tables[-1].append(word - 0x10000 if word >= 0x8000 else word)
    regs: dict[str, int] = {}
    body = text[text.index("EW_LUT_BYPASS=0") - 3000:]  # the conv task whose EW stage runs the LUT
    regs["bn_mul"] = int(re.search(r"BN_MUL_OPERAND=(\d+)", body).group(1))
    regs["oflow_scale"] = int(re.search(r"LUT_LO_SLOPE_SCALE\s+= 0x\w+\s+; OFLOW_SCALE=(\d+)", body).group(1))
    return tables[:2], regs


@pytest.mark.skipif(not FIXTURES.exists(), reason="vendor fixtures not present")
@pytest.mark.parametrize("fixture, kind, differing", [
    ("conv_hardswish_fp16", "hard_swish", {("LO", 422)}),  # f/t = 24633.498, the vendor wrote 24634
    ("conv_silu_add_fp16", "silu", set()),
    ("gelu_fp16", "gelu", {("LE", 0)}),  # the vendor wrote -1 where f/t = -76.8
])
def test_fp16_tables_reproduce_the_vendor_words(fixture, kind, differing) -> None:
    (le, lo), regs = _vendor_words(fixture)
    program = lut.lut_fp16_program(kind)
    found = {("LE", i) for i in np.nonzero(program.program.le.astype(int) != le)[0]} | \
        {("LO", i) for i in np.nonzero(program.program.lo.astype(int) != lo)[0]}
    assert found == differing
    assert program.bn_mul_bits == regs["bn_mul"]
    assert program.program.lo_oflow_scale == regs["oflow_scale"] and program.program.lo_oflow_shift == 13


def _run(model, x: np.ndarray):
    graph = prepare(model, "rk3588", CompileOptions(precision="fp16")).graph
    built = build_graph(graph)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return graph, built, runtime.output(graph.outputs[0])


def _model(nodes, shape, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _activation_nodes(kind: str, source: str) -> list:
    if kind == "Silu":  # the exported form x * Sigmoid(x) the compiler fuses
        return [helper.make_node("Sigmoid", [source], ["g"]), helper.make_node("Mul", [source, "g"], ["y"])]
    return [helper.make_node(kind, [source], ["y"], **ATTRS.get(kind, {}))]


def _expected(kind: str, values: np.ndarray, bias: float = 0.0) -> np.ndarray:
    attrs = ATTRS.get(kind, {})
    program = lut.lut_fp16_program(ONNX_KINDS[kind], attrs.get("alpha"), attrs.get("beta"))
    return fp16_chain(values, program.bn_mul_bits, program.output_unit, program.program, bias)


def _all_fp16_values(channels: int = 16) -> np.ndarray:
    """Every finite fp16 value (and the two infinities) as a [1, C, H, W] cube."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(np.float16)
    values = values[~np.isnan(values)]
    values = np.concatenate([values, np.zeros((-values.size) % (channels * 32), np.float16)])
    return values.reshape(1, channels, 32, -1).astype(np.float32)


@pytest.mark.parametrize("kind", list(ONNX_KINDS))
def test_standalone_fp16_activation_on_every_fp16_input(kind) -> None:
    """A standalone activation (one DPU-only task) over every fp16 value: bit for bit the
    reference chain; onnxruntime float on normal inputs within cosine 0.9999."""
    x = _all_fp16_values()
    model = _model(_activation_nodes(kind, "x"), x.shape)
    graph, built, got = _run(model, x)
    assert [node.target for node in graph.nodes] == ["NPU"] and [s.kind for s in built.schedule()] == ["npu"]
    want = _expected(kind, x)
    np.testing.assert_array_equal(got.astype(np.float16).view(np.uint16), want.view(np.uint16))
    normal = np.random.default_rng(3).normal(0, 3, (1, 8, 6, 10)).astype(np.float16).astype(np.float32)
    _, _, got = _run(_model(_activation_nodes(kind, "x"), normal.shape), normal)
    reference = ort.InferenceSession(_model(_activation_nodes(kind, "x"), normal.shape).SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, {"x": normal})[0]
    assert cosine(got, reference) >= 0.9999


@pytest.mark.parametrize("kind", list(ONNX_KINDS))
def test_fp16_activation_after_an_identity_conv_is_bit_exact(kind) -> None:
    """conv (1x1 identity, bias b) -> activation: fused into the conv's DPU stage where the
    fusion rules take it, else a DPU layer; either way the fp32 value the DPU sees is x + b, so
    the output is the reference chain bit for bit."""
    channels = 16
    weights = numpy_helper.from_array(np.eye(channels, dtype=np.float32).reshape(channels, channels, 1, 1), "w")
    bias_value = 0.375  # exact in fp16 and fp32
    bias = numpy_helper.from_array(np.full(channels, bias_value, np.float32), "b")
    x = np.random.default_rng(4).normal(0, 4, (1, channels, 8, 12)).astype(np.float16).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), *_activation_nodes(kind, "c")]
    graph, built, got = _run(_model(nodes, x.shape, (weights, bias)), x)
    assert all(node.target == "NPU" for node in graph.nodes) and [s.kind for s in built.schedule()] == ["npu"]
    fused = any(node.fused for node in graph.nodes)
    want = _expected(kind, x, bias_value) if fused else _expected(kind, (x + bias_value).astype(np.float16))
    np.testing.assert_array_equal(got.astype(np.float16).view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("kind", list(ONNX_KINDS))
def test_fp16_conv_with_activation_matches_onnxruntime(kind) -> None:
    """Two real convs, the second with the activation (fused where the rules fuse it)."""
    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "w2")
    b2 = numpy_helper.from_array(rng.normal(0, 0.3, (8,)).astype(np.float32), "b2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2", "b2"], ["b"], pads=[1, 1, 1, 1]), *_activation_nodes(kind, "b")]
    model = _model(nodes, (1, 3, 10, 12), (w1, w2, b2))
    x = rng.normal(size=(1, 3, 10, 12)).astype(np.float32)
    graph, built, got = _run(model, x)
    assert [s.kind for s in built.schedule()] == ["npu"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert cosine(got, want) >= 0.9999


def test_fp16_conv_silu_residual_add_runs_the_add_as_its_own_layer() -> None:
    """conv + SiLU + residual Add (the vendor's conv_silu_add_fp16: ConvExSwish, then an Add
    layer): two NPU layers, no host step."""
    rng = np.random.default_rng(9)
    w = numpy_helper.from_array(rng.normal(0, 0.2, (16, 16, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.3, (16,)).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["g"]), helper.make_node("Mul", ["c", "g"], ["s"]),
             helper.make_node("Add", ["s", "x"], ["y"])]
    model = _model(nodes, (1, 16, 9, 11), (w, b))
    x = rng.normal(size=(1, 16, 9, 11)).astype(np.float32)
    graph, built, got = _run(model, x)
    assert [s.kind for s in built.schedule()] == ["npu"]
    assert [layer.name for layer in built.layers()] == ["Conv_0_fuse_silu", "Add_3"], built.layers()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert cosine(got, want) >= 0.9999


@pytest.mark.parametrize("kind", list(ONNX_KINDS.values()))
def test_fp16_program_is_within_fp16_of_the_function(kind) -> None:
    """Table plus interpolation plus tails, evaluated through the reference chain, against the
    float function on [-12, 12]: within 1e-3 of max(1, |f|) (fp16 steps); SiLU and Gelu within
    2e-2 and 7e-3: below -X the vendor's flat underflow holds f(-X) = -0.0175 / -0.0066 where
    the function goes to 0."""
    program = lut.lut_fp16_program(kind)
    xs = np.linspace(-12, 12, 2001).astype(np.float16).astype(np.float32)
    got = fp16_chain(xs, program.bn_mul_bits, program.output_unit, program.program).astype(np.float64)
    f = lut.lut_function(kind)(xs.astype(np.float64))
    bound = {"silu": 2e-2, "gelu": 7e-3}.get(kind, 1e-3)
    assert np.max(np.abs(got - f) / np.maximum(1.0, np.abs(f))) <= bound


def test_fp16_lut_task_is_timed_like_the_int8_lut() -> None:
    """Timing (emulator/timing, unchanged): the LUT costs what it costs in int8 tasks - its
    upload's 1026 LUT_ACCESS_DATA words in the task's regcmd fetch, and a DPU-only task's unit
    cycles from its cube's bytes (2 per fp16 element at 16 bytes a cycle)."""
    from npuemu.emulator.timing.report import report_npu
    from npuemu.platforms import load_platform

    x = np.zeros((1, 32, 20, 20), np.float32)
    graph = prepare(_model(_activation_nodes("Sigmoid", "x"), x.shape), "rk3588",
                    CompileOptions(precision="fp16")).graph
    built = build_graph(graph)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    report = report_npu(built, runtime.runs, load_platform("rk3588"))
    [layer] = report.layers
    [task] = layer.tasks
    assert task.regcmd_bytes >= (2 * 513 + 69) * 8  # upload words + the DPU-only body, 8 bytes each
    assert task.unit_cycles == 32 * 20 * 20 * 2 // 16
