"""bf16 in the DPU: the forms the vendor's exNorm (LayerNormalization) programs (REGISTER_SEMANTICS.md 37,
NUMERICS.md 27).

bf16 is the upper half of an fp32 word. On the fp path (PROC fp16 or bf16) the stages run in fp32 as
NUMERICS.md 4.6 says; bf16 only changes how 16-bit values are read and written [V: rknn-fixtures-ops
layernorm_fp16 tasks 8-19, layernorm_int8 9-20]:

- the output (OUT_PRECISION bf16): fp32 rounded to bf16, to nearest with ties to even [C, NUMERICS 27],
  written as 2-byte lanes (C2 8, as int16 / fp16);
- the main cube the MRDMA reads: the element type of DPU_RDMA.FEATURE_MODE_CFG.IN_PRECISION, which may
  differ from the DPU's DATA_FORMAT.IN_PRECISION when both are 16-bit floats [V: task 12 reads the fp16
  task 11 wrote under a bf16 DPU; task 14 reads the bf16 variance under an fp16 DPU];
- the ERDMA's 16-bit operand (ERDMA_DATA_SIZE 2): the element type of DATA_FORMAT.IN_PRECISION [I: tasks
  11-13 multiply by the bf16 rsqrt seed under IN bf16, tasks 14-19 by the fp16 Newton step under IN fp16];
- the 16-bit MUL operand fields: bf16 bits under PROC bf16 (0x3dbb = 0.0913 = 1/sqrt(120), 0xbf00 = -0.5),
  fp16 bits under PROC fp16 (0xb800 = -0.5) [V]; the 32-bit ALU operands stay fp32 bits (0x3a9d4951 =
  120 x 1e-5, 0x3fc00000 = 1.5) [V].

The BN stage's per-channel fp32 ALU operand from the NRDMA (NRDMA_DATA_USE 1: LayerNorm's beta, a flat
fp32 vector at BN_BASE_ADDR) is read here too [V: the const table's beta2 FLOAT (1,120,1,1), 480 bytes].
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator.kernels.canonical_nan import BITS
from npuemu.emulator.kernels.dpu_nrdma import NRDMA_ALU, read_operand
from npuemu.emulator.memory import TaskDma, Traffic
from npuemu.emulator.units.state import BF16, FP16, INT16, DpuRdmaState, DpuState, precision_name
from npuemu.isa.errors import EmulationError

#: the canonical bf16 NaN (the upper half of the canonical fp32 NaN, ``canonical_nan.BITS``)
CANONICAL_BF16 = BITS >> 16
FLOAT16S = (FP16, BF16)  # the 16-bit float element types a float DPU task may mix


# ---------------------------------------------------------------------------------------------
# Conversions
# ---------------------------------------------------------------------------------------------
def fp32_to_bf16_bits(data: np.ndarray, truncate: bool = False) -> np.ndarray:
    """fp32 -> bf16 bits (uint16): to nearest, ties to even (default), or truncated; overflow rounds
    to infinity as IEEE rounding does; every NaN the canonical bf16 NaN 0x7FC0 (the DPU's stores in
    default-NaN mode, NUMERICS.md section on the DPU's canonical NaN)."""
    bits = np.ascontiguousarray(data, np.float32).view(np.uint32)
    if truncate:
        out = (bits >> np.uint32(16)).astype(np.uint16)
    else:
        out = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> np.uint32(16)) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(data, np.float32))
    if nan.any():
        out[nan] = np.uint16(CANONICAL_BF16)
    return out


def bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits -> fp32 (exact)."""
    return (np.asarray(bits).astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def float16_bits_to_fp32(bits: np.ndarray, precision: int) -> np.ndarray:
    """16-bit words read as fp16 or bf16 (``precision``) -> fp32 (exact)."""
    words = np.asarray(bits).astype(np.uint16)
    if precision == BF16:
        return bf16_bits_to_fp32(words)
    return words.view(np.float16).astype(np.float32)


def mul_operand(bits, proc_precision: int) -> np.ndarray:
    """A 16-bit MUL operand (register field or BRDMA slot) on the fp path: bf16 bits under PROC bf16,
    fp16 bits otherwise (NUMERICS.md 4.6)."""
    words = (np.asarray(bits, np.int64) & 0xFFFF).astype(np.uint16)
    return float16_bits_to_fp32(words, BF16 if proc_precision == BF16 else FP16)


def float_operand(cube: np.ndarray, state: DpuState) -> np.ndarray:
    """The ERDMA's 16-bit float operand (read as float16 words) -> fp32: bf16 when the DPU's
    IN_PRECISION is bf16 [I], fp16 otherwise."""
    if state.in_precision == BF16:
        return bf16_bits_to_fp32(np.ascontiguousarray(cube).view(np.uint16))
    return cube.astype(np.float32)


def carrier(precision: int) -> int:
    """The precision whose memory layout a precision shares: bf16 is stored as 2-byte lanes like int16."""
    return INT16 if precision == BF16 else precision


# ---------------------------------------------------------------------------------------------
# What is modelled
# ---------------------------------------------------------------------------------------------
def involves_bf16(state: DpuState) -> bool:
    return BF16 in (state.in_precision, state.proc_precision, state.out_precision)


def check_precisions(state: DpuState, where: str) -> None:
    """The DATA_FORMAT combinations with bf16 that are modelled: 16-bit float input, processing and
    output (fp16 or bf16 each), i.e. the exNorm tasks; others (bf16 with integers, fp32) are refused."""
    for name, code in (("IN_PRECISION", state.in_precision), ("PROC_PRECISION", state.proc_precision),
                       ("OUT_PRECISION", state.out_precision)):
        if code not in FLOAT16S:
            raise EmulationError(f"{where}: DPU.DATA_FORMAT.{name}={code} ({precision_name(code)}) in a task with "
                                 f"bf16 is not modelled (fp16 / bf16 input, processing and output only)")
    if not state.ew.bypass and not state.ew.lut_bypass:
        raise EmulationError(f"{where}: DPU.EW_CFG.EW_LUT_BYPASS=0 in a task with bf16 is not modelled (no stream "
                             f"shows the LUT there)")
    if state.out_cvt.minus_exp:
        raise EmulationError(f"{where}: DPU.OUT_CVT_SHIFT.MINUS_EXP={state.out_cvt.minus_exp} in a task with bf16 "
                             f"is not modelled (0 in every bf16 task)")


def reads_other_float(state: DpuState, rdma: DpuRdmaState | None) -> bool:
    """Whether a flying fp-path task's MRDMA reads a 16-bit float cube other than plain fp16 under an
    fp16 DPU (``main_cube`` reads it)."""
    return rdma is not None and state.flying and rdma.in_precision in FLOAT16S and \
        state.in_precision in FLOAT16S and BF16 in (rdma.in_precision, state.in_precision)


def main_cube(state: DpuState, rdma: DpuRdmaState, dma: TaskDma, where: str, read_surfaces: Callable) -> np.ndarray:
    """The MRDMA's cube [C][H][W] fp32, its elements of DPU_RDMA IN_PRECISION (``read_surfaces``:
    units.dpu's NC1HWC2 reader)."""
    if rdma.comb_use != 0:
        raise EmulationError(f"{where}: DPU_RDMA.FEATURE_MODE_CFG.COMB_USE={rdma.comb_use} with a bf16 main cube "
                             f"is not modelled (0 only)")
    c2 = rdma.atom_bytes // 2
    surfaces = -(-state.channels // c2)
    atoms = read_surfaces(dma, Traffic.MAIN_READ, rdma.src_address, rdma.surface_stride, rdma.line_stride,
                          surfaces, state.height, state.width, np.dtype(np.int16),
                          f"DPU_RDMA main cube (SRC_BASE_ADDR={rdma.src_address:#x}, "
                          f"{precision_name(rdma.in_precision)})", rdma.atom_bytes)
    planes = atoms.transpose(0, 3, 1, 2).reshape(surfaces * c2, state.height, state.width)[:state.channels]
    return float16_bits_to_fp32(planes, rdma.in_precision)


def nrdma_alu(state: DpuState, rdma: DpuRdmaState | None, dma: TaskDma, where: str) -> np.ndarray:
    """BN's per-channel ALU operand from the NRDMA: CHANNEL + 1 fp32 values at BN_BASE_ADDR, one per
    channel, flat (8-channel groups of 32 bytes, the BRDMA's ALU-only blob) [V: layernorm's beta2]."""
    if state.proc_precision not in FLOAT16S:
        raise EmulationError(f"{where}: BN operands from the NRDMA are modelled on the fp path only")
    if rdma is None or rdma.nrdma_use != NRDMA_ALU:
        use = "DPU_RDMA not enabled" if rdma is None else f"DPU_RDMA.NRDMA_CFG.NRDMA_DATA_USE={rdma.nrdma_use}"
        raise EmulationError(f"{where}: DPU.BN_CFG.BN_ALU_SRC=1 with {use} is not modelled (NRDMA_DATA_USE 1, "
                             f"the ALU operand alone)")
    return read_operand(dma, rdma, NRDMA_ALU, state.channels, "NRDMA BN operands").view(np.float32).copy()
