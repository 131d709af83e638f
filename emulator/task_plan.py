"""Task programs (issue 20: the emulator as an inner loop): a replayed chain's tasks compiled
into plain steps.

A chain replay (core.py ``_Replay``) already skips every task's register writes and decoding:
from a start state it saw before, each task runs the units from its kept decoded states. What
is left per task is the units' own per-access work - memo lookups of plans and settings,
locating DMA rows, the derived-value cache's lookups of weights and bias blobs, byte counting
and building the DmaTraffic. All of it is a function of the decoded states, the memory's
regions and the derived values, so after a successful replay each task is compiled once into
a step holding those answers (``cna_core.prepare_cna_core``, ``units.dpu_plan.prepare_dpu``):
its run copies the feature rows, runs the kernels and writes the output rows, and its record
keeps the DMA counts of the full runs (they depend on the states alone).

Replay-safety: a program belongs to one ``_Replay``, so it runs only from that replay's start
register state (a task whose registers differ is never reached through it); everything it holds
from the memory's derived cache (unpacked weights, BRDMA operands) is current while
``DerivedCache.epoch`` is the one it was built at. A write that drops a kept value moves the
epoch; from then on each step runs only while the values it holds are still the cache's
(``current``), a task whose are not runs the replay's full unit path, and the program is built
again (up to MAX_BUILDS times: a chain that writes over its own weights every run keeps that
task on the full path).
A task whose DPU runs the LUT reads the core's LUT RAM (``lut_tables``, written in place by the
chain's LUT writes, which a replay applies in stream order) as its step runs.
A flying DPU task (DPU + DPU_RDMA alone, its main cube read by the MRDMA) is a step too
(``units.dpu_plan.prepare_flying_dpu``), and so is a PPU task (PPU + PPU_RDMA alone,
``units.ppu.prepare_ppu``).
fp16 CNA + CORE -> DPU tasks and fp16 flying DPU tasks (PROC_PRECISION fp16) are steps through
``units.dpu_plan_fp.prepare_fp_dpu`` and ``prepare_cna_core``'s fp16 kernel.
Consecutive int8 steps with a compiled form run as one compiled call, and so do consecutive fp16 ones
(task_batches.py, ``ChainProgram.runs``; kernels/step_batch.py, step_batch_fp16.py).
Tasks of other forms (bf16, DPU + PPU, NRDMA operands, ...) always take the full unit path.

Fixed cost per task (issue 20, <= 20 us): a program whose tasks are all steps (LUT port writes
applied before each, in stream order) runs them in one loop (core.py ``_run_steps``) and hands
out the last replay's records again (``_replayed``); an int8 CNA + CORE -> DPU step passes the CORE's pixel-major output on without
a CoreResult (``direct`` of both halves), keeps a small feature in an array of its own and its
held weights' CBUF residency prebuilt (cna_core ``_feature_loader``, ``_cna_step``), and the
DPU's stage kernel runs as one Numba call (kernels/dpu_pixel_plan.py ``_direct_run``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npuemu.emulator.memo import Memo
from npuemu.emulator.task_batches import UNMADE
from npuemu.emulator.memory import Memory
from npuemu.emulator.units.cna_core import Cbuf, prepare_cna_core
from npuemu.emulator.units.dpu_plan import prepare_dpu, prepare_flying_dpu
from npuemu.emulator.units.state import FP16
from npuemu.emulator.units.ppu import prepare_ppu
from npuemu.isa.errors import EmulationError


def prepare_fp_dpu(*args, **kwargs):
    """``units.dpu_plan_fp.prepare_fp_dpu``, imported at the first float DPU task: an int8 model's
    process never imports the float DPU kernels (issue 20: first call)."""
    from npuemu.emulator.units.dpu_plan_fp import prepare_fp_dpu as prepare

    return prepare(*args, **kwargs)


#: programs built for one replay before it gives up (its chain keeps writing over what its
#: steps hold, so each program would be dropped again on the next run)
MAX_BUILDS = 3


@dataclass(frozen=True)
class ChainProgram:
    """The compiled steps of a replayed chain: per task ``step(cbuf)`` or None (full unit path)."""

    epoch: int  # memory.derived.epoch the held values are current at
    #: run by core.py ``_replay`` for task ``index`` while ``memory.derived.epoch`` is ``epoch``
    steps: tuple[Callable[[Cbuf], None] | None, ...]
    #: every task is a step (core.py ``_replay`` then runs the steps, and the LUT port writes
    #: before them, in one loop while the epoch holds)
    plain: bool = False
    #: how core.py ``_run_steps`` runs them (task_batches.py ``runs``): [(first task, its ``StepBatch`` or
    #: None for the one step) per run of consecutive batchable steps or single task, or None: one by one]
    #: (``UNMADE`` and the tasks until the program first runs); None: one by one
    runs: list | None = None


def build_program(tasks: tuple, memory: Memory, made: Memo,
                  lut_tables: np.ndarray | None = None) -> ChainProgram | None:
    """The program of a replay's ``tasks`` (core.py ``_Replay.tasks``: ``where`` first, the
    _TaskMemo.last entry third, its decoded states second in that, the LUT port's writes last),
    or None when no task compiles or the derived cache moved while the steps were made.
    ``made``: the core's steps by (decoded states, ``where``) - the replays of one chain from
    different start states (a chain of an odd number of tasks alternates between two) share
    them - reused while what they hold is current. ``lut_tables``: the core's LUT RAM (tasks
    with the LUT on need it)."""
    epoch = memory.derived.epoch
    steps = []
    for task in tasks:
        states, where = task[2][1], task[0]
        step = made.get(states, where)
        if step is None or not current(step, memory):
            step = task_step(states, memory, where, lut_tables)
            if step is not None:
                made.put(step, states, where)
        steps.append(step)
    if memory.derived.epoch != epoch or not any(step is not None for step in steps):
        return None
    plain = all(step is not None for step in steps)
    return ChainProgram(epoch, tuple(steps), plain, [UNMADE, tasks])


def task_step(states: dict, memory: Memory, where: str,
              lut_tables: np.ndarray | None = None) -> Callable[[Cbuf], None] | None:
    """One task's compiled step: CNA + CORE feeding the DPU (with DPU_RDMA), a flying DPU task or
    a PPU task, and nothing else, the units in a form their ``prepare_*`` takes; None otherwise."""
    conv, state, rdma = states["conv"], states["dpu"], states["dpu_rdma"]
    if state is None and conv is None and states["ppu"] is not None:  # a PPU task
        return prepare_ppu(states["ppu"], states["ppu_rdma"], states["ppu_kind"], memory, where)
    if state is None or states["ppu"] is not None or states["ppu_rdma"] is not None:
        return None
    fp16 = state.proc_precision == FP16  # the fp path (units/dpu_plan_fp.py)
    if conv is None:  # a flying DPU task (its main cube from the MRDMA)
        # (unpooling copies atoms whatever the precision, dpu.run_dpu's first branch: the integer
        # step's copy takes fp16 ones too - ppocr_det's fp16 build, 45 tasks a run)
        float_step = fp16 and (rdma is None or rdma.unpool is None)
        # an integer task with an fp16 output (int8 builds' conversions into float islands:
        # units/dpu_plan_convert.py; its chain's replays then run plain)
        converting = not fp16 and state.out_precision == FP16 and (rdma is None or rdma.unpool is None)
        prepare = prepare_fp_dpu if float_step else prepare_flying_dpu
        if converting:  # (imported here, as prepare_fp_dpu: it needs the fp16 store)
            from npuemu.emulator.units.dpu_plan_convert import prepare_int_to_fp16 as prepare
        try:
            return prepare(state, rdma, memory, where, lut_tables)
        except EmulationError:
            return None
    if (conv.precision == FP16) != fp16 or fp16 and (conv.out_channels, conv.out_height, conv.out_width) \
            != (state.channels, state.height, state.width):
        return None  # (an fp16 CORE feeds only an fp16 DPU step; a CORE cube not the DPU's: the full path raises)
    try:
        cna = prepare_cna_core(conv, memory, where)
        dpu = None if cna is None else (prepare_fp_dpu if fp16 else prepare_dpu)(state, rdma, memory, where,
                                                                                    lut_tables)
    except EmulationError:  # (the full path, which ran these states, raises it where it belongs)
        return None
    if dpu is None:
        return None

    cna_direct, dpu_direct = getattr(cna, "direct", None), getattr(dpu, "direct", None)
    then_into = getattr(cna, "then_into", None)
    if then_into is not None and dpu_direct is not None:  # (both halves in one frame: cna_core ``_direct_rows``)
        step = then_into(dpu_direct)
    elif cna_direct is not None and dpu_direct is not None:  # (int8: the CORE's pixel-major output, no CoreResult)
        def step(cbuf: Cbuf) -> None:
            dpu_direct(*cna_direct(cbuf))
    else:
        def step(cbuf: Cbuf) -> None:
            dpu(cna(cbuf))

    step.held = cna.held + dpu.held
    return step


def current(step: Callable, memory: Memory) -> bool:
    """Whether every derived value ``step`` holds is still the memory's (the check for a step
    whose program was built at another ``memory.derived.epoch``: a write dropped something, not
    necessarily what this step holds)."""
    derived = memory.derived
    return all(derived.get(key) is value for key, value in step.held)
