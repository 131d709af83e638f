"""PPU + PPU_RDMA: decode the pooling registers, read the source cube through PPU_RDMA, pool
(``kernels.ppu``, NUMERICS.md section 6) and write the result.

Register interpretations and their evidence are in REGISTER_SEMANTICS.md section 4.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator import kernels
from npuemu.emulator.kernels.ppu import FP16_RECIP_BITS
from npuemu.emulator.memory import Memory, TaskDma, Traffic, gather_rows, scatter_rows
from npuemu.emulator.numerics import POOL_AVERAGE, POOL_MAX, POOL_MIN
from npuemu.emulator.regfile import RegisterView
from npuemu.emulator.units.dpu import _SURFACE_ROWS, read_surfaces
from npuemu.emulator.units.state import (
    ATOM_BYTES, FP16, INT8, INT16, INT32, PRECISION_DTYPES, PpuRdmaState, PpuState, c2_of,
    precision_name,
)
from npuemu.isa.errors import EmulationError

#: PPU_RDMA.DATA_FORMAT.IN_PRECISION: 0/1/2/3 = 4/8/16/32-bit elements (rknpu-isa.md 3, PPU).
ELEMENT_BITS = {0: 4, 1: 8, 2: 16, 3: 32}
#: (element bits, PPU DATA_FORMAT.PROC_PRECISION) -> data type; rep07/rep08 pool int8 as (8, 0).
_PPU_TYPES = {(8, INT8): INT8, (16, INT16): INT16, (16, FP16): FP16, (32, INT32): INT32}


def decode_ppu(ppu: RegisterView, where: str, atom_bytes: int = ATOM_BYTES) -> PpuState:
    """``atom_bytes``: the chip's NC1HWC2 atom, the unit of the strides (default RK3588's; NpuCore passes its chip's)."""
    atom = atom_bytes
    mode = ppu.fields("OPERATION_MODE_CFG")
    kernel = ppu.fields("POOLING_KERNEL_CFG")
    pads = ppu.fields("POOLING_PADDING_CFG")
    if mode["INDEX_EN"]:
        raise EmulationError(f"{where}: {ppu.show('OPERATION_MODE_CFG', 'INDEX_EN')} (pooling indices) "
                             f"is not modelled")
    dst = ppu.raw("DST_BASE_ADDR")
    state = PpuState(
        flying=bool(mode["FLYING_MODE"]), dpu_flyin=bool(ppu.field("DATA_FORMAT", "DPU_FLYIN")),
        method=mode["POOLING_METHOD"], proc_precision=ppu.field("DATA_FORMAT", "PROC_PRECISION"),
        in_width=ppu.field("DATA_CUBE_IN_WIDTH", "CUBE_IN_WIDTH") + 1,
        in_height=ppu.field("DATA_CUBE_IN_HEIGHT", "CUBE_IN_HEIGHT") + 1,
        in_channels=ppu.field("DATA_CUBE_IN_CHANNEL", "CUBE_IN_CHANNEL") + 1,
        out_width=ppu.field("DATA_CUBE_OUT_WIDTH", "CUBE_OUT_WIDTH") + 1,
        out_height=ppu.field("DATA_CUBE_OUT_HEIGHT", "CUBE_OUT_HEIGHT") + 1,
        out_channels=ppu.field("DATA_CUBE_OUT_CHANNEL", "CUBE_OUT_CHANNEL") + 1,
        kernel_w=kernel["KERNEL_WIDTH"] + 1, kernel_h=kernel["KERNEL_HEIGHT"] + 1,
        stride_x=kernel["KERNEL_STRIDE_WIDTH"] + 1, stride_y=kernel["KERNEL_STRIDE_HEIGHT"] + 1,
        pad_top=pads["PAD_TOP"], pad_bottom=pads["PAD_BOTTOM"], pad_left=pads["PAD_LEFT"],
        pad_right=pads["PAD_RIGHT"], pad_value=ppu.field("PADDING_VALUE_1_CFG", "PAD_VALUE_0"),
        recip_kernel_w=ppu.field("RECIP_KERNEL_WIDTH", "RECIP_KERNEL_WIDTH"),
        recip_kernel_h=ppu.field("RECIP_KERNEL_HEIGHT", "RECIP_KERNEL_HEIGHT"),
        dst_address=dst & ~0xF,
        dst_surface_stride=ppu.field("DST_SURF_STRIDE", "DST_SURF_STRIDE") * atom, atom_bytes=atom)
    if dst & 0xF:
        raise EmulationError(f"{where}: {ppu.show('DST_BASE_ADDR')} is not 16-byte aligned (field 31:4)")
    if state.out_channels != state.in_channels:
        raise EmulationError(f"{where}: PPU channels disagree: {ppu.show('DATA_CUBE_IN_CHANNEL')} but "
                             f"{ppu.show('DATA_CUBE_OUT_CHANNEL')}")
    if state.method not in (POOL_AVERAGE, POOL_MAX, POOL_MIN):
        raise EmulationError(f"{where}: {ppu.show('OPERATION_MODE_CFG', 'POOLING_METHOD')} is not "
                             f"0 (average), 1 (max) or 2 (min)")
    _check_windows(state, ppu, where)
    if state.method == POOL_AVERAGE and state.proc_precision == FP16:
        for name, value in (("RECIP_KERNEL_WIDTH", state.recip_kernel_w), ("RECIP_KERNEL_HEIGHT", state.recip_kernel_h)):
            if value >> FP16_RECIP_BITS:  # NUMERICS.md 38: the fp16 form is the fp16 bits of 2^16 / k
                raise EmulationError(f"{where}: fp16 average pool with {ppu.show(name)}: bit 16 is set, the "
                                     f"int8 form's 2^16; the fp16 form holds the fp16 bits of 2^16 / k (0x7c00 for k = 1)")
    return state


