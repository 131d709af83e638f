"""silero-vad's front end and tail on the NPU (compiler/LOWERING.md 32): a reflect Pad of the channels
(passes/pad_channels.py), the STFT conv as per-frame 1x1 convs and a FlatConcat
(passes/signal_frames.py, lifted by passes/lift_1d.py), channel Slices (passes/channel_slice.py),
Pow(x, 2) as Mul(x, x) (passes/pow_as_mul.py), ReduceMean (passes/reduce_mean_npu.py), an
element-wise op between inverse Reshapes (lift_1d.elementwise_between_reshapes), and in int8 builds
the magnitude sqrt(a^2 + b^2) as a float16 island (passes/magnitude_island.py).

References are written here or are the testing kit's: float16 data movement and squares equal
numpy's float16 values exactly (every output is one input value, or x*x rounded once); the frame
convs are within NUMERICS.md 3.3's fp32 summation bound of the exact sums; int8 builds are bit for bit
the kit's independent reference of the built model (tools/testing_reference.reference_model), the
FlatConcat's int8 copies the kit's reference_copy; whole graphs against onnxruntime.
"""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, compile_model, prepare
from npuemu.compiler.passes import PassContext, magnitude_island
from npuemu.compiler.passes.partition import decide
from npuemu.emulator.runtime import Runtime
from npuemu.tools.testing_reference import reference_copy, reference_model

OPSET = 13


def _model(nodes, inputs: dict, output_shape, inits: dict | None = None):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        [numpy_helper.from_array(np.asarray(value), name) for name, value in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def pad_model(shape, pads, mode):
    out = [d + pads[i] + pads[len(shape) + i] for i, d in enumerate(shape)]
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    return _model([node], {"x": shape}, out, {"pads": np.array(pads, np.int64)})


def slice_model(shape, start, end, axis=1, step=1):
    out = list(shape)
    out[axis] = len(range(start, end, step))
    node = helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])
    inits = {"s": np.array([start], np.int64), "e": np.array([end], np.int64), "a": np.array([axis], np.int64),
             "t": np.array([step], np.int64)}
    return _model([node], {"x": shape}, out, inits)


def pow_model(shape, exponent):
    node = helper.make_node("Pow", ["x", "p"], ["y"])
    return _model([node], {"x": shape}, shape, {"p": np.array(exponent, np.float32)})


def reduce_mean_model(shape, axes, keepdims):
    out = [1 if i in axes else d for i, d in enumerate(shape)] if keepdims else \
        [d for i, d in enumerate(shape) if i not in axes]
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=list(axes), keepdims=keepdims)
    return _model([node], {"x": shape}, out)


def stft_model(length=640, kernels=34, taps=256, stride=128, pads=(0, 0), seed=0):
    """[1, L] -> Unsqueeze -> [1, 1, L] -> Conv1d(kernels, 1, taps) stride -> Relu -> [1, kernels, T]
    (the Relu keeps the conv inside the lifted region; silero's encoder does the same)."""
    frames = (length + sum(pads) - taps) // stride + 1
    weight = np.random.default_rng(seed).normal(0, 0.1, (kernels, 1, taps)).astype(np.float32)
    nodes = [helper.make_node("Unsqueeze", ["x", "axis"], ["u"]),
             helper.make_node("Conv", ["u", "w"], ["c"], kernel_shape=[taps], strides=[stride], pads=list(pads)),
             helper.make_node("Relu", ["c"], ["y"])]
    return _model(nodes, {"x": [1, length]}, [1, kernels, frames], {"w": weight, "axis": np.array([1], np.int64)})


def magnitude_model(channels=16, width=4):
    """[1, 2C, 1, W] -> real/imag halves -> sqrt(re^2 + im^2) (silero's STFT magnitude)."""
    halves = [helper.make_node("Slice", ["x", f"s{i}", f"e{i}", "a"], [f"h{i}"]) for i in range(2)]
    squares = [helper.make_node("Pow", [f"h{i}", "two"], [f"q{i}"]) for i in range(2)]
    tail = [helper.make_node("Add", ["q0", "q1"], ["p"]), helper.make_node("Sqrt", ["p"], ["y"])]
    inits = {"s0": np.array([0], np.int64), "e0": np.array([channels], np.int64), "s1": np.array([channels], np.int64),
             "e1": np.array([2 * channels], np.int64), "a": np.array([1], np.int64), "two": np.array(2.0, np.float32)}
    return _model(halves + squares + tail, {"x": [1, 2 * channels, 1, width]}, [1, channels, 1, width], inits)


