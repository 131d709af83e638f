"""DataConvert on the NPU (LOWERING.md 26): one DPU task per int8 <-> fp16 conversion, run on the
emulator's machine and compared bit for bit with a numpy model of the registers written here
from emulator/NUMERICS.md 26 (not the emulator's code), and within one step of the ideal
conversion (fp16(s (q - zp)), round(x / s) + zp)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.compiler.lower import Quant, feature_bytes, lower_layer
from npuemu.compiler.lower.lower_convert import ConvertLayer, convert_stages
from npuemu.compiler.memory_plan import TensorLifetime, plan_memory, regcmd_bytes
from npuemu.emulator.machine import Machine
from npuemu.isa.chain import encode_chain
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain
from npuemu.platforms import load_platform

PLATFORM = load_platform("rk3588")
REGMAP = load_regmap("rk3588")
NUMPY = {"int8": np.int8, "float16": np.float16}


def _native(x: np.ndarray, placement) -> np.ndarray:
    """[C][H][W] -> NC1HWC2 bytes of ``placement`` (its dtype, C2 lanes, surface stride)."""
    buf = np.zeros(placement.size // np.dtype(NUMPY[placement.dtype]).itemsize, NUMPY[placement.dtype])
    channels, height, width = x.shape
    pixels = (np.arange(height)[:, None] * width + np.arange(width)[None, :]) * placement.c2
    for c in range(channels):
        group, lane = divmod(c, placement.c2)
        buf[group * placement.surface_stride * placement.c2 + pixels + lane] = x[c]
    return buf


def _from_native(raw: np.ndarray, placement) -> np.ndarray:
    channels, height, width = placement.shape
    pixels = (np.arange(height)[:, None] * width + np.arange(width)[None, :]) * placement.c2
    return np.stack([raw[(c // placement.c2) * placement.surface_stride * placement.c2 + pixels + c % placement.c2]
                     for c in range(channels)])


def run_convert(layer: ConvertLayer, x: np.ndarray) -> np.ndarray:
    """The layer's task on the rk3588 machine: x stored as the input, the output read back."""
    dtypes = {layer.input: layer.source_dtype, layer.output: layer.to}
    lifetimes = [TensorLifetime(name, feature_bytes(layer.shape, dtype, PLATFORM),
                                kind="output" if name == layer.output else "input") for name, dtype in dtypes.items()]

    def lower(plan):
        placements = {name: plan.feature(name, layer.shape, dtype, PLATFORM) for name, dtype in dtypes.items()}
        return placements, lower_layer(layer, placements, PLATFORM, REGMAP)

    _, first = lower(plan_memory({}, lifetimes))
    plan = plan_memory({}, lifetimes, regcmd_bytes(first.tasks))
    placements, lowered = lower(plan)
    assert len(lowered.tasks) == 1 and lowered.tasks[0].enable_mask == 0x18  # one DPU-only task
    regcmd = plan["regcmd"]
    chain = encode_chain(Chain(lowered.tasks), REGMAP, base_addr=regcmd.address, scale=PLATFORM.pc.data_amount_scale)
    machine = Machine.for_platform("rk3588", ddr_size=plan.end + (1 << 16))
    machine.memory.load(placements[layer.input].address, _native(x, placements[layer.input]).view(np.uint8))
    machine.memory.load(regcmd.address, chain.data)
    machine.run_chain(regcmd.address, chain.first_amount)
    out = placements[layer.output]
    return _from_native(machine.memory.dump(out.address, out.size).view(NUMPY[layer.to]), out)


def reference_convert(x: np.ndarray, layer: ConvertLayer) -> np.ndarray:
    """The registers' arithmetic (NUMERICS.md 26) in numpy: int8 -> fp16 is
    fp16(fp32((q - zp) x SCALE) x 2^-MINUS_EXP) (SHIFT 0: exact); fp16 -> int8 is
    round_half_even(fp32(fp32(x a) b) + zp), saturated, with a and b the BS and BN fp16 MUL operands."""
    stages = convert_stages(layer)
    if layer.to == "float16":
        assert stages.out_cvt.shift == 0 and stages.bn.alu_operand == -layer.quant.zero_point
        product = (x.astype(np.int64) - layer.quant.zero_point) * stages.out_cvt.scale
        assert np.all(np.abs(product) < 2 ** 24)  # exact in fp32
        return (product.astype(np.float32) * np.float32(2.0 ** -stages.out_cvt.minus_exp)).astype(np.float16)
    a = np.array(stages.bs.mul_operand, np.uint16).view(np.float16).astype(np.float32)
    b = np.array(stages.bn.mul_operand, np.uint16).view(np.float16).astype(np.float32)
    zp = np.array(stages.bn.alu_operand, np.int32).view(np.float32)
    value = (x.astype(np.float32) * a) * b + zp
    return np.clip(np.rint(value.astype(np.float64)), -128, 127).astype(np.int8)


def _layer(to: str, shape, scale: float, zero_point: int) -> ConvertLayer:
    return ConvertLayer("convert", "x", "y", shape, Quant(scale, zero_point), to)


