"""The DPU's fp32 processing and the NRDMA's per-channel BN MUL operand: the forms of the
vendor's exGRU (rknn-fixtures-ops gru_int8 / gru_fp16; REGISTER_SEMANTICS.md 38, NUMERICS.md 28).

- **fp32 processing** (DATA_FORMAT IN = PROC = OUT fp32, FEATURE_MODE_CFG.COMB_USE 0, flying)
  [V: gru tasks 4, 13, 21 and their 15 repeats each]: the MRDMA reads an fp32 NC1HWC2 cube (4 lanes
  a 16-byte atom) and the stages run as the fp16 pipeline's, in fp32 (NUMERICS.md 7), without the
  final fp16 rounding: the value is written as fp32. The EW operand comes from the ERDMA with
  ERDMA_DATA_SIZE 3 read as fp32 bits (the 32-bit code of ERDMA_SIZES, whose elements are the fp32
  conv outputs an earlier task wrote with OUT_PRECISION fp32). Checked end to end: the exGRU's gates
  (z, r, n) need the sum of two fp32 conv results (x W + b and h R + b).
- **NRDMA operand** (NRDMA_CFG.NRDMA_DATA_USE 4, BN_MUL_CFG.BN_MUL_SRC 1) [V: gru task 17, BN_BASE_ADDR
  = the fp16 (1 x 1 x 64) cube task 16 wrote with DST_SURF_STRIDE 1 atom]: per channel, one 16-bit MUL
  operand, 8 channels a 16-byte group - the BRDMA blob's MUL-only layout - read as fp16 bits on the fp
  path like the BRDMA's MUL slot [I: the only NRDMA stream seen; its source is the fp16 cube].

Refused by name (no stream shows them): fp32 processing fed by the CNA (not flying), from a non-fp32
MRDMA cube, with the LUT, or to an output other than fp32 (fp16 out is the rescale's, COMB_USE 1); the
two COMB_USE fields other than (0, 0) and the rescale's (1, 3); an NRDMA MUL with NRDMA_DATA_USE other
than 4.
"""

from __future__ import annotations

import numpy as np

from npuemu.emulator.memory import TaskDma
from npuemu.emulator.units.state import FP32, DpuRdmaState, DpuState
from npuemu.emulator.kernels.dpu_nrdma import NRDMA_MUL, read_operand
from npuemu.isa.errors import EmulationError

#: ERDMA_DATA_SIZE of 32-bit elements (read as fp32 bits on the fp32 path)
ERDMA_32BIT = 3


def check_fp32_processing(state: DpuState, where: str) -> None:
    """Refuse, by name, an fp32-processing task whose form no vendor stream shows (module note)."""
    problem = None
    if not state.flying:
        problem = "fed by the CNA (FLYING_MODE=0); only the MRDMA's fp32 cube is modelled"
    elif state.in_precision != FP32:
        problem = f"IN_PRECISION={state.in_precision}; only an fp32 input cube is modelled"
    elif state.out_precision != FP32:
        problem = f"OUT_PRECISION={state.out_precision} and COMB_USE 0; only fp32 out is modelled"
    elif not state.ew.bypass and not state.ew.lut_bypass:
        problem = "DPU.EW_CFG.EW_LUT_BYPASS=0, the LUT, is not modelled with fp32 processing"
    if problem:
        raise EmulationError(f"{where}: DPU.DATA_FORMAT.PROC_PRECISION=5 (fp32) is modelled only for the vendor's "
                             f"fp32 -> fp16 rescale task (FEATURE_MODE_CFG.COMB_USE=1) and the exGRU's plain fp32 "
                             f"task (COMB_USE 0, fp32 in and out, flying): {problem}")


#: (DPU COMB_USE, DPU_RDMA COMB_USE) of the two fp32 forms: the fp32 -> fp16 rescale (REGISTER_SEMANTICS
#: 3.5) and the plain fp32 task (module note)
FP32_COMB_PAIRS = {(1, 3): "the rescale", (0, 0): "plain fp32"}


def check_comb_use(dpu_comb: int, rdma_comb: int, where: str) -> None:
    """fp32 processing runs in two forms only, told apart by the two COMB_USE fields together."""
    if (dpu_comb, rdma_comb) not in FP32_COMB_PAIRS:
        raise EmulationError(f"{where}: DPU.DATA_FORMAT.PROC_PRECISION=5 (fp32) is modelled only for the vendor's "
                             f"fp32 -> fp16 rescale task (DPU FEATURE_MODE_CFG.COMB_USE=1 with DPU_RDMA COMB_USE=3) "
                             f"and the exGRU's plain fp32 task (both 0); got DPU COMB_USE={dpu_comb}, DPU_RDMA "
                             f"COMB_USE={rdma_comb}")


def plain_fp32_read(state: DpuState, rdma: DpuRdmaState) -> bool:
    """Whether the MRDMA reads the fp32 cube by itself (COMB_USE 0), not shared with the ERDMA."""
    return state.proc_precision == FP32 and rdma.comb_use == 0


def ew_operand_dtype(rdma: DpuRdmaState, where: str) -> np.dtype:
    """The ERDMA element type with fp32 processing: 32-bit elements are fp32 bits."""
    if rdma.erdma_size != ERDMA_32BIT:
        raise EmulationError(f"{where}: an fp32 EW operation takes an fp32 operand (ERDMA_DATA_SIZE 3), got "
                             f"ERDMA_DATA_SIZE={rdma.erdma_size}")
    return np.dtype(np.float32)


def read_nrdma_mul(dma: TaskDma, rdma: DpuRdmaState | None, channels: int, where: str) -> dict[str, np.ndarray]:
    """The NRDMA's per-channel BN MUL operands as 16-bit words (the BRDMA blob's MUL-only layout)."""
    if rdma is None or rdma.nrdma_use != NRDMA_MUL:
        got = "DPU_RDMA is not enabled" if rdma is None else f"DPU_RDMA.NRDMA_CFG.NRDMA_DATA_USE={rdma.nrdma_use}"
        raise EmulationError(f"{where}: DPU.BN_MUL_CFG.BN_MUL_SRC=1 with {got} is not modelled (only NRDMA_DATA_USE "
                             f"4, the MUL operand alone)")
    return {"MUL": read_operand(dma, rdma, NRDMA_MUL, channels, "NRDMA BN operand").astype(np.int32)}
