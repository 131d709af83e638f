"""NPU/CPU partition: decisions per op and limit, the reasons a user sees (``--dump-ir``,
``--dump-json``, ``--partition-report``), per platform."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, partition
from npuemu.compiler.passes.composite_ops import FULLY_CONNECTED
from npuemu.compiler.passes.partition import NPU_OPS
from npuemu.compiler.passes.transpose_npu import transpose_swaps_height_width
from npuemu.tools.cli import main
from tests.compiler.pass_cases import passed, weights

RNG = np.random.default_rng(41)
I64 = np.int64


def _decide(onnx_case, node, inputs, inits=None, level=0, chip="rk3588", opset=13):
    """The decision for the model's only (or last) layer after the passes of ``level``."""
    outputs = [name for name in node.output]
    model = onnx_case.model([node], inputs, outputs, inits or {}, opset=opset)
    graph = passed(model, level, chip)
    return graph.nodes[-1].target, partition(graph, PassContext.for_chip(chip, level)).decisions[-1].reason


def _conv(**attrs):
    return helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)


CONV_CASES = [
    ("plain", _conv(pads=[1, 1, 1, 1]), [8, 8, 3, 3], "NPU", "CNA convolution"),
    ("depthwise", _conv(group=8), [8, 1, 3, 3], "NPU", "CNA convolution"),
    ("dilated", _conv(dilations=[2, 2]), [8, 8, 3, 3], "NPU", "CNA convolution"),
    ("stride-8", _conv(strides=[8, 8]), [8, 8, 3, 3], "CPU",
     "Strides are at most 7 (CNA CONV_CON3 stride fields): strides [8, 8]"),
    ("kernel-33", _conv(pads=[16, 16, 16, 16]), [8, 8, 33, 33], "CPU", "Kernel height and width are at most 31"),
    ("grouped", _conv(group=2), [8, 4, 3, 3], "CPU", "group 2 with 8 input and 8 output channels"),
    ("pad-16", _conv(pads=[16, 0, 0, 0]), [8, 8, 1, 1], "CPU", "Pads are 0 to 15"),
]


@pytest.mark.parametrize("name, node, weight_shape, target, reason", CONV_CASES, ids=[case[0] for case in CONV_CASES])
def test_convolutions(onnx_case, name, node, weight_shape, target, reason):
    decided = _decide(onnx_case, node, {"x": [1, 8, 40, 40]}, {"w": weights(RNG, weight_shape)})
    assert decided[0] == target and reason in decided[1]


def test_batch_of_two_runs_on_the_cpu(onnx_case):
    target, reason = _decide(onnx_case, _conv(), {"x": [2, 8, 8, 8]}, {"w": weights(RNG, [8, 8, 1, 1])})
    assert target == "CPU" and "batch N = 1" in reason and "[2, 8, 8, 8]" in reason


@pytest.mark.parametrize("attrs, target, reason", [
    ({"strides": [2, 2]}, "NPU", "stride phases"),
    ({"strides": [2, 2], "output_padding": [1, 1]}, "NPU", "stride phases"),
    ({"strides": [2, 2], "group": 2}, "CPU", "group 2"),
    ({"strides": [2, 1]}, "CPU", "strides [2, 1]"),
    ({"strides": [1, 1], "dilations": [2, 2]}, "CPU", "dilations [2, 2]"),
], ids=["2x2-s2", "output-padding", "grouped", "unequal-strides", "dilated"])
def test_transposed_convolutions(onnx_case, attrs, target, reason):
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2], **attrs)
    shape = [8, 8 // attrs.get("group", 1), 2, 2]
    decided = _decide(onnx_case, node, {"x": [1, 8, 10, 10]}, {"w": weights(RNG, shape)})
    assert decided[0] == target and reason in decided[1]


@pytest.mark.parametrize("attrs, target, reason", [
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, "NPU", "PPU"),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "CPU", "count_include_pad = 0"),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}, "NPU", "PPU"),
    ({"kernel_shape": [17, 17]}, "CPU", "window at most 16"),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, "CPU", "ceil mode makes [10, 10], not [9, 9]"),
], ids=["k2s2", "k3s2p1", "k3s2p1-count-pads", "k17", "ceil"])
def test_average_pooling(onnx_case, attrs, target, reason):
    decided = _decide(onnx_case, helper.make_node("AveragePool", ["x"], ["y"], **attrs), {"x": [1, 8, 20, 20]})
    assert decided[0] == target and reason in decided[1]


