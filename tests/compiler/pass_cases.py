"""Helpers of the graph-pass tests: import a model, run the passes with the health check after
every pass, compare the float IR with onnxruntime, find nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.ir import Graph, Node
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize

RTOL = ATOL = 1e-5


def passed(model: onnx.ModelProto, level: int = 3, chip: str = "rk3588",
           input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """The model imported and run through the passes of ``level`` (checked after every pass)."""
    graph = import_onnx(model, input_shapes)
    optimize(graph, PassContext.for_chip(chip, level), check_every_pass=True)
    return graph


def same_as_ort(onnx_case, model: onnx.ModelProto, graph: Graph, feeds: Mapping[str, np.ndarray],
                rtol: float = RTOL, atol: float = ATOL) -> None:
    ours = evaluate(graph, feeds)
    theirs = onnx_case.ort(model, feeds)
    assert list(ours) == list(theirs)
    for name, expected in theirs.items():
        assert ours[name].shape == expected.shape, name
        np.testing.assert_allclose(ours[name], expected, rtol=rtol, atol=atol, err_msg=name)


def fused(onnx_case, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], level: int = 3,
          chip: str = "rk3588") -> Graph:
    """Passes + the onnxruntime comparison; returns the graph for structural asserts."""
    graph = passed(model, level, chip)
    same_as_ort(onnx_case, model, graph, feeds)
    return graph


def ops(graph: Graph) -> list[str]:
    """``display_op`` of every node, in order (``Conv+Relu``, ``Softmax``...)."""
    return [node.display_op for node in graph.nodes]


def only(graph: Graph, op_type: str) -> Node:
    found = [node for node in graph.nodes if node.op_type == op_type]
    assert len(found) == 1, ops(graph)
    return found[0]


def weights(rng: np.random.Generator, shape: Sequence[int], scale: float = 0.5) -> np.ndarray:
    return np.asarray(rng.uniform(-scale, scale, size=tuple(shape)), dtype=np.float32)
