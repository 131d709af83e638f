"""A conv too large for the CBUF whose activation cannot follow the input-channel chain's
partial-sum add in one layer (rk3588 fuses Conv+Add+Act only with Relu): the level-3 rewrite
(passes/rewrite_channel_tiling.py ``_activations_after``) builds the Split + Conv + ConvAdd chain
and runs the activation as a layer of its own after it, instead of leaving the whole conv on the
host (PP-OCRv4 rec's fp16 build: a 480 -> 480 1x1 Conv+HardSwish at 6x80, input and weights 15
CBUF banks each; LOWERING.md 49). An activation followed by a residual Add still stays whole."""

from __future__ import annotations

import numpy as np

from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
from tests.compiler.test_build_e2e import Net, compare, cosine, onnxruntime_float


def _opset14(model):
    model.opset_import[0].version = 14  # (HardSwish)
    return model


def _rec_like(activation: str = "HardSwish", residual: bool = False):
    """rec's layer: 1x1 conv 480 -> 480 at 6x80 (+ bias) and the activation (then a residual Add)."""
    net = Net(11)
    net.conv("stem", "x", "a", 8, 480, kernel=1)
    net.conv("big", "a", "b", 480, 480, kernel=1)
    net.node(activation, ["b"], ["c" if residual else "y"], "act")
    if residual:
        net.node("Add", ["c", "a"], ["y"], "add")
    return _opset14(net.model([1, 8, 6, 80], "y")), (1, 8, 6, 80)


def _big_int8():
    """1x1 conv 512 -> 1024 at 28x28 then HardSwish: too large for the CBUF in int8 too."""
    net = Net(8)
    net.conv("stem", "x", "a", 8, 512, kernel=1)
    net.conv("big", "a", "b", 512, 1024, kernel=1)
    net.node("HardSwish", ["b"], ["y"], "hs")
    return _opset14(net.model([1, 8, 28, 28], "y")), (1, 8, 28, 28)


def _ops_after_split(graph) -> list[str]:
    ops = [node.op_type for node in graph.nodes]
    return ops[ops.index("Split"):] if "Split" in ops else []


def test_fp16_conv_and_hardswish_too_big_run_on_the_npu() -> None:
    model, shape = _rec_like()
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    graph = front.graph
    tail = _ops_after_split(graph)
    assert tail[:3] == ["Split", "Conv", "Conv"] and tail[3] == "HardSwish", tail
    last_conv = [node for node in graph.nodes if node.op_type == "Conv"][-1]
    assert [part.op_type for part in last_conv.fused] == ["Add"]  # the partial sum, no activation
    assert all(node.target == "NPU" for node in graph.nodes)
    built = build(front)
    assert all(step.kind == "npu" for step in built.schedule())
    runtime = Runtime(built)
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    runtime.set_input("x", x)
    runtime.run()
    assert cosine(runtime.output(graph.outputs[0]), onnxruntime_float(model, x)) >= 0.9999


def test_int8_conv_and_hardswish_too_big_match_fake_quant(tmp_path) -> None:
    model, shape = _big_int8()
    within, cos, stored, graph = compare(model, shape, tmp_path / "big.npu")
    assert "HardSwish" in _ops_after_split(graph)
    built = ModelFile.read(tmp_path / "big.npu")
    assert all(step.kind == "npu" for step in built.schedule())
    assert within >= 0.99, f"only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.999, f"cosine {cos:.5f} against onnxruntime float"
    assert np.unique(stored).size > 8


def test_activation_then_residual_is_still_left_whole() -> None:
    """Conv+Act+Add: the residual comes after the activation, so neither can move past the chain."""
    model, _ = _rec_like(residual=True)
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))
    ops = [node.op_type for node in front.graph.nodes]
    assert "Split" not in ops and "HardSwish" not in ops, ops
    assert any(node.target == "CPU" for node in front.graph.nodes if node.op_type == "Conv")
