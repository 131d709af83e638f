"""The DPU_RDMA unpooling mode (emulator/kernels/dpu_unpool.py, compiler/LOWERING.md 19):
hand-built tasks against an independent numpy reference (np.repeat on the logical tensor, laid
out by the test's own NC1HWC2 writer), and the vendor's own Resize nearest x2 stream
(rknn-fixtures-ops resize_nearest_2x_int8) run whole and compared with the vendor simulator."""

from __future__ import annotations

import io
import json
import lzma

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.machine import Machine
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import EmulationError
from npuemu.isa.rknn import load_rknn
from tests.emulator.test_machine_support import MASK_FLYING, TaskWriter, dpu_writes, run_tasks, to_nc1hwc2
from tests.shared_data import RKNN_FIXTURES_OPS

SRC, DST = 0x10000, 0x200000
INT8, INT16, FP16 = 0, 1, 2


def _machine() -> Machine:
    return Machine.for_platform("rk3588", ddr_size=16 << 20)


def unpool_task(width: int, height: int, fy: int, fx: int, *, src: int, dst: int, out_precision: int = INT8,
                line_notch: int | None = None, row_step: int | None = None) -> TaskWriter:
    """One surface, written as the vendor does (resize_nearest_2x_* task 0): MRDMA cube W x H of
    one int16 atom, DPU cube fx*W x H, DST_SURF_STRIDE one output row, notch (fy - 1) rows."""
    out_w = width * fx
    channels = 16 if out_precision == INT8 else 8
    t = TaskWriter()
    t.set("DPU", "S_POINTER", 0xE).set("DPU_RDMA", "S_POINTER", 0xE)
    dpu_writes(t, out_w, height, channels, channels, dst=dst, surface=out_w if row_step is None else row_step,
               size_e=1, flying=True)
    t.set("DPU", "SURFACE_ADD", SURF_ADD=out_w * height * fy)
    notch = out_w * (fy - 1) if line_notch is None else line_notch
    t.set("DPU", "DATA_CUBE_NOTCH_ADDR", NOTCH_ADDR_1=notch, NOTCH_ADDR_0=notch)
    t.set("DPU", "DATA_FORMAT", OUT_PRECISION=out_precision, IN_PRECISION=INT16, PROC_PRECISION=out_precision)
    t.set("DPU_RDMA", "DATA_CUBE_WIDTH", WIDTH=width - 1)
    t.set("DPU_RDMA", "DATA_CUBE_HEIGHT", HEIGHT=height - 1)
    t.set("DPU_RDMA", "DATA_CUBE_CHANNEL", CHANNEL=7)
    t.set("DPU_RDMA", "FEATURE_MODE_CFG", IN_PRECISION=INT16, BURST_LEN=15, PROC_PRECISION=out_precision,
          FLYING_MODE=1)
    t.set("DPU_RDMA", "SRC_DMA_CFG", UNPOOLING_EN=1, KERNEL_STRIDE_HEIGHT=fy - 1, KERNEL_STRIDE_WIDTH=fx - 1,
          KERNEL_HEIGHT=fy - 1, KERNEL_WIDTH=fx - 1)
    t.set("DPU_RDMA", "SRC_BASE_ADDR", src)
    return t


def _read_surface(m: Machine, address: int, height: int, width: int) -> np.ndarray:
    return m.memory.dump(address, height * width * 16).reshape(height, width, 16)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31))
def test_unpool_copies_every_atom_into_its_block(height, width, fy, fx, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (16, height, width)).astype(np.int8)
    m = _machine()
    m.memory.load(SRC, to_nc1hwc2(x, 16).tobytes())
    m.memory.load(DST, np.full(height * fy * width * fx * 16 + 64, 0x5A, np.uint8).tobytes())
    run = run_tasks(m, [unpool_task(width, height, fy, fx, src=SRC, dst=DST).task(MASK_FLYING)])
    expected = np.repeat(np.repeat(x, fy, axis=1), fx, axis=2)  # ONNX nearest x(fy, fx), floor / asymmetric
    got = _read_surface(m, DST, height * fy, width * fx).transpose(2, 0, 1).view(np.int8)
    np.testing.assert_array_equal(got, expected)
    # nothing written past the output surface
    assert (m.memory.dump(DST + height * fy * width * fx * 16, 64) == 0x5A).all()
    traffic = run.tasks[0].traffic
    assert traffic.main_read == height * width * 16
    assert traffic.dpu_write == height * fy * width * fx * 16


