"""The testing kit's statement of the NPU's int8 <-> fp16 conversions and of float16 islands in
int8 graphs (compiler/LOWERING.md 26, emulator/NUMERICS.md 26), for ``testing_reference``.

A DataConvert is one DPU task; its arithmetic is written here from NUMERICS.md 26 with the
register values derived as LOWERING.md 26 states them (not taken from the compiler's code):

- int8 -> fp16: SCALE M (2^14 <= M < 2^15) and MINUS_EXP E with M 2^-E closest to s; the
  result is fp16(fp32((q - zp) M) 2^-E), one rounding (the product is exact);
- fp16 -> int8: the pair of fp16 multipliers a in [1, 2), b = fp16(1 / (s a)) whose product is
  closest to 1 / s (the first such a); round_half_even(fp32(fp32(x a) b) + zp), saturated.

The float16 layers of an int8 graph (Softmax over channels, HeadAttention: quant/islands.py) run
fp16 convolutions whose MAC adder order is unknown (NUMERICS.md 3.3), so the kit states no
reference for them: it takes their stored outputs from the caller (``layer_inputs``, e.g. the
runtime's own values) and checks every int8 layer around them.
"""

from __future__ import annotations

import math

import numpy as np

INT8 = (-128, 127)


def dequantize_registers(scale: float) -> tuple[int, int]:
    """(SCALE, MINUS_EXP) of the int8 -> fp16 task."""
    exponent = 14 - math.floor(math.log2(scale))
    mantissa = math.floor(scale * 2.0 ** exponent + 0.5)
    if mantissa >= 1 << 15:
        mantissa, exponent = mantissa // 2, exponent - 1
    return mantissa, exponent


def quantize_multipliers(scale: float) -> tuple[np.float16, np.float16]:
    """(a, b), the BS and BN fp16 multipliers of the fp16 -> int8 task."""
    best, best_error = None, math.inf
    for step in range(1024):
        a = np.float16(1.0 + step / 1024.0)
        b = np.float16(1.0 / (scale * float(a)))
        if not np.isfinite(b) or abs(float(b)) < 2.0 ** -14:
            continue
        error = abs(float(a) * float(b) - 1.0 / scale)
        if error < best_error:
            best, best_error = (a, b), error
    return best


def reference_convert(x: np.ndarray, scale: float, zero_point: int, to: str) -> np.ndarray:
    """The stored output of an NPU DataConvert of stored ``x`` (int8 or fp16)."""
    if to == "float16":
        mantissa, exponent = dequantize_registers(scale)
        product = (np.asarray(x).astype(np.int64) - int(zero_point)) * mantissa
        return (product.astype(np.float32) * np.float32(2.0 ** -exponent)).astype(np.float16)
    a, b = quantize_multipliers(scale)
    value = (np.asarray(x, np.float16).astype(np.float32) * np.float32(a)) * np.float32(b) + np.float32(zero_point)
    return np.clip(np.rint(value.astype(np.float64)), *INT8).astype(np.int8)


def float16_island(graph, node) -> bool:
    """An NPU layer of an int8 graph that computes (and stores) float16 (not a DataConvert)."""
    quant = graph.tensors[node.outputs[0]].quant
    return node.op_type != "DataConvert" and quant is not None and quant.dtype == "float16"


def island_output(graph, node, layer_inputs) -> np.ndarray:
    """The stored output of a float16 island layer, from ``layer_inputs``."""
    output = node.outputs[0]
    if layer_inputs is None or output not in layer_inputs:
        raise NotImplementedError(f"the testing kit has no reference for the float16 layer {node.name} "
                                  f"({node.display_op}) of an int8 graph: pass its stored output in layer_inputs")
    return np.asarray(layer_inputs[output]).reshape(graph.tensors[output].shape)


__all__ = ["dequantize_registers", "float16_island", "island_output", "quantize_multipliers", "reference_convert"]
