"""Standard CNNs written with onnx.helper and seeded He-scaled weights (no framework needed):
MobileNetV1, MobileNetV2 and ResNet-18 with BatchNormalization after every conv, as exported
models have them. Used by the whole-network tests; the resolution is a parameter."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def conv_bn(self, x: str, cin: int, cout: int, kernel: int = 3, stride: int = 1, group: int = 1,
                act: str | None = "Relu") -> str:
        name = self._name("conv")
        fan_in = cin // group * kernel * kernel
        w = self.rng.normal(0, (2.0 / fan_in) ** 0.5, (cout, cin // group, kernel, kernel))
        self.const(f"{name}_w", w)
        self.nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_c"], name=name,
                                           kernel_shape=[kernel, kernel], strides=[stride, stride],
                                           pads=[kernel // 2] * 4, group=group))
        scale = self.rng.uniform(0.5, 1.5, cout)
        bias = self.rng.normal(0, 0.1, cout)
        mean = self.rng.normal(0, 0.1, cout)
        var = self.rng.uniform(0.5, 1.5, cout)
        for suffix, value in (("s", scale), ("b", bias), ("m", mean), ("v", var)):
            self.const(f"{name}_{suffix}", value)
        out = f"{name}_bn"
        self.nodes.append(helper.make_node("BatchNormalization", [f"{name}_c", f"{name}_s", f"{name}_b",
                                                                  f"{name}_m", f"{name}_v"], [out], name=f"{name}_bn"))
        if act == "Relu":
            self.nodes.append(helper.make_node("Relu", [out], [f"{name}_r"], name=f"{name}_relu"))
            return f"{name}_r"
        if act == "Relu6":
            lo, hi = self.const(f"{name}_lo", 0.0), self.const(f"{name}_hi", 6.0)
            self.nodes.append(helper.make_node("Clip", [out, lo, hi], [f"{name}_r"], name=f"{name}_relu6"))
            return f"{name}_r"
        return out

    def add(self, a: str, b: str, relu: bool = False) -> str:
        name = self._name("add")
        self.nodes.append(helper.make_node("Add", [a, b], [name], name=name))
        if relu:
            self.nodes.append(helper.make_node("Relu", [name], [f"{name}_r"], name=f"{name}_relu"))
            return f"{name}_r"
        return name

    def head(self, x: str, channels: int, classes: int = 1000) -> str:
        self.nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
        self.nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
        self.const("fc_w", self.rng.normal(0, (1.0 / channels) ** 0.5, (classes, channels)))
        self.const("fc_b", self.rng.normal(0, 0.01, classes))
        self.nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1))
        return "logits"

    def model(self, size: int, output: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                    [1, 3, size, size])],
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def mobilenet_v1(size: int = 224, seed: int = 1, classes: int = 1000) -> onnx.ModelProto:
    b = Builder(seed)
    x = b.conv_bn("x", 3, 32, stride=2)
    plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), *[(512, 1)] * 5, (1024, 2), (1024, 1)]
    cin = 32
    for cout, stride in plan:
        x = b.conv_bn(x, cin, cin, stride=stride, group=cin)
        x = b.conv_bn(x, cin, cout, kernel=1)
        cin = cout
    return b.model(size, b.head(x, cin, classes))


def mobilenet_v2(size: int = 224, seed: int = 2, classes: int = 1000) -> onnx.ModelProto:
    b = Builder(seed)
    x = b.conv_bn("x", 3, 32, stride=2, act="Relu6")
    cin = 32
    for expand, cout, repeats, stride in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                                          (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(repeats):
            s = stride if i == 0 else 1
            hidden = cin * expand
            y = b.conv_bn(x, cin, hidden, kernel=1, act="Relu6") if expand != 1 else x
            y = b.conv_bn(y, hidden, hidden, stride=s, group=hidden, act="Relu6")
            y = b.conv_bn(y, hidden, cout, kernel=1, act=None)
            x = b.add(y, x) if s == 1 and cin == cout else y
            cin = cout
    x = b.conv_bn(x, cin, 1280, kernel=1, act="Relu6")
    return b.model(size, b.head(x, 1280, classes))


def resnet(size: int = 224, seed: int = 3, classes: int = 1000, blocks=(2, 2, 2, 2), bottleneck: bool = False) -> onnx.ModelProto:
    """ResNet-18 (basic blocks 2-2-2-2) or, with ``bottleneck`` and (3, 4, 6, 3), ResNet-50."""
    b = Builder(seed)
    x = b.conv_bn("x", 3, 64, kernel=7, stride=2)
    b.nodes.append(helper.make_node("MaxPool", [x], ["pool"], name="maxpool", kernel_shape=[3, 3], strides=[2, 2],
                                    pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for stage, (count, width) in enumerate(zip(blocks, (64, 128, 256, 512))):
        cout = width * 4 if bottleneck else width
        for i in range(count):
            stride = 2 if i == 0 and stage > 0 else 1
            if bottleneck:
                y = b.conv_bn(x, cin, width, kernel=1)
                y = b.conv_bn(y, width, width, stride=stride)
                y = b.conv_bn(y, width, cout, kernel=1, act=None)
            else:
                y = b.conv_bn(x, cin, width, stride=stride)
                y = b.conv_bn(y, width, cout, act=None)
            shortcut = b.conv_bn(x, cin, cout, kernel=1, stride=stride, act=None) if stride != 1 or cin != cout else x
            x = b.add(y, shortcut, relu=True)
            cin = cout
    return b.model(size, b.head(x, cin, classes))


NETWORKS = {"mobilenet_v1": mobilenet_v1, "mobilenet_v2": mobilenet_v2, "resnet18": resnet}
