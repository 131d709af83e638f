"""Model pruning (guide 5.8, issue 25 item 6; passes/prune.py): all-zero conv output channels
removed with the matching inputs downstream; the outputs stay the same (float evaluation of the
pruned graph against onnxruntime on the original) with fewer MACs."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, prepare
from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.ir import Graph
from npuemu.tools.cli import main

SHAPE = (1, 3, 16, 16)
ZEROED = [2, 5, 7, 11]


def _model(bias_on_zeroed: float = 0.0) -> onnx.ModelProto:
    """conv 3->16 (channels ZEROED all zero) -> Relu -> BN (zero at zero on ZEROED) -> depthwise 3x3
    -> conv 16->8 -> output."""
    rng = np.random.default_rng(1)
    w1 = rng.normal(size=(16, 3, 3, 3)).astype(np.float32)
    b1 = rng.normal(size=16).astype(np.float32)
    w1[ZEROED], b1[ZEROED] = 0.0, bias_on_zeroed
    gamma, mean = rng.uniform(0.5, 1.5, 16).astype(np.float32), rng.normal(size=16).astype(np.float32)
    var = np.ones(16, np.float32)
    beta = rng.normal(size=16).astype(np.float32)
    beta[ZEROED] = 0.0
    mean[ZEROED] = 0.0  # BN(0) = beta - mean * gamma / std = 0 on the zeroed channels
    wd, bd = rng.normal(size=(16, 1, 3, 3)).astype(np.float32), rng.normal(size=16).astype(np.float32)
    bd[ZEROED] = 0.0
    w2, b2 = rng.normal(size=(8, 16, 1, 1)).astype(np.float32), rng.normal(size=8).astype(np.float32)
    arrays = {"w1": w1, "b1": b1, "gamma": gamma, "beta": beta, "mean": mean, "var": var, "wd": wd, "bd": bd,
              "w2": w2, "b2": b2}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("BatchNormalization", ["r1", "gamma", "beta", "mean", "var"], ["n1"], name="bn"),
             helper.make_node("Conv", ["n1", "wd", "bd"], ["d1"], name="dw", pads=[1] * 4, group=16),
             helper.make_node("Conv", ["d1", "w2", "b2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "pruneme", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [numpy_helper.from_array(value, name) for name, value in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def macs(graph: Graph) -> int:
    """Multiply-accumulates of the graph's convolutions (output elements x taps per output)."""
    total = 0
    for node in graph.nodes:
        if node.op_type == "Conv":
            weight = graph.tensors[node.inputs[1]].shape
            total += math.prod(graph.tensors[node.outputs[0]].shape) * math.prod(weight[1:])
    return total


@pytest.mark.parametrize("level", [0, 3])
def test_pruned_graph_same_outputs_fewer_macs(level) -> None:
    model = _model()
    x = np.random.default_rng(2).normal(size=SHAPE).astype(np.float32)
    plain = prepare(model, "rk3588", CompileOptions(precision="float", optimization_level=0)).graph
    pruned = prepare(model, "rk3588", CompileOptions(precision="float", optimization_level=level, prune=True))
    assert pruned.pass_log.counts[("pruning (--prune)", "prune_zero_channels")] == len(ZEROED)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = evaluate(pruned.graph, {"x": x})["y"]
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(evaluate(plain, {"x": x})["y"], reference, rtol=1e-4, atol=1e-4)
    kept = (16 - len(ZEROED)) / 16
    assert macs(pruned.graph) < macs(plain)
    if level == 0:  # the same layers, each conv on the kept channels only
        assert macs(pruned.graph) == pytest.approx(macs(plain) * kept)


def test_off_by_default_and_kept_where_bias_is_not_zero() -> None:
    model = _model()
    assert prepare(model, "rk3588", CompileOptions(precision="float", optimization_level=0)).pass_log.total() == 0
    biased = prepare(_model(bias_on_zeroed=0.5), "rk3588", CompileOptions(precision="float", prune=True))
    assert biased.pass_log.counts[("pruning (--prune)", "prune_zero_channels")] == 0  # a constant plane is not zero


def test_graph_output_channels_are_kept() -> None:
    """conv1 -> output directly: removing channels would change the output's shape."""
    model = _model()
    del model.graph.node[1:]
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("c1", TensorProto.FLOAT, [1, 16, 16, 16]))
    front = prepare(model, "rk3588", CompileOptions(precision="float", prune=True))
    assert front.graph.tensors["c1"].shape[1] == 16


def test_cli_prune(tmp_path, caplog) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    with caplog.at_level("INFO", logger="npuemu.compiler.passes.prune"):
        assert main(["compile", str(path), "--fp16", "--prune", "-o", str(tmp_path / "m.npu")]) == 0
    assert "4 all-zero output channel(s) removed [2, 5, 7, 11]" in caplog.text
