"""The value columns of a sweep with ``values: true``: a build emulated on the sweep's dataset samples
(the first ``values_samples`` lines) against the float ONNX model (compiler/float_eval.py) on the same
preprocessed inputs. Run once per build, in the worker that made it (tools/sweep_worker.py
``build``): the values do not depend on the figures only the timing model reads, so every point of
the build shares them.

``output_cosine`` is the minimum over graph outputs and samples of the cosine between the NPU's
dequantized output and the float model's; ``output_max_abs_error`` the maximum absolute difference.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

#: the value columns of a results row, after the totals
VALUE_COLUMNS = ("output_cosine", "output_max_abs_error")


def build_values(model, job) -> dict[str, Any]:
    """The value columns of build ``job`` (a BuildJob with ``samples`` and ``values_samples``),
    whose model file is ``model``."""
    from npuemu.compiler.driver import target_platform
    from npuemu.compiler.float_eval import evaluate
    from npuemu.compiler.onnx_import import import_onnx
    from npuemu.emulator.runtime import Runtime

    graph = import_onnx(job.model, {})  # the sweep gives no input shapes: the builds' are the model's
    runtime = Runtime(model, target_platform(job.target, dict(model.platform().overrides)))
    cosines, errors = [], []
    for sample in _samples(graph, job.samples, job.values_samples):
        expected = evaluate(graph, sample)
        for name, value in sample.items():
            runtime.set_input(name, _batched(value, _batch_size(runtime, name)))
        runtime.run()
        for name in runtime.outputs:
            actual = runtime.output(name)
            cosine, error = compare(actual, _batched(expected[name], np.ndim(actual) and len(actual)))
            cosines.append(cosine)
            errors.append(error)
    return {"output_cosine": round(min(cosines), 6), "output_max_abs_error": round(max(errors), 6)}


def _samples(graph, dataset: str, count: int) -> Iterator[dict[str, np.ndarray]]:
    """The first ``count`` samples of the dataset file, preprocessed as the compiler reads them
    (the sweep gives no mean/std: identity)."""
    from npuemu.compiler.quant.dataset import CalibrationSamples, read_dataset

    samples = CalibrationSamples(read_dataset(dataset, list(graph.inputs)), graph)
    for entry in samples.dataset.entries[:count]:
        yield samples.load(entry)


def _batch_size(runtime, name: str) -> int:
    """The leading dimension the build gives input ``name`` (N of ``--batch-size N``), else 0."""
    if name not in runtime.inputs:
        return 0
    try:
        shape = runtime.tensor_info(name).get("shape") or ()
    except Exception:  # noqa: BLE001 - an input no step reads: set_input ignores it
        return 0
    return int(shape[0]) if shape else 0


def _batched(value: np.ndarray, size: int) -> np.ndarray:
    """A batch-1 array repeated to a build's batch size ``size`` ([N, ...]); else as it is."""
    value = np.asarray(value)
    if value.ndim == 0 or size <= value.shape[0] or value.shape[0] != 1:
        return value
    return np.concatenate([value] * size)


def compare(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(cosine, max absolute error) of two arrays of one shape."""
    from npuemu.isa.errors import EmulationError

    a = np.asarray(actual, np.float64).ravel()
    b = np.asarray(expected, np.float64).ravel()
    if a.shape != b.shape:
        raise EmulationError(f"output of {a.size} values, the float model gives {b.size}")
    if a.size == 0:
        return 1.0, 0.0
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norms == 0.0:
        cosine = 1.0 if not a.any() and not b.any() else 0.0
    else:
        cosine = float(np.dot(a, b) / norms)
    return cosine, float(np.max(np.abs(a - b)))
