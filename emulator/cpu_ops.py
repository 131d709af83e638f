"""Host-side (CPU fallback) operators of a model's schedule (isa/CONTAINER.md 3.5, kind "cpu").

A CPU step names its op, its input and output tensors (addresses, layouts and quantization in
the model file's ``tensors``) and its parameters. The runtime calls :func:`run_step`, which
reads the inputs from memory, computes in float and writes the quantized outputs back.

Parameters are the ONNX node's attributes (e.g. Softmax ``axis``, Transpose ``perm``, Resize
``scales``/``sizes``/``mode``/``coordinate_transformation_mode``/``nearest_mode``, Reduce*
``axes``/``keepdims``). A result is reshaped to the output tensor's logical shape before it is
stored (so Reshape/Flatten/Squeeze/Unsqueeze only pass their input on). An op not listed in
:data:`OPS` is refused with its name.
"""

from __future__ import annotations

import math
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


def _identity(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    return [inputs[0]]  # Reshape/Flatten/Squeeze/Unsqueeze: run_step reshapes to the output shape


def _transpose(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    perm = params.get("perm")
    return [np.transpose(inputs[0], None if perm is None else [int(a) for a in perm])]


def _concat(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    return [np.concatenate(inputs, axis=int(params.get("axis", 0)))]


def _axes(params: dict, rank: int):
    axes = params.get("axes")
    if axes is None or len(axes) == 0:
        return None if not params.get("noop_with_empty_axes", 0) else ()
    return tuple(int(a) % rank for a in axes)


def _reduce(function):
    def run(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
        axes = _axes(params, inputs[0].ndim)
        if axes == ():
            return [inputs[0]]
        return [function(inputs[0], axis=axes, keepdims=bool(params.get("keepdims", 1)))]
    return run


def _argmax(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    axis = int(params.get("axis", 0))
    data = inputs[0]
    if params.get("select_last_index", 0):
        flipped = np.flip(data, axis=axis)
        index = data.shape[axis] - 1 - np.argmax(flipped, axis=axis)
    else:
        index = np.argmax(data, axis=axis)
    if params.get("keepdims", 1):
        index = np.expand_dims(index, axis)
    return [index.astype(np.float64)]


def _nearest_index(out_size: int, in_size: int, scale: float, transform: str, rounding: str) -> np.ndarray:
    x = np.arange(out_size, dtype=np.float64)
    if transform == "half_pixel":
        source = (x + 0.5) / scale - 0.5
    elif transform == "pytorch_half_pixel":
        source = (x + 0.5) / scale - 0.5 if out_size > 1 else np.zeros_like(x)
    elif transform == "align_corners":
        source = x * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros_like(x)
    elif transform == "asymmetric":
        source = x / scale
    else:
        raise EmulationError(f"CPU step 'Resize': coordinate_transformation_mode {transform!r} is not implemented")
    if rounding == "round_prefer_floor":
        index = np.where(source - np.floor(source) == 0.5, np.floor(source), np.floor(source + 0.5))
    elif rounding == "round_prefer_ceil":
        index = np.floor(source + 0.5)
    elif rounding == "floor":
        index = np.floor(source)
    elif rounding == "ceil":
        index = np.ceil(source)
    else:
        raise EmulationError(f"CPU step 'Resize': nearest_mode {rounding!r} is not implemented")
    return np.clip(index, 0, in_size - 1).astype(np.int64)


def _resize(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    data = inputs[0]
    mode = params.get("mode", "nearest")
    if mode != "nearest":
        raise EmulationError(f"CPU step 'Resize': mode {mode!r} is not implemented (nearest only)")
    scales, sizes = params.get("scales"), params.get("sizes")
    if sizes:
        sizes = [int(v) for v in sizes]
        if not scales:
            scales = [out / size for out, size in zip(sizes, data.shape)]
    elif scales:
        sizes = [int(np.floor(size * float(scale))) for size, scale in zip(data.shape, scales)]
    else:
        raise EmulationError("CPU step 'Resize': neither scales nor sizes in params")
    if len(sizes) != data.ndim:
        raise EmulationError(f"CPU step 'Resize': {len(sizes)} sizes for a rank-{data.ndim} input")
    transform = params.get("coordinate_transformation_mode", "half_pixel")
    rounding = params.get("nearest_mode", "round_prefer_floor")
    result = data
    for axis, (out_size, scale) in enumerate(zip(sizes, scales)):
        if out_size == data.shape[axis] and float(scale) == 1.0:
            continue
        index = _nearest_index(out_size, data.shape[axis], float(scale), transform, rounding)
        result = np.take(result, index, axis=axis)
    return [result]


def _tanh(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    return [np.tanh(inputs[0])]


def _hard_sigmoid(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    alpha, beta = float(params.get("alpha", 0.2)), float(params.get("beta", 0.5))
    return [np.clip(alpha * inputs[0] + beta, 0.0, 1.0)]


def _hard_swish(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    x = inputs[0]
    return [x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)]


def _depth_to_space(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    """ONNX DepthToSpace on [N, C * b * b, H, W]: DCR (default) or CRD channel order."""
    x = inputs[0]
    block = int(params.get("blocksize", 1))
    mode = params.get("mode", "DCR")
    n, c, h, w = x.shape
    if block < 1 or c % (block * block):
        raise EmulationError(f"DepthToSpace: {c} channels are not a multiple of blocksize^2 = {block * block}")
    depth = c // (block * block)
    if mode == "CRD":
        y = x.reshape(n, depth, block, block, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        y = x.reshape(n, block, block, depth, h, w).transpose(0, 3, 4, 1, 5, 2)
    return [y.reshape(n, depth, h * block, w * block)]


def _elu(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    x, alpha = inputs[0], float(params.get("alpha", 1.0))
    return [np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0.0)))]


def _gelu(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    x = inputs[0]
    return [0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))]


def _softplus(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    return [np.logaddexp(0.0, inputs[0])]


def _silu(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    return [inputs[0] / (1.0 + np.exp(-inputs[0]))]


def _layer_norm(inputs: list, params: dict) -> list[np.ndarray]:
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 and inputs[2] is not None else 0.0
    axis = int(params.get("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return [(x - mean) / np.sqrt(variance + float(params.get("epsilon", 1e-5))) * scale + bias]


def _gemm(inputs: list, params: dict) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    a = a.T if params.get("transA", 0) else a
    b = b.T if params.get("transB", 0) else b
    out = float(params.get("alpha", 1.0)) * (a @ b)
    if len(inputs) > 2 and inputs[2] is not None:
        out = out + float(params.get("beta", 1.0)) * inputs[2]
    return [out]


def _unary(function):
    def run(inputs: list, params: dict) -> list[np.ndarray]:
        return [function(inputs[0])]
    return run


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _binary(function):
    def run(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
        return [function(inputs[0], inputs[1])]  # numpy broadcasting, as ONNX multidirectional
    return run


#: op name -> function(list of float inputs, params) -> list of float outputs
OPS: dict[str, Callable[[list[np.ndarray], dict], list[np.ndarray]]] = {
    "Relu": _relu, "Sigmoid": _sigmoid, "Softmax": _softmax,
    "Reshape": _identity, "Flatten": _identity, "Squeeze": _identity, "Unsqueeze": _identity,
    "Transpose": _transpose, "Concat": _concat, "Resize": _resize, "DepthToSpace": _depth_to_space,
    "Tanh": _tanh, "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish,
    "Elu": _elu, "Gelu": _gelu, "Softplus": _softplus, "Silu": _silu,
    "DataConvert": _identity,  # int8 <-> float16 storage: dequantize, store in the output's type
    "LayerNormalization": _layer_norm, "Gemm": _gemm, "MatMul": _binary(np.matmul),
    "Div": _binary(np.divide), "Pow": _binary(np.power), "Sqrt": _unary(np.sqrt), "Exp": _unary(np.exp),
    "Erf": _unary(_erf), "ReduceSum": _reduce(np.sum), "ReduceMin": _reduce(np.min),
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply),
    "Max": _binary(np.maximum), "Min": _binary(np.minimum),
    "ReduceMean": _reduce(np.mean), "ReduceMax": _reduce(np.max), "ArgMax": _argmax,
}


def run_step(runtime, step) -> None:
    """Run one CPU step: dequantize its inputs, apply the op, quantize and store its outputs
    (float16 tensors are read and stored as they are)."""
    function = OPS.get(step.op)
    if function is None:
        raise EmulationError(f"CPU step {step.op!r} is not implemented by the runtime "
                             f"(known: {', '.join(sorted(OPS))})")
    params = dict(step.params or {})
    inputs = [runtime.output(name, dequantize=True).astype(np.float64) for name in step.inputs]
    if "operands" in params:  # constant operands travel in the params, in the node's input order
        tensors = iter(inputs)
        inputs = [None if operand is None else next(tensors) if "tensor" in operand
                  else np.asarray(operand["constant"]["values"], np.float64).reshape(operand["constant"]["shape"])
                  for operand in params.pop("operands")]
    outputs = function(inputs, params)
    if len(outputs) != len(step.outputs):
        raise EmulationError(f"CPU step {step.op!r}: {len(outputs)} results for {len(step.outputs)} outputs")
    for name, value in zip(step.outputs, outputs):
        shape = tuple(runtime.model.tensor(name).shape)
        if value.size != int(np.prod(shape)):
            raise EmulationError(f"CPU step {step.op!r}: result of shape {list(value.shape)} does not fit output "
                                 f"{name!r} of shape {list(shape)}")
        value = np.asarray(value).reshape(shape)
        if runtime.dtype(name) == "float16":  # fp16 tensors store the value (round to nearest even)
            runtime.write_native(name, value.astype(np.float16))
            continue
        scale, zero_point = runtime.quantization(name)
        stored = np.clip(np.rint(value / scale) + zero_point, -128, 127).astype(np.int8)
        runtime.write_native(name, stored)