def test_max_pool_with_padding_runs_on_the_npu(onnx_case):
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    assert _decide(onnx_case, node, {"x": [1, 8, 20, 20]})[0] == "NPU"


@pytest.mark.parametrize("other, target, reason", [
    ([1, 8, 6, 6], "NPU", "DPU element-wise"),
    ([1, 8, 1, 1], "NPU", "DPU element-wise"),
    ([1, 1, 1, 6], "CPU", "operands [[1, 8, 6, 6], [1, 1, 1, 6]]"),
], ids=["same-shape", "per-channel-tensor", "row-broadcast"])
def test_element_wise_operands(onnx_case, other, target, reason):
    node = helper.make_node("Mul", ["x", "z"], ["y"])
    decided = _decide(onnx_case, node, {"x": [1, 8, 6, 6], "z": other})
    assert decided[0] == target and reason in decided[1]


def test_division_only_by_a_constant(onnx_case):
    node = helper.make_node("Div", ["x", "z"], ["y"])
    reason = _decide(onnx_case, node, {"x": [1, 8, 6, 6], "z": [1, 8, 6, 6]})[1]
    assert reason.endswith("Div only by a constant (run as a multiply by its reciprocal): the divisor is not a constant")
    assert _decide(onnx_case, node, {"x": [1, 8, 6, 6]}, {"z": np.float32(3)})[0] == "NPU"


@pytest.mark.parametrize("axis, target", [(1, "NPU"), (2, "CPU")])
def test_concat_along_channels_only(onnx_case, axis, target):
    node = helper.make_node("Concat", ["x", "z"], ["y"], axis=axis)
    assert _decide(onnx_case, node, {"x": [1, 8, 6, 6], "z": [1, 8, 6, 6]})[0] == target


@pytest.mark.parametrize("source, shape, target", [
    ([1, 8, 1, 1], [1, 8], "NPU"), ([1, 8, 2, 2], [1, 32], "CPU"),
])
def test_reshape_by_address_only_when_the_bytes_stay(onnx_case, source, shape, target):
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    assert _decide(onnx_case, node, {"x": source}, {"s": np.array(shape, I64)})[0] == target


def softmax_off_channels(shape: list[int]) -> str:
    """The host reason of a Softmax over a spatial axis (axis 2): over channels it runs on the NPU
    (LOWERING.md 22.2, 25), in int8 builds as a float16 island (LOWERING.md 26)."""
    return (f"Softmax over the channel axis of a [1, C, H, W] map, each pixel on its own (LOWERING.md 22.2): "
            f"axis 2 of {shape}")


@pytest.mark.parametrize("node, inputs, reason", [
    (helper.make_node("Softmax", ["x"], ["y"], axis=2), {"x": [1, 8, 6, 6]}, softmax_off_channels([1, 8, 6, 6])),
    (helper.make_node("Transpose", ["x"], ["y"], perm=[2, 1, 0, 3]), {"x": [1, 8, 6, 6]},  # moves N (LOWERING.md 36)
     f"{transpose_swaps_height_width.describe().rstrip('.')}: perm [2, 1, 0, 3] of a rank-4 tensor is not lowered"),
    (helper.make_node("ReduceMax", ["x"], ["y"], axes=[1]), {"x": [1, 8, 6, 6]}, "no NPU lowering for ReduceMax"),
    (helper.make_node("ArgMax", ["x"], ["y"], axis=1), {"x": [1, 8, 6, 6]}, "no NPU lowering for ArgMax"),
], ids=["softmax", "transpose", "reducemax", "argmax"])
def test_ops_without_npu_lowering(onnx_case, node, inputs, reason):
    assert _decide(onnx_case, node, inputs) == ("CPU", reason)


