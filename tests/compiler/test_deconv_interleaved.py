"""ConvTranspose phase convs written interleaved (compiler/deconv_phases.py interleaved_write,
LOWERING.md 13; emulator/REGISTER_SEMANTICS.md 3.3.1): the s x s phase convs of a stride-s
ConvTranspose, each lowered with ``ConvLayer.interleave`` = (s, ry, rx), run on the emulator's
machine into one (C, s*H, s*W) tensor. Checked bit for bit against (a) this file's numpy
interleave of the integer conv model of tests/compiler/test_lower_machine.py for every phase and
(b) the same phase convs written the usual way plus a numpy DepthToSpace (today's route: the
placement is all that changes); fp16 against (b) and a float ConvTranspose within fp16 rounding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from npuemu.compiler.deconv_phases import phase_conv, phase_weights
from npuemu.compiler.lower import ConvLayer, Quant, feature_bytes, layer_constants, lower_layer, output_align
from npuemu.compiler.memory_plan import TensorLifetime, plan_memory, regcmd_bytes
from npuemu.emulator.machine import Machine
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import CompileError
from npuemu.isa.task import Chain
from tests.compiler.test_lower_machine import PLATFORM, REGMAP, conv_model

C2 = {"int8": 16, "float16": 8}


def conv_transpose_reference(x: np.ndarray, w: np.ndarray, s: int) -> np.ndarray:
    """Textbook ConvTranspose (no pads): out[co, s*i + ky, s*j + kx] += x[ci, i, j] * w[ci, co, ky, kx]."""
    c_in, h, wd = x.shape
    _, c_out, kh, kw = w.shape
    out = np.zeros((c_out, s * (h - 1) + kh, s * (wd - 1) + kw))
    for ky in range(kh):
        for kx in range(kw):
            out[:, ky:ky + s * h:s, kx:kx + s * wd:s] += np.einsum("chw,co->ohw", x, w[:, :, ky, kx])
    return out


def phase_layers(x_shape, w: np.ndarray, s: int, dtype: str, interleave: bool, rng) -> list[ConvLayer]:
    c_in, h, wd = x_shape
    phases = phase_conv(w.shape[2:], (s, s), (0, 0, 0, 0), (0, 0), (h, wd))
    stacked = phase_weights(w, phases)  # channel (co*s + ry)*s + rx
    c_out = w.shape[1]
    bias = rng.normal(0, 0.5, c_out)
    layers = []
    for ry in range(s):
        for rx in range(s):
            weights = stacked[(np.arange(c_out) * s + ry) * s + rx]
            common = dict(stride=1, pads=phases.pads, bias=bias, dtype=dtype,
                          interleave=(s, ry, rx) if interleave else ())
            name, out = f"p{ry}{rx}", "out" if interleave else f"out{ry}{rx}"
            if dtype == "int8":
                layers.append(ConvLayer(name, "in", out, x_shape, weights.astype(np.int8),
                                        weight_scale=np.full(c_out, 0.003), weight_zero_point=np.zeros(c_out, int),
                                        input_quant=Quant(0.03, -2), output_quant=Quant(0.08, -5), **common))
            else:
                layers.append(ConvLayer(name, "in", out, x_shape, weights.astype(np.float16), **common))
    return layers


def run_layers(layers, x: np.ndarray, shapes: dict, dtype: str) -> dict[str, np.ndarray]:
    """Lower ``layers`` into one chain, run it, read every non-input tensor back as [C][H][W]."""
    constants = {}
    for layer in layers:
        constants |= layer_constants(layer, PLATFORM)
    align = output_align(layers[0], PLATFORM)
    aligns = {name: align for name in shapes if name != "in"}
    lifetimes = [TensorLifetime(n, feature_bytes(shape, dtype, PLATFORM, channel_align=aligns.get(n, 1)),
                                kind="input" if n == "in" else "output") for n, shape in shapes.items()]

    def lower(plan):
        placements = {n: plan.constant(n) for n in constants}
        placements |= {n: plan.feature(n, shape, dtype, PLATFORM, channel_align=aligns.get(n, 1))
                       for n, shape in shapes.items()}
        return placements, [t for layer in layers for t in lower_layer(layer, placements, PLATFORM, REGMAP).tasks]

    sizes = {n: len(b) for n, b in constants.items()}
    _, first = lower(plan_memory(sizes, lifetimes))
    plan = plan_memory(sizes, lifetimes, regcmd_bytes(first))
    placements, tasks = lower(plan)
    regcmd = plan["regcmd"]
    chain = encode_chain(Chain(tasks), REGMAP, base_addr=regcmd.address, scale=PLATFORM.pc.data_amount_scale)
    machine = Machine.for_platform("rk3588", ddr_size=plan.end + (1 << 16))
    for name, blob in constants.items():
        machine.memory.load(placements[name].address, blob)
    element = np.int8 if dtype == "int8" else np.float16
    machine.memory.load(placements["in"].address, _native(x.astype(element), placements["in"]))
    machine.memory.load(regcmd.address, chain.data)
    machine.run_chain(regcmd.address, chain.first_amount)
    return {n: _read(machine, placements[n], element) for n in shapes if n != "in"}


def _native(x: np.ndarray, p) -> bytes:
    buf = np.zeros(p.size // x.itemsize, x.dtype)
    c, h, w = x.shape
    for ch in range(c):
        group, lane = divmod(ch, p.c2)
        buf[group * p.surface_bytes // x.itemsize + (np.arange(h * w) * p.c2) + lane] = x[ch].reshape(-1)
    return buf.tobytes()


def _read(machine, p, element) -> np.ndarray:
    raw = machine.memory.dump(p.address, p.size).view(element)
    c, h, w = p.shape
    out = np.zeros((c, h, w), element)
    for ch in range(c):
        group, lane = divmod(ch, p.c2)
        out[ch] = raw[group * p.surface_bytes // raw.itemsize + np.arange(h * w) * p.c2 + lane].reshape(h, w)
    return out


def _interleave(cubes: dict, s: int) -> np.ndarray:
    c, h, w = cubes[0, 0].shape
    out = np.zeros((c, s * h, s * w), cubes[0, 0].dtype)
    for (ry, rx), cube in cubes.items():
        out[:, ry::s, rx::s] = cube
    return out


CASES = [  # (input C, H, W), output channels, kernel, stride
    ((8, 5, 7), 24, 2, 2),      # PP-OCRv4 det's form: kernel = stride 2 (a 1x1 phase conv)
    ((16, 6, 4), 1, 2, 2),      # det's last ConvTranspose: one output channel
    ((4, 4, 5), 40, 4, 2),      # kernel 2s: 2x2 phase convs; 40 channels = 3 surfaces (SIZE_E widened)
    ((8, 3, 4), 16, 3, 3),      # stride 3
]


@pytest.mark.parametrize("x_shape, c_out, kernel, s", CASES)
def test_int8_interleaved_phases_equal_the_model_and_todays_route(x_shape, c_out, kernel, s):
    rng = np.random.default_rng(c_out + kernel)
    w = rng.integers(-128, 128, (x_shape[0], c_out, kernel, kernel)).astype(np.int8)
    x = rng.integers(-128, 128, x_shape).astype(np.int8)
    inter = phase_layers(x_shape, w, s, "int8", True, np.random.default_rng(1))
    plain = phase_layers(x_shape, w, s, "int8", False, np.random.default_rng(1))
    h, wd = inter[0].output_shape[1:]
    got = run_layers(inter, x, {"in": x_shape, "out": (c_out, s * h, s * wd)}, "int8")["out"]
    model = _interleave({(l.interleave[1], l.interleave[2]): conv_model(l, x.astype(np.int64), None)
                         for l in inter}, s)
    np.testing.assert_array_equal(got.astype(np.int64), model)
    today = run_layers(plain, x, {"in": x_shape} | {l.output: (c_out, h, wd) for l in plain}, "int8")
    np.testing.assert_array_equal(got, _interleave({(int(k[3]), int(k[4])): v for k, v in today.items()}, s))


def test_fp16_interleaved_phases_bit_identical_to_todays_route():
    rng = np.random.default_rng(9)
    x_shape, c_out, s = (8, 6, 5), 12, 2
    w = rng.standard_normal((x_shape[0], c_out, 2, 2)).astype(np.float32)
    x = rng.standard_normal(x_shape).astype(np.float16)
    inter = phase_layers(x_shape, w, s, "float16", True, np.random.default_rng(2))
    plain = phase_layers(x_shape, w, s, "float16", False, np.random.default_rng(2))
    got = run_layers(inter, x, {"in": x_shape, "out": (c_out, 12, 10)}, "float16")["out"]
    today = run_layers(plain, x, {"in": x_shape} | {l.output: (c_out, 6, 5) for l in plain}, "float16")
    expected = _interleave({(int(k[3]), int(k[4])): v for k, v in today.items()}, s)
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
    reference = conv_transpose_reference(x.astype(np.float64), w.astype(np.float16).astype(np.float64), s)
    reference += np.random.default_rng(2).normal(0, 0.5, c_out)[:, None, None]
    np.testing.assert_allclose(got.astype(np.float64), reference, atol=0.05, rtol=0.01)


def test_unwritable_forms_are_refused():
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (8, 16, 2, 2)).astype(np.int8)
    layers = phase_layers((8, 4, 1), w, 2, "int8", True, rng)  # phase width 1
    with pytest.raises(CompileError, match="at least 2 pixels wide"):
        run_layers(layers[:1], np.zeros((8, 4, 1), np.int8), {"in": (8, 4, 1), "out": (16, 8, 2)}, "int8")
    wide = [dataclasses.replace(layers[0], input_shape=(8, 4, 3), weights=np.zeros((160, 8, 1, 1), np.int8),
                                bias=None, weight_scale=np.full(160, 0.01), weight_zero_point=np.zeros(160, int))]
    with pytest.raises(CompileError, match="at most 8 surfaces"):
        run_layers(wide, np.zeros((8, 4, 3), np.int8), {"in": (8, 4, 3), "out": (160, 8, 6)}, "int8")


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_a_phase_320_wide_is_written_whole_in_the_vendors_wdma_split(precision):
    """The interleaved write's WDMA sizes are the vendor's split, W lines of H x allocated channels
    (REGISTER_SEMANTICS.md 52-53; LOWERING.md 54): a 320-wide phase fits in int8 as in float16 (it
    was cut into two 160-wide column chunks while npuemu wrote H lines of W x C, 320 x 32 > 8192);
    only a phase wider than 8192 columns is chunked. End to end against onnxruntime, no host step."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from npuemu.compiler.deconv_phases import interleave_chunks, interleave_fits
    from npuemu.compiler.driver import CompileOptions, compile_model
    from npuemu.emulator.runtime import Runtime

    assert interleave_fits(320, 1, 16) and interleave_fits(320, 1, 32) and not interleave_fits(8193, 1, 32)
    assert interleave_chunks(320, 1, 32) == ((0, 320),) and interleave_chunks(8194, 1, 32) == ((0, 4097), (4097, 4097))
    rng = np.random.default_rng(3)
    weights = (rng.normal(size=(8, 1, 2, 2)) * 0.3).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph([node], "deconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 2, 320])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.normal(size=(1, 8, 2, 320)).astype(np.float32)
    options = CompileOptions(precision="fp16") if precision == "fp16" else CompileOptions(dataset=[{"x": x}])
    built = compile_model(model, "rk3588", options)
    assert sum(step.kind == "cpu" for step in built.schedule()) == 0
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = runtime.output("y")
    assert got.shape == want.shape
    assert float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999
