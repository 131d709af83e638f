"""Vendor ``.rknn`` programs with CPU layers in front of / between NPU layers (issues 18/19/24):
emulator/rknn_cpu_layers.py and the runner's submits around the host steps.

``vendor_builds/reshape_conv_int8.rknn.xz`` (3 KB) is a vendor build made for this test with
rknn-toolkit2 2.5.0 (target rk3588, do_quantization=True, 4 calibration samples of
np.random.RandomState(7)): ONNX ``x [1,24,10] -> Reshape [1,24,1,10] -> Conv 1x1 24->16 (+bias)
-> y``. The toolkit keeps the Reshape on the CPU ("Reshape INT8 CPU", as in layernorm_int8), the
Conv is one NPU task. ``reshape_conv_int8.npz`` holds the input ``x`` (same RandomState), the
toolkit simulator's output ``sim`` (``inference`` after ``init_runtime()``) and onnxruntime's ``ort``.
It also exercises the NC1HWC2 surface stride: 1x10 pixels are 12 apart (DST_SURF_STRIDE 12).
"""

from __future__ import annotations

import lzma
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.shared_data import RKNN_FIXTURES_OPS
from npuemu.emulator.machine import Machine
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.emulator.timing.host_model import cpu_step_us
from npuemu.emulator.timing.report import report_rknn
from npuemu.emulator.timing.timeline import timeline_rknn
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn import RknnLayer, load_rknn
from npuemu.platforms import load_platform

BUILDS = Path(__file__).parent / "vendor_builds"
# the shared fixtures whose int8 build reshapes the input on the CPU before the first NPU layer
CPU_RESHAPE_FIXTURES = ("layernorm_int8", "layernorm_decomposed_int8", "matmul_rows_int8", "transpose_heads_int8")


def _small(tmp_path: Path):
    path = tmp_path / "reshape_conv_int8.rknn"
    path.write_bytes(lzma.decompress((BUILDS / "reshape_conv_int8.rknn.xz").read_bytes()))
    data = np.load(BUILDS / "reshape_conv_int8.npz")
    return load_rknn(path), data["x"], data["sim"], data["ort"]


def _quantize(x: np.ndarray, tensor) -> np.ndarray:
    return np.clip(np.rint(x.astype(np.float64) / np.float32(tensor.scales[0])) + tensor.zero_points[0],
                   -128, 127).astype(np.int8)