def _check_windows(state: PpuState, ppu: RegisterView, where: str) -> None:
    # Every output window must start inside the padded input, else the PPU has nothing to read.
    axes = ((state.out_height, state.stride_y, state.pad_top, state.in_height, "rows"),
            (state.out_width, state.stride_x, state.pad_left, state.in_width, "columns"))
    for out, stride, pad, size, axis in axes:
        if (out - 1) * stride - pad >= size:
            raise EmulationError(
                f"{where}: {out} PPU output {axis} at stride {stride} start past the {size} input "
                f"{axis} (pad {pad}): DATA_CUBE_OUT does not fit DATA_CUBE_IN "
                f"({ppu.show('POOLING_KERNEL_CFG')})")


def decode_ppu_rdma(rdma: RegisterView, where: str, atom_bytes: int = ATOM_BYTES) -> PpuRdmaState:
    code = rdma.field("DATA_FORMAT", "IN_PRECISION")
    atom = atom_bytes
    return PpuRdmaState(
        width=rdma.field("CUBE_IN_WIDTH", "CUBE_IN_WIDTH") + 1,
        height=rdma.field("CUBE_IN_HEIGHT", "CUBE_IN_HEIGHT") + 1,
        channels=rdma.field("CUBE_IN_CHANNEL", "CUBE_IN_CHANNEL") + 1,
        src_address=rdma.raw("SRC_BASE_ADDR"),
        line_stride=rdma.field("SRC_LINE_STRIDE", "SRC_LINE_STRIDE") * atom,
        surface_stride=rdma.field("SRC_SURF_STRIDE", "SRC_SURF_STRIDE") * atom,
        element_bits=ELEMENT_BITS[code], atom_bytes=atom)


def check_ppu_source(state: PpuState, rdma: PpuRdmaState | None, ppu: RegisterView, where: str) -> int:
    """The data type the PPU pools; EmulationError when the source is missing or disagrees."""
    if not state.flying or state.dpu_flyin:
        raise EmulationError(f"{where}: {ppu.show('OPERATION_MODE_CFG', 'FLYING_MODE')} / "
                             f"{ppu.show('DATA_FORMAT', 'DPU_FLYIN')}: only the PPU_RDMA source "
                             f"(FLYING_MODE=1, DPU_FLYIN=0; rep07, rep08) is modelled")
    if rdma is None:
        raise EmulationError(f"{where}: the PPU reads from PPU_RDMA (FLYING_MODE=1) but PPU_RDMA is not "
                             f"enabled in the op-enable word: the PPU would wait forever")
    if (rdma.width, rdma.height, rdma.channels) != (state.in_width, state.in_height, state.in_channels):
        raise EmulationError(
            f"{where}: PPU and PPU_RDMA sizes disagree: PPU DATA_CUBE_IN {state.in_width}x"
            f"{state.in_height}x{state.in_channels}, PPU_RDMA CUBE_IN "
            f"{rdma.width}x{rdma.height}x{rdma.channels}")
    kind = _PPU_TYPES.get((rdma.element_bits, state.proc_precision))
    if kind is None:
        raise EmulationError(f"{where}: PPU_RDMA {rdma.element_bits}-bit elements with PPU PROC_PRECISION "
                             f"{precision_name(state.proc_precision)} are not modelled")
    return kind


