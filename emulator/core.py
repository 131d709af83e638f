"""One NPU core: the PC that fetches and walks a task chain, the register file the words
fill, and the dispatch of each op-enable to the units in pipeline order.

The PC fetches ``(PC_DATA_AMOUNT + 1) * scale`` words per task and follows the tails
(rknpu-isa.md 2.2; ``isa.chain.decode_chain`` is the strict walker). For each task it applies
the register writes in order, then runs the blocks the op-enable word selects:
CNA+CORE -> DPU (with DPU_RDMA) -> PPU (with PPU_RDMA). A configuration that would hang a
real NPU (rknpu-isa.md 7.1) is an :class:`EmulationError` naming the task and registers, never
a silently wrong result. Each task leaves a :class:`TaskRecord` for the timing model.

Speed (issue 8): decoding is a pure function of the started blocks' register values, so each
task of a cached chain keeps its last views and decoded states and reuses them while one dict
comparison per block shows the executing groups unchanged (``RegisterFile.unchanged``);
anything else is decoded again. The units still run and count every DMA byte every time.
Issue 20: that memory is kept per executing group (a chain of an odd number of tasks starts
each run on the other group), and a task whose decoded state and DMA counts repeat hands out
its last (frozen) TaskRecord again, which the timing model then finds by identity.
Issue 20, chain replay: a chain that starts from a register state it started from before
(a whole-state comparison, ``RegisterFile.matches``) leads every task to the decoded states of
that run, so it runs the units alone from them and then restores the end state; see _Replay.
Issue 20, sooner: a start state that differs from a recorded one only where no task can see it
(registers the chain writes before the block runs from their group, a group it never runs from,
pointer bits its own S_POINTER writes set alike; replay_match.py) replays too (``_loosened``), so
the first runs of a model (reset state, then the states its last run left) replay from run 2 on.
Issue 20, task programs: as a replay first runs, its CNA+CORE+DPU tasks are compiled into steps
that hold what the units look up per access (task_plan.py); they run while the memory's derived
values are those they were built from, and keep the DMA counts of the full runs.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from npuemu.emulator import replay_match
from npuemu.emulator.memo import Memo
from npuemu.emulator.memory import DmaTraffic, Memory, TaskDma, Traffic
from npuemu.emulator.regfile import RegisterFile, RegisterView
from npuemu.emulator.task_batches import runs
from npuemu.emulator.task_plan import MAX_BUILDS, build_program
from npuemu.emulator.task_plan import current as task_current
from npuemu.emulator.units.cna_core import Cbuf, CoreResult, decode_conv, run_cna_core
from npuemu.emulator.units.dpu import check_rdma_matches, decode_dpu, decode_dpu_rdma, run_dpu
from npuemu.emulator.units.ppu import check_ppu_source, decode_ppu, decode_ppu_rdma, run_ppu
from npuemu.emulator.units.state import (
    ATOM_BYTES, ConvState, DpuRdmaState, DpuState, PpuRdmaState, PpuState,
)
from npuemu.isa.chain import DecodedChain, decode_chain, fetch_words
from npuemu.isa.errors import DmaError, EmulationError, EncodingError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import Task
from npuemu.isa.words import WORD_BYTES

log = logging.getLogger(__name__)

#: PC INTERRUPT bit of group 0 for each block (group 1 is the next bit; rknpu-isa.md 2.4).
#: The CNA raises its feature, weight and CSC pairs together here.
_INTERRUPT_GROUP0 = {"CNA": (0, 2, 4), "CORE": (6,), "DPU": (8,), "PPU": (10,)}


@dataclass
class _TaskMemo:
    """What the core keeps per task object of a decoded chain (one memo lookup per task)."""

    steps: tuple | None  # the writes resolved to register-file steps (RegisterFile.resolve)
    #: the blocks its op-enable word starts (set after its first writes: an unknown bit raises
    #: there, after the writes, and is never stored)
    blocks: tuple[str, ...] | None = None
    #: per executing-group index of each started block: [views, decoded states, groups,
    #: interrupt bits, TaskRecord or None] of its last run from those groups, reused while they
    #: hold the same values. Keyed by the groups because a chain of an odd number of tasks
    #: whose blocks ping-pong runs each task from the other group on the next run.
    #: The record: a run with the same decoded states and equal DMA counts gives an equal
    #: record, so that one is handed out again (records are frozen; the timing model then
    #: finds its work by identity).
    last: dict = field(default_factory=dict)


@dataclass(frozen=True)
class _Replay:
    """A chain run whose register state at the start can recur (issue 20: the emulator as an
    inner loop). Decoding is a pure function of the register values, and the writes are the
    chain's own, so from an equal start state every task decodes to what it did last time and
    the chain ends in an equal state: a replay runs the units alone (and the LUT port's writes:
    the DPU reads its RAM mid-chain) and then restores the end state."""

    #: RegisterFile.snapshot() before the first task, as a replay_match.Start (a state that
    #: differs from it only where no task sees it replays too: ``_loosened``)
    start: tuple
    end: tuple  # ... after the last
    #: per task: its ``where`` text, its regcmd fetch bytes, its _TaskMemo.last entry (views,
    #: decoded states, groups, interrupt bits, last record; the record is updated in place),
    #: its _TaskMemo (the resolved writes, for ``_replay_failed``), its address and amount, and
    #: its writes to the LUT port (``RegisterFile.lut_steps``, or the stores ``RegisterFile.lut_stores``
    #: made of them)
    tasks: tuple
    #: [its task_plan.ChainProgram or None, programs built so far] (built with it, again as it
    #: replays after a write dropped what the steps hold)
    program: list = field(default_factory=lambda: [None, 0])
    #: [the records of its last replay, the interrupt bits of its tasks, its tasks' _TaskMemo.last
    #: entries, the core's ``records_made`` when they were last found its tasks' records] (``_replayed``)
    replayed: list = field(default_factory=lambda: [None, None, None, -1])
    #: RegisterFile.restore_from's differences from ``start`` to ``end`` (kept with them)
    moves: list = field(default_factory=list)


#: start states kept per chain (a chain of an odd number of tasks alternates between two)
_REPLAYS = 4
#: a _TaskMemo.last entry's record
_RECORD = operator.itemgetter(4)


@dataclass(frozen=True)
class TaskRecord:
    """What one task did: for the timing model, traces and tests."""

    core: int
    index: int  # position in the chain
    address: int  # regcmd address of the task
    amount: int  # PC_DATA_AMOUNT it was fetched with
    enable_mask: int
    blocks: tuple[str, ...]
    groups: Mapping[str, int]  # register group each started block ran from
    writes: int  # register writes in the task body
    conv: ConvState | None = None
    dpu: DpuState | None = None
    dpu_rdma: DpuRdmaState | None = None
    ppu: PpuState | None = None
    ppu_rdma: PpuRdmaState | None = None
    traffic: DmaTraffic = field(default_factory=DmaTraffic)
    interrupts: int = 0  # PC INTERRUPT_RAW_STATUS bits the task raised
    # every register of each started block's executing group, for timing and traces
    registers: Mapping[str, RegisterView] = field(default_factory=dict, repr=False)

    def summary(self) -> str:
        parts = [f"core {self.core} task {self.index} @{self.address:#x} mask {self.enable_mask:#x}"]
        if self.conv:
            c = self.conv
            kind = "dw" if c.depthwise else "conv"
            parts.append(f"{kind} {c.kernel_h}x{c.kernel_w}/{c.stride_y} {c.in_width}x{c.in_height}x"
                         f"{c.in_channels} -> {c.out_width}x{c.out_height}x{c.out_channels}")
        elif self.dpu:
            parts.append(f"dpu {self.dpu.width}x{self.dpu.height}x{self.dpu.channels}")
        if self.ppu:
            parts.append(f"pool {self.ppu.kernel_h}x{self.ppu.kernel_w}/{self.ppu.stride_y} -> "
                         f"{self.ppu.out_width}x{self.ppu.out_height}x{self.ppu.out_channels}")
        t = self.traffic
        parts.append(f"read {t.read_bytes} B, write {t.write_bytes} B")
        return ", ".join(parts)


class NpuCore:
    """PC, register file, CBUF contents and LUT RAM of one core; memory is shared."""

    def __init__(self, index: int, regmap: RegisterMap, memory: Memory, cbuf_banks: int,
                 fetch_scale: int | None = None, kernel_atoms: dict[int, int] | None = None,
                 atom_bytes: int = ATOM_BYTES) -> None:
        self.index = index
        self.regmap = regmap
        self.memory = memory
        self.cbuf_banks = cbuf_banks
        self.kernel_atoms = kernel_atoms  # kernels per MAC pass by precision (None: RK3588's)
        self.atom_bytes = atom_bytes  # the NC1HWC2 atom, the unit of stride registers (REGISTER_SEMANTICS 9)
        self.scale = regmap.pc_amount_scale if fetch_scale is None else fetch_scale
        self.regfile = RegisterFile(regmap)
        self.cbuf = Cbuf()
        self.tasks_run = 0  # TASK_STATUS counter across chains
        self.interrupt_raw = 0
        # kept task records replaced so far (``_kept_record``, ``_run_task``): a replay whose records were
        # checked at this count hands them out again unchecked (``_replayed``)
        self.records_made = 0
        # Per task object of a decoded chain. The build closes over the register file, not
        # self: the memo would make a reference cycle.
        resolve = self.regfile.resolve
        self._tasks: Memo[_TaskMemo] = Memo(lambda task: _TaskMemo(resolve(task.writes)), identity=1)
        # Decoded unit states by the register values of the started blocks (decoding is a
        # pure function of them; see _decode).
        self._decoded: Memo[dict[str, object]] = Memo()
        # Per decoded chain: the _Replay of its last runs from distinct start states, newest first.
        self._replays: Memo[list] = Memo(identity=1)
        # Task programs' steps by (decoded states, where) (task_plan.build_program)
        self._steps: Memo = Memo(identity=1)

    # -- the PC -----------------------------------------------------------------------------
    def run_chain(self, start_address: int, first_amount: int, *,
                  driver_setup: bool = True) -> tuple[TaskRecord, ...]:
        """Run the chain the PC fetches from ``start_address`` with ``first_amount``.

        ``driver_setup`` first does what the vendor driver does over MMIO before a job: CNA
        and CORE S_POINTER = 0xe (rknpu-isa.md 2.3). State persists between chains."""
        if driver_setup:
            self.regfile.driver_setup(self.index)
        chain = self._fetch(start_address, first_amount)
        replays = self._replays.get(chain)
        found = loose = None
        for replay in replays or ():
            matched = self.regfile.matches(replay.start)
            if matched is True:
                found = replay
                break
            if matched and loose is None:  # (a start state equal to another kept one comes first)
                loose = (replay, matched)
        if found is None and loose is not None:
            found = self._loosened(replays, *loose)
        records = self._run_all(chain, replays) if found is None else self._replay(found)
        log.debug("core %d ran %d tasks from %#x", self.index, len(records), start_address)
        return records

    def _loosened(self, replays: list, replay: _Replay, matched: replay_match.Loose) -> _Replay:
        """``replay`` from the state now, which differs from its start state only where no task can
        see it (``RegisterFile.matches``, replay_match.py): the same tasks and program with this
        start state (for ``_replay_failed``, and to match whole when it recurs) and its end state,
        kept first."""
        start = replay_match.Start.of(self.regfile.snapshot(), replay.start.tasks, matched.course)
        mine = replace(replay, start=start, moves=[],
                       end=replay_match.end(self.regfile, replay.end, matched.course, matched.others))
        replays[:] = [mine] + replays[:_REPLAYS - 1]
        return mine

    def _run_all(self, chain: DecodedChain, replays: list | None) -> tuple[TaskRecord, ...]:
        """Every task through ``_run_task``; then the chain's start and end register states and
        its tasks' kept entries become a ``_Replay`` (unless a task's writes are not resolved)."""
        snapshot = self.regfile.snapshot()
        records, kept = [], []
        for index, (task, address, amount) in enumerate(zip(chain.chain.tasks, chain.task_addresses,
                                                            chain.amounts)):
            records.append(self._run_task(index, task, address, amount, kept))
        if all(memo.steps is not None for memo, _ in kept):
            start = replay_match.Start.of(snapshot, tuple((memo.steps, memo.blocks) for memo, _ in kept))
            luts = [RegisterFile.lut_steps(memo.steps) for memo, _ in kept]
            if RegisterFile.lut_inert(start, (step for lut in luts for step in lut)):
                luts = [()] * len(kept)  # (the usual case: the compiler's read-type port writes)
            else:  # the stores they make, worked out once (where each write lands is known ahead)
                luts = RegisterFile.lut_stores(start[-2], luts) or luts
            tasks = tuple((f"core {self.index} task {index} (regcmd at {address:#x})",
                           fetch_words(amount, self.scale) * WORD_BYTES, last, memo, address, amount, lut)
                          for index, ((memo, last), address, amount, lut)
                          in enumerate(zip(kept, chain.task_addresses, chain.amounts, luts)))
            replay = _Replay(start, self.regfile.snapshot(), tasks)
            # compiled now (steps already made are looked up), so its first replay runs it
            replay.program[:] = [build_program(tasks, self.memory, self._steps, self.regfile.lut.tables), 1]
            if replays is None:
                replays = self._replays.put([], chain)
            replays[:] = [replay] + replays[:_REPLAYS - 1]
        return tuple(records)

    def _replay(self, replay: _Replay) -> tuple[TaskRecord, ...]:
        """The chain again from the same register state: every task's writes and decode lead to
        what they led to last time, so only the units run (every DMA byte counted); then the
        register file takes the end state the writes would have left."""
        regfile, memory, cbuf = self.regfile, self.memory, self.cbuf
        tables, derived = regfile.lut.tables, memory.derived
        program = replay.program[0]  # the tasks compiled (task_plan.py)
        if program is None and replay.program[1] < MAX_BUILDS:
            program = build_program(replay.tasks, memory, self._steps, tables)
            replay.program[:] = [program, replay.program[1] + 1]
        steps, epoch = (None, None) if program is None else (program.steps, program.epoch)
        began, stale, interrupts = derived.epoch, False, 0
        # (every task in one loop while the epoch holds: a step, or the full path where there is none)
        done = self._run_steps(replay, steps, epoch, runs(program)) if program is not None else 0
        if done == len(replay.tasks):
            return self._replayed(replay)
        records = []
        for index, (where, regcmd_bytes, last, _, address, amount, lut) in enumerate(replay.tasks):
            _, states, _, bits, kept = last
            if index < done:  # (run by _run_steps)
                interrupts |= bits
                records.append(self._kept_record(last, index, address, amount, kept.traffic))
                continue
            step = None if steps is None else steps[index]
            if step is not None and derived.epoch != epoch and not task_current(step, memory):
                step, stale = None, True  # a write dropped what it holds: the full path
            try:
                if lut:  # the LUT RAM may change mid-chain: filled in stream order
                    regfile.apply_lut(lut, where)
                if step is not None:  # the DMA counts of the full runs: a function of the states
                    step(cbuf)
                    traffic = kept.traffic
                else:
                    dma = TaskDma(memory, where)
                    dma.count(Traffic.REGCMD_READ, regcmd_bytes)
                    _run_units(states, dma, cbuf, tables, where)
                    traffic = dma.traffic()
            except Exception:
                self._replay_failed(replay, index)
                raise
            interrupts |= bits
            records.append(self._kept_record(last, index, address, amount, traffic))
        self.regfile.restore(replay.end)
        self.tasks_run += len(records)
        self.interrupt_raw |= interrupts
        if program is not None and program.epoch != derived.epoch:
            if stale:  # built again as it next replays (while MAX_BUILDS allows)
                replay.program[0] = None if replay.program[1] < MAX_BUILDS else program
            elif began == derived.epoch:  # every step checked current, and nothing dropped since
                replay.program[0] = replace(program, epoch=began)
        return tuple(records)

    def _kept_record(self, last: list, index: int, address: int, amount: int, traffic: DmaTraffic) -> TaskRecord:
        """The task's kept record (``last[4]``), or one with this run's position and traffic, kept
        instead (the record _run_task would build: only these differ)."""
        kept = last[4]
        if kept.traffic is not traffic or kept.index != index or kept.address != address or kept.amount != amount:
            kept = last[4] = replace(kept, index=index, address=address, amount=amount, traffic=traffic)
            self.records_made += 1
        return kept

    def _run_steps(self, replay: _Replay, steps: tuple, epoch: int, runs: tuple | None = None) -> int:
        """A program's steps in one loop while the memory's derived values stay at ``epoch``, each
        task's LUT port writes first (as ``_replay``'s loop applies them), a task without a step
        through the full unit path (``_run_full``; issue 20: ppocr_rec's replays have a few, and
        ``_replay``'s own loop costs more per task): how many ran (the rest take ``_replay``'s own
        loop, which checks each step's values). ``runs``: the program's runs of steps made one
        compiled call (``ChainProgram.runs``, task_batches.py)."""
        derived, cbuf, regfile, done = self.memory.derived, self.cbuf, self.regfile, 0
        if runs is not None:
            return self._run_batched(replay, steps, epoch, runs)
        try:
            for step, task in zip(steps, replay.tasks):
                if derived.epoch != epoch:
                    break
                if task[6]:  # (ppocr_rec: ~all its 734 fp16 tasks write the LUT RAM, in stream order)
                    regfile.apply_lut(task[6], task[0])
                if step is None:  # (a task no step takes: _replay's full unit path)
                    self._run_full(task, done)
                else:
                    step(cbuf)
                done += 1
        except Exception:
            self._replay_failed(replay, done)
            raise
        return done

    def _run_batched(self, replay: _Replay, steps: tuple, epoch: int, runs: tuple) -> int:
        """``_run_steps`` with its runs of steps as one compiled call each (task_batches.StepBatch):
        the same order of LUT writes, bookkeeping and kernels per task, epoch checks, count and
        ``_replay_failed`` position."""
        derived, cbuf, regfile, tasks, done, failed = self.memory.derived, self.cbuf, self.regfile, replay.tasks, 0, [0]
        left = [None]  # (the Cbuf's values as a steady batch set them, with nothing since: StepBatch.run)
        try:
            for index, batch in runs:
                if derived.epoch != epoch:
                    break
                if batch is not None:
                    ran = batch.run(tasks, cbuf, regfile, derived, epoch, failed, left)
                    done += ran
                    if ran < batch.size:  # (the epoch moved: _replay's loop checks the rest)
                        break
                    continue
                left[0] = None
                task = tasks[index]
                if task[6]:
                    regfile.apply_lut(task[6], task[0])
                step = steps[index]
                if step is None:
                    self._run_full(task, done)
                else:
                    step(cbuf)
                done += 1
        except Exception:
            self._replay_failed(replay, done + failed[0])
            raise
        return done

    def _run_full(self, task: tuple, index: int) -> None:
        """``_replay``'s full unit path for one of its tasks inside ``_run_steps``: the units from
        the kept decoded states, every DMA byte counted; the task's kept record takes this run's
        traffic (equal counts: the very same object, ``TaskDma.traffic``), so ``_replayed`` hands
        out what ``_replay``'s loop would."""
        where, regcmd_bytes, last, _, address, amount, _ = task
        dma = TaskDma(self.memory, where)
        dma.count(Traffic.REGCMD_READ, regcmd_bytes)
        _run_units(last[1], dma, self.cbuf, self.regfile.lut.tables, where)
        traffic = dma.traffic()
        if traffic is not last[4].traffic:
            self._kept_record(last, index, address, amount, traffic)

    def _replayed(self, replay: _Replay) -> tuple[TaskRecord, ...]:
        """The end of a replay whose tasks all ran as steps: each task's kept record (the same
        objects as last time: handed out as one tuple again), the end state, counters, interrupts."""
        kept = replay.replayed
        # (the kept records compared in C, without a list of them: rec's replay has 705 tasks; not at all where
        # no record was replaced since they last were)
        if kept[3] != self.records_made and (kept[0] is None or not all(map(operator.is_, map(_RECORD, kept[2]),
                                                                            kept[0]))):  # (one task count)
            records = tuple(self._kept_record(last, index, address, amount, last[4].traffic)
                            for index, (_, _, last, _, address, amount, _) in enumerate(replay.tasks))
            bits = 0
            for task in replay.tasks:
                bits |= task[2][3]
            kept[:] = [records, bits, tuple(task[2] for task in replay.tasks), -1]
        kept[3] = self.records_made
        # (the state is the start's: matched equal, or the start taken from it, ``_loosened``; a replay's
        # steps write no register)
        self.regfile.restore_from(replay.start, replay.end, replay.moves)
        self.tasks_run += len(kept[0])
        self.interrupt_raw |= kept[1]
        return kept[0]

    def _replay_failed(self, replay: _Replay, failed: int) -> None:
        """The register file, counters and interrupts where ``_run_task`` leaves them when task
        ``failed`` raises in its units: every earlier task's writes and start, then its writes."""
        self.regfile.restore(replay.start)
        for index, (where, _, last, memo, _, _, _) in enumerate(replay.tasks[:failed + 1]):
            self.regfile.apply(memo.steps, where)
            if index < failed:
                self.regfile.started(memo.blocks)
                self.tasks_run += 1
                self.interrupt_raw |= last[3]

    def _fetch(self, start_address: int, first_amount: int) -> DecodedChain:
        where = "core {}: PC fetch at {:#x}"  # (formatted where it raises: a replay fetches every run)
        if not isinstance(first_amount, int) or first_amount < 0:
            raise EmulationError(f"{where.format(self.index, start_address)}: fetch amount {first_amount!r} is not "
                                 f"a PC_DATA_AMOUNT")
        nbytes = fetch_words(first_amount, self.scale) * WORD_BYTES
        region = self.memory.region_at(start_address, nbytes)
        if region is None:
            raise DmaError(f"{where.format(self.index, start_address)}: PC_DATA_AMOUNT {first_amount} fetches "
                           f"[{start_address:#x}, {start_address + nbytes:#x}), outside the memory "
                           f"({self.memory.describe()}); the NPU raises its DMA read error (PC INTERRUPT bit 12)")
        # A chain is decoded once per contents: the memory drops the entry when any write
        # touches the bytes its tasks span (regcmd buffers are normally written once).
        key = ("regcmd chain", id(self.regmap), self.scale, start_address, first_amount)
        cached = self.memory.derived.get(key)
        if cached is not None and cached[0] is self.regmap:
            return cached[1]
        try:
            chain = decode_chain(region.data, self.regmap, region.base, start_address, first_amount,
                                 self.scale)
        except EncodingError as error:
            raise EmulationError(f"core {self.index}: the PC cannot run the chain at {start_address:#x}: "
                                 f"{error}. A real NPU hangs here (rknpu-isa.md 7.1)") from None
        ends = [a + fetch_words(n, self.scale) * WORD_BYTES for a, n in zip(chain.task_addresses, chain.amounts)]
        self.memory.derived.put(key, min(chain.task_addresses), max(ends), (self.regmap, chain))
        return chain

    def _run_task(self, index: int, task: Task, address: int, amount: int, kept_by: list) -> TaskRecord:
        where = f"core {self.index} task {index} (regcmd at {address:#x})"
        memo = self._tasks(task)
        if memo.steps is None:
            for write in task.writes:
                self.regfile.write(write.block, write.register, write.value, where)
        else:
            self.regfile.apply(memo.steps, where)
        blocks = memo.blocks
        if blocks is None:
            blocks = memo.blocks = tuple(self.regmap.op_enable_names(task.enable_mask))
        if not blocks:
            raise EmulationError(f"{where}: the op-enable word has mask 0 and starts no block; the PC "
                                 f"waits for an interrupt that never comes")
        # The task's last views, decoded states and interrupts, reused while its blocks'
        # executing groups hold the same values (one dict comparison per block instead of
        # copying, keying and hashing every register; decoding is a pure function of them).
        pingpongs = self.regfile.blocks
        executers = tuple(pingpongs[name].executer for name in blocks)
        last = memo.last.get(executers)
        if last is None or not self.regfile.unchanged(last[0]):
            views = {name: self.regfile.view(name) for name in blocks}
            groups = {name: view.group for name, view in views.items()}
            last = memo.last[executers] = [views, self._decode(views, where), groups, _interrupts(groups), None]
        views, states, groups, interrupts, kept = last
        kept_by.append((memo, last))
        dma = TaskDma(self.memory, where)
        dma.count(Traffic.REGCMD_READ, fetch_words(amount, self.scale) * WORD_BYTES)
        _run_units(states, dma, self.cbuf, self.regfile.lut.tables, where)
        self.regfile.started(blocks)
        self.tasks_run += 1
        self.interrupt_raw |= interrupts
        traffic = dma.traffic()
        if kept is not None and kept.traffic is traffic and kept.index == index and kept.address == address \
                and kept.amount == amount:
            return kept
        record = TaskRecord(self.index, index, address, amount, task.enable_mask, blocks, groups,
                            len(task.writes), traffic=traffic, interrupts=interrupts,
                            registers=views, conv=states["conv"], dpu=states["dpu"],
                            dpu_rdma=states["dpu_rdma"], ppu=states["ppu"], ppu_rdma=states["ppu_rdma"])
        last[4] = record
        self.records_made += 1
        return record

    def _decode(self, views: dict[str, RegisterView], where: str) -> dict[str, object]:
        # Decoding checks and interprets only the views' values, so equal values give equal
        # states; a task that fails to decode raises and is never cached.
        key = tuple((name, tuple(view.values.items())) for name, view in views.items())
        states = self._decoded.get(key)
        if states is None:
            states = self._decoded.put(
                _decode_units(views, self.cbuf_banks, where, self.kernel_atoms, self.atom_bytes), key)
        return states


def _interrupts(groups: Mapping[str, int]) -> int:
    bits = 0
    for block, group in groups.items():
        for bit in _INTERRUPT_GROUP0.get(block, ()):
            bits |= 1 << (bit + group)
    return bits


# ---------------------------------------------------------------------------------------------
# Dispatch: which units run, in pipeline order, with which decoded state
# ---------------------------------------------------------------------------------------------
def _decode_units(views: dict[str, RegisterView], cbuf_banks: int, where: str,
                  kernel_atoms: dict[int, int] | None = None, atom_bytes: int = ATOM_BYTES) -> dict[str, object]:
    started = set(views)
    conv = _decode_conv_blocks(views, started, cbuf_banks, where, kernel_atoms, atom_bytes)
    dpu, rdma = _decode_dpu_blocks(views, started, conv, where, atom_bytes)
    ppu, ppu_rdma, ppu_kind = _decode_ppu_blocks(views, started, where, atom_bytes)
    return {"conv": conv, "dpu": dpu, "dpu_rdma": rdma, "ppu": ppu, "ppu_rdma": ppu_rdma,
            "ppu_kind": ppu_kind}


def _run_units(states: dict[str, object], dma: TaskDma, cbuf: Cbuf, lut_tables: np.ndarray,
               where: str) -> None:
    source: CoreResult | None = None
    if states["conv"] is not None:
        source = run_cna_core(states["conv"], dma, cbuf, where)
    if states["dpu"] is not None:
        run_dpu(states["dpu"], states["dpu_rdma"], source, dma, lut_tables, where)
    if states["ppu"] is not None:
        run_ppu(states["ppu"], states["ppu_rdma"], states["ppu_kind"], dma)


def _decode_conv_blocks(views: dict[str, RegisterView], started: set[str], cbuf_banks: int,
                        where: str, kernel_atoms: dict[int, int] | None = None,
                        atom_bytes: int = ATOM_BYTES) -> ConvState | None:
    pair = started & {"CNA", "CORE"}
    if not pair:
        return None
    if pair != {"CNA", "CORE"}:
        (alone,) = pair
        (missing,) = {"CNA", "CORE"} - pair
        raise EmulationError(f"{where}: the op-enable word starts {alone} but not {missing}; "
                             f"the CNA feeds the CORE and neither completes alone")
    if "DPU" not in started:
        raise EmulationError(f"{where}: CNA and CORE start but the DPU does not: the CORE's output has "
                             f"nowhere to go and the task never completes")
    return decode_conv(views["CNA"], views["CORE"], cbuf_banks, where, kernel_atoms, atom_bytes)


def _decode_dpu_blocks(views: dict[str, RegisterView], started: set[str], conv: ConvState | None,
                       where: str, atom_bytes: int = ATOM_BYTES) -> tuple[DpuState | None, DpuRdmaState | None]:
    if "DPU" not in started:
        if "DPU_RDMA" in started:
            raise EmulationError(f"{where}: DPU_RDMA starts without the DPU: its data has no consumer")
        return None, None
    dpu = decode_dpu(views["DPU"], where, atom_bytes)
    rdma = decode_dpu_rdma(views["DPU_RDMA"], where, atom_bytes) if "DPU_RDMA" in started else None
    fm = "FEATURE_MODE_CFG"
    if conv is not None:
        if dpu.flying:
            raise EmulationError(f"{where}: {views['DPU'].show(fm, 'FLYING_MODE')} in a task that runs "
                                 f"CNA+CORE: the DPU would ignore the CORE's output")
        expected_mode = 3 if conv.depthwise else 0
        if dpu.conv_mode != expected_mode:
            raise EmulationError(f"{where}: {views['DPU'].show(fm, 'CONV_MODE')} disagrees with the CNA's "
                                 f"{'depthwise' if conv.depthwise else 'direct'} convolution")
        sizes = (conv.out_width, conv.out_height, conv.out_channels)
        if sizes != (dpu.width, dpu.height, dpu.channels):
            raise EmulationError(
                f"{where}: CORE and DPU sizes disagree: CORE DATAOUT_SIZE_0/1 give {sizes[0]}x{sizes[1]}x"
                f"{sizes[2]}, DPU DATA_CUBE_WIDTH/HEIGHT/CHANNEL give "
                f"{dpu.width}x{dpu.height}x{dpu.channels}")
    elif not dpu.flying:
        raise EmulationError(f"{where}: {views['DPU'].show(fm, 'FLYING_MODE')} makes the DPU wait for the "
                             f"CORE, but CNA and CORE are not started: the task never completes")
    if dpu.flying and (rdma is None or not rdma.main_enabled):
        reason = ("DPU_RDMA is not started" if rdma is None
                  else views["DPU_RDMA"].show(fm, "MRDMA_DISABLE"))
        raise EmulationError(f"{where}: the DPU runs in flying mode (main data from the MRDMA) but "
                             f"{reason}: no source feeds it and the task hangs")
    if rdma is not None:
        check_rdma_matches(dpu, rdma, (views["DPU"], views["DPU_RDMA"]), where)
        if rdma.main_enabled and not rdma.flying and rdma.comb_use == 0:
            raise EmulationError(
                f"{where}: the MRDMA is enabled ({views['DPU_RDMA'].show(fm, 'MRDMA_DISABLE')}) but nothing "
                f"consumes it (FLYING_MODE=0, COMB_USE=0): MRDMA enabled but unfed hangs (rknpu-isa.md 7.1)")
    return dpu, rdma


def _decode_ppu_blocks(views: dict[str, RegisterView], started: set[str], where: str,
                       atom_bytes: int = ATOM_BYTES) -> tuple[PpuState | None, PpuRdmaState | None, int | None]:
    if "PPU" not in started:
        if "PPU_RDMA" in started:
            raise EmulationError(f"{where}: PPU_RDMA starts without the PPU: its data has no consumer")
        return None, None, None
    ppu = decode_ppu(views["PPU"], where, atom_bytes)
    rdma = decode_ppu_rdma(views["PPU_RDMA"], where, atom_bytes) if "PPU_RDMA" in started else None
    kind = check_ppu_source(ppu, rdma, views["PPU"], where)
    return ppu, rdma, kind
