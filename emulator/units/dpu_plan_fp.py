"""A task program's fp16 DPU step (issue 20, emulator/task_plan.py): ``run_dpu``'s fp path
(PROC_PRECISION fp16) for one decoded state pair and one memory, with what does not change from run
to run worked out once - the BS / BN settings and operands (the BRDMA blob held, units/dpu_plan.py's
``held_blob_entry``), the EW settings, the rows of the MRDMA and ERDMA reads and of the WDMA write located
- so a run is one ``kernels.dpu_fp_chain.fp16_step`` call (NUMERICS.md 34): the MRDMA / ERDMA rows
read and widened straight from the region (``dpu_convert.widen_rows``), BS, BN, EW in one pass
(``FloatChain.settings``) and, for an fp16 output without MINUS_EXP, the planes rounded as they
are stored into the WDMA's atoms (kernels/fp16_atoms.py), into buffers kept from run to run. With
the LUT on, the same call runs it between BN and EW (NUMERICS.md 37; its tables ``lut_fp.prepared``
from the LUT RAM as each run finds it); other outputs take ``dpu.float_output`` (OUT_CVT) and the
plain write.

Forms taken: the main cube from the CORE (a float32 [C][H][W] result) or, in flying mode, a plain
fp16 MRDMA read (COMB_USE 0); the EW operand from a register or the ERDMA (fp16, per pixel or per
channel, COMB_USE 0, or split between MRDMA and ERDMA with COMB_USE 5); plain or interleaved writes
(kernels/dpu_interleave.py: one atom a row). Not: bf16, the fp16 pair (COMB_USE 3), fp32, NRDMA
operands, reductions, transposes, lane padding, unpooling; ``prepare_fp_dpu`` hands back None for
those and the core runs the task the full way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from npuemu.emulator.kernels import (convert_stores, dpu_bf16, dpu_fp16_pair, dpu_fp_atoms, dpu_fp_chain,
                                     dpu_fp_fused, dpu_interleave, dpu_transpose, lut_fp)
from npuemu.emulator.kernels.conv_pixels import working_buffer
from npuemu.emulator.kernels.dpu_fp_chain import IN_WORK, WORK, WORK_ARRAY
from npuemu.emulator.kernels.fp16 import widening_table
from npuemu.emulator.kernels.fp16_atoms import _WIDE_ROW
from npuemu.emulator.memory import Memory, TaskDma
from npuemu.emulator.memory import _scatter_planes as scatter_planes
from npuemu.emulator.numerics import ROUND_HALF_EVEN, out_cvt_round_mode
from npuemu.emulator.units import dpu
from npuemu.emulator.units.cna_core import CoreResult, drop_after_calls
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
    shape = (state.channels, state.height, state.width)
    scratch = TaskDma(memory, where)  # (its counts are not kept)
    try:
        x_stages = dpu.float_x_stages(state, rdma, scratch, where)
        main_rows = _cube_rows(state, rdma, memory, where) if state.flying else None
        operand, operand_rows = _operand_reads(state, rdma, memory, where)
        stored, write, invalidate = _writer(state, memory, where, shape)
    except EmulationError:
        return None
    if write is None or (state.flying and main_rows is None) or operand is None:
        return None
    chain = dpu_fp_chain.FloatChain(np.zeros(shape, np.float32))
    for arguments in x_stages:
        chain.x_stage(*arguments)
    lut = not state.ew.bypass and not state.ew.lut_bypass
    if not state.ew.bypass:
        chain.ew(dpu.float_ew_config(state.ew), operand)
    # one dpu_fp_chain.fp16_step call a run: the reads, the chain with the LUT, the store
    # (NUMERICS.md 34, 37), into buffers a small task keeps from run to run
    reads = [main_rows] + [rows for rows, _, _ in operand_rows] + [None] * (2 - len(operand_rows))
    regions = tuple(_NO_REGION if rows is None else rows[0] for rows in reads)
    blocks = [None if main_rows is None else (*main_rows[1:], 0, 1)] \
        + [(*rows[1:], first, step) for rows, first, step in operand_rows] + [None] * (2 - len(operand_rows))
    settings = chain.settings()
    atoms = _atoms_form(settings, lut, shape, operand, main_rows, stored)
    store, written = (None, _NO_REGION) if stored is _NO_STORE else _store(*stored, not atoms)
    ints, floats = dpu_fp_chain.pack_step(settings, blocks, store, shape + operand.shape, lut, atoms)
    regions += (written,)
    config = dpu._lut_config(state.lut) if lut else None
    table, step, prepared, arena = widening_table(), dpu_fp_chain.fp16_step, lut_fp.prepared, _ARENA
    layout = (shape, main_rows is not None, operand, bool(operand_rows))
    kept = _in_work(*layout) if store is not None and max(np.prod(shape), operand.size) <= WORK_ARRAY \
        else _buffers(*layout) if np.prod(shape) <= _KEPT_ELEMENTS else None

    # the LUT RAM's bytes at the last run and lut_fp.prepared's tables for them: the chain's LUT port
    # writes rewrite the RAM in place, but leave it as the last run found it on most runs, and
    # prepared's lookup (hashing the settings and 2 KiB of tables) cost 8.3 us a task in the model
    # (ppocr_rec fp16: 213 a run, 1.8 ms); comparing the bytes, ~0.2 us
    last = [None, dpu_fp_chain.NO_LUT]

    def direct(data: np.ndarray | None) -> None:
        cube, operand, out = kept or _working(*layout)
        packed, parameters = dpu_fp_chain.NO_LUT
        if lut:  # (the LUT RAM as this run finds it)
            ram = lut_tables.tobytes()
            if ram != last[0]:
                last[:] = [ram, prepared(config, lut_tables[0], lut_tables[1])]
            packed, parameters = last[1]
        step(data if cube is None else cube, operand, out, *regions, ints, floats, table, packed, parameters,
             arena.work)
        if store is None:  # (OUT_CVT does more than round to fp16)
            write(dpu.float_output(state, out, where)[0])
        else:
            invalidate()

    def run(source: CoreResult | None) -> None:
        direct(None if main_rows is not None else _core_cube(source, shape, where))

    run.held = _held_blob(state, rdma, memory, where)
    lut_now = _lut_check(last, lut_tables, config, prepared) if lut else None
    # (``direct.batch_form(data)``: its parts for a batch of steps, task_batches.StepBatch)
    after = () if store is not None else _int8_store(state, write, kept)  # (the store's calls after the chain's)
    direct.batch_form = batch_form = _batch_former(after is not None, kept, layout, regions + (ints, floats, table),
                                                   invalidate, lut_now, after)
    if main_rows is not None:  # (a flying task: the step is ``run`` itself)
        run.batch = _flying_batch(batch_form(None))
    # ``run.direct(cube)``: ``run`` of the CORE's float32 [C][H][W] cube itself, for a CORE step whose
    # result is one array every run, checked once by ``direct.takes`` (cna_core ``_fused_run``'s ``then_into``:
    # the task's two halves in one frame)
    run.direct, direct.run = direct, run
    direct.takes = lambda data: main_rows is None and _takes_cube(data, shape)
    return run


def _lut_check(last: list, lut_tables: np.ndarray, config, prepared):
    """``lut_now()``: ``direct``'s LUT check (``last``: its LUT RAM bytes and tables) - the tables the LUT RAM
    gives now -, giving None where it raises (a batch member then runs as its step, which raises where it does)."""
    def lut_now() -> tuple | None:
        try:
            ram = lut_tables.tobytes()
            if ram != last[0]:
                last[:] = [ram, prepared(config, lut_tables[0], lut_tables[1])]
            return last[1]
        except Exception:
            return None

    return lut_now


def _batch_former(stores: bool, kept: tuple | None, layout: tuple, tail: tuple, invalidate, lut_now,
                  after: tuple | None = ()):
    """``batch_form(data)``: ``direct(data)`` for a caller making its ``fp16_step`` call itself (task_batches.StepBatch):
    (its drop of the stored rows' derived values, ``lut_now`` - the LUT tables ``direct`` would use now - or None
    without the LUT, ``call(tables)``: the kernel and its arguments for those tables, no LUT's by default, and
    ``after``: the calls of the store after it - none where the chain's call stores -), the arrays it takes from the
    thread's buffers as kernels/step_batch_fp16.py's thread buffers; None where OUT_CVT does more than round and
    no store call takes it (not ``stores``: the write in Python). ``tail``: the regions, ints, floats, table."""
    def batch_form(data: np.ndarray | None) -> tuple | None:
        if not stores:
            return None
        cube, operand, out = kept or _working_slots(*layout)
        head = (data if cube is None else cube, operand, out, *tail)

        def call(tables: tuple = dpu_fp_chain.NO_LUT) -> tuple:
            return dpu_fp_chain.fp16_step, head + tuple(tables) + (_WORK_SLOT,)

        return invalidate, lut_now, call, after

    return batch_form


#: kernels/step_batch_fp16.py's thread buffers (its WORK_BUFFER, RESULT_BUFFER, OPERAND_BUFFER, CUBE_BUFFER)
_WORK_SLOT = ("buffer", 0, (WORK,))


def _working_slots(shape: tuple, main: bool, operand: np.ndarray, read_operand: bool) -> tuple:
    """``_working``'s arrays as step_batch_fp16's thread buffers (the same working buffers, found as the
    batch runs: ``batch_runner``)."""
    return ("buffer", 3, shape) if main else None, ("buffer", 2, operand.shape) if read_operand else operand, \
        ("buffer", 1, shape)


def _flying_batch(form: tuple | None) -> tuple | None:
    """A flying step's ``step.batch`` (task_batches.StepBatch; ``batch_form(None)``'s parts): its Python
    part the drop of derived values, its call the DPU's."""
    if form is None:
        return None
    invalidate, lut_now, call, after = form
    drop = drop_after_calls(invalidate)

    def pre(cbuf) -> None:
        drop()

    if lut_now is None:
        return pre, (call(),) + after, None, None, "fp16"
    return pre, (None,) + after, None, (lut_now, lambda tables: (call(tables),) + after, object()), "fp16"


