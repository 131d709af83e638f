"""npuemu's own fp16 Concat copies in the vendor's rk3576 layout (emulator/REGISTER_SEMANTICS.md 58): a Concat of
flattened conv outputs (YOLOX's head, ``Concat_332``) is written as fp16 DPU-only copies; they take the vendor's fp16
copy frame (isa/rknn/rk3576_concat.py), the build keeps the vendor layout and its outputs equal the RK3588-position
build's bit for bit and onnxruntime's closely. Channel counts off the 8-channel atom take the Concat path (DPU_RDMA
0x5014 the padded channels), whole atoms the bilinear edge-copy path; both round-trip."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions
from npuemu.emulator.runtime import Runtime
from npuemu.isa.words import TARGET_OP_ENABLE
from tests.compiler.test_rk3576_vendor_emit import both_layouts


def flat_concat_model(channels: int, size: int, strides) -> onnx.ModelProto:
    """YOLOX's head in small: per stride s, ``c = Concat(Conv1x1_s(x) + b [C - 2 ch], Conv1x1_s(x) + b [2 ch], axis=1)``
    flattened to [1, C, -1]; ``y = Transpose(Concat(<those>, axis=2), [0, 2, 1])``, x [1, 8, size, size]."""
    rng = np.random.RandomState(3)
    nodes, inits, flats = [], [], []
    for index, stride in enumerate(strides):
        for part, width in (("a", channels - 2), ("b", 2)):
            inits += [numpy_helper.from_array((rng.randn(width, 8, 1, 1) * 0.3).astype(np.float32), f"w{part}{index}"),
                      numpy_helper.from_array((rng.randn(width) * 0.1).astype(np.float32), f"b{part}{index}")]
            nodes.append(helper.make_node("Conv", ["x", f"w{part}{index}", f"b{part}{index}"], [f"{part}{index}"],
                                          strides=[stride, stride]))
        inits.append(numpy_helper.from_array(np.array([1, channels, -1], np.int64), f"s{index}"))
        nodes += [helper.make_node("Concat", [f"a{index}", f"b{index}"], [f"c{index}"], axis=1),
                  helper.make_node("Reshape", [f"c{index}", f"s{index}"], [f"r{index}"])]
        flats.append(f"r{index}")
    nodes += [helper.make_node("Concat", flats, ["flat"], axis=2),
              helper.make_node("Transpose", ["flat"], ["y"], perm=[0, 2, 1])]
    length = sum(-(-size // stride) ** 2 for stride in strides)
    source = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, size, size])
    graph = helper.make_graph(nodes, "flat_concat", [source],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, length, channels])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model


def _run(built, x):
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return np.asarray(runtime.output("y", dequantize=False))


def _copies(built) -> int:
    words = np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")
    return sum(1 for w in words if int(w) >> 48 == TARGET_OP_ENABLE and (int(w) >> 16) & 0xFFFF == 0x18)


def _check(channels, size, strides):
    model = flat_concat_model(channels, size, strides)
    vendor, old = both_layouts(model, CompileOptions(precision="fp16"))
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert _copies(vendor) >= len(strides)
    x = np.random.RandomState(channels + size).randn(1, 8, size, size).astype(np.float32)
    ours = _run(vendor, x)
    np.testing.assert_array_equal(ours, _run(old, x))
    expected, = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert ours.shape == expected.shape and np.abs(ours.astype(np.float64) - expected).max() < 0.02


def test_yolox_head_concat_of_six_channels_is_vendor_layout_and_runs_like_the_old_layout():
    _check(6, 8, (1, 2, 4))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(channels=st.sampled_from([3, 6, 8, 13, 16, 21]), size=st.integers(2, 9),
       strides=st.sampled_from([(1, 2), (1, 2, 4), (2, 1)]))
def test_own_fp16_flat_concats_run_bit_identically_in_both_layouts(channels, size, strides):
    _check(channels, size, strides)
