"""BatchNormalization that cannot be folded into a conv (after a pool or an Add; issue 18 item 6)
runs on the NPU as a per-channel scale+bias layer: a 1x1 depthwise Conv with weights
``gamma / sqrt(var + eps)`` and bias ``beta - mean * scale`` (passes/fold_bn.py
``batch_norm_as_depthwise_conv``: CNA depthwise mode, the DPU's per-channel bias and
requantization), on [1, C, H, W] and, lifted by passes/lift_1d.py, on [1, C, L].

Checked: the graph (the BN became that conv, on the NPU); int8 bit for bit against the testing
kit's independent reference of the built model and by cosine against onnxruntime; float16 against
onnxruntime; ``npuemu perf`` lists the layer as an NPU layer with cycles."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.compiler.test_conv1d import build, check_against_references, onnx_model, run

def bn_inits(channels: int) -> dict:
    rng = np.random.default_rng(channels)  # per model, not per test order
    return {"gamma": rng.uniform(0.5, 1.5, channels), "beta": rng.normal(0, 0.3, channels),
            "mean": rng.normal(0, 0.3, channels), "var": rng.uniform(0.3, 2.0, channels)}


def bn_node(source: str) -> helper.NodeProto:
    return helper.make_node("BatchNormalization", [source, "gamma", "beta", "mean", "var"], ["y"], epsilon=1e-3)


def bn_after_pool(channels: int, spatial: tuple[int, ...]):
    window = [2] * len(spatial)
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=window, strides=window), bn_node("p")]
    return onnx_model(nodes, bn_inits(channels), [1, channels, *spatial], [1, channels, *(s // 2 for s in spatial)])


def bn_after_add(channels: int, spatial: tuple[int, ...]):
    """x -> MaxPool -> (p + Relu(p)) -> BN: the pool makes a 1-D input a lifted region (a BN
    alone on [1, C, L] stays a host step, test_pass_fold)."""
    window = [2] * len(spatial)
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=window, strides=window),
             helper.make_node("Relu", ["p"], ["r"]), helper.make_node("Add", ["p", "r"], ["a"]), bn_node("a")]
    return onnx_model(nodes, bn_inits(channels), [1, channels, *spatial], [1, channels, *(s // 2 for s in spatial)])


CASES = {
    "after_maxpool_2d": (bn_after_pool, 24, (12, 16)),
    "after_add_2d": (bn_after_add, 20, (10, 12)),
    "after_maxpool_1d": (bn_after_pool, 24, (50,)),
    "after_add_1d": (bn_after_add, 16, (40,)),
}


@pytest.mark.parametrize("mode", ["int8", "float16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_unfolded_batch_norm_is_an_npu_scale_bias_layer(case, mode) -> None:
    make, channels, spatial = CASES[case]
    shape = [1, channels, *spatial]
    # int8 after an Add: three requantized layers (Relu, Add, BN) before the output, cosine 0.9989
    graph, _ = check_against_references(make(channels, spatial), mode, {"x": shape},
                                        int8_cosine=0.998 if make is bn_after_add else 0.999)
    (bn,) = [node for node in graph.nodes if node.name.startswith("BatchNormalization")]
    assert bn.op_type == "Conv" and bn.attrs["group"] == channels and bn.attrs["kernel_shape"] == [1, 1]
    assert bn.target == "NPU"
    assert "BatchNormalization" not in [node.op_type for node in graph.nodes]
    if len(spatial) == 1:  # lifted with the region: Reshapes at the graph input and output only
        assert [node.op_type for node in graph.nodes].count("Reshape") == 2


def test_perf_lists_the_batch_norm_layer_with_cycles() -> None:
    from npuemu.emulator.timing.report import report_npu

    _, model = build(bn_after_pool(24, (12, 16)), "int8", {"x": [1, 24, 12, 16]})
    runtime = run(model, {"x": np.zeros((1, 24, 12, 16), np.float32)})
    rows = {row.full_name: row for row in report_npu(model, runtime.runs, runtime.machine.platform).layers if row.tasks}
    assert set(rows) >= {"BatchNormalization_1"}, set(rows)
    assert rows["BatchNormalization_1"].target == "NPU"
    assert sum(task.npu_cycles for task in rows["BatchNormalization_1"].tasks) > 0
