"""The IR as compact, stable text: a header, then one line per node.

    graph 'main'  opset 13  from model.onnx
    inputs:  x f32[1,3,224,224]
    outputs: y f32[1,1000]
    constants: 2 tensors, 1.7 KiB
      0 Conv+Relu  conv1  (x f32[1,3,224,224], w const f32[16,3,3,3]) -> (t1 f32[1,16,112,112])  group=1 ...

A node line: index, op with its fused parts, node name, inputs and outputs (name, dtype,
shape, ``const`` for constants, ``q=...`` for quantized tensors), the main op's attributes,
then each fused part with its extra inputs and attributes. Attribute order is the canonical
order of the op's definition and numbers print the same way on every run, so two dumps of
the same model compare with diff.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ir import FusedOp, Graph, Node, QuantParams, Tensor

_SHORT_DTYPES = {"float32": "f32", "float16": "f16", "float64": "f64", "int64": "i64", "int32": "i32",
                 "int16": "i16", "int8": "i8", "uint8": "u8", "uint16": "u16", "bool": "bool"}
_LIST_LIMIT = 8


def format_graph(graph: Graph) -> str:
    constants = graph.constants()
    size = sum(tensor.data.nbytes for tensor in constants if tensor.data is not None)
    header = [
        f"graph '{graph.name}'  opset {graph.opset}" + (f"  from {graph.source}" if graph.source else ""),
        "inputs:  " + ", ".join(format_tensor(graph.tensors[name]) for name in graph.inputs),
        "outputs: " + ", ".join(format_tensor(graph.tensors[name]) for name in graph.outputs),
        f"constants: {len(constants)} tensors, {_bytes(size)}",
    ]
    width = len(str(max(len(graph.nodes) - 1, 0)))
    lines = [format_node(graph, node, index, width) for index, node in enumerate(graph.nodes)]
    return "\n".join(header + lines) + "\n"


def format_node(graph: Graph, node: Node, index: int, width: int = 3) -> str:
    inputs = ", ".join(format_tensor(graph.tensors[name]) for name in node.inputs)
    outputs = ", ".join(format_tensor(graph.tensors[name]) for name in node.outputs)
    parts = [f"{index:>{width}} {node.display_op}  {node.name}  ({inputs}) -> ({outputs})"]
    if node.attrs:
        parts.append(format_attrs(node.attrs))
    parts += [_format_fused(graph, part) for part in node.fused]
    if node.target:
        parts.append(f"on {node.target}")
    return "  ".join(parts)


def format_tensor(tensor: Tensor) -> str:
    shape = ",".join(str(d) for d in tensor.shape)
    text = f"{tensor.name} {'const ' if tensor.is_const else ''}{dtype_short(tensor.dtype)}[{shape}]"
    if tensor.is_const and tensor.size == 1:
        text += f"={format_value(np.asarray(tensor.data).reshape(-1)[0].item())}"
    if tensor.quant is not None:
        text += f" q={format_quant(tensor.quant)}"
    return text


def format_quant(quant: QuantParams) -> str:
    kind = dtype_short(quant.dtype)
    if not quant.per_channel:
        return f"{kind}(s={format_value(float(quant.scale))},zp={int(quant.zero_point)})"
    return (f"{kind}(axis={quant.axis},{quant.scale.size} scales in "
            f"[{format_value(float(quant.scale.min()))},{format_value(float(quant.scale.max()))}])")


def format_attrs(attrs: dict[str, Any]) -> str:
    return " ".join(f"{key}={format_value(value)}" for key, value in attrs.items())


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        shown = [format_value(item) for item in value[:_LIST_LIMIT]]
        more = f",...({len(value)})" if len(value) > _LIST_LIMIT else ""
        return "[" + ",".join(shown) + more + "]"
    if isinstance(value, np.ndarray):
        return f"array{list(value.shape)}"
    return str(value)


def dtype_short(dtype: str) -> str:
    return _SHORT_DTYPES.get(dtype, dtype)


def _format_fused(graph: Graph, part: FusedOp) -> str:
    extra = ", ".join(format_tensor(graph.tensors[name]) for name in part.inputs)
    text = f"+{part.op_type}" + (f"({extra})" if extra else "")
    if part.attrs:
        text += " " + format_attrs(part.attrs)
    return text


def _bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"
