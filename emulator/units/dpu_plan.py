"""A task program's DPU step (issue 20, emulator/task_plan.py): ``run_dpu`` of one decoded
state pair for one memory, with its stage settings, BRDMA operands, stage plan and WDMA rows
worked out once, so a run is the EW operand's read (when it comes from the ERDMA; its rows
located once), the drop of the derived values the write covers, and the stage kernel.

It takes the integer path's common forms - the main cube from the CORE (``prepare_dpu``) or, in
flying mode, a plain MRDMA read (``prepare_flying_dpu``: COMB_USE 0, rows located once and
copied per run, the stages run from its atoms to the WDMA's where they can, ``_atoms_kernel``,
kernels/dpu_atoms.py - for int8 in the SE gates' forms one compiled call reading the rows where
they lie, ``_flying_call``, kernels/dpu_flying_lines.py - and with the float64 chain without EW a batch's
op, ``_chain_batch``; or its unpooling copy); no reduction,
transpose, lane padding, packed write or NRDMA operand, no int -> fp16 conversion, whole-word
atoms whose rows do not overlap (an interleaved write's rows are its atoms: lines of one pixel,
kernels/dpu_interleave.py) - and hands back None
for anything else: the core then runs the task the full way. With the LUT on, the stages run
pixel-major with the LUT between BN and EW (``_lut_store``: the same per-element functions as the
full path's [C][H][W] passes; with a register EW operand LUT, EW and OUT_CVT as one table,
kernels/lut.py), reading the LUT RAM the core holds (``lut_tables``, written in place by the
chain's LUT writes) as each run finds it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator.kernels import (dpu_atoms, dpu_flying_lines, dpu_int32, dpu_interleave, dpu_stage_lines,
                                     dpu_transpose, dpu_unpool, lut)
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels.dpu import _OPERAND_MATRICES
from npuemu.emulator.kernels.dpu_pixel import planned_to_atoms
from npuemu.emulator.kernels.dpu_pixel_plan import prepare_planned_to_atoms
from npuemu.emulator.memory import Memory, TaskDma, gather_rows, scatter_rows
from npuemu.emulator.units import dpu
from npuemu.emulator.units.cna_core import CoreResult
from npuemu.emulator.units.state import FP16, PRECISION_DTYPES, DpuRdmaState, DpuState, c2_of
from npuemu.isa.errors import EmulationError

#: stands for the CORE's window sums while the settings are worked out (filled in per run)
_SUMS_SLOT = np.zeros((1, 1), np.int64)
#: largest CORE output (elements) whose [1][P][C] view a DPU step keeps between runs
_HELD_OUTPUT = 1 << 14
#: largest window sums (elements) whose flat view a LUT step keeps between runs
_SEEN_SUMS = 1 << 16


def prepare_dpu(state: DpuState, rdma: DpuRdmaState | None, memory: Memory, where: str,
                lut_tables: np.ndarray | None = None) -> Callable[[CoreResult], None] | None:
    """``run(source)`` doing what ``run_dpu(state, rdma, source, ...)`` does to memory and the
    derived cache (not the DMA counts: the caller keeps those of a full run), or None (see the
    module docstring). The BRDMA operands are held: ``run.held`` lists them as (derived-cache
    key, value), and the caller must not run it once a write over their bytes dropped them.
    ``lut_tables``: the core's LUT RAM [2][513] (a task with the LUT on needs it: None otherwise)."""
    if state.flying:
        return None
    store = _prepare_store(state, rdma, memory, where, lut_tables, np.dtype(np.int32), pixel_major=True)
    if store is None:
        return None
    pixels, channels = state.height * state.width, state.channels
    # the CORE's output array and a [1][P][C] view of it: a small layer's is the same array every run
    # (conv_pixels.prepare_conv_int8_pixels; a large one's, the thread's scratch, is not held here)
    last = [None, None]

    kernel, read_ew, operand, drop, _, with_sums = store.parts

    def direct(data: np.ndarray, window_sums: np.ndarray | None) -> None:
        if data is last[0]:  # (``store`` inline: issue 20, fixed cost per task)
            ew = operand if read_ew is None else read_ew()
            drop()
            kernel(last[1], window_sums if with_sums else None, ew)
            return
        blocks = np.ascontiguousarray(data, np.int32).reshape(1, pixels, channels)
        if data.dtype == np.int32 and data.flags.c_contiguous and data.size <= _HELD_OUTPUT:  # (a view of it)
            last[:] = [data, blocks]
        store(blocks, window_sums)

    def run(source: CoreResult) -> None:
        direct(source.data, source.window_sums)

    def chained(data: np.ndarray, window_sums: np.ndarray | None):
        """For a CORE step whose outputs are ``data`` and ``window_sums`` on every run (its own arrays):
        (``drop()``: the drop of the derived values over the rows it writes, the stage kernel's ``chain_form``
        for them, kernels/dpu_pixel_plan.py) - ``direct`` with its chain call made by the caller - or None."""
        form = getattr(kernel, "chain_form", None)
        if form is None or data.dtype != np.int32 or not data.flags.c_contiguous:
            return None
        if read_ew is not None:
            return _ew_chained(form, read_ew, drop, data.reshape(1, pixels, channels),
                               window_sums if with_sums else None)
        made = form(data.reshape(1, pixels, channels), window_sums if with_sums else None, operand)
        return None if made is None else (drop, made)

    def lut_form(data: np.ndarray, window_sums: np.ndarray | None):
        """For a CORE step whose outputs are ``data`` and ``window_sums`` on every run (its own arrays) and
        whose stages store through the folded LUT table: (``drop()``: ``direct``'s drop of the derived values,
        ``_lut_store``'s ``folded_form`` for them) - ``direct`` with its kernel call made
        by the caller (kernels/step_batch.py) - or None."""
        form = getattr(kernel, "folded_form", None)
        if form is None or read_ew is not None or data.dtype != np.int32 or not data.flags.c_contiguous \
                or data.size != pixels * channels:
            return None
        made = form(data.reshape(1, pixels, channels), window_sums if with_sums else None)
        return None if made is None else (drop, made)

    run.held, run.direct = store.held, direct  # (direct: the CORE's pixel-major data and window sums)
    direct.chained, direct.lut_form = chained, lut_form
    return run


