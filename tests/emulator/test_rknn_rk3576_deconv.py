"""Vendor rk3576 ConvTranspose files run (emulator/REGISTER_SEMANTICS.md 53.1; isa/rknn/rk3576_deconv.py): the
rk3576 form of the CNA's deconvolution writes CONV_CON3's deconvolution strides with CONV_CON1.DECONV clear; the
translation sets DECONV and keeps the strides, and each file's output equals its rk3588 twin's bit for bit and
the simulator's within 1 LSB (int8) / on every normal value (fp16), as the twins do (test_vendor_deconv.py).

Files: ``tests/data/vendor_deconv/<case>_rk3576.rknn.xz`` (the README there: the same ONNX models and calibration
as the rk3588 ``<case>.rknn.xz``, built for rk3576; the simulator's outputs of both targets are identical, so
``sim_outputs.npz.xz`` serves both). Before this translation the strides were dropped without an error and the
files ran as a stride-1 conv of the unspread input."""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_deconv import deconv_writes, is_vendor_deconv
from npuemu.isa.rknn.rk3576_layout import VENDOR_DEPTHWISE, VendorTask, read_task
from tests.emulator.test_vendor_deconv import CASES, FP16_TINY, _input

DATA = Path(__file__).resolve().parents[1] / "data" / "vendor_deconv"
VENDOR, RK3588 = load_regmap("rk3576_vendor"), load_regmap("rk3588")


def _model(name: str):
    return load_rknn(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()), name)


def _run(name: str, chip: str) -> tuple[np.ndarray, np.ndarray]:
    """(stored output values, dequantized output) of a file on ``chip``."""
    result = RknnRunner(_model(name), chip, (0,)).run([_input(CASES[name.removesuffix("_rk3576")])])
    assert result.host_layers == ()
    (raw,) = (result.quantized or result.outputs).values()
    (out,) = result.outputs.values()
    return np.asarray(raw), np.asarray(out)


@pytest.fixture(scope="module")
def sims():
    with lzma.open(DATA / "sim_outputs.npz.xz") as f:
        archive = np.load(io.BytesIO(f.read()))
        return {name: archive[name] for name in archive.files}


@pytest.mark.parametrize("name", sorted(CASES))
def test_vendor_rk3576_deconv_runs_as_its_rk3588_twin_and_the_simulator(name, sims):
    raw, out = _run(f"{name}_rk3576", "rk3576")
    twin, _ = _run(name, "rk3588")
    np.testing.assert_array_equal(raw, twin)
    sim = sims[name]
    if CASES[name].fp16:   # the twin's bound (test_vendor_deconv): the simulator's own subnormal rounding aside
        same = out.astype(np.float16) == sim
        assert np.all(same | (np.abs(sim.astype(np.float32)) < FP16_TINY))
    else:
        tensor = _model(f"{name}_rk3576").output_tensors[0]
        codes = np.rint(out.astype(np.float64) / np.float32(tensor.scales[0])) + tensor.zero_points[0]
        assert np.abs(codes - sim).max() <= 1 and np.count_nonzero(codes != sim) <= sim.size // 200


def _vendor_task(name: str) -> VendorTask:
    model = _model(name)
    program = model.program
    record = program.tasks[program.chains[0].tasks[0]]
    return read_task(program.regcmd[record.first_word:record.tail_word], VENDOR, name, record.enable_mask)


@pytest.mark.parametrize("name", ["int8_k4s2p1", "int8_k3x2_s2x1_p1x0_op1x0", "fp16_k2s2p0"])
def test_the_strides_alone_say_deconvolution(name):
    """[V] CONV_CON1.DECONV (bit 16) is clear in the vendor's rk3576 task, CONV_CON3's strides are the twin's
    (s - 1 per axis: k3x2 s(2, 1) writes Y 1, X 0); the translation sets DECONV and keeps them."""
    task = _vendor_task(f"{name}_rk3576")
    assert is_vendor_deconv(task) and task.field("CNA", "CONV_CON1", "DECONV") == 0
    stride_y, stride_x = CASES[name].strides
    assert (task.field("CNA", "CONV_CON3", "DECONV_Y_STRIDE"), task.field("CNA", "CONV_CON3", "DECONV_X_STRIDE")) \
        == (stride_y - 1, stride_x - 1)
    seen = []
    writes = {(block, register): value for block, register, value in
              deconv_writes(task, RK3588, lambda view: seen.append(view) or [
                  ("CNA", "CONV_CON1", 0x120 * CASES[name].fp16), ("CNA", "CONV_CON3", 0x9)])}
    (view,) = seen   # the plain conv the rest is translated from: no strides left
    assert not is_vendor_deconv(view)
    con1 = RK3588.register("CNA", "CONV_CON1").unpack(writes[("CNA", "CONV_CON1")])
    con3 = RK3588.register("CNA", "CONV_CON3").unpack(writes[("CNA", "CONV_CON3")])
    assert con1["DECONV"] == 1 and con1["PROC_PRECISION"] == (2 if CASES[name].fp16 else 0)
    assert (con3["DECONV_Y_STRIDE"], con3["DECONV_X_STRIDE"], con3["CONV_Y_STRIDE"]) == (stride_y - 1, stride_x - 1, 1)


def test_a_depthwise_deconvolution_is_refused_by_name():
    task = _vendor_task("int8_k2s2p0_rk3576")
    con1 = VENDOR.register("CNA", "CONV_CON1")
    values = {**task.values, ("CNA", "CONV_CON1"): con1.pack({**con1.unpack(task.raw("CNA", "CONV_CON1")),
                                                             "CONV_MODE": VENDOR_DEPTHWISE})}
    depthwise = VendorTask(task.regmap, task.where, values, task.kept, task.enable)
    with pytest.raises(UnsupportedProgramError, match="depthwise deconvolution"):
        deconv_writes(depthwise, RK3588, lambda view: [])
