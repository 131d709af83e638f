"""Model surgery on the ONNX model before import (the vendor's load_onnx(inputs=, outputs=) and
input_initial_val): cut the graph at named tensors, and freeze inputs to constants.

- :func:`freeze_inputs`: a graph input becomes an initializer holding the given value, so the
  import folds what depends on it (shape arithmetic, ``Where``, an ``If``'s condition).
- :func:`cut_model`: ``outputs`` become the graph outputs and ``inputs`` the graph inputs; the
  nodes that no output needs (walking back, stopping at the new inputs) are dropped, and so are
  the graph inputs nothing reads any more. Values an ``If`` branch reads from the outer graph
  count as read. A new input's type and shape come from ONNX shape inference; a dynamic dim
  is then given with ``--input-shape`` as for any input.

Both edit the ModelProto they are given (the importer passes its own copy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npuemu.isa.errors import CompileError


def parse_freeze_spec(spec: str) -> tuple[str, list[float]]:
    """``"sr=16000"`` or ``"mask=1,0,1"`` -> (name, values)."""
    name, sep, text = spec.partition("=")
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not sep or not name or not values:
        raise CompileError(f"--freeze '{spec}': expected NAME=VALUE or NAME=V0,V1,... with numbers")
    return name, values


def freeze_inputs(model: onnx.ModelProto, values: Mapping[str, Any], source: str) -> None:
    """Each named graph input becomes a constant of the given value (a single value fills a
    fixed shape; otherwise the values must fill the input's shape, or give a dynamic input
    its shape: a scalar input stays a scalar)."""
    graph = model.graph
    inputs = {value.name: value for value in graph.input}
    for name, given in values.items():
        if name not in inputs or any(init.name == name for init in graph.initializer):
            raise CompileError(f"{source}: --freeze {name}: no graph input named {name!r}; inputs are "
                               f"{[value.name for value in graph.input]}")
        value_info = inputs[name]
        tensor_type = value_info.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        array = np.asarray(given, dtype=np.float64)
        dims = [dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None
                for dim in tensor_type.shape.dim]
        if tensor_type.HasField("shape") and None not in dims:
            if array.size == 1:
                array = np.full(dims, array.reshape(-1)[0])
            elif array.size != int(np.prod(dims, dtype=np.int64)):
                raise CompileError(f"{source}: --freeze {name}: {array.size} values do not fill its shape {dims}")
            array = array.reshape(dims)
        elif array.size == 1:
            array = array.reshape(() if not dims else [1] * len(dims))
        graph.initializer.append(numpy_helper.from_array(array.astype(dtype), name))
        graph.input.remove(value_info)


def _producers(graph: onnx.GraphProto) -> dict[str, int]:
    return {output: index for index, node in enumerate(graph.node) for output in node.output if output}


def node_reads(node: onnx.NodeProto) -> set[str]:
    """What a node reads: its inputs and, for If/Loop/Scan, what its subgraphs read from outside."""
    names = {name for name in node.input if name}
    for attribute in node.attribute:
        for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)):
            inner = {out for sub_node in sub.node for out in sub_node.output} | {i.name for i in sub.initializer} \
                | {i.name for i in sub.input}
            for sub_node in sub.node:
                names |= node_reads(sub_node) - inner
            names |= {out.name for out in sub.output} - inner
    return names


def _needed(graph: onnx.GraphProto, outputs: Iterable[str], stops: set[str]) -> set[int]:
    """Indexes of the nodes the ``outputs`` depend on, not looking past ``stops``."""
    producers, needed = _producers(graph), set()
    pending = [name for name in outputs if name not in stops]
    while pending:
        index = producers.get(pending.pop())
        if index is None or index in needed:
            continue
        needed.add(index)
        pending += [name for name in node_reads(graph.node[index]) if name not in stops]
    return needed


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - only a source of types; the importer checks the model again
        inferred = model
    graph = inferred.graph
    return {value.name: value for value in [*graph.input, *graph.value_info, *graph.output]}


def cut_model(model: onnx.ModelProto, inputs: Sequence[str] | None, outputs: Sequence[str] | None,
              source: str) -> None:
    """Cut ``model`` (in place) to the given graph inputs and outputs (module docstring)."""
    graph = model.graph
    infos = _value_infos(model)
    known = set(infos) | {name for node in graph.node for name in node.output} | {init.name for init in graph.initializer}
    initializers = {init.name for init in graph.initializer}
    for name in [*(inputs or ()), *(outputs or ())]:
        if name not in known:
            raise CompileError(f"{source}: cannot cut the model at {name!r}: no tensor of that name")
    new_inputs = list(inputs) if inputs is not None else [v.name for v in graph.input if v.name not in initializers]
    new_outputs = list(outputs) if outputs is not None else [v.name for v in graph.output]
    keep = _needed(graph, new_outputs, set(new_inputs))
    _rename_cut_outputs(graph, keep, set(new_inputs) - {v.name for v in graph.input})
    kept = [node for index, node in enumerate(graph.node) if index in keep]
    read = {name for node in kept for name in node_reads(node)} | set(new_outputs)
    del graph.node[:]
    graph.node.extend(kept)
    values = [_typed(infos, name, source, "input") for name in new_inputs if name in read or name in new_outputs]
    del graph.input[:]
    graph.input.extend(values)
    outs = [_typed(infos, name, source, "output") for name in new_outputs]
    del graph.output[:]
    graph.output.extend(outs)
    kept_inits = [init for init in graph.initializer if init.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)


def _rename_cut_outputs(graph: onnx.GraphProto, keep: set[int], cut: set[str]) -> None:
    """A kept node that also makes a tensor the cut turns into an input: that output of it is
    renamed, the graph input takes the name (one producer per name)."""
    for index in keep:
        node = graph.node[index]
        for position, name in enumerate(node.output):
            if name in cut:
                node.output[position] = f"{name}__before_cut"


def _typed(infos: dict[str, onnx.ValueInfoProto], name: str, source: str, role: str) -> onnx.ValueInfoProto:
    info = infos.get(name)
    if info is None or not info.type.tensor_type.elem_type:
        if role == "input":
            raise CompileError(f"{source}: cannot cut the model at input {name!r}: its type is not known "
                               "(ONNX shape inference could not follow the graph to it)")
        return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
    value = onnx.ValueInfoProto()
    value.CopyFrom(info)
    return value
