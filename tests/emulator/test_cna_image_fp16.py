"""The CNA's image-input mode with fp16 pixels (ARGB_IN 8..11, IN_PRECISION 2): the vendor's fp16
builds of a 3-channel input (focus_slice_fp16, dynamic_shape_fp16) store the input as float16
native [1,1,H,W,3], packed 6-byte pixels, LINE_STRIDE in pixels (emulator/units/cna_core.py).

Measured on input_0 (max |emu - sim|, cosine vs sim), tolerances a little above:
  focus_slice_fp16    0.0039  (2 fp16 steps at |y| 2.8), 0.99999964
  dynamic_shape_fp16  0.00049 (1 fp16 step at |y| 0.54), 0.99999988
"""

from __future__ import annotations

import lzma

import numpy as np
import pytest

from tests.emulator.test_machine_support import ConvSpec
from tests.emulator.test_units_decode import conv_state
from tests.shared_data import RKNN_FIXTURES_OPS
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import EmulationError
from npuemu.isa.rknn import load_rknn

TOLERANCES = {"focus_slice_fp16": (0.005, 0.9999995), "dynamic_shape_fp16": (0.0007, 0.9999997)}


def _load(path):
    return np.load(lzma.open(path))


def _onnxruntime(folder, x: np.ndarray) -> np.ndarray:
    """The shipped onnxruntime output, or (focus_slice_fp16 ships none) the fixture's model.onnx run here."""
    shipped = folder / "ort_output_0.npy.xz"
    if shipped.exists():
        return _load(shipped)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.astype(np.float32)})[0]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("case", sorted(TOLERANCES))
def test_fp16_image_input_fixture_matches_simulator(case):
    folder = RKNN_FIXTURES_OPS / case
    model = load_rknn(folder / "model.rknn")
    assert model.input_tensors[0].dtype_name == "float16" and model.input_tensors[0].native_shape[-1] == 3
    x = _load(folder / "input_0.npy.xz")
    run = RknnRunner(model).run([x])
    (name, ours), = run.outputs.items()
    sim = _load(folder / "sim_output_0.npy.xz").reshape(ours.shape)
    ort = _onnxruntime(folder, x).reshape(ours.shape)
    error = float(np.abs(ours - sim).max())
    max_error, min_cos = TOLERANCES[case]
    report = f"{case}: max |emu - sim| {error:.4g}, cosine vs sim {_cos(ours, sim):.8f}, vs ort {_cos(ours, ort):.8f}"
    assert error <= max_error, report
    assert _cos(ours, sim) >= min_cos, report
    assert _cos(ours, ort) >= _cos(sim, ort) - 1e-6, report


def test_fp16_image_read_is_exact_through_a_slicing_conv(monkeypatch):
    """focus_slice_fp16's first layer is the Focus slicing as a 2x2 stride-2 conv with one-hot fp16
    weights, in two row bands (88 + 40 input rows, the second at FEATURE_DATA_ADDR 88 x 128 x 6 B):
    its output must be the ONNX Slice/Concat of fp16(x) exactly (model.onnx: starts (0,0), (1,0),
    (0,1), (1,1) on H, W with step 2, concatenated on C)."""
    folder = RKNN_FIXTURES_OPS / "focus_slice_fp16"
    runner = RknnRunner(load_rknn(folder / "model.rknn"))
    images = []
    build = RknnRunner._memory_image
    monkeypatch.setattr(RknnRunner, "_memory_image", lambda self: images.append(build(self)) or images[-1])
    x = _load(folder / "input_0.npy.xz")
    runner.run([x])
    got = runner._read(runner.model.tensor("concat_out25"), images[0])
    h = x.astype(np.float16)
    expected = np.concatenate([h[:, :, 0::2, 0::2], h[:, :, 1::2, 0::2], h[:, :, 0::2, 1::2], h[:, :, 1::2, 1::2]], 1)
    np.testing.assert_array_equal(got, expected)


SPEC = ConvSpec(in_c=3, in_h=10, in_w=128, kernels=32, kernel=2, stride=2, out_h=5, out_w=64)


def _image_state(argb: int, in_precision: int, line_stride: int = 128):
    # focus_slice_fp16 task 0: CONV_CON1 ARGB_IN=10 PROC_PRECISION=2 IN_PRECISION=2, MISC_CFG PROC_PRECISION=2
    return conv_state(SPEC, {("CNA", "CONV_CON1"): {"ARGB_IN": argb, "NONALIGN_DMA": 1, "GROUP_LINE_OFF": 1,
                                                    "IN_PRECISION": in_precision, "PROC_PRECISION": in_precision},
                             ("CORE", "MISC_CFG"): {"PROC_PRECISION": in_precision},
                             # fp16 weights: twice the int8 bytes (2x2 taps x 16 stored channels x 2 B)
                             ("CNA", "WEIGHT_SIZE1"): 64 << (in_precision // 2),
                             ("CNA", "WEIGHT_SIZE0"): 32 * 64 << (in_precision // 2),
                             ("CNA", "DMA_CON1"): {"LINE_STRIDE": line_stride}})


@pytest.mark.parametrize("precision, pixel_bytes", [(0, 3), (2, 6)])   # int8, fp16
def test_image_line_stride_counts_pixels_of_the_input_precision(precision, pixel_bytes):
    state = _image_state(10, precision)
    assert (state.argb_channels, state.line_stride, state.surfaces) == (3, 128 * pixel_bytes, 1)


def test_image_mode_outside_8_to_11_is_refused():
    with pytest.raises(EmulationError, match="ARGB_IN=12 is not an int8/fp16 image mode"):
        _image_state(12, 2)