def ort_run(model, feeds) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _feeds(shape, seed, scale=1.0):
    return {"x": (scale * np.random.default_rng(seed).normal(0, 1, shape)).astype(np.float32)}


def _prepared(model, precision, shape, level=3, scale=1.0):
    if precision == "fp16":
        options = CompileOptions(precision="fp16", optimization_level=level)
    else:
        options = CompileOptions(dataset=[_feeds(shape, seed, scale) for seed in range(3)], optimization_level=level)
    return prepare(model, "rk3588", options).graph


def _run(graph, feeds):
    built = build_graph(graph)
    runtime = Runtime(built)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return built, runtime


def _ops(graph) -> list[str]:
    return [node.op_type for node in graph.nodes]


def _host_steps(built) -> list[str]:
    return [step.op for step in built.schedule() if step.kind == "cpu"]


def _reason(graph, node, element_bytes=2) -> str:
    """The partition's reason for a host step (what --partition-report prints)."""
    return decide(graph, node, PassContext.for_chip("rk3588", 3, element_bytes=element_bytes)).reason


def _fp16(model, shape, seed=3, scale=1.0):
    graph = _prepared(model, "fp16", shape)
    feeds = _feeds(shape, seed, scale)
    built, runtime = _run(graph, feeds)
    return graph, built, feeds, runtime.output("y", dequantize=False)


def _int8_matches_the_kit(model, shape, seed=5, scale=1.0):
    """int8 build: every stored output value equals the testing kit's reference of the build."""
    graph = _prepared(model, "int8", shape, scale=scale)
    feeds = _feeds(shape, seed, scale)
    built, runtime = _run(graph, feeds)
    stored = np.asarray(runtime.output("y", dequantize=False))
    want = reference_model(graph, built, feeds)["y"]
    assert np.array_equal(stored.reshape(-1), np.asarray(want).reshape(-1))
    assert cosine(runtime.output("y"), ort_run(model, feeds)) >= 0.99
    return graph, built


# ---- reflect / edge Pad of the channels ------------------------------------------------------

PAD_CASES = {
    "silero": ([1, 576], [0, 0, 0, 64], "reflect"),
    "both_ends": ([1, 40], [0, 3, 0, 5], "reflect"),
    "edge": ([1, 24], [0, 2, 0, 9], "edge"),
    "map": ([1, 12, 3, 5], [0, 4, 0, 0, 0, 6, 0, 0], "reflect"),
}


@pytest.mark.parametrize("case", sorted(PAD_CASES))
def test_float16_channel_pad_is_exact_on_the_npu(case) -> None:
    shape, pads, mode = PAD_CASES[case]
    graph, built, feeds, got = _fp16(pad_model(shape, pads, mode), shape)
    assert "Pad" not in _ops(graph) and _host_steps(built) == []
    rank = len(shape)
    want = np.pad(feeds["x"].astype(np.float16), [(pads[i], pads[rank + i]) for i in range(rank)], mode=mode)
    assert got.dtype == np.float16 and np.array_equal(np.asarray(got).reshape(want.shape), want)


@pytest.mark.parametrize("case", ["silero", "both_ends", "map"])
def test_int8_channel_pad_matches_the_kit(case) -> None:
    shape, pads, mode = PAD_CASES[case]
    graph, built = _int8_matches_the_kit(pad_model(shape, pads, mode), shape)
    assert _host_steps(built) == []


@settings(max_examples=10, deadline=None)
@given(channels=st.integers(2, 40), before=st.integers(0, 39), after=st.integers(0, 39),
       mode=st.sampled_from(["reflect", "edge"]))
def test_float16_channel_pad_of_any_size_is_exact(channels, before, after, mode) -> None:
    if mode == "reflect":
        before, after = before % channels, after % channels  # ONNX: reflect pads below the size
    if before + after == 0:
        after = 1
    shape, pads = [1, channels], [0, before, 0, after]
    _, built, feeds, got = _fp16(pad_model(shape, pads, mode), shape)
    want = np.pad(feeds["x"].astype(np.float16), [(0, 0), (before, after)], mode=mode)
    assert _host_steps(built) == [] and np.array_equal(np.asarray(got).reshape(want.shape), want)


