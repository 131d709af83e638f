"""fp16 average pools in npuemu's own rk3576 builds: depthwise convs of weight 1 / area, as the vendor writes them
(compiler/passes/average_pool_vendor.py, compiler/LOWERING.md 51.2), so the build keeps the vendor layout.

The reference is independent of the pass: the same model with the pool written by hand as the depthwise Conv
(weights 1 / area), built the same way - bit for bit - and onnxruntime's pool (cosine).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build, prepare
from tests.compiler.test_rk3576_vendor_emit import _inputs, _run


def _model(pool: str, size=(12, 20), channels=16, **attributes) -> onnx.ModelProto:
    """Conv 3x3 16 -> ``channels`` pad 1 + ``pool`` ("AveragePool" with ``attributes``, "GlobalAveragePool", or
    "Conv": the hand-written depthwise conv of ``attributes``' kernel, strides and pads)."""
    rng = np.random.default_rng(4)
    weights = (rng.normal(size=(channels, 16, 3, 3)) * 0.3).astype(np.float32)
    bias = rng.normal(0, 0.1, channels).astype(np.float32)
    inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    if pool == "Conv":
        kernel = attributes["kernel_shape"]
        inits.append(numpy_helper.from_array(np.full((channels, 1, *kernel), 1.0 / (kernel[0] * kernel[1]),
                                                     np.float32), "dw"))
        nodes.append(helper.make_node("Conv", ["c", "dw"], ["y"], group=channels, **attributes))
    else:
        nodes.append(helper.make_node(pool, ["c"], ["y"], **attributes))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, *size])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def _build(model, chip="rk3576", precision="fp16"):
    options = CompileOptions(precision="fp16") if precision == "fp16" else CompileOptions(
        dataset=_inputs(16, (12, 20)))
    return build(prepare(model, chip, options))


def _has_ppu_task(built) -> bool:
    words = np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")
    return any(int(w) >> 48 == 0x81 and int(w) >> 16 & 0xFFFFFFFF == 0x60 for w in words)   # op-enable 0x60


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("attributes", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [1, 1]},
    {"kernel_shape": [5, 3], "strides": [1, 2], "pads": [2, 1, 2, 1], "count_include_pad": 1}])
def test_fp16_average_pool_is_a_depthwise_conv_in_the_vendor_layout(attributes):
    built = _build(_model("AveragePool", **attributes))
    assert built.trailer["platform"].get("register_layout") == "rk3576_vendor", built.trailer["platform"]
    assert not _has_ppu_task(built)
    conv = {key: value for key, value in attributes.items() if key != "count_include_pad"}
    by_hand = _build(_model("Conv", **conv))
    session = ort.InferenceSession(_model("AveragePool", **attributes).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for sample in _inputs(16, (12, 20)):
        ours = np.asarray(_run(built, sample["x"]), np.float32)
        np.testing.assert_array_equal(ours, np.asarray(_run(by_hand, sample["x"]), np.float32))
        assert _cosine(ours, session.run(None, sample)[0]) > 0.9999


def test_fp16_global_average_pool_over_one_element_is_a_depthwise_conv():
    """A GlobalAveragePool over 1 x 1 (MobileNetV2 at 32 x 32) stays a pool after the -O3 rewrite of larger ones."""
    built = _build(_model("GlobalAveragePool", size=(1, 1)))
    assert built.trailer["platform"].get("register_layout") == "rk3576_vendor", built.trailer["platform"]
    x = _inputs(16, (1, 1))[0]["x"]
    reference = ort.InferenceSession(_model("GlobalAveragePool", size=(1, 1)).SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _cosine(_run(built, x), reference) > 0.9999


@pytest.mark.parametrize("chip, precision, attributes, ppu", [
    # pads not counted: not a uniform depthwise conv; the pool stays (a host step, as before)
    ("rk3576", "fp16", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, False),
    ("rk3576", "int8", {"kernel_shape": [2, 2], "strides": [2, 2]}, True),   # the vendor's int8 PPU form (LOWERING 42)
    ("rk3588", "fp16", {"kernel_shape": [2, 2], "strides": [2, 2]}, True)])
def test_other_average_pools_stay_pools(chip, precision, attributes, ppu):
    built = _build(_model("AveragePool", **attributes), chip, precision)
    assert [layer["op_type"] for layer in built.trailer["graph"]["layers"]] == ["Conv", "AveragePool"]
    assert _has_ppu_task(built) == ppu
