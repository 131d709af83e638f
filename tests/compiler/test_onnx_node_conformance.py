"""The ONNX backend node tests (onnx's own per-operator conformance cases, built in memory by
``onnx.backend.test.loader``) for every op the importer knows, run through import + float
evaluation and compared with the expected outputs at onnx's own tolerance (rtol 1e-3,
atol 1e-7).

The cases feed configuration inputs (Reshape shape, Slice starts, Resize scales...) as
runtime inputs; the NPU compiler needs them constant, so they become initializers here.
Models of opset 22+ run at opset 21 when the opset-21 schema accepts them (those versions
only added element types). Every case ends in one of: passes, raises UnsupportedOpError for
a reason listed in ``UNSUPPORTED_REASONS``, raises CompileError for an input type listed in
``REJECTED_INPUTS``, or is a known deviation in ``DEVIATIONS`` (which must still deviate).
"""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import onnx
import pytest

from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.ops import REGISTRY
from npuemu.tools.conformance import DEVIATIONS, importable_model
from npuemu.isa.errors import CompileError, UnsupportedOpError

#: Ops whose inputs after the first configure the op and must be constant for the compiler.
CONFIG_INPUT_OPS = {"Reshape", "Slice", "Split", "Squeeze", "Unsqueeze", "ReduceMean", "ReduceSum", "ReduceMax",
                    "ReduceMin", "ReduceProd", "Resize", "Upsample", "Pad", "Clip", "Tile", "Expand",
                    "QuantizeLinear", "DequantizeLinear"}
#: Ops whose inputs are all configuration.
ALL_CONFIG_OPS = {"ConstantOfShape", "Range"}

UNSUPPORTED_REASONS = [
    r"BatchNormalization in training mode", r"Dropout in training mode",
    r"element type (BFLOAT16|FLOAT8\w*|U?INT[24]|FLOAT4E2M1)",
    # pre-quantized models (compiler/passes/fold_qdq.py): Q/DQ pairs and quantized constants only
    r"only supported as a QuantizeLinear -> DequantizeLinear pair", r"blocked quantization \(block_size\)",
    r"quantization to (float8\w*|u?int[24]|float4\w*)",
]
REJECTED_INPUTS = [r"element type (BFLOAT16|FLOAT8\w*|U?INT[24]|FLOAT4E2M1|STRING)", r"is not a tensor"]
# DEVIATIONS (tools/conformance.py): where npuemu follows onnxruntime, not onnx's reference


@functools.cache
def _cases() -> list:
    """Single-node cases of ops npuemu knows (loading all ~1900 cases takes a few seconds)."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return [case for case in cases if "_expanded" not in case.name and len(case.model.graph.node) == 1
            and case.model.graph.node[0].op_type in REGISTRY]


def _prepared(case) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]] | str:
    """Model and data ready for npuemu, or the reason the case does not apply."""
    model = importable_model(case)
    if isinstance(model, str):
        return model
    inputs, outputs = case.data_sets[0]
    to_array = lambda value: onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value  # noqa: E731
    feeds = {value.name: to_array(data) for value, data in zip(model.graph.input, inputs)}
    node = model.graph.node[0]
    keep = set() if node.op_type in ALL_CONFIG_OPS else {node.input[0]} if node.op_type in CONFIG_INPUT_OPS else set(feeds)
    for name in [name for name in feeds if name not in keep]:
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(feeds.pop(name)), name))
        model.graph.input.remove(next(value for value in model.graph.input if value.name == name))
    return model, feeds, [to_array(value) for value in outputs]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], expected: list[np.ndarray]) -> None:
    shapes = {name: list(np.shape(value)) for name, value in feeds.items()}
    graph = import_onnx(model, shapes)
    ours = evaluate(graph, feeds)
    for (name, value), reference in zip(ours.items(), expected):
        assert value.dtype == reference.dtype, f"{name}: dtype {value.dtype}, expected {reference.dtype}"
        np.testing.assert_allclose(value, reference, rtol=1e-3, atol=1e-7, err_msg=name)


def _outcome(case) -> tuple[str, str]:
    prepared = _prepared(case)
    if isinstance(prepared, str):
        return "not applicable", prepared
    try:
        _run(*prepared)
    except UnsupportedOpError as error:
        return "unsupported", str(error)
    except CompileError as error:
        return "rejected", str(error)
    except AssertionError as error:
        return "mismatch", str(error)[:400]
    return "pass", ""


def test_onnx_backend_node_cases():
    results = {case.name: _outcome(case) for case in _cases()}
    problems = []
    for name, (outcome, detail) in results.items():
        if name in DEVIATIONS:
            if outcome != "mismatch":
                problems.append(f"{name}: listed as a deviation ({DEVIATIONS[name]}) but now {outcome}")
        elif outcome == "unsupported" and not any(re.search(p, detail) for p in UNSUPPORTED_REASONS):
            problems.append(f"{name}: unexpected unsupported: {detail.splitlines()[1] if chr(10) in detail else detail}")
        elif outcome == "rejected" and not any(re.search(p, detail) for p in REJECTED_INPUTS):
            problems.append(f"{name}: rejected: {detail}")
        elif outcome == "mismatch":
            problems.append(f"{name}: {detail}")
    passed = sum(outcome == "pass" for outcome, _ in results.values())
    assert not problems, "\n".join(problems)
    assert passed >= 370, f"only {passed} node cases passed"


@pytest.mark.parametrize("name", sorted(DEVIATIONS))
def test_deviations_agree_with_onnxruntime(onnx_case, name):
    """Where npuemu departs from onnx's expected output, onnxruntime agrees with npuemu."""
    case = next(case for case in _cases() if case.name == name)
    model, feeds, _ = _prepared(case)
    graph = import_onnx(model, {key: list(np.shape(value)) for key, value in feeds.items()})
    ours = evaluate(graph, feeds)
    theirs = onnx_case.ort(model, feeds)
    for key, value in theirs.items():
        np.testing.assert_allclose(ours[key], value, rtol=1e-5, atol=1e-6)
