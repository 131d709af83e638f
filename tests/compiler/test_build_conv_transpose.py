"""ConvTranspose with kernel = stride as a 1x1 convolution on the NPU plus DepthToSpace on the
CPU (build_adapt.split_conv_transpose), and the DepthToSpace host op against a loop reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from npuemu.emulator import cpu_ops
from npuemu.isa.container import ModelFile
from tests.compiler.test_build_e2e import Net, compare


def transposed_net(kernel: int, activation: str | None, bias: bool = True):
    def make():
        net = Net(5)
        net.conv("c1", "x", "a", 3, 16)
        rng = np.random.default_rng(kernel)
        net.inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (16, 8, kernel, kernel)).astype(np.float32), "tw"))
        inputs = ["a", "tw"]
        if bias:
            net.inits.append(numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "tb"))
            inputs.append("tb")
        out = "u" if activation else "y"
        net.node("ConvTranspose", inputs, [out], "up", kernel_shape=[kernel, kernel], strides=[kernel, kernel])
        if activation:
            net.node(activation, ["u"], ["y"], "act")
        return net.model([1, 3, 6, 8], "y"), (1, 3, 6, 8)
    return make


@pytest.mark.parametrize("kernel,activation,bias", [(2, "Relu", True), (2, "Sigmoid", True), (3, None, False)])
def test_kernel_equal_stride_runs_as_conv_and_depth_to_space(kernel, activation, bias, tmp_path) -> None:
    model, shape = transposed_net(kernel, activation, bias)()
    within, cos, stored, graph = compare(model, shape, tmp_path / "up.npu")
    steps = ModelFile.read(tmp_path / "up.npu").schedule()
    assert [(step.kind, getattr(step, "op", None)) for step in steps] == [("npu", None), ("cpu", "DepthToSpace")]
    assert stored.shape == (1, 8, 6 * kernel, 8 * kernel)
    assert within >= 0.99, f"only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.999, f"cosine {cos:.5f} against onnxruntime float"


def test_other_transposed_convolutions_run_on_the_host(tmp_path) -> None:
    """A deconvolution form not lowered (kernel 3, stride 2, pads) is a host ConvTranspose step
    (partition: deconv_lowered), matching the fake-quant model."""
    net = Net(6)
    net.conv("c1", "x", "a", 3, 16)
    net.inits.append(numpy_helper.from_array(np.random.default_rng(1).normal(0, 0.2, (16, 8, 3, 3)).astype(np.float32),
                                             "tw"))
    net.node("ConvTranspose", ["a", "tw"], ["y"], "up", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    within, cos, _, _ = compare(net.model([1, 3, 6, 8], "y"), (1, 3, 6, 8), tmp_path / "up.npu")
    steps = ModelFile.read(tmp_path / "up.npu").schedule()
    assert [(step.kind, getattr(step, "op", None)) for step in steps] == [("npu", None), ("cpu", "ConvTranspose")]
    assert within >= 0.99 and cos >= 0.999


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_matches_the_onnx_definition(mode) -> None:
    rng = np.random.default_rng(0)
    block, depth, h, w = 2, 3, 4, 5
    x = rng.normal(size=(1, depth * block * block, h, w))
    got = cpu_ops.OPS["DepthToSpace"]([x], {"blocksize": block, "mode": mode})[0]
    want = np.empty((1, depth, h * block, w * block))
    for c in range(depth):
        for y in range(h * block):
            for xx in range(w * block):
                i, j = y % block, xx % block
                source = (c * block + i) * block + j if mode == "CRD" else (i * block + j) * depth + c
                want[0, c, y, xx] = x[0, source, y // block, xx // block]
    assert np.array_equal(got, want)
