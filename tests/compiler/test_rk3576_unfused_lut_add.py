"""int8 rk3576 builds keep a residual Add after a LUT activation out of the conv (compiler/LOWERING.md 53;
passes/fusion_rules.py ``_vendor_refuses``).

The vendor never fuses it [V ORC: Conv + SiLU + Add of the input builds as ``ConvExSwish`` then a DPU-only
Add; rknn-fixtures-ops conv_silu_add_fp16 shows the same two layers in fp16], so its rk3576 layout has no
word for npuemu's one-task form (EW_CFG 0x90420240, LOWERING.md 46.1). Left apart, the Add is an ordinary
int8 Add layer and the build is written in the vendor layout. rk3588 builds and fp16 builds keep the fusion.
References: onnxruntime for the outputs; the RK3588-position build of the same graph for the layout.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import fusion_rules
from npuemu.compiler.passes.context import PassContext
from npuemu.compiler.passes.match import BIAS_TAG
from npuemu.compiler.passes.pipeline import run_passes
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_rk3576_vendor_emit import both_layouts

C, SIZE = 16, (12, 20)


def _model(activation: str):
    """x [1, 16, 12, 20] -> Conv 3x3 pad 1 (bias) -> activation -> + x -> y. ``Silu`` is x * Sigmoid(x)
    (the exporters' form, matched by fuse_patterns.silu_subgraph)."""
    rng = np.random.default_rng(11)
    weights = (rng.normal(size=(C, C, 3, 3)) * 0.15).astype(np.float32)
    bias = (rng.normal(size=C) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    if activation == "Silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["a"])]
    else:
        nodes.append(helper.make_node(activation, ["c"], ["a"]))
    nodes.append(helper.make_node("Add", ["a", "x"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, *SIZE])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, *SIZE])],
                              [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def _fused(model, chip: str, element_bytes: int) -> list[list[str]]:
    """Each conv's fused parts (bias adds left out) after the default passes."""
    graph = import_onnx(model)
    run_passes(graph, PassContext.for_chip(chip, element_bytes=element_bytes))
    return [[p.op_type for p in n.fused if p.tag != BIAS_TAG] for n in graph.nodes if n.op_type == "Conv"]


@pytest.mark.parametrize("activation", ["Silu", "Sigmoid", "Tanh", "HardSwish"])
def test_int8_rk3576_keeps_the_add_after_a_lut_activation_apart(activation):
    model = _model(activation)
    assert _fused(model, "rk3576", 1) == [[activation]]
    assert _fused(model, "rk3588", 1) == [[activation, "Add"]]   # RK3588 builds unchanged
    assert _fused(model, "rk3576", 2) == [[activation, "Add"]]   # fp16: build_adapt splits it (LOWERING.md 46.1)


def test_relu_then_add_still_fuses_on_rk3576():
    """Relu is no LUT activation: the vendor's ConvReluAdd, which its rk3576 layout has."""
    assert _fused(_model("Relu"), "rk3576", 1) == [["Relu", "Add"]]


def _samples(count=3, seed=5):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, C, *SIZE)).astype(np.float32)} for _ in range(count)]


def _cosine(model_file, model, x) -> float:
    runtime = Runtime(model_file)
    runtime.set_input("x", x)
    runtime.run()
    ours = np.asarray(runtime.output("y"), np.float64).ravel()
    ref = ort.InferenceSession(model.SerializeToString()).run(["y"], {"x": x})[0].astype(np.float64).ravel()
    return float(ours @ ref / np.linalg.norm(ours) / np.linalg.norm(ref))


def test_int8_rk3576_conv_silu_add_builds_in_the_vendor_layout():
    model, samples = _model("Silu"), _samples()
    options = CompileOptions(dataset=samples)
    vendor, old = both_layouts(model, options)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert "register_layout" not in old.trailer["platform"]
    for sample in samples:   # the layout does not change the arithmetic
        assert _cosine(vendor, model, sample["x"]) > 0.999
        for built in (vendor, old):
            runtime = Runtime(built)
            runtime.set_input("x", sample["x"])
            runtime.run()
            sample.setdefault("runs", []).append(runtime.output("y", dequantize=False))
        np.testing.assert_array_equal(*sample["runs"])


def test_without_the_rule_the_fused_task_keeps_rk3576_at_rk3588_positions(monkeypatch):
    """Why the rule exists: the fused conv + SiLU + Add task has no vendor form."""
    model, options = _model("Silu"), CompileOptions(dataset=_samples())
    monkeypatch.setattr(fusion_rules, "VENDOR_LAYOUT_OF", {})
    platform = build(prepare(model, "rk3576", options)).trailer["platform"]
    assert "register_layout" not in platform
    assert "fuse_silu_add" in platform["register_layout_notice"]


def test_rk3588_build_is_the_same_with_and_without_the_rule(monkeypatch):
    model, options = _model("Silu"), CompileOptions(dataset=_samples())
    ruled = build(prepare(model, "rk3588", options)).to_bytes()
    monkeypatch.setattr(fusion_rules, "VENDOR_LAYOUT_OF", {})
    assert build(prepare(model, "rk3588", options)).to_bytes() == ruled