def test_fp16_atoms_move_unchanged():
    """fp16 (OUT/PROC_PRECISION 2, resize_nearest_2x_fp16): NaN and -0 bit patterns survive."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 3, 5)).astype(np.float16)
    x[0, 0, 0], x[1, 1, 1] = np.float16("nan"), np.float16(-0.0)
    m = _machine()
    m.memory.load(SRC, np.ascontiguousarray(x.transpose(1, 2, 0)).tobytes())
    run_tasks(m, [unpool_task(5, 3, 2, 2, src=SRC, dst=DST, out_precision=FP16).task(MASK_FLYING)])
    got = m.memory.dump(DST, 6 * 10 * 16).view(np.uint16).reshape(6, 10, 8).transpose(2, 0, 1)
    expected = np.repeat(np.repeat(x.view(np.uint16), 2, axis=1), 2, axis=2)
    np.testing.assert_array_equal(got, expected)


def test_line_notch_and_row_step_place_the_rows():
    """Rows of input line y at DST + (y * (W + NOTCH_ADDR_0) + X) * 16 + i * DST_SURF_STRIDE * 16:
    a 4-wide output inside a 7-wide tensor (notch 3 + 7 = one more row of 7, row step 7)."""
    x = np.arange(16 * 2 * 2, dtype=np.int8).reshape(16, 2, 2)
    m = _machine()
    m.memory.load(SRC, to_nc1hwc2(x, 16).tobytes())
    m.memory.load(DST, np.zeros(4 * 7 * 16, np.uint8).tobytes())
    run_tasks(m, [unpool_task(2, 2, 2, 2, src=SRC, dst=DST, line_notch=7 + 3, row_step=7).task(MASK_FLYING)])
    got = _read_surface(m, DST, 4, 7).transpose(2, 0, 1).view(np.int8)
    np.testing.assert_array_equal(got[:, :, :4], np.repeat(np.repeat(x, 2, axis=1), 2, axis=2))
    assert not got[:, :, 4:].any()


@pytest.mark.parametrize("change, message", [
    (lambda t: t.set("DPU_RDMA", "SRC_DMA_CFG", UNPOOLING_EN=1, KERNEL_WIDTH=1, KERNEL_HEIGHT=1,
                     KERNEL_STRIDE_WIDTH=0, KERNEL_STRIDE_HEIGHT=1), "only kernel = stride"),
    (lambda t: t.set("DPU", "DATA_CUBE_WIDTH", WIDTH=5).set("DPU", "WDMA_SIZE_1", HEIGHT_WDMA=2, WIDTH_WDMA=5),
     "unpooled by 2 across"),
    (lambda t: t.set("DPU", "OUT_CVT_SCALE", OUT_CVT_SCALE=2), "OUT_CVT other than the identity"),
    (lambda t: t.set("DPU_RDMA", "DATA_CUBE_CHANNEL", CHANNEL=15), "exactly one 16-byte atom"),
])
def test_unmodelled_forms_are_refused(change, message):
    m = _machine()
    t = unpool_task(4, 3, 2, 2, src=SRC, dst=DST)
    change(t)
    with pytest.raises(EmulationError, match=message):
        run_tasks(m, [t.task(MASK_FLYING)])


# --- the vendor's stream ---------------------------------------------------------------------

def _load(path) -> np.ndarray:
    return np.load(io.BytesIO(lzma.open(path).read()))


def test_vendor_resize_nearest_int8_matches_the_simulator_bit_for_bit():
    case = RKNN_FIXTURES_OPS / "resize_nearest_2x_int8"
    meta = json.loads((case / "meta.json").read_text())
    output = meta["outputs"][0]
    run = RknnRunner(load_rknn(case / "model.rknn")).run([_load(case / "input_0.npy.xz")])
    sim = _load(case / "sim_output_0.npy.xz")
    q_sim = np.rint(sim.astype(np.float64) / np.float32(output["scale"])).astype(np.int64) + output["zero_point"]
    q_emu = run.quantized[output["name"]].astype(np.int64)
    np.testing.assert_array_equal(q_emu.reshape(-1), q_sim.reshape(-1))
    assert len(run.tasks) == meta["rknn"]["tasks_chain0"] == 4
    for task in run.tasks:  # one 16-channel surface each: 40 x 40 atoms in, 80 x 80 out
        assert task.traffic.main_read == 40 * 40 * 16 and task.traffic.dpu_write == 80 * 80 * 16


# --- timing ---------------------------------------------------------------------------------------

def test_unpool_task_cycles_count_the_written_atoms():
    """One atom of the written cube per cycle (16 B at cycle_model.dpu_bytes_per_cycle on rk3588):
    3 lines x 2 rows x 10 atoms for a 5 x 3 input at 2 x 2."""
    from npuemu.emulator.timing.unit_cycles import unit_cycles
    from npuemu.platforms.loader import load_platform

    platform = load_platform("rk3588")
    m = _machine()
    run = run_tasks(m, [unpool_task(5, 3, 2, 2, src=SRC, dst=DST).task(MASK_FLYING)])
    rate = platform.cycle_model.dpu_bytes_per_cycle
    assert unit_cycles(run.tasks[0], platform) == -(-(3 * 2 * 10 * 16) // rate)


def test_perf_vendor_model_reproduces_the_vendors_static_figures(capsys):
    """librknnc_tables.txt: Resize INT8 NPU 0/0/0 (no static estimate for a non-conv layer)."""
    from npuemu.tools.cli import main

    case = RKNN_FIXTURES_OPS / "resize_nearest_2x_int8"
    assert main(["perf", str(case / "model.rknn"), "--ddr-model", "vendor", "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    (resize,) = [layer for layer in layers if layer["op_type"] == "Resize"]
    table = next(line for line in (case / "librknnc_tables.txt").read_text().splitlines() if "Resize:Resize_4" in line)
    assert "0/0/0" in table
    assert (resize["ddr_cycles"], resize["npu_cycles"], resize["max_cycles"]) == (0, 0, 0)
    assert resize["tasks"] == 4
