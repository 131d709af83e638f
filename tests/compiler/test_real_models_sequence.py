"""Real sequence models from PyPI wheels (tests/requirements-models.txt, installed --no-deps: only
their .onnx files are used) compiled for rk3588 in float16 and int8, run on the emulator and
compared with onnxruntime: ddddocr's CRNN + bidirectional LSTM captcha recognizer and silero-vad's
1-D conv + LSTM voice-activity detector (its OpenVINO export, and the opset-15 export whose
``If`` nodes fold once shapes are fixed, with ``sr`` frozen as ``compile --freeze sr=16000``).
Each case skips only when its package is not installed.

The LSTMs are unrolled onto the NPU in both precisions (float16 islands in int8 builds,
LOWERING.md 30, 31); ddddocr's LSTM reads its steps from the CNN's map (all-steps input projections
and per-step picks, LOWERING.md 38.3) and its 8210-class FC over the 8 rows runs as two 1x1 convs of
4105 classes over the rows, picked and joined for the runtime's readout (38.2; a float16 island in
int8).
Measured cosines (``python -m pytest -s -m models`` this file prints them): ddddocr fp16 0.999998 /
int8 0.99979 (0.9996 while the FC was a host step); silero-vad fp16 1.0 (both outputs) / int8
stateN 0.9991 (was 0.672 while the STFT power was int8 - quantized over a range of 341, then
Sqrt; its magnitude is now a float16 island, LOWERING.md 32). silero's front end and tail (reflect
Pad, the STFT conv, Slices, Pow, Sqrt, ReduceMean) run on the NPU (LOWERING.md 32), and its state
is read in and out as one [1, 256, 1, 1] map (LOWERING.md 38.1): no host step.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.onnx_import import import_onnx
from npuemu.emulator.runtime import Runtime

pytestmark = pytest.mark.models


@dataclass(frozen=True)
class SequenceModel:
    package: str  # import name (found, not imported: ddddocr's __init__ needs OpenCV)
    pip_name: str
    file: str
    shapes: dict
    freeze: dict = field(default_factory=dict)
    int8_floors: dict = field(default_factory=dict)  # output -> int8 cosine floor

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"{self.pip_name} is not installed (pip install --no-deps {self.pip_name})")
        return Path(next(iter(spec.submodule_search_locations))) / self.file


DDDD, SILERO = "ddddocr==1.6.1", "silero-vad==6.2.3"
VAD_SHAPES = {"input": [1, 576], "state": [2, 1, 128]}  # 512 samples at 16 kHz + 64 of context
MODELS = {
    # width 64 (8 LSTM steps) keeps the case short; the model takes any width
    "ddddocr_common": SequenceModel("ddddocr", DDDD, "common.onnx", {"input1": [1, 1, 64, 64]},
                                    int8_floors={"387": 0.9996}),
    "silero_vad_openvino": SequenceModel("silero_vad", SILERO, "data/silero_vad_openvino_16k.onnx", VAD_SHAPES,
                                         int8_floors={"stateN": 0.998}),
    "silero_vad_op15": SequenceModel("silero_vad", SILERO, "data/silero_vad_16k_op15.onnx", VAD_SHAPES,
                                     {"sr": 16000}, int8_floors={"stateN": 0.998}),
}


def _sample(model: SequenceModel, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if "input1" in model.shapes:  # a grey captcha-like image in [0, 1]
        return {"input1": rng.uniform(0, 1, model.shapes["input1"]).astype(np.float32)}
    t = np.arange(576) / 16000  # a tone in noise, and a previous state
    audio = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 400) * t) + 0.05 * rng.normal(size=576)
    return {"input": audio.astype(np.float32)[None], "state": rng.normal(0, 0.3, (2, 1, 128)).astype(np.float32)}


def _onnxruntime(model: SequenceModel, path: Path, feeds: dict) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    given = dict(feeds) | {name: np.array(value, np.int64) for name, value in model.freeze.items()}
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, given)))


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("key", sorted(MODELS))
def test_sequence_model_imports_and_matches_onnxruntime(key):
    model = MODELS[key]
    path = model.path()
    graph = import_onnx(path, model.shapes, freeze=model.freeze)
    ops = [node.op_type for node in graph.nodes]
    assert ops.count("LSTM") == 1 and "If" not in ops
    test = _sample(model, 1000)
    ours, want = evaluate(graph, test), _onnxruntime(model, path, test)
    for name, value in want.items():
        np.testing.assert_allclose(ours[name].reshape(value.shape), value, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("key", sorted(MODELS))
def test_sequence_model_compiles_runs_and_matches_onnxruntime(key, precision):
    model = MODELS[key]
    path = model.path()
    dataset = [_sample(model, seed) for seed in range(4)] if precision == "int8" else None
    built = compile_model(path, "rk3588", CompileOptions(precision=precision, input_shapes=model.shapes,
                                                          freeze=model.freeze, dataset=dataset))
    # every LSTM is unrolled onto the NPU (LOWERING.md 30, 31): silero's reads its state input's
    # halves; in int8 builds the chain is a float16 island between DataConverts
    # no host step: silero's front end and tail (LOWERING.md 32) and its state's edges (38.1),
    # ddddocr's LSTM steps read from the CNN's map (38.3) and its FC over the LSTM's rows (38.2)
    assert not [step.op for step in built.schedule() if step.kind == "cpu"]
    test = _sample(model, 1000)
    runtime = Runtime(built)
    for name, value in test.items():
        runtime.set_input(name, value)
    runtime.run()
    for name, want in _onnxruntime(model, path, test).items():
        got = runtime.output(name).reshape(want.shape)
        cosine = _cosine(got, want)
        print(f"{key} {precision} {name}: cosine {cosine:.6f}, max error {np.abs(got - want).max():.4g}")
        if want.size == 1:  # silero's speech probability: a scalar, compared by its error
            assert abs(float(got.ravel()[0]) - float(want.ravel()[0])) <= (0.01 if precision == "fp16" else 0.1)
        else:
            assert cosine >= (0.999 if precision == "fp16" else model.int8_floors[name]), (name, cosine)
