"""Shared helpers of the compiler tests: build small ONNX models, run them in onnxruntime
(the float reference) and in npuemu's importer + float evaluator, compare.

Tolerances: float32 results are compared with rtol = atol = 1e-5 unless a test says
otherwise. npuemu accumulates in float64 and onnxruntime in float32, so the difference is
onnxruntime's float32 rounding, well inside that for the small shapes used here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.ir import Graph
from npuemu.compiler.onnx_import import import_onnx

RTOL = ATOL = 1e-5


class OnnxCase:
    """Build, run and compare helpers (used through the ``onnx_case`` fixture)."""

    @staticmethod
    def model(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, Any], outputs: Sequence[str],
              initializers: Mapping[str, np.ndarray] | None = None, opset: int = 13) -> onnx.ModelProto:
        """``inputs``: name -> shape (dims may be strings for dynamic dims), or name ->
        (shape, numpy dtype). Output types come from ONNX shape inference."""
        input_infos = []
        for name, spec in inputs.items():
            typed = isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], (type, np.dtype))
            shape, dtype = spec if typed else (spec, np.float32)
            elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
            input_infos.append(helper.make_tensor_value_info(name, elem, list(shape)))
        output_infos = [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs]
        inits = [onnx.numpy_helper.from_array(np.asarray(value), name) for name, value in (initializers or {}).items()]
        graph = helper.make_graph(list(nodes), "test", input_infos, output_infos, inits)
        opsets = [helper.make_opsetid("", opset)]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
        inferred = onnx.shape_inference.infer_shapes(model)
        by_name = {value.name: value for value in [*inferred.graph.value_info, *inferred.graph.output]}
        for value in model.graph.output:
            if value.name in by_name and by_name[value.name].type.tensor_type.elem_type:
                value.type.CopyFrom(by_name[value.name].type)
        return model

    @staticmethod
    def ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        return dict(zip(names, session.run(None, {name: np.asarray(value) for name, value in feeds.items()})))

    @classmethod
    def check(cls, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *,
              input_shapes: Mapping[str, Sequence[int]] | None = None, rtol: float = RTOL, atol: float = ATOL) -> Graph:
        """Import + evaluate with npuemu and compare every graph output with onnxruntime."""
        graph = import_onnx(model, input_shapes)
        ours = evaluate(graph, feeds)
        theirs = cls.ort(model, feeds)
        assert list(ours) == list(theirs)
        for name, expected in theirs.items():
            assert ours[name].dtype == expected.dtype, name
            assert ours[name].shape == expected.shape, name
            np.testing.assert_allclose(ours[name], expected, rtol=rtol, atol=atol, err_msg=name)
        return graph

    @classmethod
    def check_node(cls, node: onnx.NodeProto, inputs: Mapping[str, np.ndarray], *, opset: int = 13,
                   initializers: Mapping[str, np.ndarray] | None = None, rtol: float = RTOL, atol: float = ATOL) -> Graph:
        """One-node model: ``inputs`` become graph inputs, ``initializers`` constants."""
        specs = {name: (value.shape, value.dtype) for name, value in inputs.items()}
        model = cls.model([node], specs, [name for name in node.output if name], initializers, opset)
        return cls.check(model, inputs, rtol=rtol, atol=atol)


@pytest.fixture(scope="session")
def onnx_case() -> type[OnnxCase]:
    return OnnxCase


def random_array(rng: np.random.Generator, shape: Sequence[int], low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return np.asarray(rng.uniform(low, high, size=tuple(shape)), dtype=np.float32)


@pytest.fixture(scope="session")
def rand() -> Any:
    """``rand(shape, low=-2, high=2, seed=0)``: a float32 uniform array."""

    def make(shape: Sequence[int], low: float = -2.0, high: float = 2.0, seed: int = 0) -> np.ndarray:
        return random_array(np.random.default_rng(seed), shape, low, high)

    return make