def test_fully_connected_with_several_rows_runs_on_the_cpu(onnx_case):
    node = helper.make_node("MatMul", ["x", "m"], ["y"], name="fc")
    target, reason = _decide(onnx_case, node, {"x": [3, 16]}, {"m": weights(RNG, [16, 5])}, level=1)
    assert target == "CPU" and reason.startswith("A fully connected layer has one row")
    assert "token region" in reason and reason.endswith(": 3 rows")  # a matrix's rows are no tokens: no region
    # on [1, 3, 16] graph I/O its region costs no host step (readin, readout; the edge Transposes on
    # the DPU, LOWERING.md 35): converted, a 1x1 conv
    graph = passed(onnx_case.model([node], {"x": [1, 3, 16]}, ["y"], {"m": weights(RNG, [16, 5])}), 1, "rk3588")
    assert [(n.op_type, n.target) for n in graph.nodes] == [("Readin", "NPU"), ("Conv", "NPU"), ("Readout", "NPU")]
    target, _ = _decide(onnx_case, node, {"x": [1, 16]}, {"m": weights(RNG, [16, 5])}, level=1)
    assert target == "NPU"


def test_each_npu_op_is_known_to_the_registry():
    from npuemu.compiler.ops import REGISTRY

    listed = [op for entry in NPU_OPS for op in entry.ops]
    assert FULLY_CONNECTED in listed and all(op in REGISTRY for op in listed)
    assert len(listed) == len(set(listed))


def test_cbuf_limits_come_from_the_platform(onnx_case):
    # 256 -> 256 3x3 on a 200-wide map: fits RK3588's 12 x 32 KB CBUF by H-split, not RV1106's 8 x 16 KB
    node = _conv(pads=[1, 1, 1, 1])
    inits = {"w": weights(RNG, [256, 256, 3, 3])}
    model = onnx_case.model([node], {"x": [1, 256, 4, 200]}, ["y"], inits)
    graph = import_onnx(model)
    assert partition(graph, PassContext.for_chip("rk3588", 0)).decisions[0].target == "NPU"
    decision = partition(graph, PassContext.for_chip("rv1106", 0)).decisions[0]
    assert decision.target == "CPU" and "8-bank CBUF" in decision.reason


# ---- what the user sees ----------------------------------------------------------------------

@pytest.fixture
def softmax_model(onnx_case, tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Softmax", ["r"], ["y"], axis=2, name="softmax")]
    model = onnx_case.model(nodes, {"x": [1, 3, 8, 8]}, ["y"], {"w": weights(RNG, [4, 3, 1, 1])})
    path = tmp_path / "net.onnx"
    onnx.save(model, str(path))
    return path


def test_dump_ir_shows_targets_and_reasons(softmax_model, capsys):
    assert main(["compile", str(softmax_model), "--dump-ir", "-"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("0 Conv+Relu  conv ") and lines[-2].endswith("+Relu  on NPU")
    assert lines[-1].startswith("1 Softmax  softmax ") and lines[-1].endswith("on CPU: " + softmax_off_channels([1, 4, 8, 8]))


def test_dump_json_carries_target_and_reason(softmax_model, tmp_path, capsys):
    destination = tmp_path / "net.json"
    assert main(["compile", str(softmax_model), "--dump-json", str(destination)]) == 0
    layers = json.loads(destination.read_text())["layers"]
    assert [(layer["name"], layer["target"]) for layer in layers] == [("conv_fuse_relu", "NPU"), ("softmax", "CPU")]
    assert layers[1]["target_reason"] == softmax_off_channels([1, 4, 8, 8])
    assert "1 layers on the NPU, 1 on the CPU (Softmax x1)" in capsys.readouterr().out


def test_partition_report(softmax_model, capsys):
    assert main(["compile", str(softmax_model), "-t", "rk3566", "--partition-report"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "partition for rk3568: 1 layers on the NPU, 1 on the CPU"
    assert "1 CPU  Softmax  softmax  - " + softmax_off_channels([1, 4, 8, 8]) in out
