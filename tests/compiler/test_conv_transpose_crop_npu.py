"""A ConvTranspose whose pads crop, as one conv per phase of the cropped output written interleaved
(compiler/deconv_crop.py, LOWERING.md 40): no host DepthToSpace or crop step.

References written here: the textbook ConvTranspose (zero-spread definition, then the crop of the
pads) in float64; for int8 the same as an ordinary conv over the zero-spread input (inserted and
padded pixels at the input zero point, the kernel flipped) through the integer conv model of
tests/compiler/test_lower_machine.py; for float16 the exact sum of exactly representable products
rounded to fp32 and then once to fp16 (inputs on a coarse grid so every fp32 partial sum is exact:
the adder order, NUMERICS.md 3.3, cannot matter)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler import deconv_crop
from npuemu.compiler.deconv_crop import chunk_window, column_chunks, crop_axis, crop_limit, crop_phases, tap_weights
from npuemu.compiler.lower import ConvLayer, Quant
from tests.compiler.test_deconv_interleaved import run_layers
from tests.compiler.test_lower_machine import conv_model


def textbook(x: np.ndarray, w: np.ndarray, s: int, pads, out_pad) -> np.ndarray:
    """ONNX ConvTranspose (group 1, no bias): out[co, s*i + ky - top, s*j + kx - left] += x[ci, i, j] w[ci, co, ky, kx]."""
    c_in, h, wd = x.shape
    _, c_out, kh, kw = w.shape
    full = np.zeros((c_out, s * (h - 1) + kh + out_pad[0], s * (wd - 1) + kw + out_pad[1]))
    for ky in range(kh):
        for kx in range(kw):
            full[:, ky:ky + s * h:s, kx:kx + s * wd:s] += np.einsum("chw,co->ohw", x, w[:, :, ky, kx])
    top, left, bottom, right = pads
    return full[:, top:full.shape[1] - bottom, left:full.shape[2] - right]


def zero_spread(x: np.ndarray, s: int, k: int, pads, out_pad, fill: int) -> np.ndarray:
    """The input of the ConvTranspose as a plain stride-1 conv: pixels s apart, ``k - 1 - pad`` (+
    output padding after) border, every other pixel ``fill``."""
    c, h, wd = x.shape
    top, left, bottom, right = pads
    out = np.full((c, s * (h - 1) + 1 + 2 * (k - 1) - top - bottom + out_pad[0],
                   s * (wd - 1) + 1 + 2 * (k - 1) - left - right + out_pad[1]), fill, np.int64)
    out[:, k - 1 - top:k - 1 - top + s * (h - 1) + 1:s, k - 1 - left:k - 1 - left + s * (wd - 1) + 1:s] = x
    return out


def out_size(n: int, k: int, s: int, a: int, b: int, op: int) -> int:
    return s * (n - 1) + op + k - a - b


forms = st.tuples(st.integers(2, 3), st.integers(1, 5)).flatmap(lambda sk: st.tuples(
    st.just(sk[0]), st.just(sk[1]), st.lists(st.integers(0, sk[1] - 1), min_size=4, max_size=4),
    st.lists(st.integers(0, sk[0] - 1), min_size=2, max_size=2)))


def _phase_layers(x_shape, w, s, pads, out_pad, dtype, bias, quant, chunks=1):
    """This build's phase convs (deconv_crop) as ConvLayers of one (C, H, W) output; ``chunks`` > 1:
    each phase in that many column chunks (where 2 wide each), reading its own input window."""
    c_in, h, wd = x_shape
    c_out, k = w.shape[1], w.shape[2]
    phases = crop_phases((k, k), s, pads, out_pad, (h, wd))
    out_hw = (out_size(h, k, s, pads[0], pads[2], out_pad[0]), out_size(wd, k, s, pads[1], pads[3], out_pad[1]))
    layers = []
    for (ry, rx), (ty, tx, phase_pads, (_, cols)) in phases.items():
        weights = tap_weights(w, ty, tx)
        count = chunks if cols >= 2 * chunks else 1
        bounds = [cols * i // count for i in range(count + 1)]
        for start in range(0, c_out, 32):
            for first, end in zip(bounds, bounds[1:]):
                layers.append(_phase_layer(x_shape, weights, (s, ry, rx, *out_hw), start, (first, end - first, count),
                                           (len(tx), phase_pads), dtype, bias, quant))
    return layers, out_hw


def _phase_layer(x_shape, weights, phase, start, chunk, taps_pads, dtype, bias, quant):
    c_in, h, wd = x_shape
    c_out = weights.shape[0]
    taps, pads = taps_pads
    pick = slice(start, min(c_out, start + 32))
    count = pick.stop - start
    first, width, chunks = chunk
    interleave = phase + ((start, c_out) if c_out > 32 else ())
    if chunks > 1:
        in_first, in_width, left, right = chunk_window(first, width, taps, pads[1], wd)
        interleave = phase + (start, c_out, first, width, in_first, in_width, wd)
        pads, x_shape = (pads[0], left, pads[2], right), (c_in, h, in_width)
    common = dict(stride=1, pads=pads, bias=bias[pick], dtype=dtype, interleave=interleave)
    name = f"p{phase[1]}{phase[2]}g{start}c{first}"
    if dtype == "int8":
        return ConvLayer(name, "in", "out", x_shape, weights[pick].astype(np.int8),
                         weight_scale=np.full(count, 0.004), weight_zero_point=np.zeros(count, int),
                         input_quant=quant[0], output_quant=quant[1],
                         requant_scale_max=0.004 if c_out > 32 else 0.0, **common)
    return ConvLayer(name, "in", "out", x_shape, weights[pick].astype(np.float16), **common)


def _fits(k, s, pads, out_pad, h, wd, c_out, dtype):
    phases = crop_phases((k, k), s, pads, out_pad, (h, wd))
    return phases is not None and crop_limit(phases, c_out, 16 if dtype == "float16" else 32, 31, 15) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(form=forms, h=st.integers(1, 5), wd=st.integers(2, 9), c_in=st.integers(1, 20),
       c_out=st.sampled_from([1, 5, 16, 33, 40]), chunks=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_int8_phase_convs_equal_the_zero_spread_conv(form, h, wd, c_in, c_out, chunks, seed):
    s, k, pads, out_pad = form
    assume(_fits(k, s, pads, out_pad, h, wd, c_out, "int8"))
    rng = np.random.default_rng(seed)
    w = rng.integers(-100, 101, (c_in, c_out, k, k))
    x = rng.integers(-128, 128, (c_in, h, wd)).astype(np.int8)
    bias = rng.normal(0, 0.5, c_out)
    quant = (Quant(0.03, -3), Quant(0.09, 4))
    layers, out_hw = _phase_layers((c_in, h, wd), w, s, pads, out_pad, "int8", bias, quant, chunks)
    got = run_layers(layers, x, {"in": (c_in, h, wd), "out": (c_out, *out_hw)}, "int8")["out"]
    spread = zero_spread(x.astype(np.int64), s, k, pads, out_pad, quant[0].zero_point)
    flipped = w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1].astype(np.int8)
    reference = ConvLayer("ref", "in", "out", spread.shape, flipped, stride=1, pads=(0, 0, 0, 0), bias=bias,
                          weight_scale=np.full(c_out, 0.004), weight_zero_point=np.zeros(c_out, int),
                          input_quant=quant[0], output_quant=quant[1])
    want = conv_model(reference, spread, None)
    assert want.shape == got.shape
    np.testing.assert_array_equal(got.astype(np.int64), want)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(form=forms, h=st.integers(1, 5), wd=st.integers(2, 9), c_in=st.integers(1, 12),
       c_out=st.sampled_from([1, 3, 8, 20, 36]), chunks=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_float16_phase_convs_round_the_exact_sum_once(form, h, wd, c_in, c_out, chunks, seed):
    s, k, pads, out_pad = form
    assume(_fits(k, s, pads, out_pad, h, wd, c_out, "float16"))
    rng = np.random.default_rng(seed)
    # products of 1/8 and 1/32 steps, |x| <= 4, |w| <= 2: every partial sum is a multiple of 2^-8
    # below 2^12, exact in fp32 whatever the adder order; the result has more bits than fp16 keeps
    x = (rng.integers(-32, 33, (c_in, h, wd)) / 8).astype(np.float16)
    w = rng.integers(-64, 65, (c_in, c_out, k, k)) / 32
    bias = rng.integers(-256, 257, c_out) / 64
    layers, out_hw = _phase_layers((c_in, h, wd), w, s, pads, out_pad, "float16", bias, None, chunks)
    got = run_layers(layers, x, {"in": (c_in, h, wd), "out": (c_out, *out_hw)}, "float16")["out"]
    exact = textbook(x.astype(np.float64), w, s, pads, out_pad) + bias[:, None, None]
    want = exact.astype(np.float32).astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_the_phase_geometry_of_the_decoder_forms():
    """k4 s2 p1: 2-tap phases with pads 1/0 before; k3 s2 p1 op1: a 1-tap and a 2-tap phase."""
    assert crop_axis(4, 2, 1, 1, 0, 8, 0) == ([3, 1], 1, 0, 8)  # W[3] x[q-1] + W[1] x[q]
    assert crop_axis(4, 2, 1, 1, 0, 8, 1) == ([2, 0], 0, 1, 8)  # W[2] x[q] + W[0] x[q+1]
    assert crop_axis(3, 2, 1, 1, 1, 8, 0) == ([1], 0, 0, 8)
    assert crop_axis(3, 2, 1, 1, 1, 8, 1) == ([2, 0], 0, 1, 8)
    assert crop_axis(3, 2, 1, 1, 0, 8, 1) == ([2, 0], 0, 0, 7)  # odd output: phase 1 one row shorter
    assert crop_axis(2, 2, 1, 1, 0, 8, 1) == ([-1, 0], 0, 0, 7)  # past a phase's taps: a leading zero tap


def _model(k, s, pads, out_pad, c_in, c_out, h, wd, seed, grid=False):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.2, (c_in, c_out, k, k)).astype(np.float32)
    b = rng.normal(0, 0.1, c_out).astype(np.float32)
    if grid:
        w, b = (rng.integers(-64, 65, w.shape) / 32).astype(np.float32), (rng.integers(-64, 65, c_out) / 64).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[s, s], pads=pads,
                            output_padding=out_pad)
    graph = helper.make_graph([node], "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, h, wd])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), w, b


def _compile_run(model, x, precision):
    import onnxruntime as ort

    from npuemu.compiler.driver import CompileOptions, compile_model
    from npuemu.emulator.runtime import Runtime

    options = CompileOptions(precision="fp16") if precision == "fp16" else CompileOptions(dataset=[{"x": x}])
    built = compile_model(model, "rk3588", options)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return built, runtime, want


DECODER_FORMS = [  # kernel, stride, pads, output padding, C_in, C_out, H, W
    (4, 2, [1, 1, 1, 1], [0, 0], 16, 8, 6, 7),     # U-Net / pix2pix up-block
    (3, 2, [1, 1, 1, 1], [1, 1], 16, 8, 5, 6),     # FPN / ResNet decoder (same-size x2)
    (3, 2, [1, 1, 1, 1], [0, 0], 12, 5, 5, 6),     # odd output: phases of unequal size
    (5, 3, [0, 2, 1, 0], [0, 0], 8, 6, 4, 5),      # asymmetric crop
    (4, 2, [1, 1, 1, 1], [0, 0], 16, 40, 4, 5),    # more than 32 outputs: channel groups
]


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("form", DECODER_FORMS)
def test_cropping_conv_transpose_runs_on_the_npu(form, precision):
    k, s, pads, out_pad, c_in, c_out, h, wd = form
    fp16 = precision == "fp16"
    model, w, b = _model(k, s, pads, out_pad, c_in, c_out, h, wd, k * 10 + c_out, grid=fp16)
    rng = np.random.default_rng(c_in)
    x = (rng.integers(-32, 33, (1, c_in, h, wd)) / 8).astype(np.float32) if fp16 else \
        rng.normal(size=(1, c_in, h, wd)).astype(np.float32)
    built, runtime, want = _compile_run(model, x, precision)
    steps = built.schedule()
    assert [step.kind for step in steps] == ["npu"]  # no host DepthToSpace, no host crop
    got = np.asarray(runtime.output("y"), np.float64)
    assert got.shape == want.shape
    cosine = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
    assert cosine > (0.99999 if fp16 else 0.999), cosine
    if fp16:  # bit for bit: the exact sum (every fp32 partial sum exact) rounded once to fp16
        exact = textbook(x[0].astype(np.float64), w.astype(np.float64), s, pads, out_pad) + b[:, None, None]
        np.testing.assert_array_equal(np.asarray(runtime.output("y", dequantize=False)).reshape(exact.shape),
                                      exact.astype(np.float32).astype(np.float16))
    else:
        assert float(np.abs(got - want).max()) < 0.1


@pytest.mark.parametrize("form", ["k4s2p1", "k3s2p1_outpad", "k5s3_asym"])
def test_int8_layers_bit_exact_against_the_testing_kit(form, tmp_path):
    """Inside a net (a conv before, a Relu fused after): no host step, every layer bit for bit
    against the testing kit's textbook (zero-spread) ConvTranspose."""
    from npuemu.isa.container import ModelFile
    from tests.compiler.test_build_conv_transpose import FORMS, _assert_bit_exact
    from tests.compiler.test_build_e2e import Net, compare

    kernel, stride, pads, output_padding, _ = FORMS[form]
    net = Net(6)
    net.conv("c1", "x", "a", 3, 16)
    rng = np.random.default_rng(kernel * 10 + stride)
    net.inits += [numpy_helper.from_array(rng.normal(0, 0.2, (16, 8, kernel, kernel)).astype(np.float32), "tw"),
                  numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "tb")]
    net.node("ConvTranspose", ["a", "tw", "tb"], ["u"], "up", kernel_shape=[kernel, kernel],
             strides=[stride, stride], pads=pads, output_padding=output_padding)
    net.node("Relu", ["u"], ["y"], "act")
    within, cos, _, graph = compare(net.model([1, 3, 5, 7], "y"), (1, 3, 5, 7), tmp_path / "up.npu")
    assert [step.kind for step in ModelFile.read(tmp_path / "up.npu").schedule()] == ["npu"]
    assert within >= 0.99 and cos >= 0.999, (within, cos)
    _assert_bit_exact(graph, form)


