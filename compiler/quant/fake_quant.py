"""Evaluating a quantized graph with simulated quantization (fake quant), in float.

Every materialized tensor is stored as its ``quant`` says, through the float evaluator's
tensor hook: graph inputs and node outputs (after their fused parts; nothing inside a fused
node is rounded), and each constant once.

- int8 activation: ``s * (clamp(round_half_even(x / s) + z, -128, 127) - z)``. This is the
  NPU's requantization with the ideal factor: the integer path computes the exact accumulator
  ``acc = sum((w_q - zp_w)(x_q - zp_in)) + bias_q`` and OUT_CVT produces
  ``clamp(round(acc * M) + zp_out)`` with ``M = s_in s_w / s_out`` realised as
  ``MUL * 2^-14 * SCALE * 2^-SHIFT`` (NUMERICS.md 4.1, 4.5, 9); in float the layer's value is
  ``s_in s_w * acc`` exactly (to float64 rounding), so the only difference left is the
  fixed-point error of M (<= 0.2 %, quant_regs) which moves a result by at most one LSB,
  and then only near a rounding boundary. Half-even is OUT_CVT with CVT_ROUND = 0.
- weights / operands / shared constants: rounded half away from zero (compile-time rounding).
- int32 bias: ``round_half_away(b / (s_in s_w[c])) * s_in s_w[c]`` with the exact float64
  unit, the value quant_regs puts in the BS ALU operand.
- float16: rounded to fp32 then to fp16 (round to nearest even), kept as float32.

Inputs are the float inputs of the graph (the runtime quantizes them like any tensor);
outputs are dequantized floats, as the runtime returns them with ``want_float``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..float_eval import TensorHook, evaluate
from ..ir import Graph, Tensor
from . import convert_op
from .affine import INT32, QRANGES, fake_quantize, round_half_away, round_to_float16
from .quantize import FLOAT16, INT8, bias_scale, layer_dtype
from .roles import BIAS, constant_roles


def bias_units(graph: Graph) -> dict[str, np.ndarray]:
    """Exact accumulator unit of every int8 layer's bias constant, by tensor name."""
    units = {}
    for node in graph.nodes:
        if node.op_type == convert_op.OP_TYPE or layer_dtype(graph, node) != INT8:
            continue
        for role in constant_roles(graph, node):
            name = role.slot.read(node)
            quant = graph.tensors[name].quant
            if role.kind == BIAS and quant is not None and quant.dtype == "int32":
                units[name] = bias_scale(graph, node, role)
    return units


def storage_hook(graph: Graph) -> TensorHook:
    """The tensor hook that stores each value the way its ``quant`` says (module docstring)."""
    units = bias_units(graph)

    def hook(tensor: Tensor, value: np.ndarray) -> np.ndarray:
        quant = tensor.quant
        if quant is None or not np.issubdtype(np.asarray(value).dtype, np.floating):
            return value
        if quant.dtype == FLOAT16:
            return round_to_float16(value).astype(value.dtype, copy=False)
        if tensor.name in units:
            return _bias(value, units[tensor.name], quant.axis).astype(value.dtype, copy=False)
        simulated = fake_quantize(value, quant.scale, quant.zero_point, QRANGES[quant.dtype], quant.axis,
                                  half_even=not tensor.is_const)
        return simulated.astype(value.dtype, copy=False)

    return hook


def _bias(value: np.ndarray, unit: np.ndarray, axis: int | None) -> np.ndarray:
    if unit.size > 1:
        shape = [1] * np.ndim(value)
        shape[axis] = unit.size
        unit = unit.reshape(shape)
    else:
        unit = unit.reshape(())
    return np.clip(round_half_away(np.asarray(value, dtype=np.float64) / unit), INT32[0], INT32[1]) * unit


def fake_quant_evaluate(graph: Graph, inputs: Mapping[str, Any], return_all: bool = False) -> dict[str, np.ndarray]:
    """Evaluate a quantized graph with simulated storage; same interface as float_eval.evaluate.

    The int8 network exactly as a built model computes it is not this module's: the emulator
    runs the model, and the testing kit's ``reference_model`` (tools/testing_reference.py)
    recomputes it independently (QUANTIZATION.md 7.1)."""
    return evaluate(graph, inputs, return_all=return_all, tensor_hook=storage_hook(graph))