def run_ppu(state: PpuState, rdma: PpuRdmaState, kind: int, dma: TaskDma) -> np.ndarray:
    dtype = PRECISION_DTYPES[kind]
    c2 = c2_of(kind, state.atom_bytes)
    surfaces = -(-state.in_channels // c2)
    # the source's atoms (the DMA's fresh copy, zeroed in place): lanes past the channel count pool as 0 [C]
    feature = read_surfaces(dma, Traffic.PPU_READ, rdma.src_address, rdma.surface_stride, rdma.line_stride,
                            surfaces, state.in_height, state.in_width, dtype,
                            f"PPU_RDMA source (SRC_BASE_ADDR={rdma.src_address:#x})", rdma.atom_bytes)
    feature[-1, :, :, state.in_channels - (surfaces - 1) * c2:] = 0
    pooled = kernels.pool_nc1hwc2(feature, _pool_config(state, dtype))
    dma.write_rows(Traffic.PPU_WRITE, _write_rows(state, c2, dtype.itemsize),
                   pooled.reshape(surfaces * state.out_height, -1),
                   f"PPU write (DST_BASE_ADDR={state.dst_address:#x}, DST_SURF_STRIDE="
                   f"{state.dst_surface_stride} B)")
    return pooled


def _pool_config(state: PpuState, dtype: np.dtype) -> kernels.PoolConfig:
    return kernels.PoolConfig(
        method=state.method, kernel_h=state.kernel_h, kernel_w=state.kernel_w,
        out_h=state.out_height, out_w=state.out_width, stride_y=state.stride_y,
        stride_x=state.stride_x, pad_top=state.pad_top, pad_bottom=state.pad_bottom,
        pad_left=state.pad_left, pad_right=state.pad_right, pad_value=_pad_value(state.pad_value, dtype),
        recip_kernel_w=state.recip_kernel_w, recip_kernel_h=state.recip_kernel_h)


def _write_rows(state: PpuState, c2: int, itemsize: int) -> np.ndarray:
    """The output rows' addresses ([S][OH], surface-major)."""
    surfaces = -(-state.in_channels // c2)
    starts = (state.dst_address + np.arange(surfaces, dtype=np.int64)[:, None] * state.dst_surface_stride
              + np.arange(state.out_height, dtype=np.int64)[None, :] * state.out_width * c2 * itemsize)
    return starts.reshape(-1)


def prepare_ppu(state: PpuState, rdma: PpuRdmaState | None, kind: int | None, memory: Memory,
                where: str) -> Callable[[object], None] | None:
    """A PPU task's ``run(cbuf)`` for a task program (emulator/task_plan.py; the CBUF unused):
    ``run_ppu``'s read, pooling and write with the rows located and the settings made once
    (not the DMA counts: the caller keeps those of a full run). None where the full path would
    raise (rows outside the memory) or the kind is unknown."""
    if rdma is None or kind not in PRECISION_DTYPES:
        return None
    dtype = PRECISION_DTYPES[kind]
    c2 = c2_of(kind, state.atom_bytes)
    surfaces = -(-state.in_channels // c2)
    sources = _SURFACE_ROWS(rdma.src_address, rdma.surface_stride, rdma.line_stride, surfaces, state.in_height)
    targets = _write_rows(state, c2, dtype.itemsize)
    targets.flags.writeable = False
    read_bytes, write_bytes = state.in_width * c2 * dtype.itemsize, state.out_width * c2 * dtype.itemsize
    try:
        source = memory.locate_fixed(sources, read_bytes, lambda: f"{where}: PPU_RDMA source read")
        target = memory.locate_fixed(targets, write_bytes, lambda: f"{where}: PPU write")
        config = _pool_config(state, dtype)
    except EmulationError:
        return None
    shape, lanes, derived = (surfaces, state.in_height, state.in_width, c2), state.in_channels - (surfaces - 1) * c2, \
        memory.derived

    def run(cbuf: object) -> None:
        rows = np.empty((source.offsets.size, read_bytes), np.uint8)
        gather_rows(source.region.data, source.offsets, rows)
        feature = rows.view(dtype).reshape(shape)
        feature[-1, :, :, lanes:] = 0
        pooled = kernels.pool_nc1hwc2(feature, config)
        scatter_rows(np.ascontiguousarray(pooled).view(np.uint8).reshape(target.offsets.size, -1), target.offsets,
                     target.region.data)
        derived.invalidate_rows(target.starts, write_bytes, target.bounds)

    run.held = ()
    return run


def _pad_value(raw: int, dtype: np.dtype) -> int | float:
    # Like the CNA's PAD_VALUE, the low element of the register [I] (REGISTER_SEMANTICS 4.2).
    if dtype == np.float16:
        return float(np.uint16(raw & 0xFFFF).view(np.float16))
    bits = dtype.itemsize * 8
    value = raw & ((1 << bits) - 1)
    return value - (1 << bits) if value >> (bits - 1) else value
