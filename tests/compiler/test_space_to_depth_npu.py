"""SpaceToDepth on the NPU (passes/space_to_depth.py, LOWERING.md 33): one 0/1 conv with
kernel = stride = blocksize, int8 and fp16, and the host step where the rewrite does not run.

References written here: the ONNX definition of SpaceToDepth as explicit loops and a textbook
strided convolution. End to end the stored outputs equal the loops applied to the stored inputs
bit for bit (int8: one scale in and out; fp16: products by 1.0), and match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.compiler.passes.space_to_depth import space_to_depth_weights
from npuemu.emulator.cpu_ops import OPS
from npuemu.emulator.runtime import Runtime


def space_to_depth_loops(x: np.ndarray, block: int) -> np.ndarray:
    """ONNX SpaceToDepth of [C, H, W], one value at a time."""
    channels, height, width = x.shape
    out = np.empty((channels * block * block, height // block, width // block), x.dtype)
    for c in range(channels):
        for i in range(block):
            for j in range(block):
                for y in range(height // block):
                    for x_ in range(width // block):
                        out[(i * block + j) * channels + c, y, x_] = x[c, y * block + i, x_ * block + j]
    return out


def strided_conv(x: np.ndarray, weights: np.ndarray, stride: int) -> np.ndarray:
    """A textbook conv, no pads: out[o, y, x] = sum over c, i, j of w[o, c, i, j] * x[c, s*y + i, s*x + j]."""
    out_channels, _, kh, kw = weights.shape
    _, height, width = x.shape
    oh, ow = (height - kh) // stride + 1, (width - kw) // stride + 1
    out = np.zeros((out_channels, oh, ow))
    for y in range(oh):
        for x_ in range(ow):
            window = x[:, y * stride:y * stride + kh, x_ * stride:x_ * stride + kw]
            out[:, y, x_] = np.tensordot(weights, window, axes=([1, 2, 3], [0, 1, 2]))
    return out


@settings(max_examples=30, deadline=None)
@given(channels=st.integers(1, 5), block=st.integers(2, 4), rows=st.integers(1, 3), cols=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1))
def test_the_weights_make_a_strided_conv_a_space_to_depth(channels, block, rows, cols, seed):
    x = np.random.default_rng(seed).normal(size=(channels, rows * block, cols * block))
    got = strided_conv(x, space_to_depth_weights(channels, block), block)
    np.testing.assert_array_equal(got, space_to_depth_loops(x, block))


def _model(channels: int, height: int, width: int, block: int, conv: bool = False):
    nodes, inits, source = [], [], "x"
    if conv:  # a conv before: SpaceToDepth reads an NPU layer's output
        weights = np.random.default_rng(channels).normal(0, 0.4, (channels, 3, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(weights, "w"))
        nodes.append(helper.make_node("Conv", ["x", "w"], ["t"], pads=[1, 1, 1, 1]))
        source = "t"
    nodes.append(helper.make_node("SpaceToDepth", [source], ["y"], blocksize=block))
    graph = helper.make_graph(nodes, "s2d", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           [1, 3 if conv else channels, height, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _run(model, x: np.ndarray, precision: str, level: int = 3, probe: str = "x"):
    outputs = (probe, "y") if probe != "x" else ()
    common = dict(optimization_level=level, outputs=outputs) if outputs else dict(optimization_level=level)
    options = CompileOptions(precision="fp16", **common) if precision == "fp16" else \
        CompileOptions(dataset=[{"x": x}], **common)
    built = compile_model(model, "rk3588", options)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return built, runtime, want


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / np.linalg.norm(a) / np.linalg.norm(b))


#: C, H, W, block; 256 x 40 x 40: the conv is split along its input channels for the CBUF (partial convs + adds)
CASES = [(3, 8, 8, 2), (16, 6, 9, 3), (5, 8, 12, 4), (32, 4, 6, 2), (40, 4, 320, 2), (256, 40, 40, 2)]


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("channels, height, width, block", CASES)
def test_space_to_depth_runs_on_the_npu_bit_exact(channels, height, width, block, precision):
    x = np.random.default_rng(channels + width).normal(size=(1, channels, height, width)).astype(np.float32)
    built, runtime, want = _run(_model(channels, height, width, block), x, precision)
    assert [step.kind for step in built.schedule()] == ["npu"]
    stored_x = np.asarray(runtime.output("x", dequantize=False)).reshape(x.shape[1:])
    expected = space_to_depth_loops(stored_x, block)
    got_stored = np.asarray(runtime.output("y", dequantize=False))
    np.testing.assert_array_equal(got_stored.reshape(expected.shape), expected)
    got = runtime.output("y")
    assert got.shape == want.shape
    assert _cosine(got, want) > (0.9999 if precision == "fp16" else 0.999)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_a_conv_then_space_to_depth_is_one_npu_chain(precision):
    x = np.random.default_rng(3).normal(size=(1, 3, 6, 8)).astype(np.float32)
    built, runtime, want = _run(_model(8, 6, 8, 2, conv=True), x, precision, probe="t")
    assert [step.kind for step in built.schedule()] == ["npu"]
    stored_t = np.asarray(runtime.output("t", dequantize=False)).reshape(8, 6, 8)
    expected = space_to_depth_loops(stored_t, 2)
    np.testing.assert_array_equal(np.asarray(runtime.output("y", dequantize=False)).reshape(expected.shape), expected)
    assert _cosine(runtime.output("y"), want) > 0.999


def _reason(model, level: int = 3) -> str:
    from npuemu.compiler.driver import prepare

    front = prepare(model, "rk3588", CompileOptions(precision="fp16", optimization_level=level))
    (decision,) = [d for d in front.partition.decisions if d.op == "SpaceToDepth"]
    assert decision.target == "CPU"
    return decision.reason


def test_below_level_3_it_is_a_host_step_equal_to_onnxruntime():
    x = np.random.default_rng(2).normal(size=(1, 4, 6, 6)).astype(np.float32)
    built, runtime, want = _run(_model(4, 6, 6, 3), x, "fp16", level=1)
    assert [getattr(step, "op", None) for step in built.schedule() if step.kind == "cpu"] == ["SpaceToDepth"]
    assert _cosine(runtime.output("y"), want) > 0.9999
    assert "from optimization level 3" in _reason(_model(4, 6, 6, 3), level=1)


def test_the_host_step_equals_onnxruntime():
    x = np.random.default_rng(9).normal(size=(1, 5, 8, 12)).astype(np.float32)
    for block in (1, 2, 4):
        (got,) = OPS["SpaceToDepth"]([x], {"blocksize": block})
        want = ort.InferenceSession(_model(5, 8, 12, block).SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)


def test_a_block_the_conv_fields_cannot_hold_stays_on_the_host():
    """blocksize 16 > the CNA's kernel / stride fields (hw_limits max_kernel, max_stride); the
    partition report names the limit."""
    x = np.random.default_rng(4).normal(size=(1, 2, 16, 32)).astype(np.float32)
    built, runtime, want = _run(_model(2, 16, 32, 16), x, "fp16")
    assert [getattr(step, "op", None) for step in built.schedule() if step.kind == "cpu"] == ["SpaceToDepth"]
    assert _cosine(runtime.output("y"), want) > 0.9999
    assert "blocksize 16 >" in _reason(_model(2, 16, 32, 16)) and "CONV_CON3" in _reason(_model(2, 16, 32, 16))


def test_a_blocksize_that_does_not_divide_the_plane_is_refused_at_import():
    from npuemu.isa.errors import CompileError

    with pytest.raises(CompileError, match="not multiples of it"):
        compile_model(_model(2, 6, 7, 2), "rk3588", CompileOptions(precision="fp16"))


def test_perf_counts_the_layer_as_one_conv_task():
    """``npuemu perf`` (report_npu): the SpaceToDepth conv is an NPU layer with CNA cycles and DDR
    traffic of at least its input and output bytes."""
    from npuemu.emulator.timing.report import report_npu

    x = np.random.default_rng(1).normal(size=(1, 8, 16, 16)).astype(np.float32)
    built, runtime, _ = _run(_model(8, 16, 16, 2), x, "int8")
    (layer,) = [entry for entry in report_npu(built, runtime.runs, runtime.machine.platform).layers if entry.tasks]
    assert layer.target == "NPU" and len(layer.tasks) >= 1
    assert layer.op_type == "Conv" and layer.output_shape == "(1,32,8,8)"
    # every output: 2 x 2 taps of the 8 channels padded to the int8 atom's 16 (the CNA reads whole atoms)
    assert sum(task.macs for task in layer.tasks) == 32 * 8 * 8 * 16 * 2 * 2
    assert all(task.npu_cycles > 0 and task.ddr_cycles > 0 for task in layer.tasks)
    assert sum(task.ddr_write_bytes for task in layer.tasks) == 32 * 8 * 8


def _focus_fixture_as_space_to_depth():
    """The vendor's focus_slice fixture model (4 Slices + Concat -> Conv 3x3 + SiLU) and the same
    model with the Focus block written as SpaceToDepth (the next conv's input channels permuted
    from the Focus order (row, col) = (0,0), (1,0), (0,1), (1,1) to SpaceToDepth's)."""
    import onnx
    from tests.shared_data import RKNN_FIXTURES_OPS

    focus = onnx.load(str(RKNN_FIXTURES_OPS / "focus_slice_fp16" / "model.onnx"))
    inits = {init.name: numpy_helper.to_array(init) for init in focus.graph.initializer}
    phases = []
    for node in focus.graph.node[:4]:  # each Slice's (row, col) start on axes (2, 3)
        picks = dict(zip(inits[node.input[3]].tolist(), inits[node.input[1]].tolist()))
        phases.append((picks.get(2, 0), picks.get(3, 0)))
    weights, moved = inits["w27"], np.zeros_like(inits["w27"])
    for position, (row, col) in enumerate(phases):
        for c in range(3):
            moved[:, (row * 2 + col) * 3 + c] = weights[:, position * 3 + c]
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["concat_out25"], blocksize=2), *focus.graph.node[5:]]
    graph = helper.make_graph(nodes, "s2d", list(focus.graph.input), list(focus.graph.output),
                              [numpy_helper.from_array(moved, "w27"), numpy_helper.from_array(inits["b28"], "b28")])
    return focus, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_the_register_stream_is_the_vendor_rewritten_focus_blocks():
    """Built in float16, both models give the same regcmd bytes (only the weight blobs differ,
    by the channel order): SpaceToDepth runs as the vendor's Focus conv. The outputs agree within
    float16 rounding (the next conv sums its 12 input channels in the other order)."""
    focus, s2d = _focus_fixture_as_space_to_depth()
    built = [compile_model(model, "rk3588", CompileOptions(precision="fp16")) for model in (focus, s2d)]
    sections = [{section.name: bytes(section.data) for section in model.sections} for model in built]
    assert sections[0]["regcmd"] == sections[1]["regcmd"]
    assert sections[0]["weights"] != sections[1]["weights"]
    x = np.random.default_rng(0).random((1, 3, 128, 128)).astype(np.float32)
    outputs = []
    for model in built:
        runtime = Runtime(model)
        runtime.set_input("x", x)
        runtime.run()
        outputs.append(np.asarray(runtime.output("y", dequantize=False)).astype(np.float16))
    np.testing.assert_allclose(outputs[0].astype(np.float64), outputs[1].astype(np.float64), rtol=2**-10, atol=2**-12)
