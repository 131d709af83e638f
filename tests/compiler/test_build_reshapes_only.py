"""A graph whose every node is a by-address reshape (a [1, C] <-> [1, C, 1, 1] view, or a Transpose
of a 1x1 map the passes turn into one): no layer reads or writes the graph input, yet the output
is a view of it, so the input needs its own allocation (compiler/tensor_plan.py). Such builds
used to stop with a KeyError (a traceback) in packaging."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.emulator.runtime import Runtime


def _model(op: str, shape_in, shape_out, **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_in)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_out)
    inputs = ["x"]
    inits = []
    if op == "Reshape":
        inits = [helper.make_tensor("s", TensorProto.INT64, [len(shape_out)], shape_out)]
        inputs.append("s")
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], **attrs)], "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("case", [("Transpose", [1, 1, 1, 1], [1, 1, 1, 1], {"perm": [0, 2, 3, 1]}),
                                  ("Reshape", [1, 20, 1, 1], [1, 20], {})])
def test_a_graph_of_views_builds_and_hands_back_its_input(case, precision):
    op, shape_in, shape_out, attrs = case
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, shape_in).astype(np.float32)
    dataset = [{"x": rng.uniform(-1, 1, shape_in).astype(np.float32)} for _ in range(2)] + [{"x": x}]
    model = compile_model(_model(op, shape_in, shape_out, **attrs), "rk3588",
                          CompileOptions(precision=precision, dataset=dataset if precision == "int8" else None))
    runtime = Runtime(model)
    runtime.set_input("x", x)
    runtime.run()
    got = runtime.output("y")
    assert got.shape == tuple(shape_out)
    if precision == "fp16":
        np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32).reshape(shape_out))
    else:  # one int8 step: within half a step of the input's scale
        scale = float(np.max(model.tensor("x").quantization.scale))
        assert np.abs(got - x.reshape(shape_out)).max() <= scale / 2 + 1e-6
