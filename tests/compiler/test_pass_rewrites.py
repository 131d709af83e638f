"""Vendor rewrites (level 3): GlobalAveragePool as depthwise convs (the vendor's split),
FC as conv, input-channel tiling for the CBUF, the identity conv on odd-sized inputs. Each
keeps the model's output (onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.passes.rewrites import average_plan
from npuemu.platforms import load_platform
from tests.compiler.pass_cases import fused, ops, same_as_ort, weights

RNG = np.random.default_rng(31)


# ---- GlobalAveragePool -----------------------------------------------------------------------

@pytest.mark.parametrize("size, expected", [
    # vendor-corpus layers.csv / tasks.csv (rk3588): kernels, strides and pads of GlobalAveragePool2_2conv0/1/2
    ((75, 75), [([7, 7], [7, 7], [1, 1, 1, 1]), ([7, 7], [7, 7], [1, 1, 2, 2]), ([2, 2], [1, 1], [0, 0, 0, 0])]),
    ((28, 38), [([7, 7], [7, 7], [0, 2, 0, 2]), ([4, 6], [1, 1], [0, 0, 0, 0])]),
    ((38, 38), [([7, 7], [7, 7], [2, 2, 2, 2]), ([6, 6], [1, 1], [0, 0, 0, 0])]),
    ((112, 112), [([7, 7], [7, 7], [0, 0, 0, 0]), ([7, 7], [7, 7], [2, 2, 3, 3]), ([3, 3], [1, 1], [0, 0, 0, 0])]),
    ((7, 7), [([7, 7], [1, 1], [0, 0, 0, 0])]),
])
def test_average_plan_is_the_vendors(size, expected):
    assert average_plan(*size, window=7) == expected


@pytest.mark.parametrize("size", [(75, 75), (28, 38), (12, 96), (7, 7)])
def test_global_average_pool_as_depthwise_convs_keeps_the_mean(onnx_case, rand, size):
    model = onnx_case.model([helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")],
                            {"x": [1, 8, *size]}, ["y"])
    graph = fused(onnx_case, model, {"x": rand([1, 8, *size], seed=1)})
    convs = [node for node in graph.nodes if node.name.startswith("gap_2conv")]
    assert len(convs) == len(average_plan(*size, window=7))
    assert all(node.attrs["group"] == 8 for node in convs) and graph.nodes[-1].outputs == ["y"]


def test_global_average_pool_stays_below_level_3(onnx_case, rand):
    model = onnx_case.model([helper.make_node("GlobalAveragePool", ["x"], ["y"])], {"x": [1, 8, 20, 20]}, ["y"])
    graph = fused(onnx_case, model, {"x": rand([1, 8, 20, 20], seed=1)}, level=2)
    assert ops(graph) == ["GlobalAveragePool"] and graph.nodes[0].target == "CPU"


# ---- FC as conv ------------------------------------------------------------------------------

def test_fc_with_a_residual_part_is_not_rewritten(onnx_case, rand):
    nodes = [helper.make_node("MatMul", ["x", "m"], ["t"], name="fc"), helper.make_node("Add", ["t", "r"], ["y"])]
    model = onnx_case.model(nodes, {"x": [1, 16], "r": [1, 5]}, ["y"], {"m": weights(RNG, [16, 5])})
    graph = fused(onnx_case, model, {"x": rand([1, 16], seed=1), "r": rand([1, 5], seed=2)})
    assert ops(graph) == ["FullyConnected+Add"]


# ---- input-channel tiling --------------------------------------------------------------------

SMALL_CBUF = ["cbuf.bank_bytes=4096"]  # 12 banks of 4 KB: a 64-channel, 300-wide 3x3 conv no longer fits


def _tiling_case(onnx_case, rand, chip_overrides, level=3):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = onnx_case.model(nodes, {"x": [1, 64, 8, 300]}, ["y"], {"w": weights(RNG, [32, 64, 3, 3], 0.1),
                                                                   "b": rand([32], seed=3)})
    graph = import_onnx(model)
    _, split = optimize(graph, PassContext(load_platform("rk3588", chip_overrides), level), check_every_pass=True)
    same_as_ort(onnx_case, model, graph, {"x": rand([1, 64, 8, 300], seed=1)}, rtol=1e-4, atol=1e-4)
    return graph, split


def test_conv_too_large_for_the_cbuf_is_split_along_input_channels(onnx_case, rand):
    graph, split = _tiling_case(onnx_case, rand, SMALL_CBUF)
    assert ops(graph) == ["Split", "Conv", "Conv+Add+Relu"]
    assert graph.nodes[0].attrs == {"axis": 1, "split": [32, 32]}
    assert graph.nodes[2].name == "conv" and graph.nodes[2].layer_name == "conv_fuse_add_relu"
    assert split.count("CPU") == 0


def test_conv_that_fits_is_not_split(onnx_case, rand):
    graph, _ = _tiling_case(onnx_case, rand, [])
    assert ops(graph) == ["Conv+Relu"]


def test_conv_too_large_without_tiling_runs_on_the_cpu(onnx_case, rand):
    graph, split = _tiling_case(onnx_case, rand, SMALL_CBUF, level=2)
    assert ops(graph) == ["Conv+Relu"]
    reason = split.decisions[0].reason
    assert split.decisions[0].target == "CPU" and "CBUF" in reason and "level 3" in reason


# ---- identity conv on odd-sized graph inputs -------------------------------------------------

@pytest.mark.parametrize("size, reader, inserted", [
    ((7, 7), "MaxPool", True), ((75, 150), "Sigmoid", True), ((8, 8), "MaxPool", False),
    ((7, 112), "Sigmoid", False), ((7, 7), "Conv", False),
], ids=["7x7-pool", "75x150-sigmoid", "8x8", "7x112", "7x7-conv"])
def test_identity_conv_on_an_input_whose_plane_is_not_4_aligned(onnx_case, rand, size, reader, inserted):
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]} if reader == "MaxPool" else {}
    inputs = ["x", "w"] if reader == "Conv" else ["x"]
    node = helper.make_node(reader, inputs, ["y"], name="reader", **attrs)
    model = onnx_case.model([node], {"x": [1, 8, *size]}, ["y"], {"w": weights(RNG, [8, 8, 1, 1])})
    graph = fused(onnx_case, model, {"x": rand([1, 8, *size], seed=1)})
    assert (graph.nodes[0].name == "Pre_x") is inserted
    if inserted:  # an activation after it fuses into it (Pre_x+Sigmoid), a pool reads it
        assert graph.nodes[0].op_type == "Conv" and graph.nodes[0].inputs[1] == "Pre_weightx"
        assert np.all(graph.tensors["Pre_weightx"].data == 1) and graph.nodes[-1].outputs == ["y"]