@pytest.mark.parametrize("channels", [1, 8, 16, 20, 24, 40])
def test_dequantize_is_bit_exact(channels: int) -> None:
    layer = _layer("float16", (channels, 5, 7), 0.0371, -9)
    q = np.random.default_rng(channels).integers(-128, 128, size=layer.shape).astype(np.int8)
    got = run_convert(layer, q)
    want = reference_convert(q, layer)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    # within one fp16 step of the ideal s (q - zp): the scale carries 15 bits
    ideal = (0.0371 * (q.astype(np.float64) + 9)).astype(np.float16)
    steps = np.abs(got.view(np.int16).astype(np.int32) - ideal.view(np.int16).astype(np.int32))
    assert steps.max() <= 1


@pytest.mark.parametrize("channels", [1, 8, 16, 20, 24, 40])
def test_quantize_is_bit_exact(channels: int) -> None:
    layer = _layer("int8", (channels, 5, 7), 0.0213, -128 + channels)
    x = (np.random.default_rng(channels).normal(size=layer.shape) * 1.5).astype(np.float16)
    got = run_convert(layer, x)
    assert np.array_equal(got, reference_convert(x, layer))
    ideal = np.clip(np.rint(x.astype(np.float64) / 0.0213) + layer.quant.zero_point, -128, 127)
    off = np.abs(got.astype(np.int64) - ideal)
    assert off.max() <= 1
    # a one-LSB difference only at a tie of the ideal value (1/s carried to ~22 bits)
    exact = x.astype(np.float64) / 0.0213
    assert np.all(np.abs(np.abs(exact - np.floor(exact)) - 0.5)[off > 0] < 1e-4)


@settings(max_examples=40, deadline=None)
@given(scale=st.floats(1e-4, 8.0), zero_point=st.integers(-128, 127), to=st.sampled_from(["int8", "float16"]),
       channels=st.integers(1, 33), seed=st.integers(0, 2 ** 16))
def test_any_scale_is_bit_exact(scale: float, zero_point: int, to: str, channels: int, seed: int) -> None:
    layer = _layer(to, (channels, 3, 4), scale, zero_point)
    rng = np.random.default_rng(seed)
    if to == "float16":
        x = rng.integers(-128, 128, size=layer.shape).astype(np.int8)
        got, want = run_convert(layer, x).view(np.uint16), reference_convert(x, layer).view(np.uint16)
    else:  # saturating values included: +-200 steps
        x = ((rng.random(layer.shape) * 400 - 200) * scale).astype(np.float16)
        got, want = run_convert(layer, x), reference_convert(x, layer)
    assert np.array_equal(got, want)


# --- float16 islands of int8 builds --------------------------------------------------------------

def _conv_softmax_conv(channels: int = 24):
    """Conv -> Softmax(axis 1) -> Conv: the Softmax is a float16 island between two int8 convs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.normal(size=(channels, 8, 1, 1)) * 0.6).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.normal(size=(16, channels, 1, 1)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1"),
             helper.make_node("Softmax", ["a"], ["p"], axis=1, name="softmax"),
             helper.make_node("Conv", ["p", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "island", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_int8_softmax_is_a_float16_island_with_npu_converts() -> None:
    import onnxruntime as ort

    from npuemu.compiler.driver import CompileOptions, build_graph, prepare
    from npuemu.emulator.runtime import Runtime

    model = _conv_softmax_conv()
    rng = np.random.default_rng(3)
    samples = [{"x": rng.normal(size=(1, 8, 6, 10)).astype(np.float32)} for _ in range(4)]
    front = prepare(model, "rk3588", CompileOptions(precision="int8", dataset=samples))
    assert front.partition.by_node()["softmax"].target == "NPU"
    dtypes = {node.name: node.op_type for node in front.graph.nodes}
    converts = [name for name, op in dtypes.items() if op == "DataConvert"]
    assert len(converts) == 2  # int8 -> fp16 before the Softmax, fp16 -> int8 after it
    built = build_graph(front.graph)
    assert [step.kind for step in built.schedule()] == ["npu"]  # no host step at all
    assert {info.target for info in built.layers()} == {"NPU"}
    x = rng.normal(size=(1, 8, 6, 10)).astype(np.float32)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    got = runtime.output("y").ravel().astype(np.float64)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0].ravel().astype(np.float64)
    assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) >= 0.999


@pytest.mark.parametrize("chip", ["rk3588", "rk3576", "rk3568"])
def test_hybrid_build_has_no_host_step_on_every_chip(chip: str) -> None:
    """A hybrid graph (its first two convs float16): both DataConverts are DPU tasks on chips of
    16- and 8-byte atoms, and the emulated result is fake quant's (the ideal conversion) to 1e-5."""
    from npuemu.compiler.driver import CompileOptions, build_graph, prepare
    from npuemu.compiler.quant import calibrate, quantize_graph
    from npuemu.compiler.quant.fake_quant import fake_quant_evaluate
    from npuemu.emulator.runtime import Runtime
    from tests.compiler.test_build_e2e import MODELS, cosine

    model, shape = MODELS["small_cnn"]()
    graph = prepare(model, chip, CompileOptions(precision="float")).graph
    rng = np.random.default_rng(0)
    samples = [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(4)]
    quantize_graph(graph, calibrate(graph, samples, progress=False).ranges,
                   layer_dtypes={node.name: "float16" for node in graph.nodes[:2]})
    built = build_graph(graph, chip)
    assert [step.kind for step in built.schedule()] == ["npu"]
    assert sum(info.op_type == "DataConvert" for info in built.layers()) == 2
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    predicted = fake_quant_evaluate(graph, {"x": x})[graph.outputs[0]]
    assert cosine(runtime.output(graph.outputs[0]), predicted) >= 0.99999