def _ew_chained(form: Callable, read_ew: Callable, drop: Callable, blocks: np.ndarray, window_sums: np.ndarray | None):
    """``chained``'s answer for a stage chain with its EW operand read from the ERDMA every run (rows located
    once: ``_ew_reader``'s ``copied``, a plain or a split operand's): (``drop``, ("ew", the chain's arguments with the read's - its memory, row
    offsets, an array of the step's own the rows are copied into and its int8 atoms view - in place of the
    operand, the general stages' call on that view)); None where the chain form takes another way
    (kernels/dpu_pixel_plan.py ``_ew_form``) or the read is not a plain one."""
    found = getattr(read_ew, "copied", None)
    if found is None:
        return None
    data, offsets, row_bytes, shape, dtype = found
    if data.dtype != np.uint8 or data.ndim != 1:
        return None
    rows = np.empty((offsets.size, row_bytes), np.uint8)
    made = form(blocks, window_sums, rows.view(dtype).reshape(shape))
    if made is None or made[0] != "ew":
        return None
    kind, (window, layout, floats, atoms, *rest), fallback = made
    return drop, (kind, (window, layout, floats, data, np.ascontiguousarray(offsets, np.int64), rows, atoms, *rest),
                  fallback)


def prepare_flying_dpu(state: DpuState, rdma: DpuRdmaState | None, memory: Memory, where: str,
                       lut_tables: np.ndarray | None = None) -> Callable[[object], None] | None:
    """A flying DPU task's ``run(cbuf)`` (the CBUF unused): ``_main_blocks``'s MRDMA read of the
    main cube (its rows located once, copied per run) and ``prepare_dpu``'s stages and write;
    a plain read only (COMB_USE 0, an integer element type, no window sums), or the unpooling
    copy (``_prepare_unpool``): None otherwise."""
    if state.flying and rdma is not None and rdma.unpool is not None:
        return _prepare_unpool(state, rdma, memory, where)
    if not state.flying or rdma is None or rdma.comb_use != 0 or not rdma.main_enabled \
            or rdma.in_precision != state.in_precision or rdma.in_precision not in PRECISION_DTYPES:
        return None
    dtype = PRECISION_DTYPES[rdma.in_precision]
    if dtype.kind != "i" or not state.bs.bypass and not state.bs.cpend_bypass:
        return None  # (CPEND needs the CNA's window sums: the full path raises)
    surfaces = -(-state.channels // c2_of(rdma.in_precision, rdma.atom_bytes))
    starts = dpu._SURFACE_ROWS(rdma.src_address, rdma.surface_stride, rdma.line_stride, surfaces, state.height)
    row_bytes = state.width * c2_of(rdma.in_precision, rdma.atom_bytes) * dtype.itemsize
    try:
        located = memory.locate_fixed(starts, row_bytes, lambda: f"{where}: DPU_RDMA main cube read")
    except EmulationError:
        return None
    store = _prepare_store(state, rdma, memory, where, lut_tables, dtype)
    if store is None:
        return None
    fused = _flying_call(state, store, located, row_bytes, dtype)
    if fused is not None:
        fused.held = store.held
        return fused
    data, offsets, shape = located.region.data, located.offsets, (surfaces, state.height * state.width, -1)

    def run(cbuf: object) -> None:
        rows = np.empty((offsets.size, row_bytes), np.uint8)
        gather_rows(data, offsets, rows)
        store(rows.view(dtype).reshape(shape), None)

    run.held = store.held
    batch = _chain_batch(store, located, row_bytes, dtype)
    if batch is not None:
        run.batch = batch
    return run


#: largest main cube (bytes) a flying chain step keeps for its batch form (``_chain_batch``)
_KEPT_CUBE = 1 << 16


def _chain_batch(store: Callable, located, row_bytes: int, dtype: np.dtype) -> tuple | None:
    """A flying int8 step's ``step.batch`` (task_batches.StepBatch, kernels/step_batch.py FLYING_CHAIN) where its
    store runs dpu_atoms' chain without EW (``_atoms_kernel``'s ``flying_chain``): its Python part the drop of
    the derived values, its call the MRDMA rows' copy into a cube of its own and the chain loop - what ``run``
    does (the run's other checks hold for every run: the cube's type and shape are fixed). None otherwise."""
    kernel, _, _, drop, _, _ = store.parts
    made = getattr(kernel, "flying_chain", None)
    if made is None or dtype != np.int8:
        return None
    floats, chain, channels, height, width, c2, out, offsets, loop = made
    rows = np.ascontiguousarray(located.offsets, np.int64)
    surfaces = rows.size // height
    if row_bytes != width * c2 or rows.size != surfaces * height or surfaces < min(offsets.size // height,
                                                                                   -(-channels // c2)) \
            or rows.size * row_bytes > _KEPT_CUBE or located.region.data.dtype != np.uint8:
        return None  # (``dpu_atoms._checked``'s per-run checks, refused at once)
    cube = np.empty((surfaces, height * width, c2), np.int8)
    arguments = (located.region.data, rows, cube, floats, chain, channels, height, width, out, offsets, loop)

    def pre(cbuf: object) -> None:
        drop()

    return pre, ((dpu_flying_lines.gather_chain, arguments),), None, None


def _flying_call(state: DpuState, store: Callable, located, row_bytes: int, dtype: np.dtype) -> Callable | None:
    """``run(cbuf)`` as one compiled call (``dpu_flying_lines.flying_lines``: the main cube and the
    ERDMA operand read from memory where they lie, the stages, the WDMA's atoms) where the store's
    kernel has the form (``_atoms_kernel``'s ``flying``), the operand (if any) is a plain ERDMA read
    (``_ew_reader``'s ``rows``) and no written byte lies among the read ones (the full path reads
    the whole of both before it writes); None otherwise."""
    kernel, read_ew, operand, drop, rows, _ = store.parts  # (no window sums in flying mode)
    made = getattr(kernel, "flying", None)
    if made is None or dtype != np.int8:
        return None
    form, c2, out_region, out, out_rows = made
    height, width, channels = state.height, state.width, state.channels
    needed = -(-channels // c2)
    main = located.region.data.view(np.int8)
    if row_bytes != width * c2 or located.offsets.size < needed * height:
        return None
    reads = [(located.region, located.offsets, row_bytes)]
    ew_rows, per_pixel, ew_data = np.zeros(1, np.int64), False, _NO_EW
    if read_ew is not None:
        found = getattr(read_ew, "rows", None)
        if found is None:
            return None
        region, ew_rows, shape, ew_dtype = found
        per_pixel = shape[1] > 1
        if ew_dtype != np.int8 or shape[2] != c2 or shape[1] not in (1, height * width) or shape[0] < needed:
            return None
        reads.append((region, ew_rows, c2 * (width if per_pixel else 1)))
        ew_data = region.data.view(np.int8)
    elif operand is not None:
        return None
    starts, line, bounds = rows
    if not all(_apart(region, offsets, size, out_region, out_rows, line) for region, offsets, size in reads):
        return None
    call = dpu_flying_lines.flying_lines
    main_rows, ew_rows, out_rows = (np.ascontiguousarray(rows, np.int64) for rows in (located.offsets, ew_rows,
                                                                                      out_rows))

    def run(cbuf: object) -> None:
        drop()
        call(main, main_rows, ew_data, ew_rows, per_pixel, form, channels, height, width, c2, out, out_rows)

    def pre(cbuf: object) -> None:
        drop()

    # the compiled form for task_batches.StepBatch (kernels/step_batch.py FLYING_LINES): its Python part the drop,
    # its call ``run``'s (which never refuses: no general stages to fall back on)
    run.batch = (pre, ((call, (main, main_rows, ew_data, ew_rows, int(per_pixel), form, channels, height, width, c2,
                               out, out_rows)),), None, None)
    return run


_NO_EW = np.zeros(1, np.int8)


def _apart(region, offsets: np.ndarray, size: int, other, other_offsets: np.ndarray, other_size: int) -> bool:
    """Whether rows of ``size`` bytes at ``offsets`` in ``region`` share no byte with those of
    ``other_size`` at ``other_offsets`` in ``other`` (their spans apart, or other memory)."""
    if region is not other:
        return not np.may_share_memory(region.data, other.data)
    return int(offsets.max()) + size <= int(other_offsets.min()) or int(other_offsets.max()) + other_size <= \
        int(offsets.min())


def _prepare_unpool(state: DpuState, rdma: DpuRdmaState, memory: Memory, where: str) -> Callable | None:
    """``dpu_unpool.run_unpool`` (every MRDMA atom into its kernel block) with its source and output
    rows located once: the same reads, copies and writes; None where a row lies outside the memory."""
    atom = rdma.atom_bytes
    sources, outputs = dpu_unpool._ROW_STARTS(state, rdma)
    read_bytes, write_bytes = rdma.width * atom, state.width * atom
    try:
        source = memory.locate_fixed(sources, read_bytes, lambda: f"{where}: DPU_RDMA unpooling source read")
        target = memory.locate_fixed(outputs, write_bytes, lambda: f"{where}: DPU unpooling output write")
    except EmulationError:
        return None
    shape, kernel_w, kernel_h = (rdma.height, rdma.width, atom), rdma.unpool.kernel_w, rdma.unpool.kernel_h
    drop = memory.derived.rows_drop(target.starts, write_bytes, target.bounds)

    def run(cbuf: object) -> None:
        raw = np.empty((source.offsets.size, read_bytes), np.uint8)
        gather_rows(source.region.data, source.offsets, raw)
        rows = dpu_unpool.unpool_atoms(raw.reshape(shape), kernel_w, kernel_h)
        scatter_rows(np.ascontiguousarray(rows).reshape(-1, write_bytes), target.offsets, target.region.data)
        drop()

    run.held = ()
    return run


def _prepare_store(state: DpuState, rdma: DpuRdmaState | None, memory: Memory, where: str,
                   lut_tables: np.ndarray | None, data_dtype: np.dtype, pixel_major: bool = False) -> Callable | None:
    """``store(blocks, window_sums)``: ``_run_integer``'s stages and WDMA write for main blocks of
    ``data_dtype`` (the CORE's [1][P][C] int32, or the MRDMA's [S][P][C2] atoms), the ERDMA
    operand read per run; ``store.held`` as ``prepare_dpu``'s. None for forms it does not take.
    ``pixel_major``: the blocks are always int32 [1][P][C], C-contiguous (the stage kernel's
    ``direct`` form then runs, kernels/dpu_pixel_plan.py)."""
    if rdma is None or rdma.unpool is not None or state.proc_precision not in dpu.INTEGER_PROCESSING \
            or state.out_precision == FP16 or state.minmax_ctl or state.offset_pend or state.transpose is not None \
            or state.pads_lanes or dpu_transpose.is_notched_copy(state, rdma) or dpu_int32.pads_past_orig(state) \
            or isinstance(state, dpu_int32.PackedDpuState) \
            or not state.bn.bypass and state.bn.alu_from_dma and not state.bn.alu_bypass:
        return None  # (run_dpu's other branches, _run_integer's packed write, an NRDMA operand read each run)
    fixed = dpu._fixed_settings(state, where)
    if fixed.lut and lut_tables is None or fixed.c2 * fixed.out_dtype.itemsize % 8:
        return None
    located = memory.locate_fixed(fixed.starts, fixed.line, lambda: f"{where}: {fixed.what} write")
    claimed = located.elements(np.dtype(np.uint64)) if located.disjoint() else None
    if claimed is None:
        return None
    words, offsets = claimed
    scratch = TaskDma(memory, where)  # (its counts are not kept)
    stages, tail = dpu._integer_settings(state, fixed, rdma, _SUMS_SLOT, scratch, where)
    made_of = (stages.get("bs_alu"), stages.get("bs_cpend"), stages.get("bs_mul"))
    if any(isinstance(part, np.ndarray) and part.flags.writeable for part in made_of):
        return None  # an operand that may change in place
    with_sums = "window_sum" in stages
    operand = tail.get("ew_operand")
    from_erdma = operand is not None and not state.ew.op_bypass and state.ew.op_from_dma
    bounds, line, starts = located.bounds, fixed.line, located.starts
    drop = memory.derived.rows_drop(starts, line, bounds)  # (the derived values over the rows it writes)
    # an interleaved write's rows are single atoms (kernels/dpu_interleave.py): lines one pixel wide
    width = 1 if dpu_interleave.is_interleaved(state) else state.width
    c2, surfaces = fixed.c2, fixed.surfaces
    if fixed.lut:
        kernel = _lut_store(state, fixed, stages, tail, lut_tables, width, words, offsets)
        if kernel is None:
            return None
    else:
        blocks_type = np.empty((1, 0, 0), data_dtype)  # (the plan reads the main blocks' type)
        plan = dpu._stage_plan(state, rdma, blocks_type, stages, tail)
        kernel = prepare_planned_to_atoms(plan, state.height * state.width, width, words, offsets, c2, surfaces,
                                          None if from_erdma else operand) \
            or (lambda data, sums, ew: planned_to_atoms(plan, data, width, words, offsets, c2, surfaces, sums, ew))
        if pixel_major and getattr(kernel, "direct", None) is not None:
            kernel = kernel.direct
        elif not pixel_major:
            kernel = _atoms_kernel(state, plan, fixed, located, width, from_erdma or plan.ew is None, kernel)

    read_ew = _ew_reader(state, rdma, memory, where, operand) if from_erdma else None

    def store(blocks: np.ndarray, window_sums: np.ndarray | None) -> None:
        ew = read_ew() if from_erdma else operand
        drop()
        kernel(blocks, window_sums if with_sums else None, ew)

    store.held = _held_blob(state, rdma, memory, where)
    # what ``store`` runs, for a caller doing it inline: the kernel, the ERDMA read (or None: ``operand``
    # each run), the drop of the derived values over the rows it writes (``rows_drop``) and those rows,
    # whether the kernel takes the window sums
    store.parts = (kernel, read_ew, operand, drop, (starts, line, bounds), with_sums)
    return store


def _atoms_kernel(state: DpuState, plan: dp.StagePlan, fixed, located, width: int, operand_read: bool,
                  general: Callable) -> Callable:
    """``kernel(blocks, window_sums, ew_operand)`` for the MRDMA's atoms: ``kernels.dpu_atoms``'
    chain (or int64 stages, where the plan has no chain) from atoms to atoms (issue 20: no
    pixel-major copies) where there is no CPEND, an EW operand (if any) read by the ERDMA per run,
    the WDMA's atoms the MRDMA's C2 and plain lines (not interleaved); ``general`` otherwise, and
    for a run whose blocks or operand it does not take."""
    bs, chain, ew = plan.bs, plan.chain, plan.ew
    elements = located.elements(fixed.out_dtype)
    if bs is not None and bs.cpend_enable or not operand_read or elements is None \
            or width != state.width or fixed.line != width * fixed.c2 * fixed.out_dtype.itemsize:
        return general
    out, offsets = elements
    if chain is not None:  # (no window sums: always within the chain's bound)
        atoms = dpu_atoms.prepare_chain_atoms(chain[0], plan.floats, plan.channels, state.height, width, fixed.c2,
                                              out, offsets)
    else:  # prepare_planned_to_atoms' settings of the int64 stages
        settings = (dp._stage_flags(bs is not None, plan.bn is not None, ew is not None),
                    dp._x_params(bs or dp._BYPASSED), plan.bs_operands, dp._x_params(plan.bn or dp._BYPASSED),
                    plan.bn_operands, dp._ew_params(ew or dp._EW_BYPASSED),
                    dp._cvt_params(plan.cvt or dp._IDENTITY, plan.out_dtype))
        atoms = dpu_atoms.prepare_stages_atoms(settings, plan.channels, state.height, width, fixed.c2, out, offsets)
    if atoms is None:
        return general
    # (the stages as one compiled call, main cube and operand read from memory: prepare_flying_dpu)
    form = _flying_form(plan, settings, fixed) if chain is None else None

    data_dtype, operand_dtype = plan.data_dtype, plan.operand_dtype

    def kernel(blocks: np.ndarray, window_sums: np.ndarray | None, ew_operand: np.ndarray | None) -> None:
        # (other element types: the general run, which raises where the plan does not fit them)
        if blocks.dtype != data_dtype or operand_dtype is not None and (
                ew_operand is None or ew_operand.dtype != operand_dtype) or not atoms(blocks, ew_operand):
            general(blocks, window_sums, ew_operand)

    if form is not None:  # (the WDMA's bytes are int8 elements: the offsets are those of ``elements``)
        kernel.flying = (form, fixed.c2, located.region, out, offsets)
    elif chain is not None and plan.ew is None and chain[0][dp.CH_EW_ON] == 0 and data_dtype == np.int8 \
            and operand_dtype is None:
        # (the chain's loop as ``prepare_chain_atoms`` picks it and its arguments, for ``_chain_batch``)
        loop = dpu_flying_lines.flying_loop(chain[0][dp.CH_EVEN] != 0, chain[0][dp.CH_LOW1] == 0.0)
        kernel.flying_chain = (plan.floats, chain[0], plan.channels, state.height, width, fixed.c2, out,
                               np.ascontiguousarray(offsets, np.int64), loop)
    return kernel


def _flying_form(plan: dp.StagePlan, settings: tuple, fixed) -> np.ndarray | None:
    """``dpu_flying_lines.flying_form`` for int8 data, operand and output; None for other types."""
    stages, bs, _, _, _, ew, cvt = settings
    int8 = np.dtype(np.int8)
    if plan.data_dtype != int8 or plan.out_dtype != int8 or plan.operand_dtype not in (None, int8):
        return None
    lines = dpu_stage_lines.lines_settings(stages, bs, ew, cvt)
    if lines is None:
        return None
    return dpu_flying_lines.flying_form(stages, lines, plan.bs_operands, plan.channels, fixed.surfaces, fixed.c2,
                                        plan.data_dtype)


def _ew_reader(state: DpuState, rdma: DpuRdmaState, memory: Memory, where: str,
               operand: np.ndarray) -> Callable[[], np.ndarray]:
    """``read()``: ``dpu._ew_operand``'s ERDMA operand (``operand``: the one it read as the step
    was made), its rows located once and copied per run - the plain reads (COMB_USE 0, per pixel
    or per channel: the rows ``read_surfaces`` takes); ``dpu._ew_operand`` itself otherwise."""
    def full() -> np.ndarray:
        return dpu._ew_operand(state, rdma, TaskDma(memory, where), where)

    split = rdma.comb_use == dpu.COMB_SPLIT and rdma.erdma_mode == dpu.ERDMA_PER_PIXEL and not state.flying \
        and state.size_e == 1 and rdma.main_enabled
    if rdma.comb_use != 0 and not split or rdma.erdma_mode not in (dpu.ERDMA_PER_PIXEL, dpu.ERDMA_PER_CHANNEL):
        return full
    dtype, shape = operand.dtype, operand.shape
    c2 = c2_of(dpu._PRECISION_OF[dtype], rdma.atom_bytes)
    per_pixel = rdma.erdma_mode == dpu.ERDMA_PER_PIXEL
    height, width = (state.height, state.width) if per_pixel else (1, 1)
    row_bytes = width * c2 * dtype.itemsize
    if shape != (shape[0], height * width, c2):
        return full
    try:
        if split:  # dpu._split_operand's two reads, as one list of rows in surface order
            data, offsets = _split_rows(rdma, memory, where, shape[0], height, row_bytes)
        else:
            starts = dpu._SURFACE_ROWS(rdma.ew_address, rdma.ew_surface_stride,
                                       rdma.ew_line_stride if per_pixel else rdma.atom_bytes, shape[0], height)
            located = memory.locate_fixed(starts, row_bytes, lambda: f"{where}: ERDMA operand read")
            data, offsets = located.region.data, located.offsets
    except EmulationError:
        return full
    if data is None:
        return full

    def read() -> np.ndarray:
        rows = np.empty((offsets.size, row_bytes), np.uint8)
        gather_rows(data, offsets, rows)
        return rows.view(dtype).reshape(shape)

    if not split:  # (its rows, for a caller reading them itself: _flying_call)
        read.rows = (located.region, offsets, shape, dtype)
    # (what it copies, for a caller copying the rows itself into an array of its own: _ew_chained)
    read.copied = (data, offsets, row_bytes, shape, dtype)
    return read


def _split_rows(rdma: DpuRdmaState, memory: Memory, where: str, surfaces: int, height: int,
                row_bytes: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The memory bytes and row offsets of ``dpu._split_operand``'s operand (COMB_USE 5): surface
    2k is the MRDMA's surface k (SRC_BASE_ADDR, SURF/LINE_STRIDE), surface 2k + 1 the ERDMA's
    surface k (EW_BASE_ADDR, EW_SURF_NOTCH / EW_LINE_STRIDE), each ``height`` rows; (None, None)
    where the two lie in different regions (then the full read runs)."""
    first = memory.locate_fixed(dpu._SURFACE_ROWS(rdma.src_address, rdma.surface_stride, rdma.line_stride,
                                                  -(-surfaces // 2), height), row_bytes,
                                lambda: f"{where}: MRDMA split operand read")
    second = memory.locate_fixed(dpu._SURFACE_ROWS(rdma.ew_address, rdma.ew_notch_stride, rdma.ew_line_stride,
                                                   surfaces // 2, height), row_bytes,
                                 lambda: f"{where}: ERDMA split operand read")
    if first.region is not second.region:
        return None, None
    offsets = np.empty((surfaces, height), np.int64)
    offsets[0::2] = first.offsets.reshape(-1, height)
    offsets[1::2] = second.offsets.reshape(-1, height)
    return first.region.data, offsets.reshape(-1)


def _held_blob(state: DpuState, rdma: DpuRdmaState, memory: Memory, where: str) -> tuple:
    """The BRDMA blob ``dpu._integer_settings`` took from the derived cache, as (key, value) -
    the key ``dpu.read_bias_blob`` looks it up by - or nothing when the BS stage reads none."""
    if not dpu._PAIRS(state, rdma).brdma_needed:
        return ()
    return held_blob_entry(state, rdma, memory, where)


def held_blob_entry(state: DpuState, rdma: DpuRdmaState, memory: Memory, where: str) -> tuple:
    """The BRDMA blob of a BS stage that reads one, as ``((derived-cache key, value),)``."""
    blob = dpu._BLOBS.get(rdma, state.channels)
    located = memory.locate_fixed(blob.address, blob.nbytes, lambda: f"{where}: {blob.what} read")
    key = (int(located.starts[0]), blob.nbytes, blob.key)
    return ((key, memory.derived.get(key)),)


def _seen_layout(seen: list, window_sum: np.ndarray | None, channels: int, pixels: int) -> tuple:
    """``dp._window_layout(window_sum, channels, pixels)``, kept in ``seen`` (the sums and the answer)
    where it is a view of a small CORE step's sums, the same array every run (issue 20)."""
    if window_sum is seen[0]:
        return seen[1]
    made = dp._window_layout(window_sum, channels, pixels)
    if window_sum.size <= _SEEN_SUMS and np.may_share_memory(made[0], window_sum):
        seen[:] = [window_sum, made]
    return made


def _lut_store(state: DpuState, fixed, stages: dict, tail: dict, tables: np.ndarray, width: int,
               words: np.ndarray, offsets: np.ndarray) -> Callable | None:
    """``store(blocks, window_sums, ew_operand)``: the full path's BS -> BN -> LUT -> EW -> OUT_CVT
    of ``_run_integer`` on the main blocks (a channel-block cube), stored into the WDMA's atoms
    (``kernels.lut._lut_stages_to_atoms``; with a register EW operand ``lut._lut_table_to_atoms``, or
    ``lut_folded.folded_to_atoms`` where BN folds into its table); None for settings the full path refuses."""
    from npuemu.emulator.kernels import lut_folded  # (here: the rest of this module is another helper's, issue 20)

    try:
        params = dpu._lut_config(state.lut).parameters()
    except EmulationError:
        return None
    channels, c2, surfaces = state.channels, fixed.c2, fixed.surfaces
    pixels = state.height * state.width
    if offsets.shape != (surfaces * (pixels // width),) or surfaces < 1 or tables.shape != (2, lut.LUT_ENTRIES) \
            or tables.dtype != np.int16:
        return None
    bs, bn, ew = stages.get("bs"), stages.get("bn"), tail.get("ew")
    bs_operands = _OPERAND_MATRICES.get(channels, () if bs is None else (
        (stages["bs_alu"], "BS ALU operand"), (stages["bs_cpend"], "CPEND operand"),
        (stages["bs_mul"], "BS MUL operand")), 3)
    bn_operands = _OPERAND_MATRICES.get(channels, () if bn is None else (
        (stages["bn_alu"], "BN ALU operand"), (stages["bn_mul"], "BN MUL operand")), 2)
    settings = (dp._stage_flags(bs is not None, bn is not None, ew is not None), dp._x_params(bs or dp._BYPASSED),
                bs_operands, dp._x_params(bn or dp._BYPASSED), bn_operands)
    ew_params, cvt = dp._ew_params(ew or dp._EW_BYPASSED), dp._cvt_params(fixed.cvt, fixed.out_dtype)
    cpend, offsets = bs is not None and bs.cpend_enable, np.ascontiguousarray(offsets, np.int64)
    le, lo, per_block, out_dtype = tables[0], tables[1], max(1, dp.BLOCK_ELEMENTS // channels), fixed.out_dtype
    constant = None  # a register operand (or none): LUT, EW and OUT_CVT as one table (kernels.lut)
    if ew is None or state.ew.op_bypass or not state.ew.op_from_dma:
        constant = 0 if ew is None else int(tail["ew_operand"].reshape(-1)[0])

    # the LUT RAM's bytes at the last run, the values looked up for them, (one table) how
    # lut._lut_table_to_atoms runs them (``lut.table_flags``) and, where that is the clamped table
    # with one BN for every channel, the table with BN folded in (kernels/lut_folded.py)
    last = [None, None, None, None]
    computed = min(channels, surfaces * c2)
    seen = [None, None]  # the last window sums and ``_window_layout``'s answer for them (a view of them)

    def values() -> tuple[int, np.ndarray]:
        ram = tables.tobytes()
        if ram != last[0]:  # (the chain's uploads leave the RAM as it was on most runs)
            if constant is None:
                last[:] = [ram, lut.dense_values.get(params, le, lo, build=True), None, None]
            else:
                base, table = lut.after_lut_values.get(params, le, lo, constant, ew_params, cvt, out_dtype)
                flags = lut.table_flags(settings[0], settings[1], settings[3], params, int(base), table.shape[0])
                folded = lut_folded.fold_tables.get(settings[1], settings[3], settings[4], computed, table,
                                                    int(base)) if flags[3] and lut_folded.FOLDED else None
                last[:] = [ram, (base, table), flags, folded]
        return last[1]

    def store(blocks: np.ndarray, window_sum: np.ndarray | None, ew_operand: np.ndarray | None) -> None:
        if blocks.shape[0] != 1 or blocks.dtype != np.int32:  # the MRDMA's atoms: [1][P][C] int32 first
            blocks = dp._int32_pixels(blocks, channels)
        sums, layout, kernels_per_group = dp._NO_SUMS, dp.SUMS_NONE, 1
        if cpend:
            sums, layout, kernels_per_group = _seen_layout(seen, window_sum, channels, pixels)
        rows = max(per_block, dp.GATHER_PIXELS) if layout == dp.SUMS_GROUP_MAJOR else per_block
        tile = np.zeros((rows, surfaces * c2), out_dtype)
        if constant is not None:
            base, table = values()
            if last[3] is not None and blocks.shape[0] == 1:
                lut_folded.folded_to_atoms(blocks, sums, layout, kernels_per_group, *settings[1:3], last[3][1],
                                           np.int64(last[3][0]), channels, surfaces, width, tile, offsets, words,
                                           narrow_of(last[3]))
                return
            lut._lut_table_to_atoms(blocks, sums, layout, kernels_per_group, *settings, np.int64(constant), ew_params,
                                    cvt, (le, lo, params, table, base), channels, surfaces, width, tile, offsets, words,
                                    last[2])
            return
        operand = dp._operand_pixels(ew_operand, channels, pixels)
        base, dense = values()
        lut._lut_stages_to_atoms(blocks, sums, layout, kernels_per_group, *settings, operand, ew_params, cvt,
                                 (le, lo, params, dense, base), channels, surfaces, width, tile, offsets, words)

    narrow_of = _narrow_cache(settings[1], settings[2], computed)
    sizes = (channels, pixels, per_block, surfaces, c2, out_dtype, width, offsets, words, narrow_of)
    store.folded_form = None if constant is None else _folded_form(values, last, settings, cpend, seen, sizes)
    return store


def _narrow_cache(bs: np.ndarray, bs_operands: np.ndarray, computed: int) -> Callable:
    """``narrow_of(pair)``: a folded table pair's int32 factors for these BS settings and operands
    (``lut_folded.narrow_lanes``), worked out once per pair (a binary search per channel and end, issue 20)."""
    from npuemu.emulator.kernels import lut_folded  # (as ``_lut_store``)

    narrows: dict = {}  # (a pair's id: the pair and its rows)

    def narrow_of(pair: tuple) -> np.ndarray:
        got = narrows.get(id(pair))
        if got is None or got[0] is not pair:
            if len(narrows) >= lut_folded.FOLD_KEPT:
                narrows.clear()
            got = narrows[id(pair)] = (pair, lut_folded.narrow_lanes(bs, bs_operands, computed, pair[0],
                                                                     pair[1].shape[0]))
        return got[1]

    return narrow_of


def _folded_form(values, last: list, settings: tuple, cpend: bool, seen: list, sizes: tuple):
    """``_lut_store``'s ``store.folded_form(blocks, window_sum)`` for a register EW operand (``values``,
    ``last``, ``seen``: its LUT RAM check and caches; ``sizes``: channels, pixels, pixels a block,
    surfaces, lanes, the output dtype, the line width, the WDMA's row offsets and words, and ``narrow_of``:
    a folded pair's int32 factors)."""
    from npuemu.emulator.kernels import lut_folded  # (as ``_lut_store``)

    channels, pixels, per_block, surfaces, c2, out_dtype, width, offsets, words, narrow_of = sizes

    def folded_form(blocks: np.ndarray, window_sum: np.ndarray | None):
        """For [1][P][C] int32 ``blocks`` and ``window_sum`` that are the same arrays every run: (``folded()``
        - the folded table pair the LUT RAM gives now, or None -, ``call(pair)`` - the kernel and
        arguments ``store`` runs for these arrays while the RAM gives ``pair``, a tile of their own -)
        for a caller making the call itself (kernels/step_batch.py); None where ``store`` takes another way."""
        if blocks.shape[0] != 1:
            return None
        sums, layout, kernels_per_group = dp._NO_SUMS, dp.SUMS_NONE, 1
        if cpend:
            sums, layout, kernels_per_group = _seen_layout(seen, window_sum, channels, pixels)
            if not np.may_share_memory(sums, window_sum):  # (a copy made per run: not arrays a call may keep)
                return None
        tile = np.zeros((max(per_block, dp.GATHER_PIXELS) if layout == dp.SUMS_GROUP_MAJOR else per_block,
                         surfaces * c2), out_dtype)  # (its lanes past the computed channels never written: zeros)

        def folded():
            values()
            return last[3]

        def call(pair):
            return lut_folded.folded_to_atoms, (blocks, sums, layout, kernels_per_group, settings[1], settings[2],
                                                pair[1], np.int64(pair[0]), channels, surfaces, width, tile, offsets,
                                                words, narrow_of(pair))
        return folded, call

    return folded_form
