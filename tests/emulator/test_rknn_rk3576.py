"""Vendor rk3576 ``.rknn`` programs run on the emulator (issue 24 item 2, issue 25 item 1).

RknnRunner rewrites their conv tasks from the vendor's rk3576 layout into the positions the
emulator's units read (isa/rknn/rk3576_program.py, emulator/REGISTER_SEMANTICS.md 10.3). The
reference is the vendor's PC simulator (``sim_output_0`` of the six fixtures of
``../shared/rknn-fixtures-ops``; the int8 codes ``rint(sim / scale) + zp`` are exact, the fp16
outputs are fp16 values) and, for the committed oracle builds, its output on their input.

``tests/data/rk3576_vendor/{int8,int8_relu,fp16_relu}.rknn.xz`` are rknn-toolkit2 2.5.0 rk3576
builds of single ONNX convs (``build(do_quantization=True)`` on 3 random calibration inputs, or
``do_quantization=False``); ``runs.npz.xz`` holds each one's input (int8: quantised with the
file's input scale and zero point, as the runner does; fp16: float16) and the simulator's output
on it (``init_runtime(); inference(...)``; int8: the output codes, fp16: the float16 values):

  int8       Conv 5 -> 17, 9x11, kernel 3x2, pads top,left,bottom,right 1,0,1,1
  int8_relu  Conv 6 -> 20, 7x10, kernel 3x2, strides 2,1, pads 1,1,1,0, then Relu
  fp16_relu  Conv 16 -> 16, 6x10, kernel 1x3, strides 1,2, pads 0,1,0,1, then Relu (fp16)
  tall       Conv 16 -> 16, 3400x16, kernel 3x3, pad 1: three tasks, the later two keeping 2 CBUF
             rows, the last a delta task; its input is the 4th np.random.RandomState(7).randn(1,
             16, 3400, 16) draw (float32), and runs.npz.xz holds the simulator's output codes of
             the rows in ``tall.rows`` only (around the task boundaries, 1280 and 2560)
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest

from tests.shared_data import RKNN_FIXTURES_OPS
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn import load_rknn

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
INT8_CASES = ("dense_rk3576_int8", "sparse_rk3576_int8", "sparse_rk3576_off_int8")
FP16_CASES = ("dense_rk3576_fp16", "sparse_rk3576_fp16", "sparse_rk3576_off_fp16")
# measured on input_0 (share identical, max): int8 99.92 / 99.92 / 99.93 %, 1 LSB;
# fp16 99.79 / 99.83 / 99.83 %, max |emu - sim| 0.0039 / 0.0020 / 0.0020 (|y| up to ~10) with the sums
# k after k from +0 (NUMERICS.md 3.3; 99.81 / 99.85 / 99.85 % with OpenBLAS's Zen 5 order). This
# simulator's fp16 sums are not that order (the rk3588 simulator's): of the 3x3 conv's 200,704 values
# 420 differ with it, 362 with OpenBLAS's, 277 with exact (float64) sums - ~280 differ in any order tried
MIN_IDENTICAL = 0.998
FP16_MIN_IDENTICAL = 0.9975
FP16_MAX_ABS = 0.004


def _load(path: Path) -> np.ndarray:
    return np.load(lzma.open(path))


def _fixture(case: str):
    folder = RKNN_FIXTURES_OPS / case
    return load_rknn(folder / "model.rknn"), _load(folder / "input_0.npy.xz"), _load(folder / "sim_output_0.npy.xz")


def _codes(model, values: np.ndarray) -> np.ndarray:
    tensor = model.output_tensors[0]
    return (np.rint(values.astype(np.float64) / np.float32(tensor.scales[0])) + tensor.zero_points[0]).astype(np.int64)


def _run(model, x, cores=None, platform="rk3576"):
    run = RknnRunner(model, platform, cores).run([x])
    (name, quantized), = run.quantized.items()
    return run, quantized


@pytest.mark.parametrize("case", INT8_CASES)
def test_int8_fixture_matches_the_simulator_within_one_lsb(case):
    model, x, sim = _fixture(case)
    run, ours = _run(model, x)
    assert len(run.tasks) == 1
    diff = np.abs(ours.astype(np.int64) - _codes(model, sim))
    assert diff.max() <= 1 and np.mean(diff == 0) >= MIN_IDENTICAL, (diff.max(), np.mean(diff == 0))


@pytest.mark.parametrize("case", FP16_CASES)
def test_fp16_fixture_matches_the_simulator_to_fp16_rounding(case):
    model, x, sim = _fixture(case)
    run, ours = _run(model, x)
    assert ours.dtype == np.float16 and len(run.tasks) == 2      # chain 0: rows 0-43 and 44-55
    assert np.array_equal(sim.astype(np.float16).astype(np.float32), sim)
    ours, sim = ours.astype(np.float64).reshape(-1), sim.astype(np.float64).reshape(-1)
    assert np.abs(ours - sim).max() <= FP16_MAX_ABS and np.mean(ours == sim) >= FP16_MIN_IDENTICAL
    assert ours @ sim / (np.linalg.norm(ours) * np.linalg.norm(sim)) >= 0.9999999


@pytest.mark.parametrize("cores", [(1,), (0, 1)])
@pytest.mark.parametrize("case", ["dense_rk3576_int8", "dense_rk3576_fp16", "sparse_rk3576_off_int8"])
def test_core_1_copy_and_2_core_program_give_chain_0s_output(case, cores):
    """The core-1 copy and the 2-core program (28 + 28 rows, OP_EN sync bit cleared) compute the
    same conv: bit-identical to chain 0 (fp16 too: every sum runs k after k from +0 whatever the
    task's row count, NUMERICS.md 3.3; OpenBLAS's order gave 15 of 200,704 values one fp32
    rounding apart on a Zen 5 core)."""
    model, x, _ = _fixture(case)
    _, chain0 = _run(model, x)
    run, ours = _run(model, x, cores)
    assert run.cores == cores
    assert np.array_equal(ours, chain0)


def test_sparse_2_core_program_is_refused_by_name():
    """Its core-1 task reads 4:2 weights with the decompressor off (REGISTER_SEMANTICS.md 10.3)."""
    model, _, _ = _fixture("sparse_rk3576_int8")
    with pytest.raises(UnsupportedProgramError, match=r"task record 3 .*4:2 sparse weights with the decompressor off"):
        RknnRunner(model, "rk3576", (0, 1))


def test_the_translation_follows_the_platforms_map():
    """Run on the rk3588 platform, the same file is rewritten for rk3588.yaml and gives the same
    codes (the vendor's rk3576 cube and BS records are the rk3588 ones, 10.3)."""
    model, x, _ = _fixture("dense_rk3576_int8")
    assert np.array_equal(_run(model, x, platform="rk3588")[1], _run(model, x)[1])


def _oracle(case: str):
    with lzma.open(DATA / f"{case}.rknn.xz") as f:
        model = load_rknn(f.read(), name=f"{case}.rknn")
    with lzma.open(DATA / "runs.npz.xz") as f:
        runs = np.load(io.BytesIO(f.read()))
        return model, runs[f"{case}.input"], runs[f"{case}.sim"]


@pytest.mark.parametrize("case", ["int8", "int8_relu"])
def test_oracle_int8_builds_match_the_simulator(case):
    model, x, sim = _oracle(case)
    _, ours = _run(model, x)
    diff = np.abs(ours.astype(np.int64) - sim.astype(np.int64))
    assert diff.max() <= 1 and np.mean(diff == 0) >= 0.99, (diff.max(), np.mean(diff == 0))
    if case == "int8_relu":   # the Relu is applied: no code below the output zero point
        zero_point = model.output_tensors[0].zero_points[0]
        assert ours.min() >= zero_point and sim.min() >= zero_point


def test_oracle_fp16_relu_build_matches_the_simulator():
    model, x, sim = _oracle("fp16_relu")
    _, ours = _run(model, x)
    assert ours.min() >= 0
    ours, sim = ours.astype(np.float64).reshape(-1), sim.astype(np.float64).reshape(-1)
    assert np.abs(ours - sim).max() <= 0.001 and np.mean(ours == sim) >= 0.75   # measured 0.00098, 78.5 %


def test_oracle_split_conv_with_kept_rows_matches_the_simulator():
    with lzma.open(DATA / "tall.rknn.xz") as f:
        model = load_rknn(f.read(), name="tall.rknn")
    with lzma.open(DATA / "runs.npz.xz") as f:
        runs = np.load(io.BytesIO(f.read()))
        rows, sim = runs["tall.rows"], runs["tall.sim_rows"].astype(np.int64)
    rng = np.random.RandomState(7)
    for _ in range(3):
        rng.randn(1, 16, 3400, 16)
    x = rng.randn(1, 16, 3400, 16).astype(np.float32)
    run, ours = _run(model, x)
    assert len(run.tasks) == 3
    diff = np.abs(ours[0][:, rows, :].astype(np.int64) - sim)
    assert diff.max() <= 1 and np.mean(diff == 0) >= 0.99, (diff.max(), np.mean(diff == 0))
