"""A task program's fp16 DPU step (issue 20, emulator/task_plan.py): ``run_dpu``'s fp path
(PROC_PRECISION fp16) for one decoded state pair and one memory, with what does not change from run
to run worked out once - the BS / BN settings and operands (the BRDMA blob held, units/dpu_plan.py's
``held_blob_entry``), the EW settings, the rows of the MRDMA and ERDMA reads and of the WDMA write located
- so a run is the row copies and the kernels: ``kernels.dpu_fp_chain.FloatChain.runner`` (BS, BN, EW
in one pass; the LUT between them read from the core's LUT RAM as each run finds it), then
``dpu.float_output`` (OUT_CVT) and the planes scattered into the WDMA's atoms (an fp16 output
without MINUS_EXP: rounded as they are stored, kernels/fp16_atoms.py).

Forms taken: the main cube from the CORE (a float32 [C][H][W] result) or, in flying mode, a plain
fp16 MRDMA read (COMB_USE 0); the EW operand from a register or the ERDMA (fp16, per pixel or per
channel, COMB_USE 0, or split between MRDMA and ERDMA with COMB_USE 5); plain or interleaved writes
(kernels/dpu_interleave.py: one atom a row). Not: bf16, the fp16 pair (COMB_USE 3), fp32, NRDMA
operands, reductions, transposes, lane padding, unpooling; ``prepare_fp_dpu`` hands back None for
those and the core runs the task the full way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator.kernels import dpu_bf16, dpu_convert, dpu_fp16_pair, dpu_fp_chain, dpu_interleave
from npuemu.emulator.kernels import dpu_transpose, fp16_atoms, lut_fp
from npuemu.emulator.memory import Memory, TaskDma, gather_rows
from npuemu.emulator.memory import _scatter_planes as scatter_planes
from npuemu.emulator.units import dpu
from npuemu.emulator.units.cna_core import CoreResult
from npuemu.emulator.units.dpu_plan import held_blob_entry
from npuemu.emulator.units.state import FP16, INT8, PRECISION_DTYPES, DpuRdmaState, DpuState, c2_of
from npuemu.isa.errors import EmulationError

#: the outputs taken: fp16 and the fp16 -> int8 conversion (ppocr_rec's int8 build runs both as steps,
#: outputs bit-identical); int16, fp32 and bf16 outputs take the full path (no build here runs them)
_OUTPUTS = (FP16, INT8)


def prepare_fp_dpu(state: DpuState, rdma: DpuRdmaState | None, memory: Memory, where: str,
                   lut_tables: np.ndarray | None) -> Callable | None:
    """``run(source)``: what ``run_dpu(state, rdma, source, ...)`` does to memory and the derived
    cache for an fp16 task (``source``: the CORE's ``CoreResult``, or anything in flying mode), not
    the DMA counts; ``run.held`` as ``dpu_plan.prepare_dpu``'s. None for forms it does not take."""
    if not _takes(state, rdma, lut_tables):
        return None
    scratch = TaskDma(memory, where)  # (its counts are not kept)
    try:
        x_stages = dpu.float_x_stages(state, rdma, scratch, where)
        main = _main_reader(state, rdma, memory, where) if state.flying else None
        operand, read_ew = _operand_reader(state, rdma, memory, where)
        write = _writer(state, memory, where)
    except EmulationError:
        return None
    if write is None or (state.flying and main is None) or operand is None:
        return None
    shape = (state.channels, state.height, state.width)
    before = dpu_fp_chain.FloatChain(np.zeros(shape, np.float32))
    for arguments in x_stages:
        before.x_stage(*arguments)
    lut, after = not state.ew.bypass and not state.ew.lut_bypass, None
    if not state.ew.bypass:
        after = dpu_fp_chain.FloatChain(np.zeros(shape, np.float32)) if lut else before
        after.ew(dpu.float_ew_config(state.ew), operand)
    run_before, run_after = before.runner(), None if after is None else after.runner()
    config = dpu._lut_config(state.lut) if lut else None
    fixed_operand = np.ascontiguousarray(operand, np.float32)

    def run(source: CoreResult | None) -> None:
        data = main() if main is not None else _core_cube(source, shape, where)
        ew = fixed_operand if read_ew is None else read_ew()
        if lut:
            data = lut_fp.lut_stage_fp(run_before(data, fixed_operand), config, lut_tables[0], lut_tables[1])
            data = run_after(data, ew)
        else:
            data = (run_after or run_before)(data, ew)
        if write.fp16 is not None:
            write.fp16(data)
            return
        out, _ = dpu.float_output(state, data, where)
        write(out)

    run.held = _held_blob(state, rdma, memory, where)
    return run


def _held_blob(state: DpuState, rdma: DpuRdmaState | None, memory: Memory, where: str) -> tuple:
    """The BRDMA blob ``dpu.float_x_stages`` took from the derived cache, as (key, value) - the key
    ``dpu.read_bias_blob`` looks it up by - or nothing when the BS stage reads none."""
    if state.bs.bypass or not dpu._brdma_needed(state, rdma, where, cpend=False):
        return ()
    return held_blob_entry(state, rdma, memory, where)


def _takes(state: DpuState, rdma: DpuRdmaState | None, lut_tables: np.ndarray | None) -> bool:
    """The forms ``prepare_fp_dpu`` takes (the module docstring)."""
    if state.proc_precision != FP16 or dpu_bf16.involves_bf16(state) or state.out_precision not in _OUTPUTS \
            or state.minmax_ctl or state.offset_pend or state.transpose is not None or state.pads_lanes \
            or dpu_transpose.is_notched_copy(state, rdma) \
            or rdma is not None and rdma.unpool is not None or dpu_fp16_pair.applies(state, rdma) \
            or dpu_bf16.reads_other_float(state, rdma):
        return False
    if not state.bn.bypass and (state.bn.alu_from_dma and not state.bn.alu_bypass
                                or state.bn.mul_from_dma and not state.bn.mul_bypass):
        return False  # (the NRDMA's operands)
    if not state.ew.bypass and not state.ew.lut_bypass and lut_tables is None:
        return False
    if state.flying:
        return rdma is not None and rdma.comb_use == 0 and rdma.main_enabled and rdma.in_precision == FP16 \
            and state.in_precision == FP16
    return True


def _core_cube(source: CoreResult, shape: tuple, where: str) -> np.ndarray:
    """``dpu._main_input``'s cube of the CORE's [C][H][W] float32 result (its own check of the sizes)."""
    data = source.data
    if source.layout != "chw" or data.shape != shape:
        raise EmulationError(f"{where}: the CORE delivers a {'x'.join(map(str, data.shape[::-1]))} cube (CORE "
                             f"DATAOUT_SIZE_0/1) but the DPU expects {shape[2]}x{shape[1]}x{shape[0]}")
    return np.ascontiguousarray(data, np.float32)


def _surfaces_reader(memory: Memory, where: str, address: int, surface_stride: int, line_stride: int,
                     surfaces: int, height: int, width: int, atom: int, what: str) -> Callable[[], np.ndarray]:
    """``dpu.read_surfaces`` of fp16 atoms with its rows located once: ``read()`` -> [S][H*W][C2]."""
    c2 = c2_of(FP16, atom)
    row_bytes = width * c2 * 2
    located = memory.locate_fixed(dpu._SURFACE_ROWS(address, surface_stride, line_stride, surfaces, height),
                                  row_bytes, lambda: f"{where}: {what} read")
    data, offsets, shape = located.region.data, located.offsets, (surfaces, height * width, c2)

    def read() -> np.ndarray:
        rows = np.empty((offsets.size, row_bytes), np.uint8)
        gather_rows(data, offsets, rows)
        return rows.view(np.float16).reshape(shape)

    return read


def _main_reader(state: DpuState, rdma: DpuRdmaState, memory: Memory, where: str) -> Callable[[], np.ndarray]:
    """The flying task's MRDMA read, widened: ``read()`` -> float32 [C][H][W] (``dpu._main_input``)."""
    surfaces = -(-state.channels // c2_of(FP16, rdma.atom_bytes))
    read = _surfaces_reader(memory, where, rdma.src_address, rdma.surface_stride, rdma.line_stride, surfaces,
                            state.height, state.width, rdma.atom_bytes, "DPU_RDMA main cube")
    shape = (state.channels, state.height, state.width)
    return lambda: dpu_convert.fp16_blocks_to_cube(read(), shape)


def _operand_reader(state: DpuState, rdma: DpuRdmaState | None, memory: Memory,
                    where: str) -> tuple[np.ndarray | None, Callable[[], np.ndarray] | None]:
    """The EW operand: (a register operand, None), or (a zero cube of the ERDMA operand's shape, its
    ``read()`` -> float32 [C][H or 1][W or 1]); (None, None) for an ERDMA form not taken."""
    ew = state.ew
    if ew.bypass or ew.op_bypass or not ew.op_from_dma:
        return np.array(dpu._fp32(ew.op_value), np.float32).reshape(1, 1, 1), None
    if rdma is None or not rdma.erdma_enabled or rdma.erdma_size != 2 \
            or rdma.erdma_mode not in (dpu.ERDMA_PER_PIXEL, dpu.ERDMA_PER_CHANNEL):
        return None, None
    atom, c2 = rdma.atom_bytes, c2_of(FP16, rdma.atom_bytes)
    surfaces, height, width = -(-state.channels // c2), state.height, state.width
    what = f"ERDMA operand (EW_BASE_ADDR={rdma.ew_address:#x})"
    if rdma.erdma_mode == dpu.ERDMA_PER_CHANNEL:
        if rdma.comb_use != 0:
            return None, None
        read = _surfaces_reader(memory, where, rdma.ew_address, rdma.ew_surface_stride, atom, surfaces, 1, 1,
                                atom, what)
        height = width = 1
    elif rdma.comb_use == 0:
        read = _surfaces_reader(memory, where, rdma.ew_address, rdma.ew_surface_stride, rdma.ew_line_stride,
                                surfaces, height, width, atom, what)
    elif rdma.comb_use == dpu.COMB_SPLIT and not state.flying and state.size_e == 1 and rdma.main_enabled:
        read = _split_reader(state, rdma, memory, where, surfaces)
    else:
        return None, None
    shape = (state.channels, height, width)
    return np.zeros(shape, np.float32), lambda: dpu_convert.fp16_blocks_to_cube(read(), shape)


def _split_reader(state: DpuState, rdma: DpuRdmaState, memory: Memory, where: str,
                  surfaces: int) -> Callable[[], np.ndarray]:
    """``dpu._split_operand`` with its rows located once: even surfaces from the MRDMA, odd from the ERDMA."""
    atom, height, width = rdma.atom_bytes, state.height, state.width
    first = _surfaces_reader(memory, where, rdma.src_address, rdma.surface_stride, rdma.line_stride,
                             -(-surfaces // 2), height, width, atom, "MRDMA surfaces")
    second = _surfaces_reader(memory, where, rdma.ew_address, rdma.ew_notch_stride, rdma.ew_line_stride,
                              surfaces // 2, height, width, atom, "ERDMA surfaces")
    shape = (surfaces, height * width, c2_of(FP16, atom))

    def read() -> np.ndarray:
        atoms = np.empty(shape, np.float16)
        atoms[0::2] = first()
        atoms[1::2] = second()
        return atoms

    return read


def _writer(state: DpuState, memory: Memory, where: str) -> Callable[[np.ndarray], None] | None:
    """``dpu._write`` (``TaskDma.write_planes``) with the WDMA's rows located once: ``write(out)``;
    None where the rows do not start on a multiple of the element size (write_planes' other branch).
    ``write.fp16(planes)``: ``write(dpu.float_output(state, planes)[0])`` in one pass
    (kernels/fp16_atoms.py), or None where OUT_CVT does more than round to fp16."""
    dtype = PRECISION_DTYPES[state.out_precision]
    c2 = c2_of(dpu_bf16.carrier(state.out_precision), state.atom_bytes)
    wdma = dpu._WDMA(state, c2, dtype.itemsize)
    channels = min(state.channels, wdma.surfaces * c2)
    # an interleaved write's rows are single atoms, pixels apart (dpu_interleave.as_pixel_rows)
    interleaved = dpu_interleave.is_interleaved(state)
    height, width = (state.height * state.width, 1) if interleaved else (state.height, state.width)
    if wdma.starts.size != -(-channels // c2) * height:
        return None
    row_bytes = width * c2 * dtype.itemsize
    located = memory.locate_fixed(wdma.starts, row_bytes, lambda: f"{where}: {wdma.what} write")
    unsigned = np.dtype(f"u{dtype.itemsize}")
    elements = located.elements(unsigned)
    if elements is None:
        return None
    data, offsets = elements
    derived, starts, bounds = memory.derived, located.starts, located.bounds

    def invalidate() -> None:
        derived.invalidate_rows(starts, row_bytes, bounds)

    def write(out: np.ndarray) -> None:
        if out.dtype != dtype:  # (float_output's element type is the OUT_PRECISION's)
            raise EmulationError(f"{where}: fp16 step: output {out.dtype}, expected {dtype}")
        scatter_planes(np.ascontiguousarray(out[:channels]).reshape(channels, height, width).view(unsigned), c2,
                       offsets, data)
        invalidate()

    def write_fp16(planes: np.ndarray) -> None:
        fp16_atoms.planes_to_fp16_atoms(np.ascontiguousarray(planes[:channels]).reshape(channels, height, width)
                                        .view(np.uint32), c2, offsets, data)
        invalidate()

    # fp16 outputs without the MINUS_EXP scale: OUT_CVT's rounding (dpu.float_output: kernels.dpu.out_cvt_fp16)
    # as the atoms are stored, the same bytes without the fp16 copy of the cube
    write.fp16 = write_fp16 if state.out_precision == FP16 and not state.out_cvt.minus_exp else None
    return write
