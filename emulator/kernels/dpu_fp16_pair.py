"""The DPU's fp16 main cube shared by the MRDMA and the ERDMA (DPU COMB_USE 1, DPU_RDMA COMB_USE 3 under
PROC fp16): the exNorm's fp16 -> int8 edge (REGISTER_SEMANTICS.md 37).

[V: rknn-fixtures-ops layernorm_int8 / layernorm_decomposed_int8 task 23] DATA_FORMAT 0x08000002 (IN and
PROC fp16, OUT int8), DPU FEATURE_MODE_CFG 0x800001e5 (COMB_USE 1), DPU_RDMA FEATURE_MODE_CFG 0x17b49
(COMB_USE 3, MRDMA_FP16TOFP32_EN), ERDMA_CFG 0x40000008 (per pixel, 16-bit), EW_BASE_ADDR = SRC_BASE_ADDR
+ one 40 x 1 surface, SURF_NOTCH = EW_SURF_NOTCH = 40: the fp32 rescale's pairing (3.5) with fp16
elements - the MRDMA reads the even surfaces, the ERDMA the odd ones, each stepping two surfaces. The EW
stage is bypassed there, so the ERDMA's half is main cube, not an operand. What the pair changes beyond
the addresses (MRDMA_FP16TOFP32_EN: an fp32 pipeline, which the fp path has anyway) is not visible.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator.memory import TaskDma, Traffic
from npuemu.emulator.units.state import FP16, DpuRdmaState, DpuState
from npuemu.isa.errors import EmulationError

DPU_PAIR, RDMA_PAIR = 1, 3  # the two COMB_USE fields of the pair
ERDMA_PER_PIXEL, ERDMA_16BIT = 1, 2


def accepts(fmt: dict[str, int], mode: dict[str, int]) -> bool:
    """DPU FEATURE_MODE_CFG.COMB_USE 1 with fp16 input and processing (decode_dpu's check)."""
    return mode["COMB_USE"] == DPU_PAIR and fmt["PROC_PRECISION"] == FP16 and fmt["IN_PRECISION"] == FP16


def applies(state: DpuState, rdma: DpuRdmaState | None) -> bool:
    return rdma is not None and state.flying and rdma.comb_use == RDMA_PAIR and \
        state.proc_precision == FP16 and state.in_precision == FP16


def main_cube(state: DpuState, rdma: DpuRdmaState, dma: TaskDma, where: str, read_surfaces: Callable) -> np.ndarray:
    """[C][H][W] fp32: surface 2k from SRC_BASE_ADDR + k (line x H + SURF_NOTCH) atoms, surface 2k + 1
    from EW_BASE_ADDR + k (line x H + EW_SURF_NOTCH) atoms (``read_surfaces``: units.dpu's reader)."""
    if not (rdma.main_enabled and rdma.erdma_enabled and rdma.erdma_mode == ERDMA_PER_PIXEL
            and rdma.erdma_size == ERDMA_16BIT) or not state.ew.bypass:
        raise EmulationError(f"{where}: DPU_RDMA.FEATURE_MODE_CFG.COMB_USE=3 under fp16 processing is modelled with "
                             f"the MRDMA and a per-pixel 16-bit ERDMA enabled and EW bypassed (ERDMA_CFG "
                             f"0x40000008, as the vendor's exNorm task 23) only")
    c2 = rdma.atom_bytes // 2
    surfaces = -(-state.channels // c2)
    halves = []
    for count, address, stride, line, stream in (
            (-(-surfaces // 2), rdma.src_address, rdma.surface_stride, rdma.line_stride, Traffic.MAIN_READ),
            (surfaces // 2, rdma.ew_address, rdma.ew_notch_stride, rdma.ew_line_stride, Traffic.EW_READ)):
        halves.append(read_surfaces(dma, stream, address, stride, line, count, state.height, state.width,
                                    np.dtype(np.float16), f"COMB_USE 3 fp16 surfaces at {address:#x}",
                                    rdma.atom_bytes))
    atoms = np.empty((surfaces,) + halves[0].shape[1:], np.float16)
    atoms[0::2], atoms[1::2] = halves
    planes = atoms.transpose(0, 3, 1, 2).reshape(surfaces * c2, state.height, state.width)[:state.channels]
    return planes.astype(np.float32)


def check_comb_use(dpu_comb: int, rdma_comb: int, where: str) -> None:
    """Under PROC fp16 the pair is both fields together: DPU COMB_USE 1 with DPU_RDMA COMB_USE 3, or neither."""
    if (dpu_comb == DPU_PAIR) != (rdma_comb == RDMA_PAIR):
        raise EmulationError(f"{where}: DPU FEATURE_MODE_CFG.COMB_USE={dpu_comb} with DPU_RDMA COMB_USE={rdma_comb} "
                             f"under fp16 processing is not modelled (the pair is 1 with 3, REGISTER_SEMANTICS 37)")
