"""Host-side (CPU fallback) operators of a model's schedule (isa/CONTAINER.md 3.5, kind "cpu").

A CPU step names its op, its input and output tensors (addresses, layouts and quantization in
the model file's ``tensors``) and its parameters. The runtime calls :func:`run_step`, which
reads the inputs from memory, computes in float and writes the quantized outputs back.

No compiler emits CPU steps yet; an op not listed in :data:`OPS` is refused with its name.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.isa.errors import EmulationError


def _relu(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    return [np.maximum(inputs[0], 0.0)]


def _sigmoid(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    return [1.0 / (1.0 + np.exp(-inputs[0]))]


def _softmax(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    axis = int(params.get("axis", -1))
    shifted = inputs[0] - inputs[0].max(axis=axis, keepdims=True)
    exp = np.exp(shifted)
    return [exp / exp.sum(axis=axis, keepdims=True)]


#: op name -> function(list of float inputs, params) -> list of float outputs
OPS: dict[str, Callable[[list[np.ndarray], dict], list[np.ndarray]]] = {
    "Relu": _relu, "Sigmoid": _sigmoid, "Softmax": _softmax,
}


def run_step(runtime, step) -> None:
    """Run one CPU step: dequantize its inputs, apply the op, quantize and store its outputs."""
    function = OPS.get(step.op)
    if function is None:
        raise EmulationError(f"CPU step {step.op!r} is not implemented by the runtime "
                             f"(known: {', '.join(sorted(OPS))})")
    inputs = [runtime.output(name, dequantize=True).astype(np.float64) for name in step.inputs]
    outputs = function(inputs, dict(step.params or {}))
    if len(outputs) != len(step.outputs):
        raise EmulationError(f"CPU step {step.op!r}: {len(outputs)} results for {len(step.outputs)} outputs")
    for name, value in zip(step.outputs, outputs):
        scale, zero_point = runtime.quantization(name)
        stored = np.clip(np.rint(value / scale) + zero_point, -128, 127).astype(np.int8)
        runtime.write_native(name, stored)
