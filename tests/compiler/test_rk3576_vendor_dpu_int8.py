"""npuemu's own int8 standalone Add / Mul on rk3576 in the vendor's layout: the DPU-only
task's BS operands in a 64-byte record in the shift-word constant (compiler/LOWERING.md 44.4,
``rk3576_pack.dpu_record``), outputs bit-identical to the same build at RK3588 positions (the layout
switched off by emptying ``VENDOR_LAYOUT_OF``). That the words and the record are the vendor's own is
proved on the vendor's builds in tests/emulator/test_rknn_rk3576_dpu_int8.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.emulator.runtime import Runtime
from npuemu.isa.words import TARGET_OP_ENABLE
from tests.compiler.test_rk3576_vendor_emit import both_layouts


def eltwise_model(channels: int, size: tuple[int, int], op: str) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, *size])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, channels, *size])
    nodes = ([helper.make_node("Add", ["x", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])] if op == "AddRelu"
             else [helper.make_node(op, ["x", "z"], ["y"])])
    graph = helper.make_graph(nodes, "eltwise", [x, z], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _feeds(channels, size, scales, seed):
    rng = np.random.default_rng(seed)
    return {name: (rng.normal(size=(1, channels, *size)) * scale).astype(np.float32)
            for name, scale in zip("xz", scales)}


def _run(built, feeds):
    runtime = Runtime(built)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return runtime.output("y", dequantize=False)


def _enables(built):
    words = np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")
    return {(int(w) >> 16) & 0xFFFF for w in words if int(w) >> 48 == TARGET_OP_ENABLE}


@pytest.mark.parametrize("channels, size, op, scales", [
    (16, (12, 20), "Add", (1.0, 3.0)), (32, (6, 6), "Add", (2.0, 0.5)), (16, (12, 20), "Add", (2.0, 0.5)),
    (16, (12, 20), "Mul", (1.0, 3.0)), (48, (9, 4), "Mul", (0.3, 0.3)),
])
def test_own_int8_standalone_eltwise_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, channels, size, op,
                                                                                   scales):
    model = eltwise_model(channels, size, op)
    options = CompileOptions(dataset=[_feeds(channels, size, scales, seed) for seed in (0, 1)])
    vendor, old = both_layouts(model, options)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert "register_layout" not in old.trailer["platform"]
    assert 0x18 in _enables(vendor)
    for seed in (5, 6):
        feeds = _feeds(channels, size, scales, seed)
        np.testing.assert_array_equal(_run(vendor, feeds), _run(old, feeds))


def test_channels_npuemu_pads_keep_rk3588_positions_with_a_notice():
    """npuemu's DPU-only task over 20 fp16 channels computes 24 (DATA_CUBE_CHANNEL 23, ORIG 19). The vendor's
    padded int8 Add / Sub / Mul were seen since (LOWERING.md 48.2, test_rk3576_vendor_sub.py), padded fp16 whole
    operands too (LOWERING.md 55, test_rk3576_vendor_ew.py); an fp16 Add of a per-channel operand over padded
    channels was not: that build stays at RK3588 positions and says why."""
    model = eltwise_model(20, (6, 6), "Add")
    model.graph.input[1].type.tensor_type.shape.dim[2].dim_value = 1   # z [1, 20, 1, 1]: one value per channel
    model.graph.input[1].type.tensor_type.shape.dim[3].dim_value = 1
    built = build(prepare(model, "rk3576", CompileOptions(precision="fp16")))
    assert "register_layout" not in built.trailer["platform"]
    assert "DPU-only task other than" in built.trailer["platform"]["register_layout_notice"]