def _int8_store(state: DpuState, write, kept: tuple | None) -> tuple | None:
    """``write(dpu.float_output(...)[0])`` of an int8 output as a store call after the chain's
    (kernels/convert_stores.py ``int8_store``: the same rounding and row store; into an int8 array of its own) -
    OUT_CVT the identity ``fp_to_int`` takes, no MINUS_EXP, the task's own arrays (``kept``) -; None otherwise."""
    cvt, rows = state.out_cvt, getattr(write, "rows", None)
    if state.out_precision != INT8 or cvt.minus_exp or (cvt.scale, cvt.shift, cvt.offset) != (1, 0, 0) \
            or kept is None or rows is None:
        return None
    channels, height, width, c2, offsets, data = rows
    out = kept[2]
    ints = np.empty(out.size, np.int8)
    planes = ints[:channels * height * width].view(np.uint8).reshape(channels, height, width)
    half_even = out_cvt_round_mode(cvt.round_bit) == ROUND_HALF_EVEN
    return ((convert_stores.int8_store, (out.reshape(-1), half_even, ints, planes, c2, offsets, data)),)


def batch_runner(rows: np.ndarray):
    """``run_ops(table, start, stop)`` of a batch of fp16 ops (kernels/step_batch_fp16.py; ``rows``: its rows,
    a view of the table) with the thread's buffers: the DPU's working buffer (``_ARENA``) and, where its ops
    use them (``buffer_sizes``), the working buffers ``_working`` gives large tasks - the same ones: each
    grows to at least the size asked, and a task's run consumes them before the next task's. ``run_ops.refresh()``
    works the sizes out again (task_batches.StepBatch ``_remake``: a LUT member's ops made again)."""
    from npuemu.emulator.kernels import step_batch_fp16

    run, arena, sizes_of = step_batch_fp16.entry(), _ARENA, step_batch_fp16.buffer_sizes
    sizes = [sizes_of(rows)]

    def run_ops(table: np.ndarray, start: int, stop: int) -> int:
        _, result, operand, cube = sizes[0]
        return run(table, start, stop, arena.work,
                   working_buffer("fp16 DPU result", result, np.float32) if result else _NO_BUFFER,
                   working_buffer("fp16 DPU operand", operand, np.float32) if operand else _NO_BUFFER,
                   working_buffer("fp16 DPU cube", cube, np.float32) if cube else _NO_BUFFER)

    run_ops.refresh = lambda: sizes.__setitem__(0, sizes_of(rows))
    return run_ops


