"""Per-layer JSON export in the NPU perf JSON format of the seed document."""

from __future__ import annotations

import json

import numpy as np
from onnx import helper

from npuemu.compiler.ir import FusedOp
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.perf_json import dumps, perf_json, write_perf_json


def _graph(onnx_case, rand):
    nodes = [
        helper.make_node("Conv", ["data", "w", "b"], ["c"], pads=[1, 2, 3, 4], strides=[2, 2], group=1, name="conv1"),
        helper.make_node("Relu", ["c"], ["r"], name="relu1"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, name="pool1"),
        helper.make_node("Clip", ["p", "lo", "hi"], ["q"], name="relu6"),
        helper.make_node("Clip", ["q", "lo"], ["k"], name="clip_low"),
        helper.make_node("Flatten", ["k"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc"),
    ]
    inits = {"w": rand([16, 3, 3, 3], seed=1), "b": rand([16], seed=2), "lo": np.array(0, np.float32),
             "hi": np.array(6, np.float32), "fc_w": rand([10, 16 * 4 * 3], seed=3), "fc_b": rand([10], seed=4)}
    return import_onnx(onnx_case.model(nodes, {"data": [1, 3, 12, 8]}, ["y"], inits))


def test_document_structure(onnx_case, rand):
    document = perf_json(_graph(onnx_case, rand))
    assert list(document) == ["input_names", "layers"] and document["input_names"] == ["data"]
    assert [layer["op_type"] for layer in document["layers"]] == [
        "qnn.csi.conv2d", "qnn.csi.relu", "qnn.csi.maxpool2d", "qnn.csi.relu6", "qnn.csi.clip", "qnn.csi.flatten",
        "qnn.csi.dense"]
    for layer in document["layers"]:
        assert list(layer) == ["op_type", "name", "attrs", "inputs", "outputs"]
        for tensor in layer["inputs"] + layer["outputs"]:
            assert list(tensor) == ["name", "dim", "is_const", "layout"]
    # each output name is an input name of a later layer (or a graph output)
    produced = [t["name"] for layer in document["layers"] for t in layer["outputs"]]
    consumed = {t["name"] for layer in document["layers"] for t in layer["inputs"]}
    assert set(produced[:-1]) <= consumed


def test_conv_layer_matches_the_seed_example(onnx_case, rand):
    conv = perf_json(_graph(onnx_case, rand))["layers"][0]
    assert conv["name"] == "conv1"
    assert conv["attrs"] == {"channels": 16, "kernel_size": [3, 3], "strides": [2, 2],
                             "padding": [1, 3, 2, 4],  # top, bottom, left, right
                             "groups": 1, "dilation": [1, 1], "data_layout": "NCHW", "kernel_layout": "OIHW"}
    assert conv["inputs"] == [
        {"name": "data", "dim": [1, 3, 12, 8], "is_const": 0, "layout": "NCHW"},
        {"name": "w", "dim": [16, 3, 3, 3], "is_const": 1, "layout": "OIHW"},
        {"name": "b", "dim": [16], "is_const": 1, "layout": "O"},
    ]
    assert conv["outputs"] == [{"name": "c", "dim": [1, 16, 7, 6], "is_const": 0, "layout": "NCHW"}]


def test_other_attributes_and_strict_json(onnx_case, rand):
    layers = perf_json(_graph(onnx_case, rand))["layers"]
    assert layers[2]["attrs"] == {"pool_size": [2, 2], "strides": [2, 2], "padding": [0, 0, 0, 0],
                                  "dilation": [1, 1], "ceil_mode": True, "layout": "NCHW"}
    assert layers[4]["attrs"] == {"a_min": 0.0, "a_max": float(np.finfo(np.float32).max)}  # +inf bound
    assert layers[6]["attrs"]["units"] == 10 and layers[6]["inputs"][1]["layout"] == "OI"
    assert layers[5]["outputs"][0]["layout"] == "NC"
    text = dumps(_graph(onnx_case, rand))
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text) == perf_json(_graph(onnx_case, rand))
    assert '"dim": [1, 3, 12, 8]' in text  # short lists on one line


def test_fused_layers_carry_the_fusion_in_their_name(onnx_case, rand, tmp_path):
    graph = _graph(onnx_case, rand)
    conv, relu = graph.nodes[:2]
    conv.fused = [FusedOp("Relu", source=relu.name)]
    conv.outputs = relu.outputs
    del graph.nodes[1]
    graph.remove_dead()
    path = tmp_path / "layers.json"
    write_perf_json(graph, path)
    layer = json.loads(path.read_text())["layers"][0]
    assert layer["name"] == "conv1_fuse_relu"
    assert layer["attrs"]["fuse"] == [{"op_type": "qnn.csi.relu", "attrs": {}}]
    assert layer["outputs"][0]["name"] == "r"
