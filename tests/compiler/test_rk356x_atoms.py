"""Chips with 8-byte atoms (RK3566/RK3568): forms that need 16-byte atoms stay on the host there.

Interleaved phase writes: a ConvTranspose's phase convs, DepthToSpace as such a ConvTranspose and the bilinear Resize's edge
copy and phases write each phase from an odd pixel on (``ry*W + rx`` atoms), and DST_BASE_ADDR must
be 16-byte aligned (rknpu-isa.md 4): on RK356x, whose int8 and fp16 atoms are 8 bytes, such builds
compiled but stopped in the emulator ("DST_BASE_ADDR=... is not 16-byte aligned"). There the
ConvTranspose keeps its stacked conv with a host DepthToSpace, and DepthToSpace / bilinear Resize run
on the host with the reason named; rk3588 keeps every one on the NPU. Outputs vs onnxruntime. And a
MatMul of two activations (its run-time weights are 16-byte float16 atoms).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.emulator.runtime import Runtime

X_SHAPE = (1, 8, 10, 12)


def _model(kind: str) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE))
    rng = np.random.RandomState(0)
    if kind == "ConvTranspose":
        inits = [numpy_helper.from_array((rng.randn(8, 8, 2, 2) * 0.3).astype(np.float32), "w")]
        node, out = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2], strides=[2, 2]), 8
    elif kind == "DepthToSpace":
        inits, out = [], 2
        node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="DCR")
    else:
        inits, out = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")], 8
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear",
                                coordinate_transformation_mode="half_pixel")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out, 20, 24])
    graph = helper.make_graph([node], "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("chip", ["rk3568", "rk3588"])
@pytest.mark.parametrize("kind", ["ConvTranspose", "DepthToSpace", "Resize"])
def test_phase_writes_run_on_every_chip(tmp_path, kind, chip, precision):
    path = tmp_path / f"{kind}.onnx"
    path.write_bytes(_model(kind))
    x = np.random.RandomState(1).randn(*X_SHAPE).astype(np.float32)
    options = CompileOptions(precision=precision, dataset=[{"x": x}, {"x": -0.8 * x}] if precision == "int8" else None)
    built = compile_model(path, chip, options)
    host = sorted(info.op_type for info in built.layers() if info.target != "NPU")
    expected = {"rk3588": [], "rk3568": {"ConvTranspose": ["DepthToSpace"], "DepthToSpace": ["DepthToSpace"],
                                         "Resize": ["Resize"]}[kind]}[chip]
    assert host == expected
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    got = runtime.output("y")
    want = ort.InferenceSession(path.read_bytes()).run(None, {"x": x})[0]
    bound = 0.01 if precision == "fp16" else 0.05
    assert np.abs(np.asarray(got, np.float32).reshape(want.shape) - want).max() < bound


@pytest.mark.parametrize("chip", ["rk3568", "rk3588"])
def test_matmul_of_activations_stays_on_the_host_where_atoms_are_8_bytes(tmp_path, chip):
    """ActMatMul reads the second operand's float16 surfaces as the weights of 8-channel (16-byte)
    atoms (LOWERING.md 37); RK356x's float16 atom is 4 channels, and its build stopped with "is not
    the 640-byte weight blob". There the MatMul is a host step with the reason named."""
    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 8, 40, 16])
    k = helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 8, 16, 40])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 40, 40])
    graph = helper.make_graph([helper.make_node("MatMul", ["q", "k"], ["y"])], "g", [q, k], [y])
    path = tmp_path / "mm.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    built = compile_model(path, chip, CompileOptions(precision="fp16"))
    host = sorted(info.op_type for info in built.layers() if info.target != "NPU")
    assert host == (["MatMul"] if chip == "rk3568" else [])
    rng = np.random.RandomState(2)
    feeds = {"q": rng.randn(1, 8, 40, 16).astype(np.float32), "k": rng.randn(1, 8, 16, 40).astype(np.float32)}
    runtime = Runtime(built)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    want = feeds["q"] @ feeds["k"]
    assert np.abs(np.asarray(runtime.output("y"), np.float32).reshape(want.shape) - want).max() < 0.05
