"""The vendor's rk3576 fp16 conv + LUT activation programs run in the emulator (emulator/REGISTER_SEMANTICS.md 50,
isa/rknn/rk3576_lut_fp16.py): the int8 form's LUT words, the table-unit factor in OUT_CVT.

``tests/data/rk3576_vendor/lut_{sig,hsw}_fp16.rknn.xz``: rknn-toolkit2 2.5.0, ``config(target_platform="rk3576")``,
``build(do_quantization=False)`` of ONNX Conv 3x3 16 -> 16 pad 1 on 12 x 12 (weights ``RandomState(1).randn *
sqrt(2 / 144)``, bias ``* 0.1``) + Sigmoid / HardSwish (opset 14); ``*_rk3588.rknn.xz`` the same ONNX built for
rk3588 (Sigmoid: one task, EW_CFG 0x302 and MINUS_EXP 15; HardSwish: an fp32 conv task and a DPU-only rescale).
``se8_fp16.rknn.xz`` / ``se8_fp16_rk3588.rknn.xz``: the SE gate of test_rknn_rk3576_lut.py's se8 (``y = x *
Sigmoid(Conv1x1(GlobalAveragePool(x)))``, x [1, 8, 12, 12]) built fp16 for rk3576 / rk3588: its GlobalAveragePool as
depthwise convs, the Sigmoid conv, and the fp16 DPU-only Mul by a per-channel operand (REGISTER_SEMANTICS.md 50.4).
``lut_fp16_sim.npz.xz``: the vendor simulator's outputs (``init_runtime(); inference``) of the rk3576 builds on
``x = RandomState(5).randn(1, 16, 12, 12)``, stored as float16 (the outputs are fp16 values).
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn import load_rknn
from tests.emulator.test_rknn_rk3576_lut import _patched

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
with lzma.open(DATA / "lut_fp16_sim.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    SIM = {name: _archive[name].astype(np.float32) for name in _archive.files}


def _data(name: str) -> bytes:
    return lzma.decompress((DATA / f"lut_{name}.rknn.xz").read_bytes())


def _run(data: bytes, target: str, channels: int = 16) -> np.ndarray:
    x = np.random.RandomState(5).randn(1, channels, 12, 12).astype(np.float32)
    (_, out), = RknnRunner(load_rknn(data, target), target, (0,)).run([x]).outputs.items()
    return np.asarray(out, dtype=np.float32)


def _fp16_steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in fp16 steps (ordered bit patterns; +0 and -0 one value)."""
    def ordered(v):
        bits = v.astype(np.float16).view(np.int16).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFF), bits)
    return np.abs(ordered(a) - ordered(b))


def test_vendor_fp16_sigmoid_runs_bit_identically_to_its_rk3588_twin():
    """OUT_CVT_SCALE 16384 >> 14 with MINUS_EXP 15 is the twin's factor 2^-15 (EW_CFG 0x302, MINUS_EXP 15)."""
    ours = _run(_data("sig_fp16"), "rk3576")
    np.testing.assert_array_equal(ours, _run(_data("sig_fp16_rk3588"), "rk3588"))
    assert len(np.unique(ours)) > 500


def test_vendor_fp16_hardswish_runs_within_one_step_of_its_two_task_twin():
    """The rk3576 task scales the table by 24577 x 2^-13 x 2^-15 in one step; the rk3588 twin writes fp32 table
    units and rescales them in a DPU-only task by two fp16 multipliers: the same value to about 2^-15, so at most
    one fp16 step apart (and most outputs equal)."""
    ours, twin = _run(_data("hsw_fp16"), "rk3576"), _run(_data("hsw_fp16_rk3588"), "rk3588")
    steps = _fp16_steps(ours, twin)
    assert steps.max() <= 1 and np.mean(steps == 0) > 0.5


@pytest.mark.parametrize("case, tolerance", [("sig", 2.0 ** -11), ("hsw", 2.0 ** -8)])
def test_vendor_fp16_lut_runs_close_to_the_simulator(case, tolerance):
    """The simulator evaluates the activation itself, not the 513-entry table (its Sigmoid keeps falling below
    the table's flat underflow): agreement is the table's accuracy - half a step of the Sigmoid's output near 1,
    the HardSwish's interpolation near its corners - not bit equality."""
    ours, sim = _run(_data(f"{case}_fp16"), "rk3576"), SIM[case].reshape(1, 16, 12, 12)
    assert np.abs(ours - sim).max() <= tolerance
    assert np.mean(ours == sim) > 0.4


@pytest.mark.parametrize("old, new", [(0x0000F00E, 0x0000E00E),    # MINUS_EXP 14: not seen
                                      (0x00014000, 0x00010800)])   # a scale below 2^14: not the 15-bit form
def test_an_fp16_lut_out_cvt_not_decoded_is_refused_by_name(old, new):
    with pytest.raises(UnsupportedProgramError, match="fp16 LUT task with OUT_CVT_SCALE"):
        RknnRunner(load_rknn(_patched(_data("sig_fp16"), old, new), "t"), "rk3576", (0,))


def test_vendor_fp16_se_gate_runs_bit_identically_to_its_rk3588_twin():
    """The depthwise-conv average, the fp16 Sigmoid conv and the per-channel Mul (0x407C 0x010f4194 with ERDMA_CFG
    0x48: ERDMA_DATA_MODE 0, the twin's EW_CFG 0x8003c4)."""
    data = lzma.decompress((DATA / "se8_fp16.rknn.xz").read_bytes())
    twin = lzma.decompress((DATA / "se8_fp16_rk3588.rknn.xz").read_bytes())
    ours = _run(data, "rk3576", channels=8)
    np.testing.assert_array_equal(ours, _run(twin, "rk3588", channels=8))
    assert len(np.unique(ours)) > 500
