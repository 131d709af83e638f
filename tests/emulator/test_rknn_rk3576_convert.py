"""Vendor rk3576 DataConvert tasks run in the emulator (emulator/REGISTER_SEMANTICS.md 55): the hybrid build of
tests/isa/test_rk3576_vendor_convert.py (int8 conv, int8 -> fp16, fp16 conv, fp16 -> int8, int8 conv) gives its rk3588
twin's output bit for bit (its 2-core program too) and the simulator's within 1 LSB.

``convert24_hybrid_sim.npy.xz``: the simulator's output (``init_runtime(); inference`` in the build's session) on
``x = RandomState(5).randn(1, 24, 3, 10)`` as int8 codes ``rint(y / scale) + zero_point`` (y's scale 0.0299451, zero
point 11).
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.rknn import load_rknn

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"


def _run(name: str, chip: str, cores=(0,)) -> np.ndarray:
    model = load_rknn(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()), name)
    x = np.random.RandomState(5).randn(1, 24, 3, 10).astype(np.float32)
    (_, out), = RknnRunner(model, chip, cores).run([x]).quantized.items()
    return np.asarray(out).astype(np.int64)


def test_vendor_converts_run_bit_identically_to_the_twin_and_near_the_simulator():
    ours = _run("convert24_hybrid", "rk3576")
    np.testing.assert_array_equal(ours, _run("convert24_hybrid_rk3588", "rk3588"))
    sim = np.load(io.BytesIO(lzma.decompress((DATA / "convert24_hybrid_sim.npy.xz").read_bytes()))).astype(np.int64)
    assert np.abs(ours - sim).max() <= 1 and (ours == sim).mean() > 0.97   # the convs' requantization (10.3)
    assert len(np.unique(ours)) > 50
    np.testing.assert_array_equal(_run("convert24_hybrid", "rk3576", (0, 1)), ours)   # its 2-core program
