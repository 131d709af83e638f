"""A conv too large for the CBUF, split along its input channels by the level-3 rewrite
(rewrite_channel_tiling: Split + Conv + ConvAdd chain), built and run: the channel Split becomes
one DPU copy per part (ChannelSlice), and a residual Add before the activation (ResNet-50's
bottleneck exit, Conv+Add+Relu) moves to the first partial sum."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.isa.container import ModelFile
from tests.compiler.test_build_e2e import Net, compare


def big_conv(residual: bool):
    """1x1 conv 512 -> 1024 at 28x28: input 392 KB and weights 512 KB do not fit 384 KB of CBUF."""
    def make():
        net = Net(8)
        net.conv("stem", "x", "a", 8, 512, kernel=1)
        net.conv("big", "a", "b", 512, 1024, kernel=1)
        if residual:
            net.conv("short", "a", "s", 512, 1024, kernel=1)
            net.node("Add", ["b", "s"], ["c"], "add")
            net.node("Relu", ["c"], ["y"], "relu")
        else:
            net.node("Relu", ["b"], ["y"], "relu")
        return net.model([1, 8, 28, 28], "y"), (1, 8, 28, 28)
    return make


@pytest.mark.parametrize("residual", [False, True], ids=["conv_relu", "conv_add_relu"])
def test_channel_tiled_conv_builds_and_matches(residual, tmp_path) -> None:
    model, shape = big_conv(residual)()
    within, cos, stored, graph = compare(model, shape, tmp_path / "big.npu")
    ops = [node.op_type for node in graph.nodes]
    assert "Split" in ops and ops.count("Conv") >= 3, ops
    built = ModelFile.read(tmp_path / "big.npu")
    assert all(step.kind == "npu" for step in built.schedule())
    assert any(info.op_type == "ChannelSlice" for info in built.layers())
    assert within >= 0.99, f"only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.999, f"cosine {cos:.5f} against onnxruntime float"


def test_channel_tiled_conv_in_float16(tmp_path) -> None:
    from npuemu.compiler.driver import CompileOptions, build, prepare
    from npuemu.emulator.runtime import Runtime
    from tests.compiler.test_build_e2e import cosine, onnxruntime_float

    model, shape = big_conv(True)()
    front = prepare(model, "rk3588", CompileOptions(precision="fp16"))  # CBUF parts sized for 2-byte elements
    graph = front.graph
    assert "Split" in [node.op_type for node in graph.nodes]
    runtime = Runtime(build(front))
    x = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    runtime.set_input("x", x)
    runtime.run()
    assert cosine(runtime.output(graph.outputs[0]), onnxruntime_float(model, x)) >= 0.9999
