"""Per-layer JSON in the NPU perf JSON format (seed ``npu_perf_json_format_zh.md``):

    {"input_names": [...],
     "layers": [{"op_type": "qnn.csi.conv2d", "name": ..., "attrs": {...},
                 "inputs": [{"name", "dim", "is_const", "layout"}], "outputs": [...]}]}

Layers are the IR nodes in execution order. ``name`` is the node's layer name, which carries
the fusion suffix (``conv1_fuse_relu``, see ``ir.fused_layer_name``); a fused layer lists the
extra inputs of its fused parts after its own and describes them under ``attrs["fuse"]``.
Dims are NCHW as in the IR. ``padding`` lists (begin, end) per spatial axis, i.e. top, bottom,
left, right for 2-D, as the seed describes it. Layouts: activations by rank (NCHW for 4-D,
NC for 2-D...), convolution weights OIHW (ConvTranspose IOHW), biases O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .ir import Graph, Node, snake_case

_PREFIX = "qnn.csi."
_CSI_NAMES = {
    "Conv": "conv2d", "ConvTranspose": "deconv2d", "Gemm": "dense", "MatMul": "matmul",
    "MaxPool": "maxpool2d", "AveragePool": "avgpool2d", "GlobalAveragePool": "global_avgpool2d",
    "GlobalMaxPool": "global_maxpool2d", "Sub": "subtract", "Pow": "power", "Concat": "concatenate",
    "Slice": "strided_slice", "Unsqueeze": "expand_dims", "ReduceMean": "mean", "ReduceMax": "max",
    "ReduceSum": "sum", "BatchNormalization": "batch_norm", "LayerNormalization": "layer_norm",
    "Gather": "take", "PRelu": "prelu",
}
_ACTIVATION_LAYOUTS = {0: "", 1: "N", 2: "NC", 3: "NCW", 4: "NCHW", 5: "NCDHW"}
_KERNEL_LAYOUTS = {3: "OIW", 4: "OIHW", 5: "OIDHW"}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def perf_json(graph: Graph) -> dict[str, Any]:
    """The whole document as a JSON-ready dict."""
    return {"input_names": list(graph.inputs), "layers": [layer_json(graph, node) for node in graph.nodes]}


def write_perf_json(graph: Graph, path: str | Path) -> None:
    Path(path).write_text(dumps(graph), encoding="utf-8")


def dumps(graph: Graph) -> str:
    """The document as text: indented objects, lists of numbers or strings on one line."""
    return _dump(perf_json(graph), 0) + "\n"


def _dump(value: Any, depth: int) -> str:
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(key)}: {_dump(item, depth + 1)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        return "[\n" + ",\n".join(f"{inner}{_dump(item, depth + 1)}" for item in value) + f"\n{pad}]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


def layer_json(graph: Graph, node: Node) -> dict[str, Any]:
    attrs = _ATTRS.get(node.op_type, _plain_attrs)(graph, node)
    if node.fused:
        attrs["fuse"] = [{"op_type": csi_op_type(part.op_type, part.attrs), "attrs": _json_safe(part.attrs)}
                         for part in node.fused]
    inputs = [tensor_json(graph, name, _input_layout(graph, node, index, name)) for index, name in enumerate(node.inputs)]
    inputs += [tensor_json(graph, name, None) for part in node.fused for name in part.inputs]
    return {
        "op_type": csi_op_type(node.op_type, node.attrs),
        "name": node.layer_name,
        "attrs": _json_safe(attrs),
        "inputs": inputs,
        "outputs": [tensor_json(graph, name, None) for name in node.outputs],
    }


def csi_op_type(op_type: str, attrs: dict[str, Any]) -> str:
    """``qnn.csi.<name>`` of an op (Clip(0, 6) is relu6)."""
    if op_type == "Clip" and attrs.get("min") == 0.0 and attrs.get("max") == 6.0:
        return _PREFIX + "relu6"
    return _PREFIX + _CSI_NAMES.get(op_type, snake_case(op_type))


def tensor_json(graph: Graph, name: str, layout: str | None) -> dict[str, Any]:
    tensor = graph.tensors[name]
    return {"name": name, "dim": list(tensor.shape), "is_const": int(tensor.is_const),
            "layout": layout or _ACTIVATION_LAYOUTS.get(len(tensor.shape), "")}


def _input_layout(graph: Graph, node: Node, index: int, name: str) -> str | None:
    rank = len(graph.tensors[name].shape)
    if node.op_type in ("Conv", "ConvTranspose") and index == 1:
        layout = _KERNEL_LAYOUTS.get(rank)
        return layout.replace("OI", "IO", 1) if layout and node.op_type == "ConvTranspose" else layout
    if node.op_type in ("Conv", "ConvTranspose", "Gemm") and index == 2 and rank == 1:
        return "O"
    if node.op_type == "Gemm" and index == 1:
        return "OI" if node.attrs.get("transB") else "IO"
    return None


# ---- per-op attributes -----------------------------------------------------------------------

def _pairs(pads: list[int]) -> list[int]:
    """ONNX [begins..., ends...] -> [begin0, end0, begin1, end1, ...] (top, bottom, left, right)."""
    half = len(pads) // 2
    return [value for i in range(half) for value in (pads[i], pads[half + i])]


def _conv_attrs(graph: Graph, node: Node) -> dict[str, Any]:
    weight = graph.tensors[node.inputs[1]].shape
    transpose = node.op_type == "ConvTranspose"
    layout = _KERNEL_LAYOUTS.get(len(weight), "")
    attrs = {
        "channels": weight[1] * node.attrs["group"] if transpose else weight[0],
        "kernel_size": node.attrs["kernel_shape"], "strides": node.attrs["strides"],
        "padding": _pairs(node.attrs["pads"]), "groups": node.attrs["group"], "dilation": node.attrs["dilations"],
        "data_layout": _ACTIVATION_LAYOUTS.get(len(weight), ""),
        "kernel_layout": layout.replace("OI", "IO", 1) if transpose else layout,
    }
    if transpose:
        attrs["output_padding"] = node.attrs["output_padding"]
    return attrs


def _pool_attrs(graph: Graph, node: Node) -> dict[str, Any]:
    attrs = {"pool_size": node.attrs["kernel_shape"], "strides": node.attrs["strides"],
             "padding": _pairs(node.attrs["pads"]), "dilation": node.attrs["dilations"],
             "ceil_mode": bool(node.attrs["ceil_mode"]), "layout": "NCHW"}
    if "count_include_pad" in node.attrs:
        attrs["count_include_pad"] = bool(node.attrs["count_include_pad"])
    return attrs


def _dense_attrs(graph: Graph, node: Node) -> dict[str, Any]:
    return {"units": graph.tensors[node.outputs[0]].shape[-1], **node.attrs}


def _clip_attrs(graph: Graph, node: Node) -> dict[str, Any]:
    return {"a_min": node.attrs["min"], "a_max": node.attrs["max"]}


def _resize_attrs(graph: Graph, node: Node) -> dict[str, Any]:
    method = "nearest_neighbor" if node.attrs["mode"] == "nearest" else "bilinear"
    return {"method": method, "coordinate_transformation_mode": node.attrs["coordinate_transformation_mode"],
            "rounding_method": node.attrs["nearest_mode"], "scales": node.attrs["scales"],
            "size": node.attrs["sizes"][2:], "layout": "NCHW"}


def _renamed(**names: str) -> Callable[[Graph, Node], dict[str, Any]]:
    def attrs(graph: Graph, node: Node) -> dict[str, Any]:
        return {names.get(key, key): value for key, value in node.attrs.items()}
    return attrs


def _plain_attrs(graph: Graph, node: Node) -> dict[str, Any]:
    return dict(node.attrs)


_ATTRS: dict[str, Callable[[Graph, Node], dict[str, Any]]] = {
    "Conv": _conv_attrs, "ConvTranspose": _conv_attrs, "MaxPool": _pool_attrs, "AveragePool": _pool_attrs,
    "Gemm": _dense_attrs, "Clip": _clip_attrs, "Resize": _resize_attrs,
    "Reshape": _renamed(shape="newshape"), "Transpose": _renamed(perm="axes"),
    "Split": _renamed(split="indices_or_sections"), "Pad": _renamed(pads="pad_width", mode="pad_mode", value="pad_value"),
    "Slice": _renamed(starts="begin", ends="end", steps="strides"), "Cast": _renamed(to="dtype"),
    "ReduceMean": _renamed(axes="axis"), "ReduceMax": _renamed(axes="axis"), "ReduceSum": _renamed(axes="axis"),
    "Squeeze": _renamed(axes="axis"), "Unsqueeze": _renamed(axes="axis"),
}


def _json_safe(value: Any) -> Any:
    """Plain JSON values: numpy scalars/arrays to Python, infinities to the float32 limits."""
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    if isinstance(value, float) and not np.isfinite(value):
        return _FLOAT32_MAX if value > 0 else -_FLOAT32_MAX if value < 0 else None
    return value


__all__ = ["csi_op_type", "dumps", "layer_json", "perf_json", "tensor_json", "write_perf_json"]