@pytest.mark.parametrize("shape, pads, mode", [
    ([1, 4, 6, 6], [0, 0, 1, 1, 0, 0, 1, 1], "reflect"),  # H/W: each padded row a copy of its own
    ([1, 16], [0, 2, 0, 2], "constant"),  # a constant pad of the channels
    ([1, 1, 32], [0, 0, 4, 0, 0, 4], "reflect"),  # rank 3: its 4-D form is a host Reshape
])
def test_other_pads_stay_host_steps(shape, pads, mode) -> None:
    graph = _prepared(pad_model(shape, pads, mode), "fp16", shape)
    pad = next(node for node in graph.nodes if node.op_type == "Pad")
    assert pad.target == "CPU"
    assert _reason(graph, pad).endswith(f"{mode} pads {pads} of {shape}")  # the partition names the limit


# ---- channel Slice -------------------------------------------------------------------------

SLICE_CASES = {"aligned": (32, 8, 24), "to_end": (40, 16, 40), "unaligned_start": (258, 129, 258),
               "unaligned_end": (258, 0, 129), "inside": (20, 3, 11)}


@pytest.mark.parametrize("case", sorted(SLICE_CASES))
def test_float16_channel_slice_is_exact_on_the_npu(case) -> None:
    channels, start, end = SLICE_CASES[case]
    shape = [1, channels, 2, 4]
    graph, built, feeds, got = _fp16(slice_model(shape, start, end), shape)
    assert "Slice" not in _ops(graph) and _host_steps(built) == []
    aligned = start % 8 == 0 and (end % 8 == 0 or end == channels)  # float16 C2 = 8 on rk3588
    assert ("Split" in _ops(graph)) == aligned and ("Conv" in _ops(graph)) != aligned
    assert np.array_equal(np.asarray(got), feeds["x"].astype(np.float16)[:, start:end])


@pytest.mark.parametrize("case", ["aligned", "unaligned_start", "inside"])
def test_int8_channel_slice_matches_the_kit(case) -> None:
    channels, start, end = SLICE_CASES[case]
    shape = [1, channels, 2, 4]
    _, built = _int8_matches_the_kit(slice_model(shape, start, end), shape)
    assert _host_steps(built) == []


@settings(max_examples=10, deadline=None)
@given(channels=st.integers(2, 48), data=st.data())
def test_float16_any_channel_range_is_exact(channels, data) -> None:
    start = data.draw(st.integers(0, channels - 1))
    end = data.draw(st.integers(start + 1, channels))
    shape = [1, channels, 1, 3]
    _, built, feeds, got = _fp16(slice_model(shape, start, end), shape)
    assert _host_steps(built) == [] and np.array_equal(np.asarray(got), feeds["x"].astype(np.float16)[:, start:end])


def _conv_halves_model(halves: bool):
    """Conv(12 -> 2 x 20) and, with ``halves``, its output cut into channels [0, 20) and [20, 40) multiplied."""
    weight = np.random.default_rng(1).normal(0, 0.3, (40, 12, 1, 1)).astype(np.float32)
    bias = np.random.default_rng(2).normal(0, 0.3, 40).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if halves else "y"])]
    inits = {"w": weight, "b": bias}
    if halves:
        nodes += [helper.make_node("Slice", ["c", "s0", "e0", "a"], ["h0"]),
                  helper.make_node("Slice", ["c", "e0", "e1", "a"], ["h1"]),
                  helper.make_node("Mul", ["h0", "h1"], ["y"])]
        inits |= {"s0": np.array([0], np.int64), "e0": np.array([20], np.int64), "e1": np.array([40], np.int64),
                  "a": np.array([1], np.int64)}
    return _model(nodes, {"x": [1, 12, 3, 4]}, [1, 20 if halves else 40, 3, 4], inits)


def test_slices_of_a_conv_output_become_convs_of_its_kernels() -> None:
    """Only Slices read the conv: each is the conv with its kernels - the same sums, bit for bit."""
    shape = [1, 12, 3, 4]
    graph, built, feeds, got = _fp16(_conv_halves_model(True), shape)
    assert _ops(graph) == ["Conv", "Conv", "Mul"] and _host_steps(built) == []
    assert not any(node.attrs.get("selection") for node in graph.nodes)
    _, _, _, whole = _fp16(_conv_halves_model(False), shape)
    whole = np.asarray(whole, np.float32)
    want = (whole[:, :20] * whole[:, 20:]).astype(np.float16)  # an exact fp32 product of fp16 values, rounded once
    assert np.array_equal(np.asarray(got), want)
    _int8_matches_the_kit(_conv_halves_model(True), shape)


