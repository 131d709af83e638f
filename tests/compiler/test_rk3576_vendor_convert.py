"""npuemu's own int8 <-> fp16 DataConvert tasks in the vendor's rk3576 layout (compiler/LOWERING.md 56): a hybrid build
(int8 conv, a float16 conv, int8 conv) keeps the vendor layout, its two converts take the vendor's DataConvert frame
(isa/rknn/rk3576_convert.py) and its outputs equal the RK3588-position build's bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.build import build_model
from npuemu.compiler.ir import Graph, Node, Tensor
from npuemu.compiler.lower import emit_rk3576
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.quant import calibrate, quantize_graph
from npuemu.emulator.runtime import Runtime
from npuemu.isa.words import TARGET_OP_ENABLE

ONE_BY_ONE = {"kernel_shape": [1, 1], "pads": [0, 0, 0, 0], "strides": [1, 1], "dilations": [1, 1], "group": 1}


def _hybrid(shape, seed: int = 1):
    """x -> conv a (int8) -> conv b (float16) -> conv y (int8), 1x1 convs of ``RandomState(seed)`` weights."""
    channels = shape[1]
    rng = np.random.RandomState(seed)
    graph = Graph("hybrid", inputs=["x"], outputs=["y"])
    graph.add_tensor(Tensor("x", shape, "float32"))
    previous = "x"
    for index, name in enumerate("aby"):
        graph.add_tensor(Tensor(name, shape, "float32"))
        graph.add_constant(f"w{index}", (rng.randn(channels, channels, 1, 1) / np.sqrt(channels)).astype(np.float32))
        graph.add_constant(f"b{index}", (rng.randn(channels) * 0.1).astype(np.float32))
        graph.nodes.append(Node(f"conv_{name}", "Conv", [previous, f"w{index}", f"b{index}"], [name], dict(ONE_BY_ONE)))
        previous = name
    optimize(graph, PassContext.for_chip("rk3576", 3))
    samples = [{"x": np.random.RandomState(10 + j).randn(*shape).astype(np.float32)} for j in range(3)]
    quantize_graph(graph, calibrate(graph, samples, "normal", progress=False).ranges,
                   layer_dtypes={graph.nodes[1].name: "float16"})
    return graph


def _run(built, x):
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return np.asarray(runtime.output("y", dequantize=False))


def _dpu_only_tasks(built) -> int:
    words = np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")
    return sum(1 for w in words if int(w) >> 48 == TARGET_OP_ENABLE and (int(w) >> 16) & 0xFFFF == 0x18)


@pytest.mark.parametrize("shape", [(1, 24, 3, 10), (1, 384, 1, 40), (1, 8, 2, 5), (1, 40, 4, 6)])
def test_own_converts_keep_the_vendor_layout_and_run_like_the_old_layout(shape):
    vendor = build_model(_hybrid(shape), "rk3576")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(emit_rk3576, "VENDOR_LAYOUT_OF", {})
        old = build_model(_hybrid(shape), "rk3576")
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert "register_layout" not in old.trailer["platform"]
    assert _dpu_only_tasks(vendor) == 2   # int8 -> fp16 and fp16 -> int8
    for seed in (5, 6):
        x = np.random.RandomState(seed).randn(*shape).astype(np.float32)
        np.testing.assert_array_equal(_run(vendor, x), _run(old, x))