def _nc1hwc2(nchw: np.ndarray, c2: int, surface: int) -> bytes:
    """Independent packing: surface k holds channels 16k..16k+15 of every pixel, row-major,
    surfaces ``surface`` pixels apart, padding channels 0; the last surface unpadded."""
    _, channels, height, width = nchw.shape
    c1 = -(-channels // c2)
    out = bytearray()
    for k in range(c1):
        block = np.zeros((height * width, c2), nchw.dtype)
        lanes = nchw[0, k * c2:(k + 1) * c2].reshape(-1, height * width).T
        block[:, :lanes.shape[1]] = lanes
        out += block.tobytes()
        if k + 1 < c1:
            out += bytes((surface - height * width) * c2 * nchw.dtype.itemsize)
    return bytes(out)


def test_vendor_reshape_before_conv_matches_simulator(tmp_path):
    """The whole program: the CPU Reshape, then the Conv task reading its NC1HWC2 output.
    Measured: max 1 LSB vs the simulator, 99.4 % identical; cosine vs onnxruntime 0.997554 (the
    simulator's 0.997554: 160 outputs of a 24-tap int8 conv)."""
    model, x, sim, ort = _small(tmp_path)
    run = RknnRunner(model).run([x])
    assert run.host_layers == ("Reshape:xr",)
    assert [(s.layer.name, s.after_tasks) for s in run.host_steps] == [("Reshape:xr", 0)]
    y = model.tensor("y")
    q_sim = np.rint(sim / np.float32(y.scales[0])).astype(int) + y.zero_points[0]
    diff = np.abs(run.quantized["y"].astype(int) - q_sim.reshape(run.quantized["y"].shape))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99, (diff.max(), (diff == 0).mean())
    ours = run.outputs["y"].ravel().astype(np.float64)
    cos = float(ours @ ort.ravel() / np.linalg.norm(ours) / np.linalg.norm(ort))
    assert cos >= 0.9975, cos


def _first_submit_image(monkeypatch, runner: RknnRunner, tensor_name: str, x: np.ndarray) -> bytes:
    """The bytes of ``tensor_name`` in DDR when the first NPU submit starts (the run is stopped there)."""
    tensor = runner.model.tensor(tensor_name)
    size = tensor.size
    seen = []

    class Stop(Exception):
        pass

    def fake_run_chain(machine, address, first_amount, core=0):
        seen.append(machine.memory.dump(runner.program.addresses[tensor_name], size).tobytes())
        raise Stop

    monkeypatch.setattr(Machine, "run_chain", fake_run_chain)
    with pytest.raises(Stop):
        runner.run([x])
    return seen[0]


@pytest.mark.parametrize("case", CPU_RESHAPE_FIXTURES)
def test_cpu_reshape_output_is_in_ddr_before_the_npu_starts(case, monkeypatch):
    """The four fixtures' input Reshape runs on the host first and leaves its output in the
    NC1HWC2 layout the Feature Tensor table gives (x_rs (1,40,1,120) -> (1,3,1,120,16))."""
    folder = RKNN_FIXTURES_OPS / case
    model = load_rknn(folder / "model.rknn")
    runner = RknnRunner(model)
    (step,) = runner.host_steps
    assert step.after_tasks == 0 and step.layer.op_type == "Reshape"
    target = model.tensors[step.layer.outputs[0]]
    x = np.load(lzma.open(folder / "input_0.npy.xz"))
    q = _quantize(x, model.input_tensors[0]).reshape(target.shape)
    native = target.native_shape
    expected = _nc1hwc2(q, native[4], -(-native[2] * native[3] // 4) * 4)
    got = _first_submit_image(monkeypatch, runner, target.name, x)
    assert got[:len(expected)] == expected


# measured on inputs 0..2 (max LSB vs the simulator, share identical); the Transpose tasks after the
# host Reshape are the DPU transpose writes (REGISTER_SEMANTICS.md 31)
RUNS = {"matmul_rows_int8": (1, 0.998),        # 1 LSB, 99.89 / 99.90 / 99.92 %
        "transpose_heads_int8": (0, 1.0)}      # bit-identical (the layer moves bytes)


@pytest.mark.parametrize("index", range(3))
@pytest.mark.parametrize("case", sorted(RUNS))
def test_fixture_with_a_cpu_reshape_matches_simulator(case, index):
    folder = RKNN_FIXTURES_OPS / case
    model = load_rknn(folder / "model.rknn")
    run = RknnRunner(model).run([np.load(lzma.open(folder / f"input_{index}.npy.xz"))])
    assert run.host_layers[0] == model.layers[1].name            # the input Reshape, on the host first
    (name, ours), = run.quantized.items()
    y = model.output_tensors[0]
    sim = np.load(lzma.open(folder / f"sim_output_{index}.npy.xz")).reshape(ours.shape)
    diff = np.abs(ours.astype(int) - (np.rint(sim / np.float32(y.scales[0])).astype(int) + y.zero_points[0]))
    max_lsb, identical = RUNS[case]
    assert diff.max() <= max_lsb and (diff == 0).mean() >= identical, (diff.max(), (diff == 0).mean())
    ort = np.load(lzma.open(folder / f"ort_output_{index}.npy.xz")).ravel().astype(np.float64)

    def cos(a):
        a = a.ravel().astype(np.float64)
        return float(a @ ort / np.linalg.norm(a) / np.linalg.norm(ort))
    assert cos(run.outputs[name]) >= cos(sim) - 2e-5, (cos(run.outputs[name]), cos(sim))


def test_reshape_output_keeps_the_surface_stride(tmp_path, monkeypatch):
    """(1,24,1,10): two surfaces 12 pixels apart, the 2 padding pixels between them 0."""
    model, x, _, _ = _small(tmp_path)
    q = _quantize(x, model.tensor("x")).reshape(1, 24, 1, 10)
    got = _first_submit_image(monkeypatch, RknnRunner(model), "xr", x)
    expected = _nc1hwc2(q, 16, 12)
    assert len(expected) == (12 + 10) * 16
    assert got[:len(expected)] == expected


def test_host_step_is_charged_on_the_timeline(tmp_path):
    model, x, _, _ = _small(tmp_path)
    platform = load_platform("rk3588")
    run = RknnRunner(model).run([x])
    timeline = timeline_rknn(model, run, platform)
    assert timeline.host_us == pytest.approx(cpu_step_us([(1, 24, 10)], platform))
    assert timeline.total_us == pytest.approx(timeline.npu_cycles / platform.clock.npu_mhz + timeline.host_us)
    report = report_rknn(model, run, platform)                     # `npuemu perf`: the Reshape's row
    row = next(layer for layer in report.layers if layer.full_name == "Reshape:xr")
    assert row.host_us == pytest.approx(timeline.host_us)


# --- a CPU layer between NPU layers: chain 0 cut into two submits ------------------------------

def _with_identity_reshape(model, after_layer: int):
    """``model`` with a CPU Reshape of layer ``after_layer``'s output onto itself inserted after it:
    the host reads the tensor from DDR and writes it back in its native layout, so the outputs
    must be those of the uncut program while the NPU program is run as two submits."""
    layers = list(model.layers)
    position = next(k for k, layer in enumerate(layers) if layer.index == after_layer)
    made = layers[position].outputs[0]
    host = RknnLayer(len(layers), "Reshape", "Reshape:identity", (made,), (made,), (0,) * 6, 0)
    return replace(model, layers=tuple(layers[:position + 1] + [host] + layers[position + 1:]))


def test_cpu_layer_between_npu_layers_cuts_the_program():
    folder = RKNN_FIXTURES_OPS / "dynamic_shape_int8"
    model = load_rknn(folder / "model.rknn")
    x = np.load(lzma.open(folder / "input_0.npy.xz"))
    whole = RknnRunner(model).run([x])
    cut_model = _with_identity_reshape(model, 2)   # after ConvRelu 2: chain-0 records [1, 1, 1, 2 | 3, ...]
    cut = RknnRunner(cut_model).run([x])
    (step,) = cut.host_steps
    assert step.after_tasks == 4 and cut.host_layers[0] == "Reshape:identity"
    assert len(cut.tasks) == len(whole.tasks)
    for name, values in whole.quantized.items():
        np.testing.assert_array_equal(cut.quantized[name], values)
    platform = load_platform("rk3588")
    timeline = timeline_rknn(cut_model, cut, platform)
    assert timeline.host_us == pytest.approx(cpu_step_us([step.input_shapes[0]], platform))


def test_multicore_program_with_a_cpu_layer_inside_is_refused():
    model = load_rknn(RKNN_FIXTURES_OPS / "dynamic_shape_int8" / "model.rknn")
    with pytest.raises(UnsupportedProgramError, match=r"'Reshape:identity' run between NPU layers; .*chain 0"):
        RknnRunner(_with_identity_reshape(model, 2), cores=(0, 1))
