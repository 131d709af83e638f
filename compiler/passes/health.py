"""The graph health check run after every pass stage: ``Graph.check`` (names, definition
order) plus a shape check that infers every node again - main op, then each fused part on
the running result - and compares with the tensors the graph holds, so a pass that
miswires an operand fails at once, naming the stage and the node."""

from __future__ import annotations

from npuemu.isa.errors import CompileError

from ..ir import Graph, Node
from ..ops import REGISTRY, TensorInfo


def _info(graph: Graph, name: str) -> TensorInfo:
    tensor = graph.tensors[name]
    return TensorInfo(tensor.shape, tensor.dtype)


def _node_problem(graph: Graph, node: Node) -> str | None:
    op = REGISTRY.get(node.op_type)
    if op is None:
        return f"unknown op {node.op_type}"
    results = op.infer(node.attrs, [_info(graph, name) for name in node.inputs])
    carried = results[0]
    for part in node.fused:
        part_op = REGISTRY.get(part.op_type)
        if part_op is None:
            return f"unknown fused op {part.op_type}"
        operands = [_info(graph, name) for name in part.inputs]
        operands.insert(part.carry_index, carried)
        inferred = part_op.infer(part.attrs, operands)[0]
        if inferred.shape != carried.shape:
            return f"fused {part.op_type} changes the shape {list(carried.shape)} to {list(inferred.shape)}"
        carried = inferred
    results[0] = carried
    for name, info in zip(node.outputs, results):
        if info != _info(graph, name):
            return f"output '{name}' is {list(info.shape)} {info.dtype}, the graph says {list(graph.tensors[name].shape)}"
    return None


def check_health(graph: Graph, where: str) -> None:
    """Raise CompileError if the graph is malformed after ``where`` (a stage or pass name)."""
    try:
        graph.check()
    except CompileError as error:
        raise CompileError(f"after {where}: {error}") from None
    for node in graph.nodes:
        try:
            problem = _node_problem(graph, node)
        except CompileError as error:
            problem = str(error)
        if problem is not None:
            raise CompileError(f"after {where}: node '{node.name}' ({node.display_op}): {problem}")