def test_perf_counts_no_host_layer_and_cycles_per_phase(tmp_path, capsys):
    import onnx

    from npuemu.tools.cli import main

    model, _, _ = _model(4, 2, [1, 1, 1, 1], [0, 0], 16, 8, 8, 8, 1)
    path = tmp_path / "up.onnx"
    onnx.save(model, path)
    assert main(["perf", str(path), "--fp16", "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    conv_layers = [layer for layer in layers if layer["op_type"] not in ("InputOperator", "OutputOperator")]
    assert [layer for layer in conv_layers if layer["target"] != "NPU"] == []
    assert len(conv_layers) == 4 and all(layer["cycles"] > 0 and layer["tasks"] for layer in conv_layers)


def test_the_column_chunks_and_their_windows(monkeypatch):
    """A phase wider than the WDMA's line count (8192 columns in the vendor's split, LOWERING.md 54;
    here lowered to 256 so small maps reach it) is written in near-equal chunks; each reads its own
    input window with the halo its taps reach."""
    monkeypatch.setattr(deconv_crop, "MAX_WDMA_LINES", 256)
    assert column_chunks(260, 8, 32) == ((0, 130), (130, 130))
    assert column_chunks(256, 8, 32) == ((0, 256),)
    assert column_chunks(300, 40, 16) == ((0, 150), (150, 150))  # fp16: a 32-channel group, 32 allocated
    assert chunk_window(0, 130, 2, 1, 260) == (0, 130, 1, 0)      # columns -1..129: the left pad
    assert chunk_window(130, 130, 2, 1, 260) == (129, 131, 0, 0)  # one halo column before
    assert chunk_window(130, 130, 2, 0, 260) == (130, 130, 0, 1)  # the right pad: output padding


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_a_wide_cropping_conv_transpose_runs_in_column_chunks(precision, monkeypatch):
    monkeypatch.setattr(deconv_crop, "MAX_WDMA_LINES", 256)  # 300-wide phases: two chunks (LOWERING.md 54)
    model, w, b = _model(4, 2, [1, 1, 1, 1], [0, 0], 4, 40, 2, 300, 3, grid=precision == "fp16")
    rng = np.random.default_rng(2)
    x = (rng.integers(-32, 33, (1, 4, 2, 300)) / 8).astype(np.float32) if precision == "fp16" else \
        rng.normal(size=(1, 4, 2, 300)).astype(np.float32)
    built, runtime, want = _compile_run(model, x, precision)
    assert [step.kind for step in built.schedule()] == ["npu"]
    assert any(layer.name.endswith("_c1") for layer in built.layers())  # the chunks ran
    got = np.asarray(runtime.output("y"), np.float64)
    assert float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999
    if precision == "fp16":
        exact = textbook(x[0].astype(np.float64), w.astype(np.float64), 2, [1, 1, 1, 1], [0, 0]) + b[:, None, None]
        np.testing.assert_array_equal(np.asarray(runtime.output("y", dequantize=False)).reshape(exact.shape),
                                      exact.astype(np.float32).astype(np.float16))


def test_a_one_pixel_phase_keeps_the_host_moves():
    """A cropped phase 1 pixel wide (input 1 wide, k4 s2 p1: output 2 wide) cannot write
    interleaved (the WDMA sizes would read as a plain write): the stacked phase conv and the host
    DepthToSpace and crop stay, and crop_limit names the limit."""
    assert crop_limit(crop_phases((4, 4), 2, (1, 1, 1, 1), (0, 0), (3, 1)), 8, 32, 31, 15) == \
        "phase (0, 0) is 1 pixel wide (the interleaved write needs 2)"
    assert crop_phases((3, 3), 2, (1, 1, 1, 1), (0, 0), (2, 1)) is None  # a 1-wide output: phase 1 has no column
    model, _, _ = _model(4, 2, [1, 1, 1, 1], [0, 0], 4, 8, 3, 1, 3)
    x = np.random.default_rng(2).normal(size=(1, 4, 3, 1)).astype(np.float32)
    built, runtime, want = _compile_run(model, x, "int8")
    assert [getattr(step, "op", None) for step in built.schedule() if step.kind == "cpu"] == ["DepthToSpace", "Slice"]
    got = np.asarray(runtime.output("y"))
    assert float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def test_eight_byte_atom_chips_keep_the_host_moves():
    """RK356x atoms are 8 bytes (C2 8 int8): a phase starting at an odd atom is no 16-byte
    DST_BASE_ADDR, so rk3568 keeps the stacked phase conv and the host moves (and runs)."""
    from npuemu.compiler.deconv_crop import phase_atoms_addressable
    from npuemu.compiler.driver import CompileOptions, compile_model
    from npuemu.emulator.runtime import Runtime
    from npuemu.platforms import load_platform

    assert not phase_atoms_addressable(load_platform("rk3568"), False)
    assert phase_atoms_addressable(load_platform("rk3588"), True) and phase_atoms_addressable(load_platform("rk3576"), False)
    model, _, _ = _model(4, 2, [1, 1, 1, 1], [0, 0], 8, 8, 4, 5, 1)
    x = np.random.default_rng(1).normal(size=(1, 8, 4, 5)).astype(np.float32)
    built = compile_model(model, "rk3568", CompileOptions(dataset=[{"x": x}]))
    assert [getattr(step, "op", None) for step in built.schedule() if step.kind == "cpu"] == ["DepthToSpace", "Slice"]
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    assert runtime.output("y").shape == (1, 8, 8, 10)