_NO_BUFFER = np.zeros(1, np.float32)


def _takes_cube(data: np.ndarray, shape: tuple) -> bool:
    """Whether ``_core_cube`` hands ``data`` (a CORE result's chw array) on as it is: float32, C-contiguous,
    of the DPU's shape."""
    return data.shape == shape and data.dtype == np.float32 and data.flags.c_contiguous


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


_NO_REGION = np.zeros(0, np.uint16)  # (a read or store without rows)
#: a task of at most this many elements keeps its arrays from run to run (<= 64 KiB each; keeping
#: every task's would double ppocr_det fp16's peak memory, 362 -> 702 MB); larger ones use the
#: thread's working buffers (``_working``)
_KEPT_ELEMENTS = 1 << 14
_NO_STORE = ()  # (_writer: no store in the step)


def _surface_rows(memory: Memory, where: str, address: int, surface_stride: int, line_stride: int,
                  surfaces: int, height: int, width: int, atom: int, what: str) -> tuple:
    """``dpu.read_surfaces``' fp16 atom rows, located once: (the region as uint16, each row's first
    element, height, lanes) for ``dpu_convert.widen_rows``; an odd row address raises (the full
    path then reads the rows byte by byte)."""
    c2 = c2_of(FP16, atom)
    located = memory.locate_fixed(dpu._SURFACE_ROWS(address, surface_stride, line_stride, surfaces, height),
                                  width * c2 * 2, lambda: f"{where}: {what} read")
    elements = located.elements(np.dtype(np.uint16))
    if elements is None:
        raise EmulationError(f"{where}: {what} rows at odd addresses (not taken by the step)")
    return elements[0], np.ascontiguousarray(elements[1], np.int64), height, c2


