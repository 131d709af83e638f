"""The CNA's deconvolution mode (CONV_CON1.DECONV = 1, REGISTER_SEMANTICS.md 40): vendor
rknn-toolkit2 2.5.0 rk3588 ConvTranspose builds against the vendor's simulator and onnxruntime,
the spread-then-convolve read pattern against an independent scatter-form ConvTranspose
reference, and the forms refused by name.

tests/data/vendor_deconv/README.md says how the builds and the simulator outputs were made.
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator import kernels
from npuemu.emulator.kernels import cna_deconv
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import EmulationError
from npuemu.isa.rknn import load_rknn

DATA = Path(__file__).resolve().parents[1] / "data" / "vendor_deconv"
CI, CO, H, W = 16, 8, 8, 8


class Case(NamedTuple):
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int]
    output_padding: tuple[int, int]
    fp16: bool = False


CASES = {
    "int8_k4s2p1": Case((4, 4), (2, 2), (1, 1), (0, 0)),
    "int8_k2s2p0": Case((2, 2), (2, 2), (0, 0), (0, 0)),
    "int8_k3s2p1op1": Case((3, 3), (2, 2), (1, 1), (1, 1)),
    "int8_k3x2_s2x1_p1x0_op1x0": Case((3, 2), (2, 1), (1, 0), (1, 0)),
    "fp16_k4s2p1": Case((4, 4), (2, 2), (1, 1), (0, 0), fp16=True),
    "fp16_k2s2p0": Case((2, 2), (2, 2), (0, 0), (0, 0), fp16=True),
}
#: smallest fp16 normal: below it a value's ulp is 2**-24
FP16_TINY = 2.0 ** -14


def _onnx_weights(case: Case) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(1)
    weights = (rng.randn(CI, CO, *case.kernel) * 0.1).astype(np.float32)
    return weights, (rng.randn(CO) * 0.5).astype(np.float32)


def _input(case: Case) -> np.ndarray:
    x = np.random.RandomState(11).randn(1, CI, H, W).astype(np.float32)
    return x.astype(np.float16).astype(np.float32) if case.fp16 else x


def _conv_transpose(x: np.ndarray, weights: np.ndarray, case: Case) -> np.ndarray:
    """ConvTranspose by its definition (scatter form): input pixel (i, j) adds x * w[a, b] to
    output (i * sy + a - py, j * sx + b - px); the output has s * (n - 1) + op + k - 2p pixels.
    float64; x [C][H][W], weights [C][M][KH][KW] (ONNX's order) -> [M][OH][OW]."""
    (kh, kw), (sy, sx), (py, px), (oy, ox) = case.kernel, case.strides, case.pads, case.output_padding
    channels, height, width = x.shape
    out_h, out_w = sy * (height - 1) + oy + kh - 2 * py, sx * (width - 1) + ox + kw - 2 * px
    full = np.zeros((weights.shape[1], sy * (height - 1) + kh + oy, sx * (width - 1) + kw + ox))
    for i in range(height):
        for j in range(width):
            contribution = np.einsum("c,cmab->mab", x[:, i, j].astype(np.float64), weights.astype(np.float64))
            full[:, i * sy:i * sy + kh, j * sx:j * sx + kw] += contribution
    return full[:, py:py + out_h, px:px + out_w]


@pytest.fixture(scope="module")
def sims():
    with lzma.open(DATA / "sim_outputs.npz.xz") as f:
        archive = np.load(io.BytesIO(f.read()))
        return {name: archive[name] for name in archive.files}


def _run(name: str, tmp_path: Path):
    path = tmp_path / f"{name}.rknn"
    path.write_bytes(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()))
    model = load_rknn(path)
    run = RknnRunner(model).run([_input(CASES[name])])
    assert run.host_layers == ()
    (got,) = run.outputs.values()
    return model, got


@pytest.mark.parametrize("name", sorted(CASES))
def test_vendor_deconv_matches_the_simulator(name, sims, tmp_path):
    model, got = _run(name, tmp_path)
    sim, case = sims[name], CASES[name]
    assert sim.shape == got.shape
    if case.fp16:
        # bit-identical but for <= 1 ulp on subnormal outputs. Measured: 1 of 2048 in k4s2p1, where
        # the exact (float64) sum -3.87868e-5 rounds to the emulator's -3.88026e-5 and the simulator
        # gives -3.87430e-5, 1 ulp toward zero: its own subnormal rounding [I] (the emulator equals the
        # exactly rounded ConvTranspose on all 2048 outputs of that build)
        same = got.astype(np.float16) == sim
        assert np.all(same | (np.abs(sim.astype(np.float32)) < FP16_TINY))
        assert np.abs(got.astype(np.float16).astype(np.float32) - sim.astype(np.float32)).max() <= 2.0 ** -24
    else:
        tensor = model.output_tensors[0]
        codes = np.rint(got.astype(np.float64) / np.float32(tensor.scales[0])) + tensor.zero_points[0]
        # within 1 LSB: the simulator requantises in float, the NPU with the DPU's integer
        # multiplier (as in test_vendor_conv_forms); measured 1-3 codes of 1152 / 2048 differ
        assert np.abs(codes - sim).max() <= 1
        assert np.count_nonzero(codes != sim) <= sim.size // 200


