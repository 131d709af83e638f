"""ConvTranspose as the conv of its stride phases on the NPU plus DepthToSpace (and a crop of the
pads) on the CPU (build_adapt.split_conv_transpose, compiler/deconv_phases.py); kernel = stride is
the 1x1 case. Without a crop the s x s phase convs write interleaved and no host step is left. The DepthToSpace host op against a loop reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

import copy

from npuemu.compiler.build import build_model
from npuemu.emulator import cpu_ops
from npuemu.emulator.runtime import Runtime
from npuemu.tools.testing_reference import reference_graph, reference_model
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
    # the phase convs write their pixels interleaved: no host DepthToSpace (LOWERING.md 13)
    assert [(step.kind, getattr(step, "op", None)) for step in steps] == [("npu", None)]
    assert stored.shape == (1, 8, 6 * kernel, 8 * kernel)
    _assert_bit_exact(graph, f"k{kernel}", (1, 3, 6, 8))
    assert within >= 0.99, f"only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.999, f"cosine {cos:.5f} against onnxruntime float"


FORMS = {  # name: (kernel, stride, pads, output_padding, expected host steps after the NPU chain)
    # the cropping forms: one conv per phase of the rows the crop keeps (deconv_crop.py, LOWERING.md 40)
    "k3s2p1": (3, 2, [1, 1, 1, 1], [0, 0], []),
    "k4s2p1": (4, 2, [1, 1, 1, 1], [0, 0], []),
    "k3s2p1_outpad": (3, 2, [1, 1, 1, 1], [1, 1], []),
    "k5s3_asym": (5, 3, [0, 2, 1, 0], [0, 0], []),
    "k3s1p1": (3, 1, [1, 1, 1, 1], [0, 0], []),
    "k3s1": (3, 1, [0, 0, 0, 0], [0, 0], []),
}


@pytest.mark.parametrize("form", FORMS)
def test_transposed_convolutions_run_as_the_conv_of_their_stride_phases(form, tmp_path) -> None:
    """Kernel, stride, pads and output padding of any size (group 1, dilation 1): the phase convs on
    the NPU, written interleaved, also where the pads crop (deconv_phases.py, deconv_crop.py)."""
    kernel, stride, pads, output_padding, host = FORMS[form]
    net = Net(6)
    net.conv("c1", "x", "a", 3, 16)
    rng = np.random.default_rng(kernel * 10 + stride)
    net.inits += [numpy_helper.from_array(rng.normal(0, 0.2, (16, 8, kernel, kernel)).astype(np.float32), "tw"),
                  numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "tb")]
    net.node("ConvTranspose", ["a", "tw", "tb"], ["u"], "up", kernel_shape=[kernel, kernel],
             strides=[stride, stride], pads=pads, output_padding=output_padding)
    net.node("Relu", ["u"], ["y"], "act")
    within, cos, stored, graph = compare(net.model([1, 3, 5, 7], "y"), (1, 3, 5, 7), tmp_path / "up.npu")
    steps = ModelFile.read(tmp_path / "up.npu").schedule()
    assert [getattr(step, "op", None) for step in steps] == [None] + host
    assert steps[0].kind == "npu"
    assert stored.shape == tuple(graph.tensor(graph.outputs[0]).shape)
    assert within >= 0.99, f"{form}: only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.999, f"{form}: cosine {cos:.5f} against onnxruntime float"
    _assert_bit_exact(graph, form)


def _assert_bit_exact(graph, form: str, shape=(1, 3, 5, 7)) -> None:
    """Every layer of the build equals the testing kit's independent reference (its ConvTranspose
    is the zero-spread textbook form, not the phase conv), also walked from the input alone on the
    built model (reference_model) up to the output."""
    probe = copy.deepcopy(graph)
    probe.outputs = list(dict.fromkeys([*probe.outputs, *(node.outputs[0] for node in graph.nodes)]))
    runtime = Runtime(build_model(probe))
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    runtime.set_input("x", x)
    runtime.run()
    stored = {name: runtime.output(name, dequantize=False) for name in ["x", *(n.outputs[0] for n in graph.nodes)]}
    cpu_outputs = {output for step in runtime.model.schedule() if step.kind == "cpu" for output in step.outputs}
    reference = reference_graph(graph, {"x": stored["x"]}, layer_inputs=stored,
                                host_layers={n.name for n in graph.nodes if n.outputs[0] in cpu_outputs})
    for node in graph.nodes:
        assert np.array_equal(stored[node.outputs[0]], reference[node.outputs[0]].reshape(stored[node.outputs[0]].shape)), \
            f"{form}: layer {node.name} differs from the kit's reference"
    output = graph.outputs[0]
    exact = reference_model(graph, runtime.model, {"x": x})[output]
    assert np.array_equal(exact.reshape(-1), runtime.output(output, dequantize=False).reshape(-1)), \
        f"{form}: the kit's reference of the built model differs from the emulator"


def test_grouped_or_dilated_transposed_convolutions_run_on_the_host(tmp_path) -> None:
    """Forms without a phase conv (here dilation 2) are a host ConvTranspose step (partition:
    deconv_form), matching the fake-quant model."""
    net = Net(6)
    net.conv("c1", "x", "a", 3, 16)
    net.inits.append(numpy_helper.from_array(np.random.default_rng(1).normal(0, 0.2, (16, 8, 3, 3)).astype(np.float32),
                                             "tw"))
    net.node("ConvTranspose", ["a", "tw"], ["y"], "up", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
             dilations=[2, 2])
    within, cos, _, _ = compare(net.model([1, 3, 6, 8], "y"), (1, 3, 6, 8), tmp_path / "up.npu")
    steps = ModelFile.read(tmp_path / "up.npu").schedule()
    assert [(step.kind, getattr(step, "op", None)) for step in steps] == [("npu", None), ("cpu", "ConvTranspose")]
    assert within >= 0.99 and cos >= 0.99  # int8 quantization loss of this net: 0.9989


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
