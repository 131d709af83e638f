"""The vendor's rk3576 conv + LUT activation programs run in the emulator (emulator/REGISTER_SEMANTICS.md 46,
isa/rknn/rk3576_lut.py): the table-upload task and the conv task with its BN record translate to the rk3588 twin.

``tests/data/rk3576_vendor/lut_{sig,hsw}_int8.rknn.xz``: rknn-toolkit2 2.5.0, ``config(target_platform="rk3576")``,
``build(do_quantization=True)`` on 3 calibration samples ``RandomState(0).randn(1, 16, 12, 12)`` (drawn in turn) of
ONNX Conv 3x3 16 -> 16 pad 1 (weights ``RandomState(1).randn * sqrt(2 / 144)``, bias ``* 0.1``) + Sigmoid /
HardSwish (opset 14). ``lut_sig_int8_rk3588.rknn.xz``: the same ONNX and dataset built for rk3588.
``clip_int8.rknn.xz``: the same conv + Clip(-1, 2) for rk3576 (a Clip with a lower bound, REGISTER_SEMANTICS.md 46.5).
``se8_int8.rknn.xz`` / ``se8_int8_rk3588.rknn.xz``: an SE gate on 8 channels, ``y = x * Sigmoid(Conv1x1(
GlobalAveragePool(x)))`` (x [1, 8, 12, 12], 3 calibration samples ``RandomState(0).randn``), for rk3576 / rk3588: its
last task is the int8 DPU-only Mul by a per-channel operand over channels padded to 16 (REGISTER_SEMANTICS.md 46.3).
``lut_runs.npz.xz``: ``<case>.sim``, the vendor simulator's output (``init_runtime(); inference``) of the rk3576
build on ``x = RandomState(5).randn(1, C, 12, 12)`` (C = 16, 8 for se8) as int8 codes ``rint(y / scale) + zp``.
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

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
with lzma.open(DATA / "lut_runs.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    RUNS = {name: _archive[name] for name in _archive.files}


def _data(name: str) -> bytes:
    return lzma.decompress((DATA / f"lut_{name}.rknn.xz").read_bytes())


def _run(data: bytes, target: str, channels: int = 16) -> np.ndarray:
    x = np.random.RandomState(5).randn(1, channels, 12, 12).astype(np.float32)
    (_, out), = RknnRunner(load_rknn(data, target), target, (0,)).run([x]).quantized.items()
    return np.asarray(out).astype(np.int64)


@pytest.mark.parametrize("case", ["sig", "hsw", "clip"])
def test_vendor_lut_conv_runs_within_one_step_of_the_simulator(case):
    """Sigmoid (flat LUT ends), HardSwish (the LO overflow slope) and Clip(-1, 2) (BN record, EW add of L): within
    1 LSB, as the vendor's plain int8 convs (the requantization of REGISTER_SEMANTICS.md 10.3)."""
    data = lzma.decompress((DATA / "clip_int8.rknn.xz").read_bytes()) if case == "clip" else _data(f"{case}_int8")
    ours, sim = _run(data, "rk3576"), RUNS[f"{case}.sim"].astype(np.int64)
    assert np.abs(ours - sim).max() <= 1
    assert np.mean(ours == sim) > 0.99 and len(np.unique(sim)) > 40


def test_vendor_lut_conv_runs_bit_identically_to_its_rk3588_twin():
    np.testing.assert_array_equal(_run(_data("sig_int8"), "rk3576"), _run(_data("sig_int8_rk3588"), "rk3588"))


def _patched(data: bytes, old: int, new: int) -> bytes:
    """``data`` with the one 32-bit little-endian value ``old`` of a command word's value field replaced."""
    needle = old.to_bytes(4, "little")
    positions = [i for i in range(0, len(data) - 8, 8) if data[i + 2:i + 6] == needle]
    assert positions, hex(old)
    out = bytearray(data)
    for position in positions:
        out[position + 2:position + 6] = new.to_bytes(4, "little")
    return bytes(out)


def test_a_lut_form_not_decoded_is_refused_by_name():
    """LUT_CFG other than the vendor's 0x02000006 in the conv task; an upload frame with another LUT_CFG is no
    upload (and no other task kind)."""
    with pytest.raises(UnsupportedProgramError, match="LUT task with ACT_CFG"):
        RknnRunner(load_rknn(_patched(_data("sig_int8"), 0x02000006, 0x02000007), "t"), "rk3576", (0,))
    with pytest.raises(UnsupportedProgramError, match="op-enable 0x18"):
        RknnRunner(load_rknn(_patched(_data("sig_int8"), 0x00FF0000, 0x00FE0000), "t"), "rk3576", (0,))


def test_vendor_se_gate_runs_bit_exactly_against_the_simulator_and_its_twin():
    """GlobalAveragePool, the Sigmoid conv (upload + LUT task) and the per-channel Mul (its record, ERDMA data
    mode 0, DPU_RDMA's padded channel count): every output code equals the simulator's and the twin's."""
    ours = _run(lzma.decompress((DATA / "se8_int8.rknn.xz").read_bytes()), "rk3576", 8)
    np.testing.assert_array_equal(ours, RUNS["se8.sim"].astype(np.int64))
    np.testing.assert_array_equal(ours, _run(lzma.decompress((DATA / "se8_int8_rk3588.rknn.xz").read_bytes()),
                                             "rk3588", 8))
    assert len(np.unique(ours)) > 100
