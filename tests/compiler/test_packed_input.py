"""A 1-4 channel int8 graph input read only by direct convs is stored packed (C2 = C, the
vendor's first-layer format, rknpu-isa.md 4) and fetched in ARGB mode; the values are those of
the NC1HWC2 build (pack_inputs=False) bit for bit, on one core, split across cores, in a batch
build and on chips with other atoms. Any other reader keeps NC1HWC2."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.build import build_model
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import Net, compile_graph


def _net(channels: int, second_reader: str | None = None):
    net = Net(11)
    net.conv("c1", "x", "a", channels, 16, stride=2)
    net.node("Relu", ["a"], ["a1"], "r1")
    net.conv("c2", "a1", "y", 16, 8)
    if second_reader == "pool":  # the input is also read by the PPU
        net.node("MaxPool", ["x"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2])
        net.conv("c3", "p", "q", channels, 8)
        net.node("Add", ["y", "q"], ["z"], "sum")
        return net.model([1, channels, 12, 10], "z"), (1, channels, 12, 10)
    return net.model([1, channels, 12, 10], "y"), (1, channels, 12, 10)


def _run(graph, shape, **build):
    model = build_model(graph, **build)
    runtime = Runtime(model)
    batch = build.get("batch", 1)
    x = np.random.default_rng(4).normal(size=(batch, *shape[1:])).astype(np.float32)
    runtime.set_input("x", x)
    runtime.run()
    record = next(t for t in model.tensors() if t.name == "x")
    return runtime.output(graph.outputs[0], dequantize=False), record


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("build", [{}, {"cores": (0, 1, 2)}, {"batch": 2}, {"platform": "rk3562"},
                                   {"platform": "rk3568"}], ids=["one-core", "three-cores", "batch", "rk3562", "rk3568"])
def test_a_first_layer_image_is_packed_and_computes_the_same(channels, build) -> None:
    model, shape = _net(channels)
    graph = compile_graph(model, shape)
    packed, record = _run(graph, shape, **build)
    plain, plain_record = _run(graph, shape, pack_inputs=False, **build)
    assert tuple(record.native_shape)[1:] == (1, 12, 10, channels)  # [N, C1 = 1, H, W, C2 = C]
    assert tuple(plain_record.native_shape)[-1] != channels
    assert np.array_equal(packed, plain)


def test_an_input_read_by_anything_but_a_direct_conv_stays_nc1hwc2() -> None:
    model, shape = _net(3, second_reader="pool")
    graph = compile_graph(model, shape)
    _, record = _run(graph, shape)
    assert tuple(record.native_shape)[-1] == 16
