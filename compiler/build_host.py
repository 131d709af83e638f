"""Host (CPU) steps of a built model: the step records and the storage of host-only tensors.

A node the partition gives to the CPU (or an NPU node the build runs on the host, build.py
``_host_step``) becomes one ``cpu`` schedule step (isa/CONTAINER.md 3.5): op, input and
output tensor names and params (the node's canonical attributes). Constant inputs travel in
the params as ``operands`` (node input order), so a step is self-contained; one larger than
``HOST_CONSTANT_LIMIT`` elements (an LSTM's or a wide Gemm's weights) is an ND tensor stored in
the weights area instead, which the step reads as an input (operand ``{"tensor": name}``).

Storage (CONTAINER.md 3.3): a tensor only host steps read or write (and a graph input or
output of such steps) is stored in the ``ND`` layout, row-major in its ONNX shape, of any rank,
in its own element type: a float tensor as the quantized graph stores it (int8 with its
quantization, or float16; the host dequantizes, computes in float and requantizes, as the
fake-quant model predicts), any other in its ONNX type (int64, bool, int32, ...). A tensor an
NPU layer also touches is an NC1HWC2 feature map like every NPU tensor.

A node with several outputs becomes one step per output, each computing the op and keeping
output ``output_index`` (params): steps have one output tensor each. Fused parts (a bias Add,
an activation) travel as ``fused``: [{"op", "attrs", "carry", "operands"}], applied in order to
output 0 with the running result as operand ``carry``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from npuemu.compiler import op_table
from npuemu.compiler.ir import UNUSED_OUTPUT, Graph, Node
from npuemu.isa.container_trailer import ND_DTYPES, ND_LAYOUT  # the trailer schema's layout and element types
from npuemu.isa.errors import CompileError, UnsupportedOpError


#: ops a CPU schedule step may name (the runtime's host-side operators, emulator/cpu_ops*.py): the op
#: table's rows with ``host`` set (compiler/op_table.py)
CPU_OPS = op_table.host_ops()
HOST_CONSTANT_LIMIT = 1 << 20  # elements: a larger constant belongs in a weights section, not the trailer


@dataclass(frozen=True)
class CpuOp:
    """A layer the partition sent to the host: one ``cpu`` schedule step (isa/CONTAINER.md 3.5)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    output: str
    params: dict


def _fail(node: Node, what: str, kind: type[CompileError] = CompileError) -> CompileError:
    return kind(f"layer {node.layer_name} ({node.display_op}): {what}")


def json_value(value):
    """An attribute value as JSON: arrays as lists, non-finite floats as "nan"/"inf"/"-inf"."""
    if isinstance(value, np.ndarray):
        return json_value(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else str(float(value))
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()}
    if isinstance(value, np.dtype):
        return value.name
    return value


def split_outputs(node: Node) -> list[Node] | None:
    """One single-output node per used output of a multi-output CPU node (``output_index`` in
    its attributes), else None."""
    if node.target != "CPU" or len(node.outputs) < 2:
        return None
    return [Node(f"{node.name}_{index}", node.op_type, list(node.inputs), [output],
                 dict(node.attrs) | {"output_index": index}, list(node.fused), "CPU")
            for index, output in enumerate(node.outputs) if output and UNUSED_OUTPUT not in output]


CONSTANT = "Constant"  # build-internal host op: writes the constant value in its params


def constant_outputs(graph: Graph) -> list[Node]:
    """A CPU ``Constant`` node for each graph output the import folded to a constant (a Shape,
    Size, Range... of known shapes): the model still has to deliver it."""
    nodes = []
    for name in dict.fromkeys(graph.outputs):
        if graph.tensor(name).is_const:
            nodes.append(Node(f"{name}_constant", CONSTANT, [], [name], {}, [], "CPU"))
    return nodes