@pytest.mark.parametrize("axis, step", [(1, 2), (2, 1), (3, 1)])
def test_other_slices_stay_host_steps(axis, step) -> None:
    shape = [1, 16, 4, 4]
    graph = _prepared(slice_model(shape, 0, 3, axis, step), "fp16", shape)
    node = next(node for node in graph.nodes if node.op_type == "Slice")
    assert node.target == "CPU" and _reason(graph, node).endswith(f"axes [{axis}], steps [{step}] of {shape}")


# ---- Gather of constant channels ------------------------------------------------------------

def gather_model(shape, indices, axis=1):
    indices = np.asarray(indices, np.int64)
    out = [*shape[:axis], *indices.shape, *shape[axis + 1:]]
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    return _model([node], {"x": shape}, out, {"i": indices})


GATHER_CASES = {"run": ([1, 24, 2, 3], [8, 9, 10, 11, 12, 13, 14, 15]), "permutation": ([1, 12, 2, 3], [3, 0, 11, 5]),
                "repeat_negative": ([1, 10, 1, 4], [-1, 2, 2]), "vector": ([1, 40], [39, 0, 7])}


@pytest.mark.parametrize("case", sorted(GATHER_CASES))
def test_float16_gather_of_channels_is_exact_on_the_npu(case) -> None:
    shape, indices = GATHER_CASES[case]
    graph, built, feeds, got = _fp16(gather_model(shape, indices), shape)
    assert "Gather" not in _ops(graph) and _host_steps(built) == []
    want = np.take(feeds["x"].astype(np.float16), indices, axis=1)
    assert np.array_equal(np.asarray(got).reshape(want.shape), want)


@pytest.mark.parametrize("case", ["run", "permutation", "vector"])
def test_int8_gather_of_channels_matches_the_kit(case) -> None:
    shape, indices = GATHER_CASES[case]
    _, built = _int8_matches_the_kit(gather_model(shape, indices), shape)
    assert _host_steps(built) == []


def test_a_scalar_gather_stays_a_host_step_and_says_why() -> None:
    """silero's Gather(state, 0): the axis goes, a [1, 128] row of channel 0 becomes 128 channels."""
    shape = [2, 1, 128]
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0)
    model = _model([node], {"x": shape}, [1, 128], {"i": np.array(0, np.int64)})
    graph = _prepared(model, "fp16", shape)
    gather = next(node for node in graph.nodes if node.op_type == "Gather")
    assert gather.target == "CPU" and _reason(graph, gather).endswith(f"indices 0 on axis 0 of {shape}")


# ---- Pow(x, 2) -------------------------------------------------------------------------------

def test_float16_square_is_x_times_x_rounded_once() -> None:
    shape = [1, 129, 1, 4]
    graph, built, feeds, got = _fp16(pow_model(shape, 2.0), shape, scale=20.0)
    assert _ops(graph) == ["Mul"] and graph.nodes[0].inputs[0] == graph.nodes[0].inputs[1]
    x = feeds["x"].astype(np.float16).astype(np.float32)  # exact product of two fp16 values in fp32
    assert _host_steps(built) == [] and np.array_equal(np.asarray(got), (x * x).astype(np.float16))


def test_int8_square_matches_the_kit() -> None:
    shape = [1, 20, 2, 3]
    graph, built = _int8_matches_the_kit(pow_model(shape, 2.0), shape)
    assert "Pow" not in _ops(graph) and "Mul" in _ops(graph) and _host_steps(built) == []


def test_rank3_square_runs_as_an_element_wise_layer() -> None:
    shape = [1, 5, 7]  # element-wise layers take maps up to 4-D by their NCHW layout
    graph, built, feeds, got = _fp16(pow_model(shape, 2.0), shape)
    x = feeds["x"].astype(np.float16).astype(np.float32)
    assert _host_steps(built) == [] and np.array_equal(np.asarray(got).reshape(shape), (x * x).astype(np.float16))


