"""The DPU_RDMA's unpooling mode (SRC_DMA_CFG.UNPOOLING_EN): nearest-neighbour upsampling as a
DPU-only task, the way the vendor lowers ONNX Resize nearest x2 (compiler/LOWERING.md 19 has
the register-by-register reading).

What the registers say [V] (rknn-fixtures-ops resize_nearest_2x_int8 / _fp16, every task):
- DPU_RDMA SRC_DMA_CFG 0x1249: UNPOOLING_EN 1, KERNEL_WIDTH/HEIGHT 1 and KERNEL_STRIDE_WIDTH/HEIGHT
  1 (field + 1 = 2, the factor); the MRDMA cube is the input, 40 x 40, one 16-byte atom a pixel
  (IN_PRECISION int16 with CHANNEL 7 in both builds: the unit moves bytes, not values).
- DPU cube WIDTH 80 (input width x kernel width) and HEIGHT 40 (input lines); DST_SURF_STRIDE 80
  atoms = one output row; DATA_CUBE_NOTCH_ADDR 80; SURFACE_ADD one whole output surface; every
  stage bypassed and OUT_CVT the identity (scale 1, shift 0, offset 0); one task per C2 surface.

How it is read here:
- each input pixel becomes a kernel_h x kernel_w block of copies of its atom (kernel = stride: the
  only form any stream shows; overlapping or gapped blocks are refused) [I];
- output column X of input line y, kernel row i is written at
  ``DST_BASE_ADDR + (y * (W + NOTCH_ADDR_0) + X) * 16 + i * DST_SURF_STRIDE * 16`` (W = the DPU
  cube width): the line stride W + NOTCH_ADDR_0 is what the vendor's bilinear edge-copy tasks use
  too (resize_bilinear_2x_int8 tasks 0/3/4: a 40-wide copy into a 42-wide tensor with notch 2, a
  1-wide column with notch 41) [V]; the kernel-row step DST_SURF_STRIDE is the one register left
  that equals an output row in both builds [I];
- kernel = stride = 1 (SRC_DMA_CFG kernel fields 0) is then a plain copy of a W x H cube whose
  source lines lie W + LINE_NOTCH_ADDR and whose written lines lie W + NOTCH_ADDR_0 atoms apart:
  the compiler's edge-padded copy for Resize bilinear (compiler/LOWERING.md 19.1) is five such
  tasks per surface, the vendor's five edge copies in shape (which use plain DPU copies) [I];
- the atom's bytes are copied unconverted: the int8 build reads int16 and writes int8 with all
  stages bypassed, and its output equals the input bit for bit in the vendor simulator, which a
  value conversion (int16 -> int8 saturation) could not give [I].
"""

from __future__ import annotations

import numpy as np

from npuemu.emulator.memo import Memo
from npuemu.emulator.memory import TaskDma, Traffic
from npuemu.emulator.units.state import PRECISION_DTYPES, DpuRdmaState, DpuState, Unpool
from npuemu.isa.errors import EmulationError


def decode_unpool(src_dma: dict[str, int], where: str) -> Unpool | None:
    """None unless UNPOOLING_EN; refuses the forms no stream shows (pooling, kernel != stride)."""
    if not src_dma["UNPOOLING_EN"]:
        return None
    if src_dma["POOLING_METHOD"]:
        raise EmulationError(f"{where}: DPU_RDMA.SRC_DMA_CFG UNPOOLING_EN=1 with POOLING_METHOD="
                             f"{src_dma['POOLING_METHOD']} is not modelled (expected 0)")
    unpool = Unpool(src_dma["KERNEL_WIDTH"] + 1, src_dma["KERNEL_HEIGHT"] + 1,
                    src_dma["KERNEL_STRIDE_WIDTH"] + 1, src_dma["KERNEL_STRIDE_HEIGHT"] + 1)
    if (unpool.kernel_w, unpool.kernel_h) != (unpool.stride_w, unpool.stride_h):
        raise EmulationError(f"{where}: DPU_RDMA.SRC_DMA_CFG unpooling kernel {unpool.kernel_w}x{unpool.kernel_h} "
                             f"with stride {unpool.stride_w}x{unpool.stride_h}: only kernel = stride is modelled")
    return unpool


def _atom_bytes_of(channels: int, precision: int) -> int:
    return channels * PRECISION_DTYPES[precision].itemsize


