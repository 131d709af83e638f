"""``DataConvert``: the explicit storage conversion between an int8 and a float16 layer.

In a hybrid build a tensor is stored in its producer's type; where a consumer computes in the
other type, quantize_graph inserts ``DataConvert`` (the vendor's ``exDataConvert`` layer,
hardware.md 4) reading the stored tensor and writing a converted copy for that consumer:

- int8 -> float16: ``s (q - z)`` rounded to fp16;
- float16 -> int8: requantized with the tensor's calibrated scale and zero point.

In float it is the identity (the float evaluator and calibration see no change); the output
tensor's ``quant`` says what the copy holds, so the fake-quant evaluator simulates the
conversion by storing the output like any other tensor. Attribute ``to``: "int8" or
"float16". On the NPU it is one DPU-only pass (flying mode, OUT_CVT to the new precision).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops.base import REGISTRY, register, same_as_input

OP_TYPE = "DataConvert"


def _convert(attrs: dict[str, Any], arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0]


if OP_TYPE not in REGISTRY:  # importing this module twice (tests reload packages) is harmless
    register(OP_TYPE, infer=same_as_input)(_convert)
