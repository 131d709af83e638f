"""DepthToSpace on the NPU (passes/depth_to_space.py, LOWERING.md 28) and phase convs written in
column chunks (deconv_phases.interleave_chunks, LOWERING.md 28).

References written here: the ONNX definition of DepthToSpace as explicit loops, a textbook
kernel = stride ConvTranspose, and the integer conv model of tests/compiler/test_lower_machine.py
interleaved by numpy. End to end the stored outputs equal the numpy DepthToSpace of the stored
inputs bit for bit (int8 and fp16), and match onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.deconv_phases import MAX_WDMA_LINES, interleave_chunks, phase_conv, phase_weights
from npuemu.compiler.lower import ConvLayer, Quant
from npuemu.compiler.passes.depth_to_space import depth_to_space_weights
from tests.compiler.test_deconv_interleaved import conv_transpose_reference, run_layers
from tests.compiler.test_lower_machine import conv_model


def depth_to_space_loops(x: np.ndarray, block: int, mode: str) -> np.ndarray:
    """ONNX DepthToSpace of [C, H, W], one value at a time."""
    channels, height, width = x.shape
    depth = channels // (block * block)
    out = np.empty((depth, height * block, width * block), x.dtype)
    for c in range(depth):
        for ry in range(block):
            for rx in range(block):
                source = (ry * block + rx) * depth + c if mode == "DCR" else c * block * block + ry * block + rx
                for y in range(height):
                    for x_ in range(width):
                        out[c, y * block + ry, x_ * block + rx] = x[source, y, x_]
    return out


@settings(max_examples=40, deadline=None)
@given(depth=st.integers(1, 5), block=st.integers(2, 4), mode=st.sampled_from(["DCR", "CRD"]),
       height=st.integers(1, 4), width=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_the_weights_make_a_conv_transpose_a_depth_to_space(depth, block, mode, height, width, seed):
    x = np.random.default_rng(seed).normal(size=(depth * block * block, height, width))
    weights = depth_to_space_weights(depth, block, mode)
    got = conv_transpose_reference(x, weights, block)
    np.testing.assert_array_equal(got, depth_to_space_loops(x, block, mode))


def test_chunks_cover_the_phase_within_the_wdma_line_count():
    """The vendor's WDMA split (LOWERING.md 54): a column is a WDMA line (HEIGHT_WDMA, 13 bits), so a
    phase is chunked only past MAX_WDMA_LINES columns, whatever its channels."""
    for width in (2, 3, 160, 255, 320, 4099, 8192, 8193, 20000):
        for channels, kernels in ((1, 32), (24, 32), (1, 16), (32, 16)):
            chunks = interleave_chunks(width, channels, kernels)
            assert chunks[0][0] == 0 and sum(w for _, w in chunks) == width
            assert all(a + wa == b for (a, wa), (b, _) in zip(chunks, chunks[1:]))
            assert all(2 <= w <= MAX_WDMA_LINES for _, w in chunks)
            assert len(chunks) == -(-width // MAX_WDMA_LINES)  # as few as the field allows
    assert interleave_chunks(1, 1, 32) is None and interleave_chunks(64, 33, 32) is None  # 1 wide; 9 surfaces


def _chunk_layers(x_shape, w, dtype, chunks, rng) -> list[ConvLayer]:
    """The 1x1 phase convs of a kernel = stride 2 ConvTranspose, each written in ``chunks``."""
    c_in, h, width = x_shape
    stacked = phase_weights(w, phase_conv((2, 2), (2, 2), (0, 0, 0, 0), (0, 0), (h, width)))
    c_out = w.shape[1]
    bias = rng.normal(0, 0.5, c_out)
    layers = []
    for ry in range(2):
        for rx in range(2):
            weights = stacked[(np.arange(c_out) * 2 + ry) * 2 + rx]
            for first, size in chunks:
                common = dict(stride=1, bias=bias, dtype=dtype, interleave=(2, ry, rx, first, size, width, 0, c_out))
                name = f"p{ry}{rx}_{first}"
                if dtype == "int8":
                    layers.append(ConvLayer(name, "in", "out", (c_in, h, size), weights.astype(np.int8),
                                            weight_scale=np.full(c_out, 0.003), weight_zero_point=np.zeros(c_out, int),
                                            input_quant=Quant(0.03, -2), output_quant=Quant(0.08, -5), **common))
                else:
                    layers.append(ConvLayer(name, "in", "out", (c_in, h, size), weights.astype(np.float16), **common))
    return layers


@settings(max_examples=8, deadline=None)
@given(c_in=st.sampled_from([8, 20]), c_out=st.sampled_from([1, 5, 24]), height=st.integers(1, 5),
       cuts=st.lists(st.integers(2, 6), min_size=1, max_size=3), seed=st.integers(0, 2**31 - 1))
def test_int8_column_chunks_equal_the_integer_model(c_in, c_out, height, cuts, seed):
    """Chunk convs read their own input columns (GROUP_LINE_OFF 1 windows) and write their own
    output columns: every pixel equals the integer conv model of its phase."""
    rng = np.random.default_rng(seed)
    chunks, first = [], 0
    for size in cuts:
        chunks.append((first, size))
        first += size
    width = first
    w = rng.integers(-128, 128, (c_in, c_out, 2, 2)).astype(np.int8)
    x = rng.integers(-128, 128, (c_in, height, width)).astype(np.int8)
    layers = _chunk_layers((c_in, height, width), w, "int8", chunks, np.random.default_rng(seed + 1))
    got = run_layers(layers, x, {"in": (c_in, height, width), "out": (c_out, 2 * height, 2 * width)}, "int8")["out"]
    want = np.zeros((c_out, 2 * height, 2 * width), np.int64)
    for layer in layers:
        _, ry, rx, start, size = layer.interleave[:5]
        cube = conv_model(layer, x[:, :, start:start + size].astype(np.int64), None)
        want[:, ry::2, 2 * start + rx:2 * (start + size):2] = cube
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("dtype", ["int8", "float16"])
def test_channel_groups_equal_one_write_of_all_channels_by_the_model(dtype):
    """72 output channels as groups of 32, 32 and 8, each written from its first channel's
    surface (int8: against the integer conv model of every phase; fp16: against the textbook
    ConvTranspose within fp16 rounding)."""
    rng = np.random.default_rng(8)
    c_in, c_out, height, width = 16, 72, 3, 5
    w = rng.integers(-128, 128, (c_in, c_out, 2, 2)) if dtype == "int8" else rng.standard_normal((c_in, c_out, 2, 2))
    stacked = phase_weights(w, phase_conv((2, 2), (2, 2), (0, 0, 0, 0), (0, 0), (height, width)))
    bias = rng.normal(0, 0.5, c_out)
    layers = []
    for ry in range(2):
        for rx in range(2):
            for start in (0, 32, 64):
                count = min(32, c_out - start)
                pick = (np.arange(start, start + count) * 2 + ry) * 2 + rx
                common = dict(stride=1, bias=bias[start:start + count], dtype=dtype,
                              interleave=(2, ry, rx, 0, width, width, start, c_out))
                name = f"p{ry}{rx}g{start}"
                if dtype == "int8":
                    layers.append(ConvLayer(name, "in", "out", (c_in, height, width), stacked[pick].astype(np.int8),
                                            weight_scale=np.full(count, 0.003), weight_zero_point=np.zeros(count, int),
                                            input_quant=Quant(0.03, -2), output_quant=Quant(0.08, -5), **common))
                else:
                    layers.append(ConvLayer(name, "in", "out", (c_in, height, width),
                                            stacked[pick].astype(np.float16), **common))
    if dtype == "int8":
        x = rng.integers(-128, 128, (c_in, height, width)).astype(np.int8)
    else:
        x = rng.standard_normal((c_in, height, width)).astype(np.float16)
    shapes = {"in": (c_in, height, width), "out": (c_out, 2 * height, 2 * width)}
    got = run_layers(layers, x, shapes, dtype)["out"]
    if dtype == "int8":
        want = np.zeros((c_out, 2 * height, 2 * width), np.int64)
        for layer in layers:
            _, ry, rx, _, _, _, start, _ = layer.interleave
            want[start:start + layer.out_channels, ry::2, rx::2] = conv_model(layer, x.astype(np.int64), None)
        np.testing.assert_array_equal(got.astype(np.int64), want)
    else:
        reference = conv_transpose_reference(x.astype(np.float64), w.astype(np.float16).astype(np.float64), 2)
        np.testing.assert_allclose(got.astype(np.float64), reference + bias[:, None, None], atol=0.05, rtol=0.01)


def test_fp16_column_chunks_equal_a_float_conv_transpose():
    rng = np.random.default_rng(4)
    c_in, c_out, height, width = 8, 3, 3, 9
    w = rng.standard_normal((c_in, c_out, 2, 2)).astype(np.float32)
    x = rng.standard_normal((c_in, height, width)).astype(np.float16)
    whole = _chunk_layers((c_in, height, width), w, "float16", [(0, width)], np.random.default_rng(5))
    chunked = _chunk_layers((c_in, height, width), w, "float16", [(0, 4), (4, 3), (7, 2)], np.random.default_rng(5))
    shapes = {"in": (c_in, height, width), "out": (c_out, 2 * height, 2 * width)}
    got = run_layers(chunked, x, shapes, "float16")["out"]
    np.testing.assert_array_equal(got.view(np.uint16), run_layers(whole, x, shapes, "float16")["out"].view(np.uint16))
    reference = conv_transpose_reference(x.astype(np.float64), w.astype(np.float16).astype(np.float64), 2)
    reference += np.random.default_rng(5).normal(0, 0.5, c_out)[:, None, None]
    np.testing.assert_allclose(got.astype(np.float64), reference, atol=0.05, rtol=0.01)


def test_a_chunk_reads_a_window_of_single_rows():
    """The chunk task's CNA input fields: the vendor's cropped-window form (resnet18's 1x1 convs,
    REGISTER_SEMANTICS 2.3: GROUP_LINE_OFF 1, LINE_STRIDE the row, SURF_STRIDE surface - width)."""
    from npuemu.compiler.lower import feature_bytes, layer_constants, output_align
    from npuemu.compiler.lower.lower_conv import lower_conv
    from npuemu.compiler.memory_plan import TensorLifetime, plan_memory
    from tests.compiler.test_lower_machine import PLATFORM

    rng = np.random.default_rng(0)
    layer = _chunk_layers((16, 4, 12), rng.integers(-9, 9, (16, 2, 2, 2)).astype(np.int8), "int8",
                          [(0, 5), (5, 7)], rng)[1]
    constants = layer_constants(layer, PLATFORM)
    align = output_align(layer, PLATFORM)
    shapes = {"in": (16, 4, 12), "out": (2, 8, 24)}
    aligns = {"in": 1, "out": align}
    lifetimes = [TensorLifetime(n, feature_bytes(s, "int8", PLATFORM, channel_align=aligns[n])) for n, s in shapes.items()]
    plan = plan_memory({n: len(b) for n, b in constants.items()}, lifetimes)
    placements = {n: plan.constant(n) for n in constants}
    placements |= {n: plan.feature(n, s, "int8", PLATFORM, channel_align=aligns[n]) for n, s in shapes.items()}
    task = lower_conv(layer, placements, PLATFORM)[0]
    inp, out = placements["in"], placements["out"]
    assert task.single_rows and task.in_width == task.out_width == 7
    assert task.line_stride == 12  # one 12-pixel row in atoms
    assert task.surface_stride == inp.surface_stride_atoms - 7
    assert task.feature_address == inp.address + 5 * inp.pixel_bytes
    assert task.cube.dst_address == out.address + (2 * 5) * out.atom_bytes  # phase (0, 0), column 5 -> 10
    assert task.cube.width == 7 and task.cube.interleave == (2, 48)


def _d2s_model(channels: int, height: int, width: int, block: int, mode: str):
    node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=block, mode=mode)
    graph = helper.make_graph([node], "d2s", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           [1, channels, height, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _conv_d2s_model(channels: int, height: int, width: int, block: int, mode: str, seed: int):
    """A conv before the DepthToSpace (its usual place: a sub-pixel upsampling head)."""
    weights = np.random.default_rng(seed).normal(0, 0.4, (channels, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["t"], pads=[1, 1, 1, 1]),
             helper.make_node("DepthToSpace", ["t"], ["y"], blocksize=block, mode=mode)]
    graph = helper.make_graph(nodes, "d2s", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, height, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _run(model, x: np.ndarray, precision: str, probe: str):
    import onnxruntime as ort

    from npuemu.compiler.driver import CompileOptions, compile_model
    from npuemu.emulator.runtime import Runtime

    options = CompileOptions(precision="fp16") if precision == "fp16" else CompileOptions(dataset=[{"x": x}])
    if probe != "x":
        options = CompileOptions(precision="fp16", outputs=(probe, "y")) if precision == "fp16" else \
            CompileOptions(dataset=[{"x": x}], outputs=(probe, "y"))
    built = compile_model(model, "rk3588", options)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return built, runtime, want


CASES = [  # channels in, H, W, block, mode
    (16, 5, 7, 2, "DCR"), (16, 5, 7, 2, "CRD"), (27, 3, 4, 3, "DCR"), (32, 2, 3, 4, "CRD"),
    (4, 2, 320, 2, "DCR"),      # 1 output channel 320 wide: int8 lines need two column chunks
    (96, 3, 300, 2, "CRD"),     # 24 channels 300 wide: two int8 chunks, one fp16 line
    (160, 3, 5, 2, "CRD"),      # 40 output channels: a 32-channel group and an 8-channel one
    (576, 2, 260, 3, "DCR"),    # 64 output channels in two groups, 260 wide: chunks and groups at once
]


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("channels, height, width, block, mode", CASES)
def test_depth_to_space_runs_on_the_npu_bit_exact(channels, height, width, block, mode, precision):
    rng = np.random.default_rng(channels + width)
    x = rng.normal(size=(1, channels, height, width)).astype(np.float32)
    built, runtime, want = _run(_d2s_model(channels, height, width, block, mode), x, precision, "x")
    assert [step.kind for step in built.schedule()] == ["npu"]
    stored_x, stored_y = runtime.output("x", dequantize=False), runtime.output("y", dequantize=False)
    expected = depth_to_space_loops(np.asarray(stored_x).reshape(x.shape[1:]), block, mode)
    np.testing.assert_array_equal(np.asarray(stored_y).reshape(expected.shape), expected)
    got = runtime.output("y")
    assert got.shape == want.shape
    assert float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_a_conv_then_depth_to_space_is_one_npu_chain(mode, precision):
    x = np.random.default_rng(7).normal(size=(1, 3, 6, 9)).astype(np.float32)
    built, runtime, want = _run(_conv_d2s_model(16, 6, 9, 2, mode, 3), x, precision, "t")
    assert [step.kind for step in built.schedule()] == ["npu"]
    stored_t, stored_y = runtime.output("t", dequantize=False), runtime.output("y", dequantize=False)
    expected = depth_to_space_loops(np.asarray(stored_t).reshape(16, 6, 9), 2, mode)
    np.testing.assert_array_equal(np.asarray(stored_y).reshape(expected.shape), expected)
    got = runtime.output("y")
    assert float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def test_forms_the_write_cannot_place_stay_on_the_host():
    """A 1-pixel-wide input (the WDMA sizes of a 1-wide phase read as a plain write): the
    DepthToSpace stays a host step (not a stacked NPU conv plus a host DepthToSpace)."""
    for channels, width in ((16, 1), (4 * 40, 1)):
        x = np.random.default_rng(1).normal(size=(1, channels, 2, width)).astype(np.float32)
        built, runtime, want = _run(_d2s_model(channels, 2, width, 2, "DCR"), x, "int8", "x")
        assert [getattr(step, "op", None) for step in built.schedule() if step.kind == "cpu"] == ["DepthToSpace"]
        got = runtime.output("y")
        assert float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


@pytest.mark.parametrize("c_out", [48, 70])
def test_a_conv_transpose_with_more_than_32_outputs_has_no_host_step(c_out, tmp_path):
    """A UNet / YOLOv8-seg style 2x2 stride-2 ConvTranspose of 48 or 70 channels: 32-channel groups
    (the last smaller) written interleaved, no host DepthToSpace; every layer bit for bit against
    the testing kit's textbook ConvTranspose (tests/compiler/test_build_conv_transpose.py)."""
    from npuemu.isa.container import ModelFile
    from tests.compiler.test_build_conv_transpose import _assert_bit_exact
    from tests.compiler.test_build_e2e import Net, compare

    net = Net(5)
    net.conv("c1", "x", "a", 3, 16)
    rng = np.random.default_rng(c_out)
    net.inits += [numpy_helper.from_array(rng.normal(0, 0.3, (16, c_out, 2, 2)).astype(np.float32), "tw"),
                  numpy_helper.from_array(rng.normal(0, 0.1, (c_out,)).astype(np.float32), "tb")]
    net.node("ConvTranspose", ["a", "tw", "tb"], ["u"], "up", kernel_shape=[2, 2], strides=[2, 2])
    net.node("Relu", ["u"], ["y"], "act")
    within, cos, stored, graph = compare(net.model([1, 3, 6, 8], "y"), (1, 3, 6, 8), tmp_path / "up.npu")
    assert [step.kind for step in ModelFile.read(tmp_path / "up.npu").schedule()] == ["npu"]
    assert stored.shape == (1, c_out, 12, 16)
    _assert_bit_exact(graph, f"c{c_out}", (1, 3, 6, 8))
    assert within >= 0.99 and cos >= 0.999, (within, cos)


def test_float16_conv_transpose_with_more_than_32_outputs_has_no_host_step():
    from npuemu.compiler.driver import CompileOptions, compile_model
    from npuemu.emulator.runtime import Runtime

    rng = np.random.default_rng(4)
    weights = rng.normal(0, 0.3, (16, 40, 2, 2)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph([node], "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 5, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    built = compile_model(model, "rk3588", CompileOptions(precision="fp16"))
    assert [step.kind for step in built.schedule()] == ["npu"]
    x = rng.normal(size=(1, 16, 5, 7)).astype(np.float32)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    stored = np.asarray(runtime.output("x", dequantize=False)).astype(np.float64).reshape(16, 5, 7)
    want = conv_transpose_reference(stored, weights.astype(np.float16).astype(np.float64), 2)
    np.testing.assert_allclose(np.asarray(runtime.output("y"), np.float64).reshape(want.shape), want,
                               atol=0.01, rtol=0.002)
