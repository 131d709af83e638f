"""The DPU WDMA's interleaved write (emulator/kernels/dpu_interleave.py, REGISTER_SEMANTICS.md 3.3.1):
s x s DPU-only tasks, each writing one phase cube with the vendor's Resize bilinear register form
(WDMA_SIZE one W*C-channel pixel a line, NOTCH_ADDR_0 = s - 1, SURFACE_ADD = s output rows,
DST_BASE_ADDR + phase offset), against an independent numpy interleave (out[:, ry::s, rx::s])."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.machine import Machine
from npuemu.isa.errors import EmulationError
from tests.emulator.test_machine_support import MASK_FLYING, TaskWriter, dpu_writes, run_tasks, to_nc1hwc2

SRC, DST = 0x10000, 0x200000
INT8, FP16 = 0, 2


def _machine() -> Machine:
    return Machine.for_platform("rk3588", ddr_size=16 << 20)


def phase_task(width: int, height: int, channels: int, s: int, ry: int, rx: int, *, src: int, dst: int,
               precision: int = INT8, size_e: int = 3, notch: int | None = None) -> TaskWriter:
    """A flying DPU copy of one [C][H][W] phase cube into the s*H x s*W tensor at ``dst``."""
    out_w, out_h = s * width, s * height
    t = TaskWriter()
    t.set("DPU", "S_POINTER", 0xE).set("DPU_RDMA", "S_POINTER", 0xE)
    dpu_writes(t, width, height, channels, channels, dst=dst + (ry * out_w + rx) * 16,
               surface=out_w * out_h, size_e=size_e, flying=True)
    t.set("DPU", "DATA_FORMAT", OUT_PRECISION=precision, IN_PRECISION=precision, PROC_PRECISION=precision)
    t.set("DPU_RDMA", "FEATURE_MODE_CFG", IN_PRECISION=precision, PROC_PRECISION=precision, BURST_LEN=15,
          FLYING_MODE=1)
    notch = s - 1 if notch is None else notch
    t.set("DPU", "DATA_CUBE_NOTCH_ADDR", NOTCH_ADDR_1=notch, NOTCH_ADDR_0=notch)
    t.set("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=width * channels - 1)
    t.set("DPU", "WDMA_SIZE_1", HEIGHT_WDMA=height - 1, WIDTH_WDMA=0)
    t.set("DPU", "SURFACE_ADD", SURF_ADD=s * out_w)
    t.set("DPU_RDMA", "SRC_BASE_ADDR", src)
    return t


def _interleave(phases: dict, s: int) -> np.ndarray:
    """The reference: out[:, ry::s, rx::s] = phase (ry, rx)."""
    c, h, w = phases[0, 0].shape
    out = np.zeros((c, s * h, s * w), phases[0, 0].dtype)
    for (ry, rx), cube in phases.items():
        out[:, ry::s, rx::s] = cube
    return out


def _run_phases(phases: dict, s: int, precision: int) -> tuple[Machine, object]:
    c, h, w = phases[0, 0].shape
    c2 = 16 if precision == INT8 else 8
    channels = -(-c // c2) * c2
    m = _machine()
    tasks, src = [], SRC
    for (ry, rx), cube in phases.items():
        m.memory.load(src, to_nc1hwc2(cube, c2).tobytes())
        tasks.append(phase_task(w, h, channels, s, ry, rx, src=src, dst=DST, precision=precision,
                                size_e=max(3, channels // c2 - 1)).task(MASK_FLYING))
        src += channels * h * w * 16 // c2 + 64
    m.memory.load(DST, np.full(channels // c2 * s * s * h * w * 16 + 64, 0x5A, np.uint8).tobytes())
    return m, run_tasks(m, tasks)


def _read(m: Machine, channels: int, c2: int, height: int, width: int, dtype) -> np.ndarray:
    surfaces = -(-channels // c2)
    raw = m.memory.dump(DST, surfaces * height * width * 16).view(dtype)
    return raw.reshape(surfaces, height, width, c2).transpose(0, 3, 1, 2).reshape(-1, height, width)[:channels]


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 6), st.integers(2, 6), st.sampled_from([2, 3]), st.integers(1, 40), st.integers(0, 2**31))
def test_int8_phases_interleave_into_one_tensor(height, width, s, channels, seed):
    rng = np.random.default_rng(seed)
    phases = {(ry, rx): rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
              for ry in range(s) for rx in range(s)}
    m, run = _run_phases(phases, s, INT8)
    expected = _interleave(phases, s)
    np.testing.assert_array_equal(_read(m, channels, 16, s * height, s * width, np.int8), expected)
    surfaces = -(-channels // 16)
    # nothing written past the tensor
    assert (m.memory.dump(DST + surfaces * s * s * height * width * 16, 64) == 0x5A).all()
    assert all(task.traffic.dpu_write == surfaces * height * width * 16 for task in run.tasks)


def test_fp16_phases_interleave_bit_for_bit():
    rng = np.random.default_rng(5)
    phases = {(ry, rx): rng.standard_normal((12, 3, 4)).astype(np.float16) for ry in range(2) for rx in range(2)}
    phases[1, 0][0, 0, 0] = np.float16(-0.0)
    m, _ = _run_phases(phases, 2, FP16)
    got = _read(m, 12, 8, 6, 8, np.uint16)
    np.testing.assert_array_equal(got, _interleave({k: v.view(np.uint16) for k, v in phases.items()}, 2))


def test_vendor_bilinear_phase_write_form():
    """rknn-fixtures-ops resize_bilinear_2x_int8 task 5's write registers, 40 x 40 x 64 (32 real):
    phase (0, 0) pixel (y, x) of surface k lands at atom k * 6400 + y * 160 + x * 2."""
    x = np.arange(32 * 40 * 40, dtype=np.int64).reshape(32, 40, 40).astype(np.int8)
    m = _machine()
    m.memory.load(SRC, to_nc1hwc2(x, 16, c1=4).tobytes())
    t = phase_task(40, 40, 64, 2, 0, 0, src=SRC, dst=DST)
    t.set("DPU", "DATA_CUBE_CHANNEL", ORIG_CHANNEL=31, CHANNEL=63)
    m.memory.load(DST, np.zeros(2 * 6400 * 16, np.uint8).tobytes())
    run_tasks(m, [t.task(MASK_FLYING)])
    got = _read(m, 32, 16, 80, 80, np.int8)
    np.testing.assert_array_equal(got[:, ::2, ::2], x)
    assert not got[:, 1::2].any() and not got[:, :, 1::2].any()


def test_more_surfaces_than_one_size_e_group_are_refused():
    m = _machine()
    t = phase_task(4, 2, 48, 2, 0, 0, src=SRC, dst=DST, size_e=1)
    with pytest.raises(EmulationError, match="SURFACE_ADD is the line step"):
        run_tasks(m, [t.task(MASK_FLYING)])


def test_other_wdma_disagreements_are_still_refused():
    m = _machine()
    t = phase_task(4, 2, 16, 2, 0, 0, src=SRC, dst=DST)
    t.set("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=4 * 16 - 2)
    with pytest.raises(EmulationError, match="DPU sizes disagree"):
        run_tasks(m, [t.task(MASK_FLYING)])
