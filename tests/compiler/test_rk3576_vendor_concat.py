"""npuemu's own int8 Concat copies in the vendor's rk3576 layout (compiler/LOWERING.md 50.3): the requantizing copy
(BS ALU + multiplier, written through the BS record) and the plain one take the vendor's copy frame
(isa/rknn/rk3576_concat.py); the build keeps the vendor layout and its outputs equal the RK3588-position build's
bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions
from npuemu.emulator.runtime import Runtime
from npuemu.isa.words import TARGET_OP_ENABLE
from tests.compiler.test_rk3576_vendor_emit import both_layouts


def concat_model(first: int, second: int, size, scales, relu_second: bool = False) -> onnx.ModelProto:
    """y = Concat(Conv1x1(x) [first ch], Conv1x1(z) [second ch] (+ Relu)), x, z [1, 16, H, W]."""
    rng = np.random.RandomState(7)
    inits = [numpy_helper.from_array((rng.randn(first, 16, 1, 1) * scales[0]).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.randn(second, 16, 1, 1) * scales[1]).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Conv", ["z", "w2"], ["c0"])]
    nodes.append(helper.make_node("Relu", ["c0"], ["c"]) if relu_second else helper.make_node("Identity", ["c0"], ["c"]))
    nodes.append(helper.make_node("Concat", ["a", "c"], ["y"], axis=1))
    shape = [1, 16, *size]
    graph = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "xz"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, first + second, *size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model


def _feeds(size, seed):
    rng = np.random.RandomState(seed)
    return {"x": rng.randn(1, 16, *size).astype(np.float32), "z": (rng.randn(1, 16, *size) * 0.5).astype(np.float32)}


def _run(built, feeds):
    runtime = Runtime(built)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return np.asarray(runtime.output("y", dequantize=False))


def _copies(built) -> int:
    """DPU-only tasks (op-enable 0x18) in the build's regcmd: the Concat's copies."""
    words = np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")
    return sum(1 for w in words if int(w) >> 48 == TARGET_OP_ENABLE and (int(w) >> 16) & 0xFFFF == 0x18)


def _check(first, second, size, scales, relu_second=False):
    model = concat_model(first, second, size, scales, relu_second)
    vendor, old = both_layouts(model, CompileOptions(dataset=[_feeds(size, seed) for seed in (10, 11, 12)]))
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert "register_layout" not in old.trailer["platform"]
    for seed in (5, 6):
        feeds = _feeds(size, seed)
        np.testing.assert_array_equal(_run(vendor, feeds), _run(old, feeds))
    return _copies(vendor)


def test_own_concat_of_two_scales_is_vendor_layout_and_runs_like_the_old_layout():
    assert _check(16, 32, (12, 20), (0.3, 0.6)) == 2


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.sampled_from([16, 24, 32, 48]), second=st.sampled_from([8, 16, 40]), height=st.integers(1, 9),
       width=st.integers(1, 11), scales=st.sampled_from([(0.3, 0.6), (1.0, 1.0), (0.05, 2.0)]),
       relu_second=st.booleans())
def test_own_concats_run_bit_identically_in_both_layouts(first, second, height, width, scales, relu_second):
    _check(first, second, (height, width), scales, relu_second)
