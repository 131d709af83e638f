"""The ERDMA's per-channel operand mode (ERDMA_DATA_MODE 0; emulator/REGISTER_SEMANTICS.md 3.4)
on the vendor's own stream: rknn-fixtures-ops se_gate_int8 (GAP as two depthwise convs, a
ConvRelu, a ConvHardSigmoid, then the SE gate's Mul as one DPU-only task reading the [1, 64, 1, 1]
gate per channel), run whole and compared with the vendor simulator in output LSBs, as
test_rknn_fixtures_run.py does for the other fixtures. Measured on input_0 (the one input
shipped): 99.34 % identical, the rest 1 LSB (174 below, 155 above); cosine vs onnxruntime 0.99995.

se_gate_fp16 runs too (test_rknn_fixtures_run.py: float16 tensors, and its ConvHardSigmoid
task's OUT_CVT_SHIFT MINUS_EXP 15, NUMERICS.md 4.6): within 2 fp16 steps of the simulator."""

from __future__ import annotations

import io
import json
import lzma

import numpy as np

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.rknn import load_rknn
from tests.shared_data import RKNN_FIXTURES_OPS

CASE = RKNN_FIXTURES_OPS / "se_gate_int8"


def _load(path) -> np.ndarray:
    return np.load(io.BytesIO(lzma.open(path).read()))


def _run():
    return RknnRunner(load_rknn(CASE / "model.rknn")).run([_load(CASE / "input_0.npy.xz")])


def test_se_gate_int8_runs_and_agrees_with_the_simulator_within_one_lsb() -> None:
    meta = json.loads((CASE / "meta.json").read_text())
    output = meta["outputs"][0]
    run = _run()
    sim = _load(CASE / "sim_output_0.npy.xz")
    q_sim = np.rint(sim.astype(np.float64) / np.float32(output["scale"])).astype(np.int64) + output["zero_point"]
    q_emu = run.quantized[output["name"]].astype(np.int64)
    diff = np.abs(q_emu.reshape(-1) - q_sim.reshape(-1))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99, (int(diff.max()), float((diff == 0).mean()))
    ort = _load(CASE / "ort_output_0.npy.xz").reshape(-1).astype(np.float64)
    emu = run.outputs[output["name"]].reshape(-1).astype(np.float64)
    assert float(emu @ ort / np.linalg.norm(emu) / np.linalg.norm(ort)) >= 0.9999


def test_the_gate_task_reads_one_atom_per_surface() -> None:
    """Task 5 (the Mul): ERDMA_CFG 0x4, EW_SURF_STRIDE 1: 4 surfaces of one 16-byte atom, read once;
    the main cube and the output 64 x 28 x 28 bytes each."""
    gate = _run().tasks[5].traffic
    assert gate.ew_read == 4 * 16
    assert gate.main_read == gate.dpu_write == 64 * 28 * 28
