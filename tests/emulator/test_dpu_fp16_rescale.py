"""Two DPU settings the vendor's fp16 builds use (issue 24 item 2), each against a reference
written here from emulator/REGISTER_SEMANTICS.md 3.5 / NUMERICS.md 4.6:

- the fp32 -> fp16 rescale task (rknn-fixtures-ops conv_hardswish_fp16 task 2: DPU COMB_USE 1,
  DPU_RDMA COMB_USE 3, IN/PROC fp32, BS and BN MUL by an fp16 operand, fp16 out): the main cube
  is fp32 NC1HWC2 (C2 = 4), the MRDMA reads the even surfaces from SRC_BASE_ADDR and the ERDMA
  the odd ones from EW_BASE_ADDR, each stepping (line x height + notch) atoms;
- OUT_CVT_SHIFT.MINUS_EXP on the fp path (se_gate_fp16 / glu_fp16: 15 after the sigmoid LUT):
  the fp32 result times 2^-MINUS_EXP, then rounded to fp16."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator.machine import Machine
from npuemu.isa.errors import EmulationError
from tests.emulator.test_machine_support import MASK_FLYING, flying_task, run_tasks

FP16, FP32 = 2, 5
SRC, DST = 0x10000, 0x40000


def _machine() -> Machine:
    return Machine.for_platform("rk3588", ddr_size=16 << 20)


def _blocked(x: np.ndarray, c2: int) -> np.ndarray:
    """[C][H][W] -> [C/c2][H][W][c2] (C a multiple of c2)."""
    c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(c // c2, c2, h, w).transpose(0, 2, 3, 1))


def _unblocked(raw: np.ndarray, c: int, h: int, w: int, c2: int) -> np.ndarray:
    return raw.reshape(c // c2, h, w, c2).transpose(0, 3, 1, 2).reshape(c, h, w)


def _fp16(bits: int) -> np.float32:
    return np.float32(np.array(bits, np.uint16).view(np.float16))


def _rescale_task(w: int, h: int, c: int, mul_bits: int):
    """conv_hardswish_fp16 task 2's registers for a w x h x c cube (REGISTER_SEMANTICS 3.5)."""
    t = flying_task(w, h, c, src=SRC, dst=DST)
    t.set("DPU", "FEATURE_MODE_CFG", COMB_USE=1, BURST_LEN=15, OUTPUT_MODE=2, FLYING_MODE=1)
    t.set("DPU", "DATA_FORMAT", OUT_PRECISION=FP16, IN_PRECISION=FP32, PROC_PRECISION=FP32)
    t.set("DPU", "BS_CFG", BS_RELU_BYPASS=1, BS_ALU_BYPASS=1)
    t.set("DPU", "BS_MUL_CFG", BS_MUL_OPERAND=mul_bits)
    t.set("DPU", "BN_CFG", BN_RELU_BYPASS=1, BN_ALU_BYPASS=1)
    t.set("DPU", "BN_MUL_CFG", BN_MUL_OPERAND=mul_bits)
    t.set("DPU", "OUT_CVT_SCALE", FP32TOFP16_EN=1, OUT_CVT_SCALE=1)
    t.set("DPU_RDMA", "FEATURE_MODE_CFG", IN_PRECISION=FP32, BURST_LEN=15, COMB_USE=3, PROC_PRECISION=FP32,
          MRDMA_FP16TOFP32_EN=1, FLYING_MODE=1)
    t.set("DPU_RDMA", "ERDMA_CFG", ERDMA_DATA_MODE=1, ERDMA_DATA_SIZE=3)
    t.set("DPU_RDMA", "EW_BASE_ADDR", SRC + w * h * 16)      # one fp32 surface further
    t.set("DPU_RDMA", "SURF_NOTCH", SURF_NOTCH_ADDR=w * h)    # each stream skips the other's surface
    t.set("DPU_RDMA", "EW_SURF_NOTCH", EW_SURF_NOTCH=w * h)
    return t


@pytest.mark.parametrize("seed, w, h, c, mul_bits", [(0, 5, 3, 16, 0x20E6), (1, 1, 7, 32, 0x3C00),
                                                     (2, 4, 4, 24, 0xB555)])
def test_fp32_rescale_task_reads_alternate_surfaces_and_multiplies_twice(seed, w, h, c, mul_bits):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((c, h, w)) * 1e4).astype(np.float32)      # |x| < 65504: no fp16 overflow
    m = _machine()
    m.memory.load(SRC, _blocked(x, 4).tobytes())
    run_tasks(m, [_rescale_task(w, h, c, mul_bits).task(MASK_FLYING)])
    out = _unblocked(m.memory.dump(DST, c * h * w * 2).view("<f2"), c, h, w, 8)
    mul = _fp16(mul_bits)
    expected = ((x * mul).astype(np.float32) * mul).astype(np.float32).astype(np.float16)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_fp32_processing_without_comb_use_is_refused():
    t = _rescale_task(2, 2, 8, 0x3C00)
    t.set("DPU", "FEATURE_MODE_CFG", BURST_LEN=15, OUTPUT_MODE=2, FLYING_MODE=1)
    with pytest.raises(EmulationError, match=r"PROC_PRECISION=5 \(fp32\) is modelled only for the vendor's "
                                             r"fp32 -> fp16 rescale task"):
        run_tasks(_machine(), [t.task(MASK_FLYING)])


@pytest.mark.parametrize("minus_exp", [1, 3, 15])
def test_minus_exp_scales_the_fp_result_by_a_power_of_two(minus_exp):
    w, h, c = 4, 3, 16
    x = (np.random.default_rng(minus_exp).standard_normal((c, h, w)) * 100).astype(np.float16)
    t = flying_task(w, h, c, src=SRC, dst=DST)
    t.set("DPU", "DATA_FORMAT", OUT_PRECISION=FP16, IN_PRECISION=FP16, PROC_PRECISION=FP16)
    t.set("DPU", "OUT_CVT_SHIFT", MINUS_EXP=minus_exp)
    t.set("DPU_RDMA", "FEATURE_MODE_CFG", IN_PRECISION=FP16, PROC_PRECISION=FP16, BURST_LEN=15, FLYING_MODE=1)
    m = _machine()
    m.memory.load(SRC, _blocked(x, 8).tobytes())
    run_tasks(m, [t.task(MASK_FLYING)])
    out = _unblocked(m.memory.dump(DST, c * h * w * 2).view("<f2"), c, h, w, 8)
    expected = (x.astype(np.float32) * np.float32(2.0 ** -minus_exp)).astype(np.float16)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_minus_exp_on_the_integer_path_is_refused():
    t = flying_task(2, 2, 16, src=SRC, dst=DST)
    t.set("DPU", "OUT_CVT_SHIFT", MINUS_EXP=15)
    with pytest.raises(EmulationError, match=r"MINUS_EXP=15 is not modelled"):
        run_tasks(_machine(), [t.task(MASK_FLYING)])


def test_fp32_rescale_needs_the_erdma_half():
    t = _rescale_task(2, 2, 8, 0x3C00)
    t.set("DPU_RDMA", "ERDMA_CFG", ERDMA_DISABLE=1)
    with pytest.raises(EmulationError, match=r"COMB_USE=3 reads half the fp32 cube through the ERDMA"):
        run_tasks(_machine(), [t.task(MASK_FLYING)])
