"""A compile error with a known way out ends with it (issue 21 item 2): each case triggers the
error through ``npuemu.tools.cli.main``, checks the message ends with the hint (``...; try: ...``
or the option to give), then follows the hint and checks the compile goes through."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.tools.cli import main

SHAPE = [1, 8, 16, 16]


def _save(tmp_path, nodes, *, inputs=None, initializers=(), name="net.onnx", opsets=(("", 13),)) -> str:
    inputs = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 8
    path = tmp_path / name
    onnx.save(model, path)
    return str(path)


def _weights() -> onnx.TensorProto:
    values = np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1
    return numpy_helper.from_array(values, "W")


def _conv(inp: str, out: str) -> onnx.NodeProto:
    return helper.make_node("Conv", [inp, "W"], [out], pads=[1] * 4, name=f"conv_{out}")


def _error(capsys, argv: list[str]) -> str:
    """The one error `npuemu` prints for ``argv`` (exit code 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("npuemu ") and ": error: " in err
    return err.strip()


def _ok(capsys, argv: list[str]) -> None:
    code = main(argv)
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()


# --- unsupported op: --outputs cuts before it ------------------------------------------------

def test_unsupported_op_names_custom_op_and_the_cut(tmp_path, capsys) -> None:
    model = _save(tmp_path, [_conv("x", "a"), helper.make_node("Mish", ["a"], ["y"])], initializers=[_weights()],
                  opsets=(("", 18),))
    err = _error(capsys, ["compile", model, "--fp16"])
    assert err.endswith("; try: --custom-op MODULE:CLASS to run Mish as a host step (compiler/ops/custom.py); "
                        "or --outputs a to end the model before the unsupported node(s)")
    _ok(capsys, ["compile", model, "--fp16", "--outputs", "a", "-o", str(tmp_path / "cut.npu")])


# --- an op type npuemu lacks: --custom-op runs it as a host step ------------------------------

MODULE = "npuemu_test_ways_out_square"
SOURCE = textwrap.dedent('''
    class Square:
        op_type = "CstSquare"
        domain = "com.test"

        def shape_infer(self, node, in_shapes, in_dtypes):
            return [list(in_shapes[0])], [in_dtypes[0]]

        def compute(self, node, inputs):
            return [inputs[0] * inputs[0]]
''')


@pytest.fixture
def square_module(tmp_path, monkeypatch):
    from npuemu.compiler.ops.custom import unregister_custom_op

    folder = tmp_path / "ops"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    yield f"{MODULE}:Square"
    sys.modules.pop(MODULE, None)
    unregister_custom_op("CstSquare")


def test_custom_domain_op_names_custom_op(tmp_path, capsys, square_module) -> None:
    model = _save(tmp_path, [_conv("x", "a"), helper.make_node("CstSquare", ["a"], ["y"], domain="com.test")],
                  initializers=[_weights()], opsets=(("", 13), ("com.test", 1)))
    err = _error(capsys, ["compile", model, "--fp16"])
    assert err.endswith("; try: --custom-op MODULE:CLASS to run CstSquare as a host step (compiler/ops/custom.py); "
                        "or --outputs a to end the model before the unsupported node(s)")
    _ok(capsys, ["compile", model, "--fp16", "--custom-op", square_module, "-o", str(tmp_path / "sq.npu")])


# --- If on a graph input: --freeze -----------------------------------------------------------

def test_if_on_an_input_names_freeze(tmp_path, capsys) -> None:
    then = helper.make_graph([helper.make_node("Relu", ["a"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Sigmoid", ["a"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, [])]
    model = _save(tmp_path, [_conv("x", "a"), helper.make_node("If", ["flag"], ["y"], then_branch=then,
                                                                  else_branch=other)],
                  inputs=inputs, initializers=[_weights()])
    err = _error(capsys, ["compile", model, "--fp16"])
    assert err.endswith("; try: --freeze NAME=VALUE for the inputs an If condition depends on (its taken branch "
                        "is inlined)")
    _ok(capsys, ["compile", model, "--fp16", "--freeze", "flag=1", "-o", str(tmp_path / "if.npu")])


# --- dynamic dims: --input-shape -------------------------------------------------------------

def test_dynamic_dims_name_input_shape(tmp_path, capsys) -> None:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "H", "W"])]
    model = _save(tmp_path, [_conv("x", "y")], inputs=inputs, initializers=[_weights()])
    err = _error(capsys, ["compile", model, "--fp16"])
    assert err.endswith("Give the input shapes: --input-shape x=1,8,<dim2>,<dim3>")
    _ok(capsys, ["compile", model, "--fp16", "--input-shape", "x=1,8,16,16", "-o", str(tmp_path / "dyn.npu")])


# --- a batch asked of a batch-1 model: --batch-size ------------------------------------------

def test_fixed_batch_dim_names_batch_size(tmp_path, capsys) -> None:
    model = _save(tmp_path, [_conv("x", "y")], initializers=[_weights()])
    err = _error(capsys, ["compile", model, "--fp16", "--input-shape", "x=2,8,16,16"])
    assert err.endswith("; try: dim 0 at 1 with --batch-size 2 (a build of 2 batch slices, guide 5.6)")
    _ok(capsys, ["compile", model, "--fp16", "--batch-size", "2", "-o", str(tmp_path / "b2.npu")])


# --- a quant config naming a layer the model lacks: the layer names --------------------------

def test_quant_config_unknown_layer_names_the_nearest(tmp_path, capsys) -> None:
    model = _save(tmp_path, [_conv("x", "a"), helper.make_node("Relu", ["a"], ["b"]), _conv("b", "y")],
                  initializers=[_weights()])
    dataset = _dataset(tmp_path, SHAPE)
    config = tmp_path / "net.yaml"
    _ok(capsys, ["quant-config", model, "--dataset", str(dataset), "-o", str(config)])
    text = config.read_text()
    assert '"conv_y":' in text
    config.write_text(text.replace('"conv_y":', '"conv_z":', 1))
    err = _error(capsys, ["compile", model, "--quant-config", str(config)])
    assert "layers.conv_z: no layer of that name in the model" in err
    assert err.endswith("; try: the nearest names: conv_y, conv_a; or write the config again with `npuemu quant-config` "
                        "at the same -O level")
    config.write_text(text)
    _ok(capsys, ["compile", model, "--quant-config", str(config), "-o", str(tmp_path / "h.npu")])


# --- a dataset array of another shape: the expected shape ------------------------------------

def _dataset(tmp_path, shape, name: str = "ds.txt"):
    array = np.random.default_rng(1).random(shape, dtype=np.float32)
    np.save(tmp_path / f"{name}.npy", array)
    (tmp_path / name).write_text(f"{name}.npy\n")
    return tmp_path / name


def test_nhwc_dataset_array_names_the_transpose(tmp_path, capsys) -> None:
    model = _save(tmp_path, [_conv("x", "y")], initializers=[_weights()])
    nhwc = _dataset(tmp_path, [1, 16, 16, 8], "nhwc.txt")
    err = _error(capsys, ["compile", model, "--dataset", str(nhwc)])
    assert "shape [1, 16, 16, 8] does not match input 'x' [1, 8, 16, 16]" in err
    assert err.endswith("; try: the array is in NHWC order: save np.transpose(array, (0, 3, 1, 2)) (NCHW)")
    np.save(tmp_path / "nhwc.txt.npy", np.transpose(np.load(tmp_path / "nhwc.txt.npy"), (0, 3, 1, 2)))
    _ok(capsys, ["compile", model, "--dataset", str(nhwc), "-o", str(tmp_path / "q.npu")])


def test_other_dataset_shape_names_the_expected_shape(tmp_path, capsys) -> None:
    model = _save(tmp_path, [_conv("x", "y")], initializers=[_weights()])
    wrong = _dataset(tmp_path, [8, 20, 20], "wrong.txt")
    err = _error(capsys, ["compile", model, "--dataset", str(wrong)])
    assert err.endswith("; try: save each array with shape [1, 8, 16, 16]; or, if the model's input dims are "
                        "dynamic, compile with --input-shape x=1,8,20,20")
