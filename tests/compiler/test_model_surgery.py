"""Model surgery (compiler/passes/surgery.py, onnx_import's If inlining): cut points
(``import_onnx(inputs=, outputs=)``, ``compile --inputs/--outputs``), inputs frozen to constants
(``--freeze``, ``load_onnx(input_initial_val=)``), ``If`` with a constant condition inlined (nested,
branches reading outer values), a non-constant ``If`` refused naming the node and --freeze.
Results are compared with onnxruntime on the same (cut or fed) model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes.surgery import parse_freeze_spec
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import CompileError, UnsupportedOpError
from npuemu.tools.cli import main

RNG = np.random.default_rng(3)


def _ort(model: onnx.ModelProto, feeds: dict) -> dict:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _chain(extra_nodes=(), extra_outputs=()) -> onnx.ModelProto:
    """x -> Conv -> Relu (r) -> Conv -> Sigmoid (y), plus ``extra_nodes`` after y."""
    w1 = numpy_helper.from_array(RNG.normal(0, 0.4, (4, 2, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(RNG.normal(0, 0.4, (3, 4, 1, 1)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["d"], name="conv2"),
             helper.make_node("Sigmoid", ["d"], ["y"], name="sigmoid"), *extra_nodes]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", *extra_outputs)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                              outputs, [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


X = RNG.normal(size=(1, 2, 6, 6)).astype(np.float32)


def test_outputs_cut_keeps_only_what_they_need():
    model = _chain()
    graph = import_onnx(model, outputs=["r"])
    assert graph.outputs == ["r"] and [n.op_type for n in graph.nodes] == ["Conv", "Relu"]
    full = evaluate(import_onnx(model), {"x": X}, return_all=True)
    np.testing.assert_allclose(evaluate(graph, {"x": X})["r"], full["r"], rtol=1e-6, atol=1e-6)


def test_inputs_cut_starts_the_model_there():
    model = _chain()
    graph = import_onnx(model, inputs=["r"])
    assert graph.inputs == ["r"] and graph.tensor("r").shape == (1, 4, 6, 6)
    assert [n.op_type for n in graph.nodes] == ["Conv", "Sigmoid"]
    r = np.abs(RNG.normal(size=(1, 4, 6, 6))).astype(np.float32)
    want = _ort(_tail(model), {"r": r})["y"]
    np.testing.assert_allclose(evaluate(graph, {"r": r})["y"], want, rtol=1e-5, atol=1e-6)


def _tail(model: onnx.ModelProto) -> onnx.ModelProto:
    """The chain's second half written by hand (conv2, sigmoid) for onnxruntime."""
    graph = model.graph
    nodes = [n for n in graph.node if n.name in ("conv2", "sigmoid")]
    inits = [i for i in graph.initializer if i.name == "w2"]
    tail = helper.make_graph(nodes, "tail", [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4, 6, 6])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(tail, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_cut_drops_an_unsupported_tail():
    tail = helper.make_node("Det", ["y"], ["z"], name="odd")  # an ONNX op npuemu does not import
    model = _chain([tail], ["z"])
    with pytest.raises(UnsupportedOpError, match="odd"):
        import_onnx(model)
    assert import_onnx(model, outputs=["y"]).outputs == ["y"]


def test_cut_at_an_unknown_tensor_names_it():
    with pytest.raises(CompileError, match="'nope'"):
        import_onnx(_chain(), outputs=["nope"])


def _gated(condition_from_input: bool) -> onnx.ModelProto:
    """y = If(cond, then: x * 2 (and a nested If on a shape: + 1), else: x - 3). The condition is
    Equal(mode, 1) of an int64 input ``mode``, or of x's batch dim (folds from shapes)."""
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    three = numpy_helper.from_array(np.array(3.0, np.float32), "three")
    inner_then = helper.make_graph([helper.make_node("Add", ["doubled", "one_f"], ["plus"])], "inner_then", [],
                                   [helper.make_tensor_value_info("plus", TensorProto.FLOAT, None)],
                                   [numpy_helper.from_array(np.array(1.0, np.float32), "one_f")])
    inner_else = helper.make_graph([helper.make_node("Identity", ["doubled"], ["same"])], "inner_else", [],
                                   [helper.make_tensor_value_info("same", TensorProto.FLOAT, None)])
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"]),
         helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
         helper.make_node("Equal", ["batch", "one"], ["is_one"]),
         helper.make_node("If", ["is_one"], ["inner"], then_branch=inner_then, else_branch=inner_else, name="inner_if")],
        "then", [], [helper.make_tensor_value_info("inner", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(0, np.int64), "zero")])
    else_branch = helper.make_graph([helper.make_node("Sub", ["x", "three"], ["less"])], "else", [],
                                    [helper.make_tensor_value_info("less", TensorProto.FLOAT, None)])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])]
    if condition_from_input:
        inputs.append(helper.make_tensor_value_info("mode", TensorProto.INT64, []))
        head = [helper.make_node("Equal", ["mode", "one"], ["cond"])]
    else:
        head = [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Size", ["xs"], ["rank"]),
                helper.make_node("Equal", ["rank", "two_i"], ["cond"])]
    nodes = head + [helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch,
                                     name="gate")]
    inits = [one, two, three, numpy_helper.from_array(np.array(2, np.int64), "two_i")]
    graph = helper.make_graph(nodes, "gated", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_if_on_shapes_inlines_its_branch_and_nested_ifs():
    model = _gated(False)
    graph = import_onnx(model)
    assert "If" not in [n.op_type for n in graph.nodes]
    x = RNG.normal(size=(1, 4)).astype(np.float32)
    np.testing.assert_allclose(evaluate(graph, {"x": x})["y"], _ort(model, {"x": x})["y"], rtol=1e-6)
    np.testing.assert_allclose(evaluate(graph, {"x": x})["y"], x * 2 + 1, rtol=1e-6)


def test_if_on_an_input_is_refused_naming_the_node_and_freeze():
    with pytest.raises(UnsupportedOpError, match=r"node 'gate': If .*--freeze"):
        import_onnx(_gated(True))


@pytest.mark.parametrize("mode", [1, 0])
def test_freeze_folds_the_if_to_the_chosen_branch(mode):
    model = _gated(True)
    graph = import_onnx(model, freeze={"mode": mode})
    assert graph.inputs == ["x"] and "If" not in [n.op_type for n in graph.nodes]
    x = RNG.normal(size=(1, 4)).astype(np.float32)
    want = _ort(model, {"x": x, "mode": np.array(mode, np.int64)})["y"]
    np.testing.assert_allclose(evaluate(graph, {"x": x})["y"], want, rtol=1e-6)


def test_freeze_fills_a_fixed_shape_and_checks_names_and_counts():
    model = _chain()
    graph = import_onnx(model, freeze={"x": 0.5})  # everything folds: the output is a constant
    assert graph.tensor("y").is_const
    want = _ort(model, {"x": np.full((1, 2, 6, 6), 0.5, np.float32)})["y"]
    np.testing.assert_allclose(graph.tensor("y").data, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(CompileError, match="no graph input named 'sr'"):
        import_onnx(model, freeze={"sr": 1})
    with pytest.raises(CompileError, match="3 values do not fill its shape"):
        import_onnx(model, freeze={"x": [1, 2, 3]})
    assert parse_freeze_spec("sr=16000") == ("sr", [16000.0])
    with pytest.raises(CompileError, match="NAME=VALUE"):
        parse_freeze_spec("sr")


def test_compile_cli_outputs_and_freeze(tmp_path, capsys):
    model = _gated(True)
    path, out = tmp_path / "gated.onnx", tmp_path / "gated.npu"
    onnx.save(model, path)
    assert main(["compile", str(path), "--freeze", "mode=1", "--fp16", "-o", str(out)]) == 0
    runtime = Runtime(ModelFile.read(out))
    x = RNG.normal(size=(1, 4)).astype(np.float32)
    runtime.set_input("x", x)
    runtime.run()
    np.testing.assert_allclose(runtime.output("y"), x * 2 + 1, rtol=2e-3, atol=2e-3)
    chain = tmp_path / "chain.onnx"
    onnx.save(_chain(), chain)
    assert main(["compile", str(chain), "--outputs", "r", "--fp16", "-o", str(tmp_path / "r.npu")]) == 0
    capsys.readouterr()
    assert main(["compile", str(path), "--fp16", "-o", str(tmp_path / "x.npu")]) != 0  # the If needs --freeze
    assert "node 'gate': If" in capsys.readouterr().err


def test_compile_options_cut_and_run_on_the_emulator():
    model = _chain()
    built = compile_model(model, "rk3588", CompileOptions(precision="fp16", inputs=["r"]))
    assert built.trailer["graph"]["inputs"] == ["r"]
    r = np.abs(RNG.normal(size=(1, 4, 6, 6))).astype(np.float32)
    runtime = Runtime(built)
    runtime.set_input("r", r)
    runtime.run()
    want = _ort(_tail(model), {"r": r})["y"]
    np.testing.assert_allclose(runtime.output("y"), want, rtol=0, atol=3e-3)


def test_api_load_onnx_input_initial_val(tmp_path):
    from npuemu.api import RKNN

    path = tmp_path / "gated.onnx"
    onnx.save(_gated(True), path)
    rknn = RKNN()
    assert rknn.load_onnx(str(path), input_initial_val=[None, np.array(0, np.int64)]) == 0
    assert rknn.build(do_quantization=False) == 0
    assert rknn.init_runtime() == 0
    x = RNG.normal(size=(1, 4)).astype(np.float32)
    got = rknn.inference(inputs=[x], data_format="nchw")[0]
    np.testing.assert_allclose(got, x - 3, rtol=2e-3, atol=4e-3)
