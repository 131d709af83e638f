"""Calibration's compiled depthwise Conv (compiler/depthwise_kernel.py) gives the same bits as the
plain float64 formulation written out here (zero padding, a multiply-add per tap from +0.0 in
row-major tap order, bias added in float64, cast to the input's dtype) and as the registry's Conv,
on values chosen so that another summation order or a skipped -0.0 shows in the result; and
calibration with it gives the ranges of calibration without it (issue 20: byte-identical builds)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler import depthwise_kernel
from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.ops import get_op
from npuemu.compiler.quant.calibrate import calibrate


def plain_depthwise(attrs: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    kernel, strides, dilations, pads = attrs["kernel_shape"], attrs["strides"], attrs["dilations"], attrs["pads"]
    padded = np.pad(np.asarray(x, np.float64), [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    sizes = [(padded.shape[2 + i] - e) // s + 1 for i, (e, s) in enumerate(zip(extents, strides))]
    taps = np.asarray(w, np.float64).reshape(w.shape[0], -1)
    result = np.zeros((x.shape[0], x.shape[1], *sizes))
    for index, (ty, tx) in enumerate(np.ndindex(*kernel)):
        rows = slice(ty * dilations[0], ty * dilations[0] + strides[0] * (sizes[0] - 1) + 1, strides[0])
        cols = slice(tx * dilations[1], tx * dilations[1] + strides[1] * (sizes[1] - 1) + 1, strides[1])
        result = result + padded[:, :, rows, cols] * taps[:, index].reshape(-1, 1, 1)
    if b is not None:
        result = result + np.asarray(b, np.float64).reshape(-1, 1, 1)
    return result.astype(x.dtype)


def operands(x_shape, kernel, seed, with_bias, weight_dtype=np.float32):
    """Signed powers of two far apart (2^30, 1, 2^-30; weights 1 or 2^-30): large terms cancel
    exactly, so a sum in another order keeps or loses the small ones; -0.0 inputs too."""
    rng = np.random.default_rng(seed)
    x = (rng.choice([-1.0, 1.0], x_shape) * 2.0 ** rng.choice([30, 0, -30], x_shape)).astype(np.float32)
    x[..., ::3] = -0.0
    w_shape = (x_shape[1], 1, *kernel)
    w = (rng.choice([-1.0, 1.0], w_shape) * 2.0 ** rng.choice([0, -30], w_shape)).astype(weight_dtype)
    b = rng.standard_normal(x_shape[1]).astype(np.float32) if with_bias else None
    return [x, w] + ([b] if with_bias else []), b


@st.composite
def cases(draw):
    kernel = [draw(st.integers(1, 5)), draw(st.integers(1, 5))]
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    sizes = [draw(st.integers(max(1, e - pads[i] - pads[i + 2]), e + 12)) for i, e in enumerate(extents)]
    channels = draw(st.integers(1, 5))
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads, "group": channels}
    return attrs, (draw(st.integers(1, 2)), channels, *sizes), draw(st.booleans()), draw(st.integers(0, 2**16))


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_kernel_gives_the_plain_formulations_bits(case) -> None:
    attrs, x_shape, with_bias, seed = case
    x, b = operands(x_shape, attrs["kernel_shape"], seed, with_bias)
    assert depthwise_kernel.applies(attrs, x)
    got = depthwise_kernel.depthwise_conv(attrs, x)
    want = plain_depthwise(attrs, x[0], x[1], b)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
    assert got.tobytes() == want.tobytes()
    assert got.tobytes() == get_op("Conv").run(attrs, x)[0].tobytes()


def test_model_sized_layers_give_the_same_bits() -> None:
    """PP-OCRv4 rec's 5x5 and strided 5x5, its 6x7 pooling conv, a MobileNetV2 3x3 stride 2."""
    layers = [((1, 240, 12, 80), [5, 5], [1, 1], [2] * 4), ((1, 480, 6, 80), [5, 5], [2, 1], [2] * 4),
              ((1, 240, 6, 80), [6, 7], [6, 7], [0, 2, 0, 2]), ((1, 96, 56, 56), [3, 3], [2, 2], [1] * 4)]
    for seed, (x_shape, kernel, strides, pads) in enumerate(layers):
        attrs = {"kernel_shape": kernel, "strides": strides, "dilations": [1, 1], "pads": pads, "group": x_shape[1]}
        x, b = operands(x_shape, kernel, seed, True)
        assert depthwise_kernel.conv(attrs, x).tobytes() == plain_depthwise(attrs, x[0], x[1], b).tobytes()


