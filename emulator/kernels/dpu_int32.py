"""The DPU's int32 processing (DATA_FORMAT PROC_PRECISION 4): the exLSTM's address arithmetic and
gate sums (rknn-fixtures-ops lstm_int8 / lstm_fp16; REGISTER_SEMANTICS.md 38, NUMERICS.md 28).

[V: lstm_int8 blocks 1, 2 (and the PC's later steps)]: IN = PROC = OUT int32, flying: the MRDMA reads
an int32 NC1HWC2 cube (4 lanes a 16-byte atom), BS MUL by a register operand (-1, 16, 64) or the BRDMA's
MUL slot, BN ALU add of a per-channel int32 operand the NRDMA fetches (NRDMA_DATA_USE 1: 8-channel
groups of 32 bytes, the BRDMA blob's ALU-only layout, at BN_BASE_ADDR inside DynamicCMD_StackBuf).
[I] The stages are the integer path's (NUMERICS 4: the same BS -> BN -> EW -> OUT_CVT datapath an int8
conv's int32 accumulators go through), the int32 cube taking the accumulators' place; OUT_CVT 1/0/0
leaves it as it is, saturated to int32.

Also here, the two other DPU forms of the exLSTM's program: the counter atom whose lanes past ORIG_CHANNEL
are written 0 (:func:`pads_past_orig`) and NONALIGN's packed int16 -> int8 write (:class:`PackedDpuState`).

Refused by name: int32 processing fed by the CNA, from a cube that is not int32, BN MUL from the NRDMA,
NRDMA_DATA_USE other than 1 with BN_ALU_SRC; NONALIGN packing other than the exLSTM's form.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from npuemu.emulator.memory import TaskDma, Traffic
from npuemu.emulator.units.state import INT8, INT16, INT32, PRECISION_DTYPES, DpuRdmaState, DpuState
from npuemu.emulator.kernels.dpu_nrdma import NRDMA_ALU, read_operand
from npuemu.isa.errors import EmulationError



def check_int32_processing(state: DpuState, where: str) -> None:
    """Refuse an int32-processing task whose form no vendor stream shows (module note)."""
    problem = None
    if not state.flying:
        problem = "fed by the CNA (FLYING_MODE=0); only the MRDMA's int32 cube is modelled"
    elif state.in_precision != INT32:
        problem = f"IN_PRECISION={state.in_precision}; only an int32 input cube is modelled"
    elif not state.bn.bypass and state.bn.mul_from_dma and not state.bn.mul_bypass:
        problem = "DPU.BN_MUL_CFG.BN_MUL_SRC=1 (a BN MUL from the NRDMA) is not modelled"
    if problem:
        raise EmulationError(f"{where}: DPU.DATA_FORMAT.PROC_PRECISION=4 (int32): {problem}")


def paired_read(state: DpuState, rdma: DpuRdmaState) -> bool:
    """The int32 form of the rescale's read (REGISTER_SEMANTICS 3.5, 38): DPU_RDMA COMB_USE 3, the MRDMA and
    the ERDMA alternating surfaces of one int32 cube [V: lstm_int8 block 10, int32 -> int16]."""
    return state.proc_precision == INT32 and rdma.comb_use == 3


def nrdma_bn_alu(state: DpuState, rdma: DpuRdmaState | None, dma: TaskDma, where: str) -> np.ndarray:
    """BN's per-channel int32 ALU operand from the NRDMA (module note)."""
    if rdma is None or rdma.nrdma_use != NRDMA_ALU:
        got = "DPU_RDMA is not enabled" if rdma is None else f"DPU_RDMA.NRDMA_CFG.NRDMA_DATA_USE={rdma.nrdma_use}"
        raise EmulationError(f"{where}: DPU.BN_CFG.BN_ALU_SRC=1 with {got} is not modelled on the integer path "
                             f"(only NRDMA_DATA_USE 1, the int32 ALU operand alone)")
    return read_operand(dma, rdma, NRDMA_ALU, state.channels, "NRDMA BN ALU operand").astype(np.int32)


