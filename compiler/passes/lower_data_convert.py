"""DataConvert nodes -> NPU conversion records (LOWERING.md 26), or the reason they stay host steps.

quantize_graph inserts a ``DataConvert`` wherever a layer reads a tensor stored in the other
type (QUANTIZATION.md 6). Each becomes a :class:`ConvertLayer` - one DPU-only task - when its
tensor is a feature map the DPU can stream ([1, C, H, W] or fewer dimensions) and its int8
side's scale fits the converter's registers; otherwise it stays a host step (``host_reason``
says why; the build keeps the step, the summary counts it).
"""

from __future__ import annotations

from npuemu.isa.errors import CompileError

from ..ir import Graph, Node
from ..lower.layers import FLOAT16, INT8, Quant
from ..lower.lower_convert import ConvertLayer, dequantize_scale, quantize_factors
from ..quant.convert_op import OP_TYPE
from .constraints import as_cube


def _int8_side(graph: Graph, node: Node) -> str:
    return node.inputs[0] if node.attrs.get("to") == FLOAT16 else node.outputs[0]


def host_reason(graph: Graph, node: Node) -> str | None:
    """Why this DataConvert runs on the host; None when the DPU converts it."""
    if node.op_type != OP_TYPE:
        return f"{node.op_type} is not a DataConvert"
    if node.attrs.get("to") not in (INT8, FLOAT16) or len(node.inputs) != 1 or len(node.outputs) != 1:
        return f"a DataConvert to {node.attrs.get('to')!r} with {len(node.inputs)} input(s) is not lowered"
    shape = graph.tensor(node.inputs[0]).shape
    if as_cube(shape) is None:
        return f"tensor shape {list(shape)} is not a [1, C, H, W] feature map"
    quant = graph.tensor(_int8_side(graph, node)).quant
    if quant is None or quant.dtype != INT8 or quant.per_channel:
        return "its int8 side is not per-tensor int8"
    other = graph.tensor(node.inputs[0] if node.attrs["to"] == INT8 else node.outputs[0]).quant
    if other is None or other.dtype != FLOAT16:
        return "its float16 side is not stored as float16"
    try:
        dequantize_scale(float(quant.scale)) if node.attrs["to"] == FLOAT16 else quantize_factors(float(quant.scale))
    except CompileError as error:
        return str(error)
    return None


def convert_record(graph: Graph, node: Node, platform) -> ConvertLayer | None:
    """The NPU record of a DataConvert (build_adapt.LAYER_BUILDERS["convert"]); None where
    ``host_reason`` names a limit."""
    if host_reason(graph, node) is not None:
        return None
    quant = graph.tensor(_int8_side(graph, node)).quant
    return ConvertLayer(node.layer_name, node.inputs[0], node.outputs[0], as_cube(graph.tensor(node.inputs[0]).shape),
                        Quant(float(quant.scale), int(quant.zero_point)), node.attrs["to"])