def test_other_cases_keep_the_registry_op() -> None:
    """Non-finite weights (0 * inf in a pad is NaN), float16 input, 1-D and grouped convs: the numpy op."""
    attrs = {"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [1, 1], "pads": [1] * 4, "group": 2}
    x, _ = operands((1, 2, 4, 4), [3, 3], 1, False)
    x[1][0, 0, 0, 0] = np.inf
    assert not depthwise_kernel.applies(attrs, x)
    with np.errstate(invalid="ignore"):
        assert np.isnan(depthwise_kernel.conv(attrs, x)).any()  # the pad's 0 * inf, as numpy has it
        assert depthwise_kernel.conv(attrs, x).tobytes() == get_op("Conv").run(attrs, x)[0].tobytes()
    finite = [x[0], np.ones_like(x[1])]
    assert depthwise_kernel.applies(attrs, finite)
    assert not depthwise_kernel.applies(attrs, [np.ones(x[0].shape, np.float16), finite[1]])
    one_d = {"kernel_shape": [3], "strides": [1], "dilations": [1], "pads": [1, 1], "group": 2}
    assert not depthwise_kernel.applies(one_d, [x[0][:, :, 0], finite[1][:, :, 0]])
    grouped, _ = operands((1, 4, 4, 4), [3, 3], 3, False)
    assert not depthwise_kernel.applies(attrs, grouped)  # 4 channels in 2 groups


def depthwise_graph(channels: int = 8, size: int = 16):
    """depthwise 3x3 conv with bias -> relu, imported from ONNX."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((channels, 1, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=channels),
             helper.make_node("Relu", ["c"], ["y"])]
    shape = [1, channels, size, size]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def test_the_threshold_decides_and_evaluation_is_unchanged(monkeypatch) -> None:
    graph = depthwise_graph()
    work = 8 * 16 * 16 * 9
    assert depthwise_kernel.calibration_work(graph, 3) == 3 * work
    assert depthwise_kernel.calibration_ops(graph, 3) is None  # far below MIN_CALIBRATION_WORK
    monkeypatch.setattr(depthwise_kernel, "MIN_CALIBRATION_WORK", 3 * work)
    ops = depthwise_kernel.calibration_ops(graph, 3)
    assert ops is not None and ops["Conv"].compute is depthwise_kernel.conv
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)}
    plain, fast = evaluate(graph, x, return_all=True), evaluate(graph, x, return_all=True, ops=ops)
    assert plain.keys() == fast.keys() and all(plain[name].tobytes() == fast[name].tobytes() for name in plain)


@pytest.mark.parametrize("workers", [1, 2])
def test_calibration_with_the_kernel_gives_the_same_ranges(monkeypatch, workers) -> None:
    graph = depthwise_graph()
    rng = np.random.default_rng(2)
    samples = [{"x": (rng.standard_normal((1, 8, 16, 16)) * 3).astype(np.float32)} for _ in range(5)]
    without = calibrate(graph, samples, progress=False, workers=workers)
    monkeypatch.setattr(depthwise_kernel, "MIN_CALIBRATION_WORK", 1)
    used = []
    monkeypatch.setattr(depthwise_kernel, "depthwise_conv",
                        lambda attrs, x, original=depthwise_kernel.depthwise_conv: used.append(1) or original(attrs, x))
    with_kernel = calibrate(graph, samples, progress=False, workers=workers)
    assert used or workers > 1  # (a worker's calls are in its own process)
    assert bits(without.ranges) == bits(with_kernel.ranges) and bits(without.observed) == bits(with_kernel.observed)


def bits(ranges) -> dict:
    return {name: (np.float64(r.lo).tobytes(), np.float64(r.hi).tobytes()) for name, r in ranges.items()}
