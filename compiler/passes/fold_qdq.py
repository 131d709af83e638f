"""QDQ folding: the QuantizeLinear/DequantizeLinear nodes of a pre-quantized model (guide 6.4:
onnxruntime ``quantize_static`` QDQ output, PyTorch QAT exports) become the int8 parameters of
the tensors they quantize, so the build uses the model's own scales and zero points instead of
calibrating.

- **weights**: ``DequantizeLinear(int8 constant, s, zp)`` folds at import to the float weight
  (exactly on the int8 grid); :func:`weight_params` gives its parameters, which the importer
  stores as the folded constant's ``Tensor.quant`` (per output channel when the scale is).
- **activations**: a ``QuantizeLinear -> DequantizeLinear`` pair on tensor ``t`` is removed
  (:func:`fold_qdq_pairs`): readers of the pair's output read ``t`` again, and ``t.quant``
  holds the pair's int8 parameters. Storing ``t`` as int8 with them rounds and clamps it just
  as the pair did (the hardware's rounding aside: tests/compiler/test_qdq_import.py).
- uint8 parameters become int8 ones (zero point - 128: the same real values).

These annotations are only carried through the graph passes; quantization (``quant/qdq.py``)
takes them off and builds with them. It runs at import, not as a pipeline stage: at -O0 too a
pair must not reach the partition, and a lone QuantizeLinear or DequantizeLinear (not a pair,
not foldable) is refused by :func:`refuse_leftover_qdq`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from npuemu.isa.errors import UnsupportedOpError

from ..ir import Graph, Node, QuantParams

log = logging.getLogger(__name__)

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
#: the stored int8 zero point of each ONNX zero-point type (uint8 shifted: the same real values)
_ZERO_SHIFT = {"int8": 0, "uint8": -128}


def qdq_params(scale: np.ndarray, zero_point: np.ndarray | None, axis: int) -> QuantParams | None:
    """int8 parameters of an ONNX (scale, zero point) pair; None for types the NPU's int8 does
    not hold (int16, int32 biases: those fold to float and are requantized as biases)."""
    zero = np.zeros((), np.uint8) if zero_point is None else np.asarray(zero_point)
    if zero.dtype.name not in _ZERO_SHIFT:
        return None
    scale = np.asarray(scale, np.float32)
    zero = zero.astype(np.int32) + _ZERO_SHIFT[zero.dtype.name]
    if scale.size == 1:
        return QuantParams("int8", scale.reshape(()), zero.reshape(()))
    return QuantParams("int8", scale.reshape(-1), np.broadcast_to(zero.reshape(-1), (scale.size,)), axis)


def weight_params(attrs: dict[str, Any], arrays: Sequence[np.ndarray]) -> QuantParams | None:
    """The parameters of a DequantizeLinear of an int8/uint8 constant (a quantized weight)."""
    if np.asarray(arrays[0]).dtype.name not in _ZERO_SHIFT:
        return None
    return qdq_params(arrays[1], arrays[2] if len(arrays) > 2 else None, attrs["axis"])


def _node_params(graph: Graph, node: Node) -> QuantParams | None:
    scale = graph.tensors[node.inputs[1]].data
    zero = graph.tensors[node.inputs[2]].data if len(node.inputs) > 2 else None
    if node.op_type == QUANTIZE and zero is None:
        zero = np.zeros((), node.attrs["to"])
    return None if scale is None else qdq_params(scale, zero, node.attrs["axis"])


def _same(a: QuantParams, b: QuantParams) -> bool:
    return (a.axis == b.axis and np.array_equal(a.scale, b.scale)
            and np.array_equal(a.zero_point, b.zero_point))


def fold_qdq_pairs(graph: Graph) -> int:
    """QuantizeLinear -> DequantizeLinear pairs on activations as the tensor's int8 parameters
    (the module docstring); returns the number of pairs folded."""
    folded = 0
    for dq in [node for node in graph.nodes if node.op_type == DEQUANTIZE]:
        q = graph.producers().get(dq.inputs[0])
        if q is None or q.op_type != QUANTIZE:
            continue
        params, check = _node_params(graph, q), _node_params(graph, dq)
        if params is None or check is None or not _same(params, check) or params.axis is not None:
            continue  # not a plain per-tensor round trip: left for refuse_leftover_qdq
        source = q.inputs[0]
        if not _attach(graph, source, params):
            continue
        _remove_dequantize(graph, dq, source)
        folded += 1
    graph.remove_dead()
    if folded:
        log.info("%s: %d QuantizeLinear/DequantizeLinear pair(s) folded into int8 parameters", graph.name, folded)
    return folded


def _attach(graph: Graph, name: str, params: QuantParams) -> bool:
    """Give activation ``name`` the pair's parameters; a second pair with other parameters on
    the same tensor (two requantizations of one value) cannot be one storage: not folded."""
    tensor = graph.tensors[name]
    if tensor.is_const:
        return False
    if tensor.quant is not None and not _same(tensor.quant, params):
        log.warning("tensor '%s' is quantized twice with different parameters: the second pair is kept", name)
        return False
    tensor.quant = params
    return True


def _remove_dequantize(graph: Graph, dq: Node, source: str) -> None:
    """Readers of the pair's output read ``source``; a graph output takes over ``source``'s
    tensor (its name stays the model's output name, its parameters the pair's)."""
    target, position = dq.outputs[0], graph.nodes.index(dq)
    graph.nodes.remove(dq)
    if target in graph.outputs and source not in graph.inputs and source not in graph.outputs:
        del graph.tensors[target]
        graph.rename_tensor(source, target)
        return
    if target in graph.outputs:  # an input passed through to an output: keep a copy node
        graph.nodes.insert(position, Node(graph.unique_node_name(f"{target}_identity"), "Identity", [source], [target]))
        graph.tensors[target].quant = graph.tensors[source].quant
        return
    graph.replace_uses(target, source)
    graph.tensors.pop(target, None)


def refuse_leftover_qdq(graph: Graph) -> None:
    """A QuantizeLinear or DequantizeLinear that is not part of a folded pair has no NPU or
    host form: refuse it by name (a quantized graph input or output, per-channel activation
    parameters, a pair whose two halves disagree)."""
    left = [node for node in graph.nodes if node.op_type in (QUANTIZE, DEQUANTIZE)]
    if not left:
        return
    lines = [f"  node '{node.name}': {node.op_type}: only supported as a QuantizeLinear -> DequantizeLinear pair "
             "with per-tensor int8/uint8 parameters, or on a constant (a pre-quantized model, guide 6.4)"
             for node in left]
    raise UnsupportedOpError(f"{graph.source or graph.name}: {len(left)} unsupported node(s):\n" + "\n".join(lines))
