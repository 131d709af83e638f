"""A task program's DPU step (issue 20, emulator/task_plan.py): ``run_dpu`` of one decoded
state pair for one memory, with its stage settings, BRDMA operands, stage plan and WDMA rows
worked out once, so a run is the EW operand's read (when it comes from the ERDMA), the drop of
the derived values the write covers, and the stage kernel.

It takes the integer path's common form only - a CORE source (not flying), no unpooling, no
LUT, no int -> fp16 conversion, no interleaved write, whole-word atoms whose rows do not
overlap - and hands back None for anything else: the core then runs the task the full way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator.kernels import dpu_interleave
from npuemu.emulator.kernels.dpu_pixel import planned_to_atoms
from npuemu.emulator.kernels.dpu_pixel_plan import prepare_planned_to_atoms
from npuemu.emulator.memory import Memory, TaskDma
from npuemu.emulator.units import dpu
from npuemu.emulator.units.cna_core import CoreResult
from npuemu.emulator.units.state import FP16, DpuRdmaState, DpuState

#: stands for the CORE's window sums while the settings are worked out (filled in per run)
_SUMS_SLOT = np.zeros((1, 1), np.int64)


def prepare_dpu(state: DpuState, rdma: DpuRdmaState | None, memory: Memory,
                where: str) -> Callable[[CoreResult], None] | None:
    """``run(source)`` doing what ``run_dpu(state, rdma, source, ...)`` does to memory and the
    derived cache (not the DMA counts: the caller keeps those of a full run), or None (see the
    module docstring). The BRDMA operands are held: ``run.held`` lists them as (derived-cache
    key, value), and the caller must not run it once a write over their bytes dropped them."""
    if rdma is None or rdma.unpool is not None or state.flying or state.proc_precision not in dpu.INTEGER_PROCESSING \
            or state.out_precision == FP16 or dpu_interleave.is_interleaved(state):
        return None
    fixed = dpu._fixed_settings(state, where)
    if fixed.lut or fixed.c2 * fixed.out_dtype.itemsize % 8:
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
    pixels, channels = state.height * state.width, state.channels
    blocks_type = np.empty((1, 0, 0), np.int32)  # the CORE's int32 results (the plan reads their type)
    plan = dpu._stage_plan(state, rdma, blocks_type, stages, tail)
    with_sums = "window_sum" in stages
    operand = tail.get("ew_operand")
    from_erdma = operand is not None and not state.ew.op_bypass and state.ew.op_from_dma
    bounds, line, starts = located.bounds, fixed.line, located.starts
    derived = memory.derived
    width, c2, surfaces = state.width, fixed.c2, fixed.surfaces
    store = prepare_planned_to_atoms(plan, pixels, width, words, offsets, c2, surfaces) or (
        lambda data, sums, ew: planned_to_atoms(plan, data, width, words, offsets, c2, surfaces, sums, ew))

    def run(source: CoreResult) -> None:
        data = source.data
        blocks = (data if data.dtype == np.int32 else data.astype(np.int32)).reshape(1, pixels, channels)
        ew = dpu._ew_operand(state, rdma, TaskDma(memory, where), where) if from_erdma else operand
        derived.invalidate_rows(starts, line, bounds)
        store(blocks, source.window_sums if with_sums else None, ew)

    run.held = _held_blob(state, rdma, memory, where)
    return run


def _held_blob(state: DpuState, rdma: DpuRdmaState, memory: Memory, where: str) -> tuple:
    """The BRDMA blob ``dpu._integer_settings`` took from the derived cache, as (key, value) -
    the key ``dpu.read_bias_blob`` looks it up by - or nothing when the BS stage reads none."""
    if not dpu._PAIRS(state, rdma).brdma_needed:
        return ()
    blob = dpu._BLOBS.get(rdma, state.channels)
    located = memory.locate_fixed(blob.address, blob.nbytes, lambda: f"{where}: {blob.what} read")
    key = (int(located.starts[0]), blob.nbytes, blob.key)
    return ((key, memory.derived.get(key)),)