def cpu_from_node(graph: Graph, node: Node) -> CpuOp:
    """The CPU step record of a node partitioned to the CPU, or a CompileError naming it."""
    if node.op_type not in CPU_OPS and "custom_op" not in node.attrs:  # a custom op: params name its class
        raise _fail(node, f"the partition sent {node.op_type} to the CPU, but the runtime has no host-side "
                          f"{node.op_type} (CPU ops: {', '.join(sorted(CPU_OPS))})", UnsupportedOpError)
    unknown = [part.op_type for part in node.fused if part.op_type not in CPU_OPS]
    if unknown:
        raise _fail(node, f"fused {', '.join(unknown)} on a CPU layer: no host-side op", UnsupportedOpError)
    if len(node.outputs) != 1:
        raise _fail(node, f"{len(node.outputs)} outputs; CPU steps are built for single-output layers")
    inputs = tuple(name for name in node.inputs if name and _read_as_tensor(graph, name))
    params = json_value(dict(node.attrs))
    if len(inputs) != len(node.inputs):
        params["operands"] = _host_operands(graph, node, node.inputs)
    if node.fused:  # applied in order to the running result; their tensor operands follow the op's inputs
        params["fused"] = [{"op": part.op_type, "attrs": json_value(dict(part.attrs)), "carry": part.carry_index,
                            "operands": _host_operands(graph, node, part.inputs)} for part in node.fused]
        inputs += tuple(name for part in node.fused for name in part.inputs if _read_as_tensor(graph, name))
    if node.op_type == CONSTANT:
        params["operands"] = _host_operands(graph, node, node.outputs)
    return CpuOp(node.layer_name, node.op_type, inputs, node.outputs[0], params)


def _in_weights(tensor) -> bool:
    """A constant too large for a step's params: an ND tensor in the weights area."""
    return tensor.is_const and np.asarray(tensor.data).size > HOST_CONSTANT_LIMIT


def _read_as_tensor(graph: Graph, name: str) -> bool:
    """A step input read from memory: a non-constant, or a constant in the weights area."""
    tensor = graph.tensor(name)
    return not tensor.is_const or _in_weights(tensor)


def host_constants(graph: Graph, host: dict[str, dict]) -> dict[str, bytes]:
    """The bytes of the constant ND tensors among ``host`` (operands above HOST_CONSTANT_LIMIT:
    an LSTM's or a wide Gemm's weights), stored in the weights area in their own element type."""
    blobs = {}
    for name, record in host.items():
        tensor = graph.tensor(name)
        if not _in_weights(tensor):  # a folded graph output is written by its Constant step
            continue
        blobs[name] = np.asarray(tensor.data).astype(np.dtype(record["dtype"])).tobytes()  # nd_record: its own type
    return blobs


def _host_operands(graph: Graph, node: Node, names) -> list:
    """{"tensor": name} | {"constant": {"shape", "dtype", "values"}} | None per name."""
    operands = []
    for name in names:
        if not name:
            operands.append(None)
            continue
        tensor = graph.tensor(name)
        if _read_as_tensor(graph, name):  # a large constant is an ND tensor in the weights area
            operands.append({"tensor": name})
            continue
        values = np.asarray(tensor.data)
        if values.dtype.name not in ND_DTYPES:
            raise _fail(node, f"constant operand {name!r} has element type {values.dtype.name}")
        operands.append({"constant": {"shape": list(values.shape), "dtype": values.dtype.name,
                                      "values": json_value(values.reshape(-1))}})
    return operands


def host_tensors(graph: Graph, cpu_ops, npu_tensors) -> dict[str, dict]:
    """The ND trailer records (without region and address) of the tensors only host steps
    touch: every CPU step input/output not in ``npu_tensors``."""
    records = {}
    for name in (name for op in cpu_ops for name in (*op.inputs, op.output)):
        if name not in npu_tensors and name not in records:
            records[name] = nd_record(graph, name)
    return records


def nd_record(graph: Graph, name: str) -> dict:
    """A host-only tensor stored as the quantized graph decided (int8 with its quantization, or
    float16) when it is a float tensor, else in its ONNX element type (int64, bool, ...)."""
    tensor = graph.tensor(name)
    # integers and bools keep their values; so does a large constant operand (its values, as params carry them)
    quant = tensor.quant if tensor.dtype.startswith("float") and not _in_weights(tensor) else None
    record = {"name": name, "shape": list(tensor.shape), "layout": ND_LAYOUT}
    if quant is not None and quant.dtype == "float16":
        record["dtype"] = "float16"
    elif quant is not None and quant.dtype == "int8" and not quant.per_channel:
        record["dtype"] = "int8"
        record["quantization"] = {"scale": float(quant.scale), "zero_point": int(quant.zero_point)}
    elif quant is None and tensor.dtype in ND_DTYPES:
        record["dtype"] = tensor.dtype
    else:
        got = tensor.dtype if quant is None else f"{quant.dtype}{' per-channel' if quant.per_channel else ''}"
        raise CompileError(f"tensor {name!r}: the runtime stores no host tensors of type {got}")
    record["size"] = max(1, int(np.prod(tensor.shape, dtype=np.int64)) * np.dtype(record["dtype"]).itemsize)
    return record
