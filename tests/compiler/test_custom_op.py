"""Custom ops (issue 25 item 5, guide 5.5 ``reg_custom_op``): a user's Python op class, registered
with ``CompileOptions(custom_ops=...)`` / ``npuemu compile --custom-op module:Class``, runs as a
host step; the emulator imports the same class to run it (compiler/ops/custom.py)."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.compiler.ops.custom import unregister_custom_op
from npuemu.emulator.runtime import run_model_file
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import EmulationError, UnsupportedOpError
from npuemu.tools.cli import main

MODULE = "npuemu_test_custom_scaleshift"
SPEC = f"{MODULE}:ScaleShift"

SOURCE = textwrap.dedent('''
    import numpy as np

    class ScaleShift:
        """y = x * scale + shift (per channel), the vendor's custom op shape (guide 5.5.3)."""
        op_type = "ScaleShift"
        domain = "com.example"

        def shape_infer(self, node, in_shapes, in_dtypes):
            return [list(in_shapes[0])], [in_dtypes[0]]

        def compute(self, node, inputs):
            x = inputs[0]
            scale = np.asarray(node.attrs["scale"], x.dtype).reshape(1, -1, 1, 1)
            shift = np.asarray(node.attrs["shift"], x.dtype).reshape(1, -1, 1, 1)
            return [x * scale + shift]
''')

SCALE = [0.5, -1.0, 2.0, 1.5]
SHIFT = [0.1, 0.2, -0.3, 0.0]


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    """The op's module importable from tmp_path; forgotten afterwards (registry and sys.modules)."""
    folder = tmp_path / "ops"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop(MODULE, None)
    unregister_custom_op("ScaleShift")


def _conv(rng, name, x, y, cin, cout):
    w = numpy_helper.from_array(rng.normal(0, 0.3, (cout, cin, 3, 3)).astype(np.float32), f"{name}_w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"{name}_b")
    return helper.make_node("Conv", [x, w.name, b.name], [y], name=name, pads=[1, 1, 1, 1]), [w, b]


def scale_shift_model():
    """Conv -> ScaleShift (com.example) -> Conv."""
    rng = np.random.default_rng(25)
    c1, i1 = _conv(rng, "c1", "x", "a", 3, 4)
    c2, i2 = _conv(rng, "c2", "s", "y", 4, 8)
    custom = helper.make_node("ScaleShift", ["a"], ["s"], name="scaleshift", domain="com.example",
                              scale=SCALE, shift=SHIFT)
    graph = helper.make_graph([c1, custom, c2], "custom_net",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 8, 8])], i1 + i2)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    return model, [i1, i2]


def _conv_ref(x, w, b):
    n, c, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", padded[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out + b.reshape(1, -1, 1, 1)


def reference(x, inits):
    (w1, b1), (w2, b2) = [[numpy_helper.to_array(t).astype(np.float64) for t in pair] for pair in inits]
    a = _conv_ref(x.astype(np.float64), w1, b1)
    s = a * np.reshape(SCALE, (1, -1, 1, 1)) + np.reshape(SHIFT, (1, -1, 1, 1))
    return _conv_ref(s, w2, b2)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_custom_op_compiles_and_runs_as_a_host_step(precision, custom_module, tmp_path) -> None:
    model, inits = scale_shift_model()
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    options = CompileOptions(precision=precision, dataset=samples if precision == "int8" else None,
                             custom_ops=(SPEC,))
    built = compile_model(model, "rk3588", options)
    path = tmp_path / f"custom_{precision}.npu"
    built.write(path)
    steps = ModelFile.read(path).schedule()
    assert [step.kind for step in steps] == ["npu", "cpu", "npu"]
    cpu = steps[1]
    assert cpu.op == "ScaleShift" and cpu.params["custom_op"] == SPEC
    assert np.allclose(cpu.params["scale"], SCALE) and np.allclose(cpu.params["shift"], SHIFT)

    x = samples[0]["x"]
    got = run_model_file(path, {"x": x})["y"].astype(np.float64)
    want = reference(x, inits)
    cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cosine > 0.999, cosine
    tolerance = 0.05 if precision == "int8" else 0.01
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max()


def test_custom_node_without_the_option_names_node_and_option(custom_module) -> None:
    model, _ = scale_shift_model()
    with pytest.raises(UnsupportedOpError) as info:
        compile_model(model, "rk3588", CompileOptions(precision="fp16"))
    message = str(info.value)
    assert "scaleshift" in message and "ScaleShift" in message and "--custom-op" in message


def test_running_without_the_module_is_a_one_line_error(custom_module, tmp_path, monkeypatch) -> None:
    model, _ = scale_shift_model()
    path = tmp_path / "custom.npu"
    compile_model(model, "rk3588", CompileOptions(precision="fp16", custom_ops=(SPEC,))).write(path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(custom_module)])
    sys.modules.pop(MODULE, None)
    with pytest.raises(EmulationError) as info:
        run_model_file(path, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    message = str(info.value)
    assert "\n" not in message
    assert "ScaleShift" in message and SPEC in message and "PYTHONPATH" in message and "custom_net" in message


def test_cli_custom_op_flag(custom_module, tmp_path, capsys) -> None:
    model, _ = scale_shift_model()
    onnx_path, out = tmp_path / "net.onnx", tmp_path / "net.npu"
    onnx.save(model, str(onnx_path))
    assert main(["compile", str(onnx_path), "--fp16", "--custom-op", SPEC, "-o", str(out)]) == 0
    assert any(step.kind == "cpu" and step.params.get("custom_op") == SPEC for step in ModelFile.read(out).schedule())
    assert main(["compile", str(onnx_path), "--fp16", "-o", str(tmp_path / "no.npu")]) == 2
    assert "--custom-op" in capsys.readouterr().err