@pytest.mark.parametrize("name", sorted(CASES))
def test_vendor_deconv_is_the_onnx_conv_transpose(name, tmp_path):
    """End to end against onnxruntime running the ONNX model the build came from."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    case = CASES[name]
    weights, bias = _onnx_weights(case)
    node = helper.make_node("ConvTranspose", ["x", "w1", "b2"], ["y"], kernel_shape=list(case.kernel),
                            strides=list(case.strides), pads=list(case.pads) * 2,
                            output_padding=list(case.output_padding))
    graph = helper.make_graph([node], "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CI, H, W])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w1"), numpy_helper.from_array(bias, "b2")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": _input(case)})[0]
    _, got = _run(name, tmp_path)
    # the test's own scatter reference agrees with onnxruntime (so the property test below leans on a checked one)
    np.testing.assert_allclose(_conv_transpose(_input(case)[0], weights, case) + bias[:, None, None], expected[0],
                               atol=1e-5)
    cosine = float(np.dot(got.ravel(), expected.ravel()) / np.linalg.norm(got) / np.linalg.norm(expected))
    assert got.shape == expected.shape
    assert cosine > (0.99999 if case.fp16 else 0.999)


@st.composite
def _geometries(draw):
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pads = (draw(st.integers(0, kernel[0] - 1)), draw(st.integers(0, kernel[1] - 1)))
    output_padding = (draw(st.integers(0, strides[0] - 1)), draw(st.integers(0, strides[1] - 1)))
    return Case(kernel, strides, pads, output_padding)


def _spread_conv_int8(x, weights_onnx, case, pad_value):
    """What the CNA does in the mode: spread the atoms, pad by k - 1 - p (bottom/right: as far
    as the output reaches), convolve the stored (flipped, [M][C]) kernel at stride 1."""
    (kh, kw), (py, px) = case.kernel, case.pads
    channels, height, width = x.shape
    atoms = np.zeros((-(-channels // 16), height, width, 16), np.int8)
    for c in range(channels):
        atoms[c // 16, :, :, c % 16] = x[c]
    stored = np.ascontiguousarray(weights_onnx.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    spread = cna_deconv.spread(atoms, case.strides, pad_value)
    rows, columns = cna_deconv.spread_size(height, width, case.strides)
    assert spread.shape[1:3] == (rows, columns)
    out_h = case.strides[0] * (height - 1) + case.output_padding[0] + kh - 2 * py
    out_w = case.strides[1] * (width - 1) + case.output_padding[1] + kw - 2 * px
    geometry = kernels.ConvGeometry(kernel_h=kh, kernel_w=kw, out_h=out_h, out_w=out_w,
                                    pad_top=kh - 1 - py, pad_left=kw - 1 - px)
    out_channels = 32
    data, _ = kernels.conv_pixels.conv_int8_pixels(spread, channels, channels, stored, geometry, pad_value,
                                                   0, 0, out_channels)
    return data.reshape(out_h, out_w, out_channels).transpose(2, 0, 1)[:weights_onnx.shape[1]]


@settings(max_examples=60, deadline=None)
@given(_geometries(), st.integers(1, 6), st.integers(1, 6), st.integers(1, 20), st.integers(1, 5),
       st.integers(-128, 127), st.integers(0, 2 ** 31 - 1))
def test_spread_then_convolve_is_the_conv_transpose(case, height, width, channels, kernels_out, zero_point, seed):
    """The mode's read pattern against the scatter-form definition: with the pad value the input's
    zero point z, every output is ConvTranspose(x - z) + z * (the kernel's sum), whatever the
    stride, kernel, pads and output padding on each axis."""
    (kh, kw), (sy, sx), (py, px), (oy, ox) = case.kernel, case.strides, case.pads, case.output_padding
    assume(sy * (height - 1) + oy + kh - 2 * py >= 1 and sx * (width - 1) + ox + kw - 2 * px >= 1)
    rng = np.random.RandomState(seed)
    x = rng.randint(-128, 128, (channels, height, width)).astype(np.int8)
    weights = rng.randint(-128, 128, (channels, kernels_out) + case.kernel).astype(np.int8)
    got = _spread_conv_int8(x, weights, case, zero_point)
    expected = _conv_transpose(x.astype(np.int64) - zero_point, weights, case) \
        + zero_point * weights.astype(np.int64).sum(axis=(0, 2, 3))[:, None, None]
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected.astype(np.int64))


def test_spread_places_the_pixels_and_the_pad_value():
    atoms = np.arange(1, 2 * 3 * 16 + 1).astype(np.int8).reshape(1, 2, 3, 16)
    out = cna_deconv.spread(atoms, (3, 2), -7)
    assert out.shape == (1, 4, 5, 16)
    assert np.array_equal(out[:, ::3, ::2], atoms)
    mask = np.ones(out.shape, bool)
    mask[:, ::3, ::2] = False
    assert np.all(out[mask] == -7)


class _View:
    def __init__(self, **fields):
        self.values = {"CONV_CON1": {"DECONV": 1, "CONV_MODE": 0, "ARGB_IN": 0, "IN_PRECISION": 0,
                                     "PROC_PRECISION": 0},
                       "CONV_CON3": {"DECONV_Y_STRIDE": 1, "DECONV_X_STRIDE": 0, "CONV_Y_STRIDE": 1,
                                     "CONV_X_STRIDE": 1, "ATROUS_Y_DILATION": 0},
                       "DCOMP_CTRL": {"DECOMP_CONTROL": 0}, "CVT_CON0": {"CVT_BYPASS": 1}}
        for key, value in fields.items():
            register, name = key.split("__")
            self.values[register][name] = value

    def field(self, register, name):
        return self.values[register][name]

    def show(self, register, name):
        return f"CNA.{register}.{name}={self.values[register][name]}"


def _state(**changes):
    base = dict(depthwise=False, argb_channels=0, feature_type=0, weight_type=0, decompress=None,
                input_convert=None, stride_y=1, stride_x=1, dilation_y=1, dilation_x=1)
    return SimpleNamespace(**{**base, **changes})


def test_decode_reads_stride_minus_one():
    assert cna_deconv.decode_deconv(_View(), "t") == (2, 1)
    assert cna_deconv.decode_deconv(_View(CONV_CON1__DECONV=0), "t") is None
    cna_deconv.check_deconv(_state(), _View(), "t")   # the vendor's form passes


@pytest.mark.parametrize("changes, match", [
    ({"depthwise": True}, r"CONV_MODE=0 \(depthwise\)"),
    ({"argb_channels": 3}, r"ARGB_IN=0 \(image input\)"),
    ({"feature_type": 6, "weight_type": 6}, r"int8 or fp16 only"),
    ({"feature_type": 2, "weight_type": 0}, r"int8 or fp16 only"),
    ({"decompress": object()}, r"DECOMP_CONTROL=0 \(sparse weights\)"),
    ({"input_convert": object()}, r"CVT_BYPASS=1 \(input converter\)"),
    ({"stride_x": 2}, r"convolve at stride 1"),
    ({"dilation_y": 2}, r"ATROUS_Y_DILATION=0 / ATROUS_X_DILATION \(dilation\)"),
])
def test_unmodelled_deconv_forms_are_refused_by_name(changes, match):
    with pytest.raises(EmulationError, match=r"DECONV=1 with .*" + match):
        cna_deconv.check_deconv(_state(**changes), _View(), "core 0 task 0")


#: the vendor's table row of each build, Cycles(DDR/NPU/Total) (tests/data/vendor_deconv/README.md)
VENDOR_TABLE = {"int8_k4s2p1": (488, 4096, 4096), "int8_k2s2p0": (423, 1024, 1024),
                "int8_k3s2p1op1": (450, 2304, 2304), "int8_k3x2_s2x1_p1x0_op1x0": (282, 864, 864),
                "fp16_k4s2p1": (609, 4096, 4096), "fp16_k2s2p0": (479, 1024, 1024)}


def _vendor_perf(name: str, tmp_path: Path, capsys) -> tuple[int, int, int]:
    import json
    from npuemu.tools.cli import main
    path = tmp_path / f"{name}.rknn"
    path.write_bytes(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()))
    assert main(["perf", str(path), "--ddr-model", "vendor", "--json"]) == 0
    (row,) = [layer for layer in json.loads(capsys.readouterr().out)["layers"] if layer["npu_cycles"]]
    return row["ddr_cycles"], row["npu_cycles"], row["cycles"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_vendor_mode_gives_the_vendor_npu_and_total_cycles(name, tmp_path, capsys):
    ddr, npu, total = _vendor_perf(name, tmp_path, capsys)
    assert (npu, total) == VENDOR_TABLE[name][1:]
    if CASES[name].fp16:
        assert ddr == VENDOR_TABLE[name][0]


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if not case.fp16))
def test_vendor_mode_gives_the_vendor_int8_ddr_cycles(name, tmp_path, capsys):
    assert _vendor_perf(name, tmp_path, capsys)[0] == VENDOR_TABLE[name][0]
