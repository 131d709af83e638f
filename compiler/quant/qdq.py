"""Pre-quantized (QDQ) models, guide 6.4: build int8 with the model's own scales and zero
points, no calibration.

The importer (``passes/fold_qdq.py``) leaves the parameters of each QuantizeLinear ->
DequantizeLinear pair and of each quantized weight in ``Tensor.quant``; the graph passes carry
them along with the tensors. :func:`take_qdq_params` takes them off again (every build does, so
a float or float16 build of a QDQ model is the plain float graph of its dequantized weights),
and :func:`quantize_prequantized` is the int8 build of the driver when the model has them:
``precision="int8"`` without a dataset (``npuemu compile --quantize`` without ``--dataset``).

What the NPU cannot follow exactly: its requantization (the DPU's fixed-point multiplier,
shift and rounding, quant_regs) differs from onnxruntime's float requantization of QLinearConv
by one LSB at rounding ties and where the multiplier's precision ends; a sharing group (a
MaxPool's input and output, a Concat) is one storage here, so a model that requantizes inside
one takes the group's parameters; a tensor the model leaves unquantized (a fused activation's
input) needs none, any other is refused by name.
"""

from __future__ import annotations

import logging

from npuemu.isa.errors import CompileError

from ..ir import Graph, QuantParams
from .affine import INT8, Range
from .quantize import QuantizationResult, quantize_graph

log = logging.getLogger(__name__)


def take_qdq_params(graph: Graph) -> dict[str, QuantParams]:
    """The QDQ parameters the importer left on the graph's tensors, removed from them."""
    found = {}
    for name, tensor in graph.tensors.items():
        if tensor.quant is not None and tensor.quant.dtype == "int8":
            found[name] = tensor.quant
            tensor.quant = None
    return found


def represented_range(params: QuantParams) -> Range:
    """The real interval int8 storage with these per-tensor parameters holds."""
    scale, zero = float(params.scale), int(params.zero_point)
    return Range(scale * (INT8[0] - zero), scale * (INT8[1] - zero))


def quantize_prequantized(graph: Graph, params: dict[str, QuantParams]) -> QuantizationResult:
    """int8 throughout with the QDQ model's parameters: activations take theirs (ranges are the
    intervals they represent, for anything that reads ranges), weights theirs; biases are
    requantized to the accumulator unit s_in * s_w as in any int8 build."""
    ranges = {name: represented_range(value) for name, value in params.items()
              if value.axis is None and not graph.tensors[name].is_const}
    try:
        result = quantize_graph(graph, ranges, fixed=params)
    except CompileError as error:
        raise CompileError(f"pre-quantized (QDQ) model: {error} (the model has no QuantizeLinear/"
                           "DequantizeLinear pair on them: quantize it with them, or build with --dataset "
                           "from the float model)") from None
    weights = sum(1 for name in params if graph.tensors.get(name) is not None and graph.tensors[name].is_const)
    result.algorithm = "qdq"
    log.info("pre-quantized model: %d activation and %d weight parameter set(s) taken from its QDQ nodes",
             len(ranges), weights)
    return result
