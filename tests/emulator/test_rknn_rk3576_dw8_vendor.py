"""The vendor's rk3576 int8 depthwise conv in a vendor ``.rknn`` file: RK3588's cube and BS record in memory the
runner adds past the file's regions (isa/rknn/rk3576_dw8.place_memory, emulator/REGISTER_SEMANTICS.md 47.2).

``tests/data/rk3576_vendor/dw8_split_{rk3576,rk3588}.rknn.xz``: rknn-toolkit2 2.5.0, ONNX depthwise Conv 96 3x3
s1 p1 (weights ``RandomState(0).randn(96, 1, 3, 3) * 0.5``, bias the next ``randn(96) * 0.3``) + Clip(0, 6) on
[1, 96, 64, 64] float32, ``config(target_platform=...)``, ``build(do_quantization=True)`` with 3 calibration
samples ``RandomState(0).randn``. The vendor splits the conv by channels (64 + 32: the second task's weights at
1152, its BS record at 384) and its 2-core program by rows. ``dw8_split_sim.npy.xz``: the rk3576 simulator's
output (``init_runtime(); inference(inputs=[x], data_format='nchw')``) on ``x = RandomState(1).randn`` as int8
codes ``rint(y / scale) + zp``, channels 0, 63, 64, 95, every 4th row.
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.platforms import load_platform

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
SHAPE = (1, 96, 64, 64)
SIM_CHANNELS = [0, 63, 64, 95]


def _model(target: str):
    return load_rknn(lzma.decompress((DATA / f"dw8_split_{target}.rknn.xz").read_bytes()), f"dw8_split_{target}")


def _run(target: str, cores=None) -> np.ndarray:
    x = np.random.RandomState(1).randn(*SHAPE).astype(np.float32)
    (_, out), = RknnRunner(_model(target), "rk3576" if target == "rk3576" else "rk3588", cores).run([x]).quantized.items()
    return np.asarray(out).astype(np.int64)


@pytest.fixture(scope="module")
def twin() -> np.ndarray:
    return _run("rk3588")


@pytest.mark.parametrize("cores", [None, (0, 1)])
def test_vendor_int8_depthwise_runs_like_its_rk3588_twin(twin, cores):
    """Was refused by name; now bit-identical to the vendor's rk3588 build of the same ONNX, single-core and the
    2-core program (row split) alike."""
    ours = _run("rk3576", cores)
    np.testing.assert_array_equal(ours, twin)
    assert len(np.unique(ours)) > 200


def test_vendor_int8_depthwise_within_one_lsb_of_the_simulator(twin):
    with lzma.open(DATA / "dw8_split_sim.npy.xz") as f:
        sim = np.load(io.BytesIO(f.read())).astype(np.int64)
    ours = _run("rk3576")[0, SIM_CHANNELS, ::4, :]
    assert ours.shape == sim.shape
    assert np.abs(ours - sim).max() <= 1
    assert (ours != sim).mean() < 0.01   # the twin's own rounding differences (about 0.2 %)


def test_added_memory_holds_the_twins_cube_and_record():
    """Each task's translated weight and BS addresses point past everything the file places, at the rk3588 twin's
    own bytes for its channel block (64 + 32 channels: cube 9 taps a channel, record 64 bytes per 8 channels,
    rounded up to 64 channels); the file's regions stay as stored."""
    runner = RknnRunner(_model("rk3576"), "rk3576")
    twin = _model("rk3588")
    blob = {t.name: bytes(twin.blobs[t.blob_index]) for t in twin.tensors if t.name in ("w", "b")}
    expected = [(blob["w"][:64 * 9], blob["b"][:512]), (blob["w"][64 * 9:96 * 9], blob["b"][512:1024])]
    regmap = load_regmap(load_platform("rk3576").register_map.family)
    added, base = bytes(runner.added.data), runner.added.base
    assert base >= runner.program.bases.task + len(runner.program.task_blob)
    for index, (cube, record) in zip(runner.model.program.chains[0].tasks, expected):
        task = runner.model.program.tasks[index]
        first = task.regcmd_addr // 8
        values = read_task(runner.program.regcmd[first:first + task.regcfg_amount], regmap, "t", task.enable_mask).values
        weights, bs = values[("CNA", "DCOMP_ADDR0")], values[("DPU_RDMA", "BS_BASE_ADDR")]
        assert added[weights - base:weights - base + len(cube)] == cube
        assert added[bs - base:bs - base + len(record)] == record