def test_other_exponents_stay_pow() -> None:
    shape = [1, 8, 2, 2]
    graph = _prepared(pow_model(shape, 3.0), "fp16", shape)
    assert _ops(graph) == ["Pow"] and graph.nodes[0].target == "CPU"
    assert _reason(graph, graph.nodes[0]).endswith(": exponent 3")


# ---- ReduceMean ------------------------------------------------------------------------------

def test_float16_channel_mean_is_exact_where_the_sums_are() -> None:
    """Inputs on a 1/8 grid: every fp32 partial sum is exact, so the mean is the exact mean rounded once."""
    shape = [1, 4, 3, 5]
    model = reduce_mean_model(shape, [1], 1)
    graph = _prepared(model, "fp16", shape)
    assert _ops(graph) == ["Conv"]
    x = np.random.default_rng(2).integers(-64, 64, shape).astype(np.float32) / 8
    built, runtime = _run(graph, {"x": x})
    want = (x.astype(np.float64).sum(axis=1, keepdims=True) / 4).astype(np.float16)
    assert _host_steps(built) == [] and np.array_equal(runtime.output("y", dequantize=False), want)


@pytest.mark.parametrize("shape, axes, keepdims", [([1, 1], [1], 0), ([1, 1], [1], 1), ([1, 24], [1], 0),
                                                   ([1, 6, 4, 4], [2, 3], 1), ([1, 6, 4, 4], [2, 3], 0)])
def test_reduce_mean_runs_on_the_npu(shape, axes, keepdims) -> None:
    model = reduce_mean_model(shape, axes, keepdims)
    graph, built, feeds, got = _fp16(model, shape)
    assert "ReduceMean" not in _ops(graph)
    want = ort_run(model, feeds)
    assert np.allclose(np.asarray(got, np.float32).reshape(want.shape), want, rtol=2e-3, atol=2e-3)
    # a rank-1 result is a host Reshape of the conv's [1, 1, 1, 1] (silero's Unsqueeze after it merges it away)
    assert _host_steps(built) == ([] if keepdims or len(shape) == 4 else ["Reshape"])


def test_int8_channel_mean_matches_the_kit() -> None:
    shape = [1, 24, 2, 2]
    graph, built = _int8_matches_the_kit(reduce_mean_model(shape, [1], 1), shape)
    assert _ops(graph) == ["Conv"] and _host_steps(built) == []


@pytest.mark.parametrize("shape, axes", [([1, 6, 4], [1]), ([2, 6, 1, 1], [0]), ([1, 6, 4, 4], [1, 2, 3])])
def test_other_means_stay_host_steps(shape, axes) -> None:
    graph = _prepared(reduce_mean_model(shape, axes, 1), "fp16", shape)
    node = next(node for node in graph.nodes if node.op_type == "ReduceMean")
    assert node.target == "CPU" and _reason(graph, node).endswith(f"axes {axes} of {shape}")


# ---- the STFT conv as frames ------------------------------------------------------------------