def _cube_rows(state: DpuState, rdma: DpuRdmaState, memory: Memory, where: str) -> tuple:
    """The flying task's MRDMA rows (``dpu._main_input``), as ``_surface_rows``."""
    surfaces = -(-state.channels // c2_of(FP16, rdma.atom_bytes))
    return _surface_rows(memory, where, rdma.src_address, rdma.surface_stride, rdma.line_stride, surfaces,
                         state.height, state.width, rdma.atom_bytes, "DPU_RDMA main cube")


class _Arena(threading.local):
    """The thread's ``fp16_step`` working buffer (``dpu_fp_chain.WORK``): the chain's scratch pieces and
    the arrays of tasks that store their result within the step (``_in_work``). Shared by the
    thread's tasks, so that it stays in the cache from task to task: ppocr_rec int8's fp16 islands,
    ~570 tasks of ~2K elements each a run, each kept its own arrays, cold at every run (NUMERICS.md,
    section on the fp chain's working buffer); per thread, as the other working buffers."""

    def __init__(self) -> None:
        self.work = np.empty(WORK, np.float32)


_ARENA = _Arena()


def _in_work(shape: tuple, main: bool, operand: np.ndarray, read_operand: bool) -> tuple:
    """``_buffers`` for a task whose step stores its result (nothing of it is read after the call):
    every array that the step fills placed in the thread's working buffer (``IN_WORK``)."""
    return IN_WORK if main else None, IN_WORK if read_operand else operand, IN_WORK


def _buffers(shape: tuple, main: bool, operand: np.ndarray, read_operand: bool) -> tuple:
    """A run's arrays: (the MRDMA's cube or None, the EW operand, the result)."""
    cube = np.empty(shape, np.float32) if main else None
    if read_operand:  # (an ERDMA operand: filled by its reads)
        operand = np.empty(operand.shape, np.float32)
    return cube, operand, np.empty(shape, np.float32)


def _working(shape: tuple, main: bool, operand: np.ndarray, read_operand: bool) -> tuple:
    """``_buffers`` in the thread's working buffers (``conv_pixels.working_buffer``), for tasks too large
    to keep their own: fresh arrays of several MiB are fresh mappings whose pages fault on every run
    (ppocr_det fp16's flying adds, 21 a run of 2.2 MB each: ~0.4 ms a task), and a run consumes its
    arrays before it returns (the next task's run overwrites them)."""
    size = shape[0] * shape[1] * shape[2]
    cube = working_buffer("fp16 DPU cube", size, np.float32).reshape(shape) if main else None
    if read_operand:
        operand = working_buffer("fp16 DPU operand", operand.size, np.float32).reshape(operand.shape)
    return cube, operand, working_buffer("fp16 DPU result", size, np.float32).reshape(shape)


def _operand_reads(state: DpuState, rdma: DpuRdmaState | None, memory: Memory,
                   where: str) -> tuple[np.ndarray | None, tuple]:
    """The EW operand: (a register operand, no rows), or (a zero cube of the ERDMA operand's shape,
    float32 [C][H or 1][W or 1], and the (rows, first surface, surface step) of its reads: one source,
    or a split operand's two); (None, ()) for an ERDMA form not taken."""
    ew = state.ew
    if ew.bypass or ew.op_bypass or not ew.op_from_dma:
        return np.array(dpu._fp32(ew.op_value), np.float32).reshape(1, 1, 1), ()
    if rdma is None or not rdma.erdma_enabled or rdma.erdma_size != 2 \
            or rdma.erdma_mode not in (dpu.ERDMA_PER_PIXEL, dpu.ERDMA_PER_CHANNEL):
        return None, ()
    atom, c2 = rdma.atom_bytes, c2_of(FP16, rdma.atom_bytes)
    surfaces, height, width = -(-state.channels // c2), state.height, state.width
    what = f"ERDMA operand (EW_BASE_ADDR={rdma.ew_address:#x})"
    if rdma.erdma_mode == dpu.ERDMA_PER_CHANNEL:
        if rdma.comb_use != 0:
            return None, ()
        return np.zeros((state.channels, 1, 1), np.float32), \
            ((_surface_rows(memory, where, rdma.ew_address, rdma.ew_surface_stride, atom, surfaces, 1, 1, atom,
                            what), 0, 1),)
    operand = np.zeros((state.channels, height, width), np.float32)
    if rdma.comb_use == 0:
        return operand, ((_surface_rows(memory, where, rdma.ew_address, rdma.ew_surface_stride, rdma.ew_line_stride,
                                        surfaces, height, width, atom, what), 0, 1),)
    if rdma.comb_use == dpu.COMB_SPLIT and not state.flying and state.size_e == 1 and rdma.main_enabled:
        # dpu._split_operand: even surfaces from the MRDMA, odd from the ERDMA
        even = _surface_rows(memory, where, rdma.src_address, rdma.surface_stride, rdma.line_stride,
                             -(-surfaces // 2), height, width, atom, "MRDMA surfaces")
        odd = _surface_rows(memory, where, rdma.ew_address, rdma.ew_notch_stride, rdma.ew_line_stride,
                            surfaces // 2, height, width, atom, "ERDMA surfaces")
        return operand, ((even, 0, 2), (odd, 1, 2))
    return None, ()


#: narrow rows (fp16_atoms' blocked loop) of a surface that follow each other in the region are stored as
#: one row, of at most this many pixels (the row loop's buffer: 16 KiB at C2 = 8)
_MERGED_ROW = 1024


def _store(channels: int, height: int, width: int, c2: int, offsets: np.ndarray, data: np.ndarray,
           merge: bool = True) -> tuple:
    """``pack_step``'s store block of ``out``'s first ``channels`` planes as [C][H][W] rows (an
    interleaved write: [C][H*W][1]): (row offsets, C2, channels, height, width), and the region.
    Where each surface's rows are narrow and follow each other in the region (a dense surface:
    7x7, 14x14 maps; ``_dense_surfaces``), the block stores each surface as one row of H*W pixels:
    the same elements into the same places in the same order (rows of one surface never overlap),
    through ``fp16_atoms``' row loop instead of its blocked loop (256x14x14: 0.43 -> 0.11 ns an
    element, 512x7x7: 0.53 -> 0.22); not ``merge``: the rows as they are (a step from atoms to atoms)."""
    if merge and _dense_surfaces(offsets, height, width, c2):
        return (offsets[::height].copy(), c2, channels, 1, height * width), data
    return (offsets, c2, channels, height, width), data


def _dense_surfaces(offsets: np.ndarray, height: int, width: int, c2: int) -> bool:
    """Whether ``fp16_atoms``' blocked loop would store these rows (narrower than its ``_WIDE_ROW``)
    and each surface's rows follow each other (row y + 1 where row y ends), at most ``_MERGED_ROW``
    pixels a surface."""
    if height < 2 or width >= _WIDE_ROW or height * width > _MERGED_ROW or offsets.size % height:
        return False
    rows = offsets.reshape(-1, height)
    return bool(np.all(rows[:, 1:] - rows[:, :-1] == width * c2))


def _atoms_form(settings: tuple, lut: bool, shape: tuple, operand: np.ndarray, main_rows: tuple | None,
                stored: tuple) -> bool:
    """Whether the step runs from the MRDMA's atom rows straight into the WDMA's (kernels/dpu_fp_atoms.py):
    a flying task whose chain is EW alone (``dpu_fp_fused``'s forms 4 to 7: no BS / BN operation or ReLU,
    no LUT), its operand one value or one a channel, its fp16 store of every channel in rows of the
    read's layout (lanes, lines, pixels a line, row count), and no store row over a source row read
    after it."""
    if main_rows is None or stored is _NO_STORE or lut:
        return False
    x_params, _, _, _, stages, e_params, _, _ = settings
    form = dpu_fp_fused.form_of(x_params, stages, e_params, lut, dpu_fp_fused.operand_form(shape, operand.shape),
                                shape[1] * shape[2])
    channels, height, width, c2, targets, data = stored
    region, sources, rows_height, lanes = main_rows
    x_relus = any(x_params[s][dpu_fp_chain.X_RELU] or x_params[s][dpu_fp_chain.X_RELUX] for s in range(stages))
    if not 4 <= form <= 7 or x_relus or operand.size not in (1, shape[0]) or channels != shape[0] or lanes != c2 \
            or rows_height != height or width != shape[2] or sources.size != targets.size \
            or dpu_fp_atoms.PIECE % c2 or sources.size > _ATOM_ROWS:
        return False
    return _no_hazard(region, sources, data, targets, width * c2)


#: most rows ``_no_hazard`` compares (pairwise: [rows][rows] boolean arrays at prepare time)
_ATOM_ROWS = 1024


def _no_hazard(region: np.ndarray, sources: np.ndarray, data: np.ndarray, targets: np.ndarray, line: int) -> bool:
    """Whether writing target row j (elements ``targets[j]``, ``line`` of them) after reading source rows
    0..j changes no source row read later: the regions apart, or in one region no target row over a
    source row i >= j, except its own row in place (i == j, the same elements: each piece read, then written)."""
    if not np.may_share_memory(region, data):
        return True
    # (two uint16 views of one region's bytes, maybe apart: the targets in the source view's elements)
    shift = data.__array_interface__["data"][0] - region.__array_interface__["data"][0]
    if shift % 2 or region.strides != (2,) or data.strides != (2,):
        return False
    source, target = sources[:, None], targets[None, :] + shift // 2  # [i][j]
    over = (source < target + line) & (target < source + line)
    later = np.arange(sources.size)[:, None] >= np.arange(targets.size)[None, :]
    in_place = np.diag(sources == targets + shift // 2)
    return not np.any(over & later & ~in_place)


def _writer(state: DpuState, memory: Memory, where: str, shape: tuple, scaled: bool = False) -> tuple:
    """``dpu._write`` (``TaskDma.write_planes``) with the WDMA's rows located once: (store, write,
    invalidate) - ``store`` the ``fp16_step`` store of its float32 [C][H][W] result as OUT_CVT
    rounds it to fp16 (kernels/fp16_atoms.py), or ``_NO_STORE`` where OUT_CVT does more (then
    ``write(dpu.float_output(...)[0])``); ``invalidate()`` drops the derived values the store
    overwrote. (None, None, None) where the rows do not start on a multiple of the element size
    (write_planes' other branch). ``scaled``: the caller's results already carry MINUS_EXP's scale
    (the integer path's int -> fp16 conversion, units/dpu_plan_convert.py), so OUT_CVT only rounds."""
    dtype = PRECISION_DTYPES[state.out_precision]
    c2 = c2_of(dpu_bf16.carrier(state.out_precision), state.atom_bytes)
    wdma = dpu._WDMA(state, c2, dtype.itemsize)
    channels = min(state.channels, wdma.surfaces * c2)
    # an interleaved write's rows are single atoms, pixels apart (dpu_interleave.as_pixel_rows)
    interleaved = dpu_interleave.is_interleaved(state)
    height, width = (state.height * state.width, 1) if interleaved else (state.height, state.width)
    if wdma.starts.size != -(-channels // c2) * height:
        return None, None, None
    row_bytes = width * c2 * dtype.itemsize
    located = memory.locate_fixed(wdma.starts, row_bytes, lambda: f"{where}: {wdma.what} write")
    unsigned = np.dtype(f"u{dtype.itemsize}")
    elements = located.elements(unsigned)
    if elements is None:
        return None, None, None
    data, offsets = elements
    invalidate = memory.derived.rows_drop(located.starts, row_bytes, located.bounds)

    def write(out: np.ndarray) -> None:
        if out.dtype != dtype:  # (float_output's element type is the OUT_PRECISION's)
            raise EmulationError(f"{where}: fp16 step: output {out.dtype}, expected {dtype}")
        scatter_planes(np.ascontiguousarray(out[:channels]).reshape(channels, height, width).view(unsigned), c2,
                       offsets, data)
        invalidate()

    # (its planes and rows, for a store made by a batch's op: ``_int8_store``)
    write.rows = (channels, height, width, c2, np.ascontiguousarray(offsets, np.int64), data)

    # fp16 outputs without the MINUS_EXP scale: OUT_CVT's rounding (dpu.float_output: kernels.dpu.out_cvt_fp16)
    # as the atoms are stored, the same bytes without the fp16 copy of the cube
    if state.out_precision != FP16 or state.out_cvt.minus_exp and not scaled or not offsets.size:
        return _NO_STORE, write, invalidate
    return (channels, height, width, c2, np.ascontiguousarray(offsets, np.int64), data), write, invalidate
