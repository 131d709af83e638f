"""PP-OCRv4 det (models.md) compiled for rk3588 in int8 and run on the emulated NPU: DBNet's
HardSwish convs in the DPU LUT, SE gates, ConvTranspose upsampling (four 1x1 phase convs written interleaved),
the sigmoid head, the SE gates' Muls (ERDMA per channel, LOWERING.md 17; host steps before issue 18
item 2) and the nearest Resizes (DPU unpooling, LOWERING.md 19); the unaligned Concat as placement convs
(LOWERING.md 20.2)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.quant import calibrate, quantize_graph
from npuemu.compiler.quant.fake_quant import fake_quant_evaluate
from npuemu.compiler.quant.synthetic import synthetic_batch
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine
from tests.compiler.test_quant_accuracy import OCR_PREPROCESS
from tests.compiler.test_real_models import MODELS



@pytest.mark.models
def test_ppocr_det_int8_runs_on_the_emulated_npu() -> None:
    import onnxruntime as ort

    model = MODELS["ppocr_det"]
    path, shape = model.path(), model.shape  # skips, naming the package, where it is not installed
    name = onnx.load(str(path), load_external_data=False).graph.input[0].name
    # stages 1-3 by the driver; the quantization by hand: mmse ranges with min/max weights (the
    # driver's int8 build with algorithm mmse also clips the weights by mmse)
    graph = prepare(path, "rk3588", CompileOptions(precision="float", input_shapes={name: list(shape)})).graph

    def sample(seed):
        return {name: OCR_PREPROCESS.apply(synthetic_batch(shape, seed, "document"), is_image=True)}

    quantize_graph(graph, calibrate(graph, [sample(seed) for seed in range(8)], "mmse", progress=False).ranges)
    model = build_graph(graph)
    cpu = sorted({step.op for step in model.schedule() if step.kind == "cpu"})
    # the SE gates' Muls, the Resizes (LOWERING.md 19), the 4 x 24-channel Concat (placement convs,
    # LOWERING.md 20.2) and the ConvTransposes' DepthToSpace (interleaved phase writes, LOWERING.md 13)
    # on the NPU
    assert cpu == [], cpu
    test = sample(1000)
    runtime = Runtime(model)
    runtime.set_input(name, test[name])
    runtime.run()
    output = graph.outputs[0]
    got = runtime.output(output)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(None, test)[0]
    predicted = fake_quant_evaluate(graph, test)[output]
    scale, _ = runtime.quantization(output)
    assert cosine(got, want) >= 0.99, cosine(got, want)  # measured 0.9957 (fake-quant 0.9958)
    assert np.mean(np.abs(got - predicted) <= 1.5 * scale) >= 0.95