def _frame_bound(x16: np.ndarray, weight: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(exact sums, NUMERICS.md 3.3 bound gamma(K-1) * sum|p| + half an fp16 step) of the frames."""
    kernels, _, taps = weight.shape
    w16 = weight.astype(np.float16).astype(np.float64)[:, 0, :]
    frames = (x16.shape[1] - taps) // stride + 1
    windows = np.stack([x16[0, t * stride:t * stride + taps] for t in range(frames)], axis=1).astype(np.float64)
    exact = w16 @ windows
    unit = 2.0 ** -24
    gamma = (taps - 1) * unit / (1 - (taps - 1) * unit)
    bound = gamma * (np.abs(w16) @ np.abs(windows)) + np.abs(exact) * 2.0 ** -11 + 2.0 ** -25
    return exact, bound


#: the block form (k = 2 s: one conv over the signal's blocks) and the per-frame form (the blocks
#: the frames read would run past the signal: 1x1 convs, one per frame)
STFT_FORMS = {"blocks": ({}, 1, [1, 2]), "frames": ({"length": 600, "taps": 200}, 4, [1, 1])}


@pytest.mark.parametrize("form", sorted(STFT_FORMS))
def test_float16_stft_conv_runs_on_the_npu_within_the_fp32_bound(form) -> None:
    params, convs, kernel = STFT_FORMS[form]
    model = stft_model(**params)
    shape = [1, params.get("length", 640)]
    graph, built, feeds, got = _fp16(model, shape)
    ops = _ops(graph)
    # the one host step is the lifted region's edge: [1, O, 1, T] -> the [1, O, T] graph output (LOWERING.md 18)
    assert ops.count("FlatConcat") == 1 and ops.count("Conv") == convs and _host_steps(built) == ["Reshape"]
    assert all(node.attrs["kernel_shape"] == kernel for node in graph.nodes if node.op_type == "Conv")
    weight = numpy_helper.to_array(next(init for init in model.graph.initializer if init.name == "w"))
    exact, bound = _frame_bound(feeds["x"].astype(np.float16), weight, 128)
    got = np.asarray(got, np.float64).reshape(exact.shape)
    assert np.all(np.abs(got - np.maximum(exact, 0)) <= bound)
    assert cosine(got, ort_run(model, feeds)) >= 0.9999


@pytest.mark.parametrize("form", sorted(STFT_FORMS))
def test_int8_stft_layers_match_the_kit_and_onnxruntime(form) -> None:
    params = STFT_FORMS[form][0] | {"kernels": 20}
    model = stft_model(**params)
    shape = [1, params.get("length", 640)]
    graph = _prepared(model, "int8", shape)
    feeds = _feeds(shape, 9)
    assert _host_steps(_run(graph, feeds)[0]) == ["Reshape"]
    flat = next(node for node in graph.nodes if node.op_type == "FlatConcat")
    probe = copy.deepcopy(graph)  # the layers' inputs and outputs kept as graph outputs: their stored values
    conv_io = [name for node in graph.nodes if node.op_type == "Conv" for name in (node.inputs[0], node.outputs[0])]
    probe.outputs = list(dict.fromkeys([*graph.outputs, *flat.inputs, *flat.outputs, *conv_io]))
    built, runtime = _run(probe, feeds)

    def stored(name):
        return np.asarray(runtime.output(name, dequantize=False))

    out = graph.tensors[flat.outputs[0]].quant
    copies = [np.asarray(reference_copy(stored(name), input_quant=graph.tensors[name].quant, output_quant=out))
              for name in flat.inputs]  # each input one column of [1, C, 1, N]: a requantizing DPU copy
    assert np.array_equal(stored(flat.outputs[0]).reshape(-1, len(copies)),
                          np.concatenate([c.reshape(-1, 1) for c in copies], axis=1))
    convs = copy.copy(graph)  # the kit has no FlatConcat: its convs, each from the stored input it read
    convs.nodes = [node for node in graph.nodes if node.op_type == "Conv"]
    kit = reference_model(convs, built, feeds, layer_inputs={node.inputs[0]: stored(node.inputs[0])
                                                             for node in convs.nodes})
    for node in convs.nodes:
        assert np.array_equal(np.asarray(kit[node.outputs[0]]).reshape(-1), stored(node.outputs[0]).reshape(-1))
    assert cosine(runtime.output("y"), ort_run(model, feeds)) >= 0.995


@pytest.mark.parametrize("pads, source", [((8, 8), "vector"), ((0, 0), "input")])
def test_frames_need_a_pad_free_conv_over_a_channel_vector(pads, source) -> None:
    if source == "vector":
        model, shape = stft_model(pads=pads), [1, 640]
    else:  # the signal is a [1, 1, L] graph input: a row, not a channel vector
        weight = np.random.default_rng(0).normal(0, 0.1, (8, 1, 64)).astype(np.float32)
        node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[64], strides=[32])
        model, shape = _model([node], {"x": [1, 1, 256]}, [1, 8, 7], {"w": weight}), [1, 1, 256]
    graph = _prepared(model, "fp16", shape)
    assert "FlatConcat" not in _ops(graph)
    assert any(node.op_type == "Conv" and node.target == "CPU" for node in graph.nodes)


def test_perf_lists_the_block_layers_with_cycles() -> None:
    from npuemu.emulator.timing.report import report_npu

    graph = _prepared(stft_model(), "fp16", [1, 640])
    built, runtime = _run(graph, _feeds([1, 640], 1))
    rows = {row.full_name: row for row in report_npu(built, runtime.runs, runtime.machine.platform).layers}
    blocked = [row for name, row in rows.items() if "_blocked" in name]
    flat = [row for name, row in rows.items() if name.endswith("_blocks")]
    assert len(blocked) == 1 and len(flat) == 1
    for row in [*blocked, *flat]:
        assert row.target == "NPU" and sum(task.npu_cycles + task.ddr_cycles for task in row.tasks) > 0


# ---- element-wise op between inverse reshapes --------------------------------------------------

def test_relu_between_inverse_reshapes_loses_them() -> None:
    nodes = [helper.make_node("Reshape", ["x", "s3"], ["r"]), helper.make_node("Relu", ["r"], ["a"]),
             helper.make_node("Reshape", ["a", "s4"], ["b"]), helper.make_node("Conv", ["b", "w"], ["y"])]
    inits = {"s3": np.array([1, 16, 1], np.int64), "s4": np.array([1, 16, 1, 1], np.int64),
             "w": np.random.default_rng(0).normal(0, 1, (4, 16, 1, 1)).astype(np.float32)}
    model = _model(nodes, {"x": [1, 16, 1, 1]}, [1, 4, 1, 1], inits)
    graph, built, feeds, got = _fp16(model, [1, 16, 1, 1])
    assert _ops(graph) == ["Relu", "Conv"] and _host_steps(built) == []
    assert cosine(np.asarray(got, np.float32), ort_run(model, feeds)) >= 0.9999


# ---- int8: the magnitude as a float16 island --------------------------------------------------

def test_int8_magnitude_is_a_float16_island_on_the_npu(monkeypatch) -> None:
    model, shape = magnitude_model(), [1, 32, 1, 4]
    graph = _prepared(model, "int8", shape, scale=8.0)
    assert "Sqrt" not in _ops(graph)
    island = [node for node in graph.nodes if node.op_type in ("Mul", "Add", "Rsqrt")]
    assert island and all(graph.tensors[node.outputs[0]].quant.dtype == "float16" for node in island)
    feeds = _feeds(shape, 4, 8.0)
    built, runtime = _run(graph, feeds)
    assert _host_steps(built) == []
    want = ort_run(model, feeds)
    with_island = cosine(runtime.output("y"), want)
    monkeypatch.setattr(magnitude_island, "magnitude_as_float16_island", lambda graph, ctx: 0)
    from npuemu.compiler.passes import pipeline
    monkeypatch.setattr(pipeline, "STAGES", tuple(
        stage if "magnitudes" not in stage.name else pipeline.Stage(stage.name, stage.level, ())
        for stage in pipeline.STAGES))
    plain = _prepared(model, "int8", shape, scale=8.0)
    assert "Sqrt" in _ops(plain)
    _, plain_runtime = _run(plain, feeds)
    assert with_island >= 0.9999 and with_island > cosine(plain_runtime.output("y"), want)


def test_an_int8_sqrt_of_anything_else_stays_a_host_step() -> None:
    shape = [1, 8, 2, 2]
    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sqrt", ["r"], ["y"])], {"x": shape},
                   shape)
    graph = _prepared(model, "int8", shape)
    sqrt = next(node for node in graph.nodes if node.op_type == "Sqrt")
    assert sqrt.target == "CPU"
    assert _reason(graph, sqrt, 1).endswith(f"an int8 Sqrt of {shape} that is not the root of a sum of squares")


# ---- the real model ---------------------------------------------------------------------------

STATE_IO = {"Gather", "Reshape", "Concat", "DataConvert"}  # the LSTM's state in and out (rank-3 layouts)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_silero_front_end_and_tail_run_on_the_npu(precision) -> None:
    if importlib.util.find_spec("silero_vad") is None:
        pytest.skip("silero-vad is not installed")
    from tests.compiler.test_real_models_sequence import MODELS, _onnxruntime, _sample

    model = MODELS["silero_vad_openvino"]
    dataset = [_sample(model, seed) for seed in range(4)] if precision == "int8" else None
    built = compile_model(model.path(), "rk3588", CompileOptions(precision=precision, input_shapes=model.shapes,
                                                                  dataset=dataset))
    host = _host_steps(built)
    assert set(host) <= STATE_IO, host
    feeds = _sample(model, 1000)
    runtime = Runtime(built)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    want = _onnxruntime(model, model.path(), feeds)
    assert cosine(runtime.output("stateN").reshape(want["stateN"].shape), want["stateN"]) >= 0.999
    assert abs(float(np.asarray(runtime.output("output")).ravel()[0]) - float(want["output"].ravel()[0])) <= 0.01
