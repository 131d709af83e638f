"""The DPU's min/max reduction over channels (DATA_CUBE_HEIGHT.MINMAX_CTL with OFFSET_PEND), the
first step of the vendor's exSoftmax13 (REGISTER_SEMANTICS.md 35 has the evidence).

Read [V: rknn-fixtures-ops softmax_last_int8 / _fp16 tasks 2-4, the only MINMAX_CTL tasks in the
fixtures]: MINMAX_CTL 7 with OFFSET_PEND 0xfbff (fp16 -65504, the lowest finite fp16) over an fp16
cube W x 1 x C (IN = PROC = OUT fp16, every stage bypassed, OUT_CVT the identity) writes ONE fp16
per pixel, the maximum of OFFSET_PEND and the pixel's C channels, pixels back to back from
DST_BASE_ADDR: the three tasks of 128, 128 and 64 pixels write at DST 0, 256, 512 (2 bytes a pixel)
with FEATURE_MODE_CFG.NONALIGN 1 and SURF_LEN = the written bytes / 16 (16, 16, 8), and task 5
reads the 320 values back as one fp16 per pixel. The whole softmax stream then matches the vendor
simulator (tests/emulator/test_vendor_dpu_modes.py). OFFSET_PEND is read as the fp16 start value
[I: the one value seen is fp16's lowest, the neutral element of a max]. Other MINMAX_CTL values,
other precisions, H > 1 or an enabled stage are refused, naming the register.

OFFSET_PEND without MINMAX_CTL is the padding channels' value of an int8 copy (``check_pending`` /
``fill_pending``; matmul_act_int8's exMatMul pads q's 15 channels with its zero point -3).
"""

from __future__ import annotations

import numpy as np

from npuemu.emulator.kernels.canonical_nan import BITS16
from npuemu.emulator.memory import TaskDma, Traffic
from npuemu.emulator.units.state import FP16, INT8, DpuRdmaState, DpuState
from npuemu.isa.errors import EmulationError

#: DATA_CUBE_HEIGHT.MINMAX_CTL of the channel max [V: softmax_last tasks 2-4]
MINMAX_CHANNEL_MAX = 7


def check_reduce(state: DpuState, where: str) -> None:
    """Refuse every reduction form outside the one the fixtures show."""
    def fail(what: str) -> EmulationError:
        return EmulationError(f"{where}: DPU.DATA_CUBE_HEIGHT.MINMAX_CTL={state.minmax_ctl} with {what} "
                              f"is not modelled (only 7: an fp16 max over channels, H 1, stages bypassed)")
    if state.minmax_ctl != MINMAX_CHANNEL_MAX:
        raise fail("this value")
    if not state.in_precision == state.proc_precision == state.out_precision == FP16:
        raise fail("IN/PROC/OUT_PRECISION other than fp16 (DATA_FORMAT)")
    cvt = state.out_cvt
    if not (state.bs.bypass and state.bn.bypass and state.ew.bypass) or (cvt.scale, cvt.shift, cvt.offset) != (1, 0, 0):
        raise fail("a BS/BN/EW stage enabled or OUT_CVT other than the identity")
    if state.height != 1 or state.transpose is not None or not state.flying:
        raise fail("DATA_CUBE_HEIGHT.HEIGHT above 0, a transpose write or a non-flying source")


def run_reduce(state: DpuState, rdma: DpuRdmaState | None, dma: TaskDma, where: str) -> None:
    """Each pixel's max over its channels (and OFFSET_PEND), one fp16 a pixel from DST_BASE_ADDR."""
    check_reduce(state, where)
    if rdma is None or rdma.comb_use or rdma.erdma_enabled or rdma.brdma_use or rdma.nrdma_use:
        raise EmulationError(f"{where}: DPU.DATA_CUBE_HEIGHT.MINMAX_CTL={state.minmax_ctl} with a source other "
                             f"than a plain MRDMA read (DPU_RDMA COMB_USE / ERDMA / BRDMA / NRDMA) is not modelled")
    lanes = state.atom_bytes // 2
    surfaces = -(-state.channels // lanes)
    s = np.arange(surfaces, dtype=np.int64)
    starts = (rdma.src_address + s * rdma.surface_stride) % (1 << 32)
    rows = dma.read_rows(Traffic.MAIN_READ, starts, state.width * state.atom_bytes,
                         f"DPU_RDMA main cube (SRC_BASE_ADDR={rdma.src_address:#x})")
    cube = rows.view(np.float16).reshape(surfaces, state.width, lanes)
    channels = cube.transpose(1, 0, 2).reshape(state.width, surfaces * lanes)[:, :state.channels]
    start = np.array([state.offset_pend], dtype=np.uint16).view(np.float16)[0]
    out = np.maximum(channels.max(axis=1), start).astype(np.float16)  # a max is exact in fp16
    out.view(np.uint16)[np.isnan(out)] = BITS16  # (a NaN max stored as the canonical NaN, NUMERICS.md 37)
    dma.write_rows(Traffic.DPU_WRITE, np.array([state.dst_address], dtype=np.int64),
                   out.view(np.uint8).reshape(1, -1), f"DPU channel max (DST_BASE_ADDR={state.dst_address:#x})")


def check_pending(state: DpuState, where: str) -> None:
    """OFFSET_PEND without MINMAX_CTL: the value of the padding channels (ORIG_CHANNEL + 1 .. CHANNEL + 1) in the
    output [V: matmul_act_int8 tasks 49-50, an int8 copy of 15 channels padded to 16 with OFFSET_PEND -3, the
    zero point of q; REGISTER_SEMANTICS.md 35]. Only that form: an int8 copy, stages bypassed, one partial atom."""
    cvt = state.out_cvt
    pure = state.bs.bypass and state.bn.bypass and state.ew.bypass and (cvt.scale, cvt.shift, cvt.offset) == (1, 0, 0)
    lanes = state.atom_bytes  # int8 lanes
    if not (pure and state.in_precision == state.proc_precision == state.out_precision == INT8) or \
            state.transpose is not None or state.pixel_step or state.channels % lanes or \
            state.channels - state.orig_channels >= lanes or state.orig_channels == state.channels:
        raise EmulationError(f"{where}: DPU.OFFSET_PEND.OFFSET_PEND={state.offset_pend} is modelled only as the "
                             f"padding channels' value of an int8 copy (stages bypassed, ORIG_CHANNEL inside the "
                             f"last atom, the vendor's exMatMul pad)")


def fill_pending(state: DpuState, dma: TaskDma) -> None:
    """After the task's write: the padding lanes of the last surface's pixels hold OFFSET_PEND (its low byte,
    int8). A host-side store into the atoms the WDMA wrote whole, so no DMA bytes are counted twice."""
    lanes = state.atom_bytes
    surface = state.orig_channels // lanes
    group = state.size_e + 1
    start = state.dst_address + (surface // group) * state.surface_add + (surface % group) * state.dst_surface_stride
    line = (state.width + state.line_notch) * lanes
    value = np.uint8(state.offset_pend & 0xFF)
    first = state.orig_channels % lanes
    for y in range(state.height):
        row = start + y * line
        atoms = dma.memory.dump(row, state.width * lanes).reshape(state.width, lanes)
        atoms[:, first:] = value
        dma.memory.load(row, atoms)