def pads_past_orig(state: DpuState) -> bool:
    """The exLSTM's counter tasks [V: lstm_int8 block 58: int16, CHANNEL 7, ORIG_CHANNEL 0, OFFSET_PEND 0]: one
    atom of which only the first ORIG_CHANNEL + 1 lanes are real. [I] The lanes past ORIG_CHANNEL are written as
    OFFSET_PEND (REGISTER_SEMANTICS 35's reading of it), here 0: the next int32 task reads lanes 0-1 of that
    atom as ONE int32 counter (block 59: x 16 + the NRDMA's base offset = an address), which is only an
    address if lane 1 is 0. Kept to that form: flying, int16 / int32 in and out, the cube within one atom."""
    lanes = state.atom_bytes // PRECISION_DTYPES[state.out_precision].itemsize \
        if state.out_precision in PRECISION_DTYPES else 0
    return (state.flying and state.proc_precision in (INT16, INT32) and state.out_precision in (INT16, INT32)
            and state.orig_channels < state.channels <= lanes and state.height == state.width == 1
            and not state.offset_pend and not state.minmax_ctl)


def zero_past_orig(state: DpuState, dma: TaskDma) -> None:
    """After the task's write: lanes ORIG_CHANNEL + 1 .. of its one atom hold 0 (host-side, as
    kernels/dpu_reduce.fill_pending: the WDMA wrote the atom whole, its bytes are counted once)."""
    itemsize = PRECISION_DTYPES[state.out_precision].itemsize
    atom = dma.memory.dump(state.dst_address, state.atom_bytes).copy()
    atom[state.orig_channels * itemsize:] = 0
    dma.memory.load(state.dst_address, atom)


@dataclasses.dataclass(frozen=True)
class PackedDpuState(DpuState):
    """A DpuState whose WDMA packs the output (FEATURE_MODE_CFG.NONALIGN 1): pixels back to back, each its C
    values and no lane padding, SURF_LEN x 16 bytes in all [V: lstm_int8 blocks 31 / 56, int16 -> int8 of an
    8 x 1 x 8 cube with SURF_LEN 4: the 64 bytes of h in channel order, which the next task reads as one
    64-channel int8 atom row; the simulator's y is that order. Written as 16-lane atoms (8 values, 8 pad) the
    run gave y[8:16] at 16..24, 0 between]. Only that form: int16 processing, int8 out, height 1."""


def packed(state: DpuState, mode: dict[str, int], where: str) -> DpuState:
    """``state`` as a PackedDpuState when NONALIGN packs its write (the form above), else unchanged."""
    if not mode["NONALIGN"] or state.proc_precision != INT16 or state.out_precision != INT8:
        return state
    written = state.width * state.height * state.channels
    if state.height != 1 or written != mode["SURF_LEN"] * 16 or state.orig_channels != state.channels:
        raise EmulationError(f"{where}: DPU.FEATURE_MODE_CFG.NONALIGN=1 (SURF_LEN={mode['SURF_LEN']}) on a "
                             f"{state.width}x{state.height}x{state.channels} int16 -> int8 cube is modelled only for "
                             f"height 1, every channel real and SURF_LEN x 16 = the cube's bytes")
    return PackedDpuState(**{field.name: getattr(state, field.name) for field in dataclasses.fields(state)})


def write_packed(state: DpuState, out: np.ndarray, dma: TaskDma) -> None:
    """The packed write of ``out`` [C][H][W]: one row of W pixels x C values at DST_BASE_ADDR."""
    dma.write_planes(Traffic.DPU_WRITE, np.array([state.dst_address], np.int64), out, state.channels,
                     f"DPU WDMA packed (NONALIGN, DST_BASE_ADDR={state.dst_address:#x})")
