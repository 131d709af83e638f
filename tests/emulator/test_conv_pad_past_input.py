"""Convolutions whose last output windows lie wholly in the bottom/right padding
(REGISTER_SEMANTICS.md 43): a 1x1 conv with pads, asymmetric pads, a strided 3x3 with a wide bottom
pad. They compiled to one task each (as the vendor's builds are) and used to stop in the emulator
("start past the input rows"); now they run. Against onnxruntime: every output within the
quantization step, and the windows of padding only - whose value is the bias alone - within one
output LSB in int8 and equal to float16 rounding in fp16."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.emulator.runtime import Runtime

X_SHAPE = (1, 8, 10, 12)
CASES = {  # name: (kernel, ONNX pads top, left, bottom, right, stride)
    "1x1_pad1": (1, (1, 1, 1, 1), 1),
    "1x1_bottom3": (1, (0, 0, 3, 3), 1),
    "3x3_s2_bottom4": (3, (1, 1, 4, 4), 2),
}


def _model(kernel: int, pads, stride: int) -> bytes:
    rng = np.random.RandomState(0)
    w = numpy_helper.from_array((rng.randn(16, 8, kernel, kernel) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.randn(16).astype(np.float32), "b")
    height = (X_SHAPE[2] + pads[0] + pads[2] - kernel) // stride + 1
    width = (X_SHAPE[3] + pads[1] + pads[3] - kernel) // stride + 1
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[kernel] * 2, strides=[stride] * 2,
                            pads=list(pads))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, height, width])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def _padding_only(kernel: int, pads, stride: int, shape) -> np.ndarray:
    """Mask of the output pixels whose window holds no input pixel (computed from the geometry)."""
    rows = np.arange(shape[2]) * stride - pads[0]
    cols = np.arange(shape[3]) * stride - pads[1]
    row_out = (rows >= X_SHAPE[2]) | (rows + kernel <= 0)
    col_out = (cols >= X_SHAPE[3]) | (cols + kernel <= 0)
    return row_out[:, None] | col_out[None, :]


@pytest.mark.parametrize("chip", ["rk3588", "rk3562", "rk3568"])
@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_windows_in_the_padding_run(tmp_path, case, precision, chip):
    kernel, pads, stride = CASES[case]
    path = tmp_path / f"{case}.onnx"
    path.write_bytes(_model(kernel, pads, stride))
    x = np.random.RandomState(1).randn(*X_SHAPE).astype(np.float32)
    options = CompileOptions(precision=precision, dataset=[{"x": x}, {"x": -0.8 * x}] if precision == "int8" else None)
    built = compile_model(path, chip, options)
    assert all(info.target == "NPU" for info in built.layers() if info.op_type == "Conv")
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    want = ort.InferenceSession(path.read_bytes()).run(None, {"x": x})[0]
    got = np.asarray(runtime.output("y"), np.float32).reshape(want.shape)
    border = _padding_only(kernel, pads, stride, want.shape)
    assert border.any() and (~border).any()
    if precision == "fp16":
        assert np.abs(got - want).max() < 0.02 * np.abs(want).max()
        np.testing.assert_array_equal(got[..., border], want[..., border].astype(np.float16).astype(np.float32))
        return
    scale, _ = runtime.quantization("y")
    assert np.abs(got - want).max() < 4 * scale + 0.02 * np.abs(want).max()
    assert np.abs(got[..., border] - want[..., border]).max() <= scale * 1.001