def check_unpool(state: DpuState, rdma: DpuRdmaState, where: str) -> None:
    """The DPU cube must be the unpooled MRDMA cube, one atom a pixel, with nothing converted."""
    unpool = rdma.unpool
    atom = rdma.atom_bytes
    expected = (rdma.width * unpool.kernel_w, rdma.height)
    if (state.width, state.height) != expected:
        raise EmulationError(f"{where}: unpooling: the DPU cube is {state.width}x{state.height} but the MRDMA's "
                             f"{rdma.width}x{rdma.height} unpooled by {unpool.kernel_w} across gives "
                             f"{expected[0]}x{expected[1]} (DPU DATA_CUBE_WIDTH/HEIGHT)")
    if rdma.in_precision != state.in_precision:
        raise EmulationError(f"{where}: unpooling: DPU IN_PRECISION {state.in_precision} but DPU_RDMA IN_PRECISION "
                             f"{rdma.in_precision}")
    for name, channels, precision in (("DPU_RDMA", rdma.channels, rdma.in_precision),
                                      ("DPU", state.channels, state.out_precision)):
        if precision not in PRECISION_DTYPES or _atom_bytes_of(channels, precision) != atom:
            raise EmulationError(f"{where}: unpooling: the {name} cube's channels ({channels}) must fill "
                                 f"exactly one {atom}-byte atom a pixel")
    stages = (state.bs.bypass, state.bn.bypass, state.ew.bypass)
    cvt = state.out_cvt
    if not all(stages) or (cvt.scale, cvt.shift, cvt.offset) != (1, 0, 0):
        raise EmulationError(f"{where}: unpooling with a DPU stage enabled or OUT_CVT other than the identity "
                             f"(scale 1, shift 0, offset 0) is not modelled")
    if not rdma.flying or rdma.comb_use or rdma.erdma_enabled or rdma.brdma_use or rdma.nrdma_use:
        raise EmulationError(f"{where}: unpooling with BRDMA/NRDMA/ERDMA operands or COMB_USE is not modelled")


def unpool_atoms(atoms: np.ndarray, kernel_w: int, kernel_h: int) -> np.ndarray:
    """``[H][W][B]`` atoms -> ``[H][kernel_h][W * kernel_w][B]``: each atom repeated into its block."""
    wide = np.repeat(atoms, kernel_w, axis=1)
    return np.broadcast_to(wide[:, None], (atoms.shape[0], kernel_h) + wide.shape[1:])


def output_row_starts(state: DpuState, kernel_h: int, notch: int) -> np.ndarray:
    """The address of each output row, [H][kernel_h] (module docstring)."""
    atom = state.atom_bytes
    lines = np.arange(state.height, dtype=np.int64)[:, None] * (state.width + notch) * atom
    rows = np.arange(kernel_h, dtype=np.int64)[None, :] * state.dst_surface_stride
    return (state.dst_address + lines + rows).reshape(-1)


def _row_starts(state: DpuState, rdma: DpuRdmaState) -> tuple[np.ndarray, np.ndarray]:
    """The source rows' and the output rows' addresses, read-only (the DMA locates them once)."""
    source = rdma.src_address + np.arange(rdma.height, dtype=np.int64) * rdma.line_stride
    output = output_row_starts(state, rdma.unpool.kernel_h, state.line_notch)
    source.flags.writeable = output.flags.writeable = False
    return source, output


#: per (DpuState, DpuRdmaState) objects: a network's unpooling tasks reuse theirs every run
_ROW_STARTS: Memo[tuple[np.ndarray, np.ndarray]] = Memo(_row_starts, identity=2)


def run_unpool(state: DpuState, rdma: DpuRdmaState, dma: TaskDma) -> None:
    """Read the MRDMA cube, write every atom into its kernel block."""
    atom = rdma.atom_bytes
    source, output = _ROW_STARTS(state, rdma)
    raw = dma.read_rows(Traffic.MAIN_READ, source, rdma.width * atom,
                        f"DPU_RDMA unpooling source (SRC_BASE_ADDR={rdma.src_address:#x})")
    atoms = raw.reshape(rdma.height, rdma.width, atom)
    rows = unpool_atoms(atoms, rdma.unpool.kernel_w, rdma.unpool.kernel_h)
    dma.write_rows(Traffic.DPU_WRITE, output, np.ascontiguousarray(rows).reshape(-1, state.width * atom),
                   f"DPU unpooling output (DST_BASE_ADDR={state.dst_address:#x})")
