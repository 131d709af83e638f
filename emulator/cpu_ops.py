"""Host-side (CPU fallback) operators of a model's schedule (isa/CONTAINER.md 3.5, kind "cpu").

A CPU step names its op, its input and output tensors (addresses, layouts and quantization in
the model file's ``tensors``) and its parameters. The runtime calls :func:`run_step`, which
reads the inputs from memory (int8 dequantized, float16 and float as float64, integer and
bool tensors as they are), computes, and stores the output in its tensor's type (int8
requantized, round half to even). Tensors only host steps touch are ``ND`` (row-major, any
rank and type: cpu_ops_tensors.py); the others NC1HWC2 feature maps.

Parameters are the compiler's canonical attributes of the ONNX node (e.g. Softmax ``axis``,
Transpose ``perm``, Reduce* ``axes``/``keepdims``); constant inputs travel as ``operands``
(node input order), ``output_index`` picks one output of a multi-output op. A result is
reshaped to the output tensor's logical shape before it is stored (so Reshape/Flatten/
Squeeze/Unsqueeze only pass their input on). The ops live here and in cpu_ops_math.py
(element-wise, comparison, logic), cpu_ops_move.py (data movement, pooling), cpu_ops_conv.py
(convolutions) and cpu_ops_resize.py; an op not in :data:`OPS` is refused with its name.
int8 and float16 tensors are read and stored through per-tensor plans (cpu_ops_io.py), with
the very arithmetic of the general path below.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from npuemu.emulator.cpu_ops_conv import CONV_OPS
from npuemu.emulator.cpu_ops_io import tensor_io
from npuemu.emulator.cpu_ops_math import MATH_OPS, binary, unary
from npuemu.emulator.cpu_ops_move import MOVE_OPS
from npuemu.emulator.cpu_ops_recurrent import RECURRENT_OPS
from npuemu.emulator.cpu_ops_resize import resize
from npuemu.emulator.cpu_ops_tensors import ND_LAYOUT
from npuemu.emulator.memo import Memo
from npuemu.isa.custom_op import CUSTOM_OP_KEY, custom_node, import_class
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


def _dropout(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    """Inference Dropout: the input, and an all-true mask (params ``mask``: the mask is used)."""
    return [inputs[0]] + ([np.ones(inputs[0].shape, bool)] if params.get("mask") else [])


def _transpose(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    perm = params.get("perm")
    return [np.transpose(inputs[0], None if perm is None else [int(a) for a in perm])]


def _concat(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    return [np.concatenate(inputs, axis=int(params.get("axis", 0)))]


def _axes(params: dict, rank: int):
    """The canonical ``axes`` (compiler/ops/reduce.py): an empty list means no reduction (the
    ``noop_with_empty_axes`` case); absent means every axis."""
    axes = params.get("axes")
    if axes is None:
        return None
    return tuple(int(a) % rank for a in axes)


def _reduce(function, empty=None):
    """A Reduce* op; ``empty(dtype)``: the value of a reduction over no elements (Max/Min)."""
    def run(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
        axes = _axes(params, inputs[0].ndim)
        if axes == ():
            return [inputs[0]]
        keep = bool(params.get("keepdims", 1))
        if empty is not None and inputs[0].size == 0:
            return [function(inputs[0], axis=axes, keepdims=keep, initial=empty(inputs[0].dtype))]
        return [function(inputs[0], axis=axes, keepdims=keep)]
    return run


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min if dtype.kind in "iu" else False


def _highest(dtype: np.dtype):
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max if dtype.kind in "iu" else True


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


def _glu(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
    """GLU (compiler/passes/composite_ops.py): halves ``a, b`` of X along ``axis``; ``a * sigmoid(b)``."""
    a, b = np.split(inputs[0], 2, axis=int(params.get("axis", -1)))
    return [a / (1.0 + np.exp(-b))]


def _layer_norm(inputs: list, params: dict) -> list[np.ndarray]:
    """Y, and the Mean and InvStdDev outputs (over the axes from ``axis`` on)."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 and inputs[2] is not None else 0.0
    axis = int(params.get("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    inverse = 1.0 / np.sqrt(variance + float(params.get("epsilon", 1e-5)))
    return [(x - mean) * inverse * scale + bias, mean, inverse]


def _gemm(inputs: list, params: dict) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    a = a.T if params.get("transA", 0) else a
    b = b.T if params.get("transB", 0) else b
    out = float(params.get("alpha", 1.0)) * (a @ b)
    if len(inputs) > 2 and inputs[2] is not None:
        out = out + float(params.get("beta", 1.0)) * inputs[2]
    return [out]


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


#: op name -> function(list of float inputs, params) -> list of float outputs
OPS: dict[str, Callable[[list[np.ndarray], dict], list[np.ndarray]]] = {
    "Relu": _relu, "Sigmoid": _sigmoid, "Softmax": _softmax,
    "Reshape": _identity, "Flatten": _identity, "Squeeze": _identity, "Unsqueeze": _identity,
    "Transpose": _transpose, "Concat": _concat, "Resize": resize, "DepthToSpace": _depth_to_space,
    "Tanh": _tanh, "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish,
    "Elu": _elu, "Gelu": _gelu, "Softplus": _softplus, "Silu": _silu, "Glu": _glu,
    "DataConvert": _identity,  # int8 <-> float16 storage: dequantize, store in the output's type
    "LayerNormalization": _layer_norm, "Gemm": _gemm, "MatMul": binary(np.matmul),
    "Pow": binary(np.power), "Sqrt": unary(np.sqrt), "Exp": unary(np.exp),
    "Erf": unary(_erf), "ReduceSum": _reduce(np.sum), "ReduceMin": _reduce(np.min, _highest),
    "Add": binary(np.add), "Sub": binary(np.subtract), "Mul": binary(np.multiply),
    "ReduceMean": _reduce(np.mean), "ReduceMax": _reduce(np.max, _lowest), "ReduceProd": _reduce(np.prod),
    "ArgMax": _argmax, "Dropout": _dropout, "Constant": _identity, "Identity": _identity, **MATH_OPS, **MOVE_OPS, **CONV_OPS,
    **RECURRENT_OPS,
}


def _operand(operand) -> np.ndarray:
    """A constant operand of the params: values (non-finite floats as "nan"/"inf" strings) in
    its element type (float64 before element types were recorded)."""
    constant = operand["constant"]
    dtype = np.dtype(constant.get("dtype", "float64"))
    values = np.asarray(constant["values"], dtype=object)
    values = values.astype(np.float64).astype(dtype) if dtype.kind == "f" else values.astype(dtype)
    return _computing(values.reshape(constant["shape"]))


#: an operand record's place for the next tensor (``_Prepared.operand_values``)
_TENSOR = object()


def _computing(values: np.ndarray) -> np.ndarray:
    """Float values compute in float64; integer and bool ones in their own type."""
    return values.astype(np.float64) if values.dtype.kind == "f" else values


def _read(runtime, name: str) -> np.ndarray:
    plan = tensor_io(runtime, name)  # an int8 tensor: its plan, worked out once (cpu_ops_io.py)
    if plan is not None:
        return plan.read()
    info = runtime.tensor_info(name)
    if "quantization" in info or info.get("layout") != ND_LAYOUT:
        return runtime.output(name, dequantize=True).astype(np.float64)
    return _computing(runtime.read_native(name))


def _store(runtime, name: str, value: np.ndarray, op: str) -> None:
    plan = tensor_io(runtime, name)
    if plan is not None:
        plan.store(value, name, op)
        return
    info = runtime.tensor_info(name)
    shape = tuple(info["shape"])
    value = np.asarray(value)
    if value.size != math.prod(shape):
        raise EmulationError(f"CPU step {op!r}: result of shape {list(value.shape)} does not fit output "
                             f"{name!r} of shape {list(shape)}")
    value = value.reshape(shape)
    if "quantization" in info:  # int8: quantize (round half to even, saturate)
        scale, zero_point = runtime.quantization(name)
        # in place on one float64 temporary: rint(v / scale) + zero point, clipped to int8
        quantized = np.asarray(np.divide(value, scale, dtype=np.float64))  # a 0-d result is a scalar
        np.rint(quantized, out=quantized)
        quantized += zero_point
        value = np.minimum(np.maximum(quantized, -128, out=quantized), 127, out=quantized)
    runtime.write_native(name, value.astype(np.dtype(info["dtype"]), copy=False))  # float16: round to nearest even


#: a custom op's runner per schedule step (the Runtime keeps its parsed steps across runs)
_CUSTOM_RUNNERS: Memo = Memo(identity=1)


def _custom_op(runtime, step) -> Callable[[list[np.ndarray], dict], list[np.ndarray]]:
    """A custom op's host step (params ``custom_op``: "module:Class", isa/custom_op.py): the
    user's class, imported where the model runs (once per step), computes on float inputs."""
    runner = _CUSTOM_RUNNERS.get(step)
    return runner if runner is not None else _CUSTOM_RUNNERS.put(_custom_runner(runtime, step), step)


def _custom_runner(runtime, step) -> Callable[[list[np.ndarray], dict], list[np.ndarray]]:
    spec = str(step.params[CUSTOM_OP_KEY])
    try:
        instance = import_class(spec)()
    except (ImportError, AttributeError, ValueError) as error:
        model = runtime.model.trailer.get("graph", {}).get("name", "model")
        raise EmulationError(f"model {model!r}: the model uses custom op {step.op} from {spec}; make it importable "
                             f"(PYTHONPATH) to run this file ({type(error).__name__}: {error})") from None

    def run(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
        node = custom_node(step.op, step.op, params, getattr(instance, "domain", None))
        outputs = instance.compute(node, inputs)
        return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    return run


class _Prepared:
    """What ``run_step`` derives from a step's record alone, once per step (the Runtime keeps its
    parsed steps): the op's function and its params without the entries ``run_step`` consumes."""

    __slots__ = ("function", "params", "fused", "operands", "index", "plain", "constants", "__weakref__")

    def __init__(self, function, step) -> None:
        params = dict(step.params or {})
        self.function = function
        self.fused = params.pop("fused", [])
        self.operands = params.pop("operands", None)  # constant operands, in the node's input order
        self.index = params.pop("output_index", None)
        self.params = params
        # without operands: the step's inputs, of which the fused parts' tensors come last
        self.plain = None if self.fused else len(step.inputs)
        self.constants: dict[int, tuple[list, list]] = {}  # by id of an operand list: (it, its values)

    def operand_values(self, operands: list, tensors) -> list:
        """Operand records ({"tensor"} | {"constant"} | None) as values, tensors taken in order;
        each constant built once per step (its JSON values parsed) and handed out as a copy."""
        entry = self.constants.get(id(operands))
        if entry is None or entry[0] is not operands:
            entry = self.constants[id(operands)] = (operands, [
                None if operand is None else _TENSOR if "tensor" in operand else _operand(operand)
                for operand in operands])
        return [next(tensors) if value is _TENSOR else None if value is None else value.copy()
                for value in entry[1]]


#: each schedule step's _Prepared (the Runtime keeps its parsed steps across runs)
_PREPARED: Memo = Memo(identity=1)


def _prepared(runtime, step) -> _Prepared:
    prepared = _PREPARED.get(step)
    if prepared is None:
        function = _custom_op(runtime, step) if CUSTOM_OP_KEY in (step.params or {}) else OPS.get(step.op)
        if function is None:
            raise EmulationError(f"CPU step {step.op!r} is not implemented by the runtime "
                                 f"(known: {', '.join(sorted(OPS))})")
        prepared = _PREPARED.put(_Prepared(function, step), step)
    return prepared


def run_step(runtime, step) -> None:
    """Run one CPU step: read its inputs (dequantized int8, float16 and float as float64;
    integer and bool host tensors as they are), apply the op, store its output in the output
    tensor's type (int8 quantized, float16 or the ND tensor's element type). A step of a
    multi-output op keeps output ``output_index`` (params)."""
    prepared = _prepared(runtime, step)
    params = dict(prepared.params)
    reads = [_read(runtime, name) for name in step.inputs]
    tensors = iter(reads)
    if prepared.operands is not None:
        inputs = prepared.operand_values(prepared.operands, tensors)
    else:
        plain = prepared.plain
        if plain is None:
            plain = len(step.inputs) - sum("tensor" in operand for part in prepared.fused
                                           for operand in part["operands"] if operand)
        # (all of them: no fused part takes a tensor, so the iterator is not read again)
        inputs = reads if plain == len(reads) else [next(tensors) for _ in range(plain)]
    try:
        outputs = prepared.function(inputs, params)
        for part in prepared.fused:  # fused parts on output 0: the running result is operand "carry"
            operands = prepared.operand_values(part["operands"], tensors)
            operands.insert(int(part.get("carry", 0)), outputs[0])
            outputs[0] = OPS[part["op"]](operands, dict(part.get("attrs", {})))[0]
    except (ValueError, IndexError, TypeError, KeyError) as error:  # e.g. an out-of-range Gather index
        raise EmulationError(f"CPU step {step.op!r}: {type(error).__name__}: {error}") from None
    index = prepared.index
    if index is not None:
        outputs = outputs[int(index):int(index) + 1]
    elif 0 < len(step.outputs) < len(outputs):  # ONNX's optional trailing outputs, not asked for
        outputs = outputs[:len(step.outputs)]
    if len(outputs) != len(step.outputs):
        raise EmulationError(f"CPU step {step.op!r}: {len(outputs)} results for {len(step.outputs)} outputs")
    for name, value in zip(step.outputs, outputs):
        _store(runtime, name, value, step.op)
