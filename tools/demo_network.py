"""The bundled demo network: a small image classifier written with onnx.helper from one seed
(He-initialised weights), so the demo needs no download. Layers exercise the main NPU paths:
convs with fused Relu, a fused residual Add, max pooling, a depthwise conv, a 1x1 conv,
GlobalAveragePool (rewritten as depthwise convs) and a fully connected head (a 1x1 conv)."""

from __future__ import annotations

import numpy as np

INPUT_SHAPE = (1, 3, 32, 32)
CLASSES = 10


def demo_network(seed: int = 2026):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, initializers = [], []

    def conv(name, x, y, cin, cout, kernel=3, group=1):
        fan_in = cin // group * kernel * kernel
        weights = rng.normal(0, (2.0 / fan_in) ** 0.5, (cout, cin // group, kernel, kernel))
        bias = rng.normal(0, 0.1, cout)
        initializers.extend([numpy_helper.from_array(weights.astype(np.float32), f"{name}.weight"),
                             numpy_helper.from_array(bias.astype(np.float32), f"{name}.bias")])
        nodes.append(helper.make_node("Conv", [x, f"{name}.weight", f"{name}.bias"], [y], name=name,
                                      kernel_shape=[kernel, kernel], pads=[kernel // 2] * 4, group=group))

    def node(op, inputs, outputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))

    conv("stem", "image", "s", 3, 16)
    node("Relu", ["s"], ["s1"], "stem_relu")
    conv("block_a", "s1", "a", 16, 16)
    node("Relu", ["a"], ["a1"], "block_a_relu")
    conv("block_b", "a1", "b", 16, 16)
    node("Add", ["b", "s1"], ["r"], "residual_add")
    node("Relu", ["r"], ["r1"], "residual_relu")
    node("MaxPool", ["r1"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2])
    conv("depthwise", "p", "d", 16, 16, group=16)
    node("Relu", ["d"], ["d1"], "depthwise_relu")
    conv("expand", "d1", "e", 16, 32, kernel=1)
    node("Relu", ["e"], ["e1"], "expand_relu")
    node("GlobalAveragePool", ["e1"], ["g"], "gap")
    node("Flatten", ["g"], ["f"], "flatten", axis=1)
    fc_weights = rng.normal(0, (1.0 / 32) ** 0.5, (CLASSES, 32)).astype(np.float32)
    fc_bias = rng.normal(0, 0.1, CLASSES).astype(np.float32)
    initializers.extend([numpy_helper.from_array(fc_weights, "classifier.weight"),
                         numpy_helper.from_array(fc_bias, "classifier.bias")])
    node("Gemm", ["f", "classifier.weight", "classifier.bias"], ["logits"], "classifier", transB=1)

    graph = helper.make_graph(
        nodes, "npuemu_demo_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def demo_images(count: int, seed: int) -> list[np.ndarray]:
    """Natural-looking synthetic images (shapes, gradients, strokes), scaled to [0, 1]."""
    from npuemu.compiler.quant.synthetic import synthetic_batch

    return [(synthetic_batch(INPUT_SHAPE, seed + index) / 255.0).astype(np.float32) for index in range(count)]
