"""Runs of consecutive task steps as one compiled call (issue 20: fixed cost per task): a task
program's (task_plan.py) int8 steps with a compiled form (units/cna_core.py ``_fused_rows``' ``step.batch``,
units/dpu_plan.py ``_chain_batch``'s flying steps) grouped into StepBatches whose kernels run as one
kernels/step_batch.py ``run_ops`` call, and its fp16 steps (``_fused_run``'s composed steps, dpu_plan_fp's
flying steps, with an int8 output too, and dpu_plan_convert's int -> fp16 steps) into StepBatches of one
kernels/step_batch_fp16.py ``run_fp16_ops`` call, each step's Python part (Cbuf bookkeeping, derived-row
drop, LUT table check) before it. core.py ``_run_batched``
runs a program's batches and its other steps in order; what a batch leaves - memory, Cbuf, LUT RAM,
register file, counters, records, the position of a failing task - is what the steps one by one leave.
kernels/step_batch.py (step_batch_fp16.py) is imported when a program with such steps first runs (a
process's first inference does not need it).

Steady memo (issue 20: silero-vad's members spent ~0.5 us each a run on Python parts that redo the same): a
member's Python part is a function of the Cbuf's values (its keeps: cna_core ``_keep_held``, whose older-sets
lists are replaced, never changed in place) and of the derived cache (its drops: ``DerivedCache.rows_drop``, which
after a call changes nothing until the next put), and its LUT check of the LUT RAM. After a full run of every
member (none stale, the epoch held, no put meanwhile, LUT writes that are stores alone) a batch keeps the Cbuf's
values before and after, ``derived.puts`` and the RAM its members read; a later run that finds the very same
objects in the Cbuf, the same ``puts`` and epoch and, after its writes, the same RAM bytes sets the Cbuf to the
values after and runs the calls: what the members would have done (their own memos, caches alone, left as they were).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from npuemu.emulator.regfile import lut_ram_after, lut_stores_only
from npuemu.emulator.units.cna_core import CALLS_BEFORE, Cbuf

#: shortest run of batchable steps made one StepBatch (one step's calls as one op call save its argument
#: unboxing too)
BATCH_LEAST = 1
#: a batch's precision (``step.batch``'s fifth item; int8 without one): int8 steps' calls run as
#: kernels/step_batch.py ops, fp16 steps' as kernels/step_batch_fp16.py ops (a compiled entry of their own:
#: an int8 model compiles none of the fp16 kinds); a batch holds one precision's steps
INT8, FP16 = "int8", "fp16"


@dataclass(frozen=True)
class StepBatch:
    """Consecutive steps ``first`` .. ``first + size - 1`` (``steps``) whose compiled calls are ops
    ``start`` .. of ``ops`` (kernels/step_batch.py; member i's end at ``start + ends[i]``): run as each
    member's LUT port writes (a member after the first only where none before it reads the LUT RAM:
    ``batched``) and Python part (``pres``), then one ``step_batch.run_ops`` call; ``fallbacks``: per op,
    the general stages' call where its chain refuses. ``run`` keeps what the steps one by one do
    (``_run_steps``)."""

    first: int
    steps: tuple
    pres: tuple
    ends: tuple
    fallbacks: tuple
    #: per member whose calls read the LUT RAM (cna_core ``_lut_batch``): (``folded()``, ``calls(table)``),
    #: else None; and the table its ops are for (they run only while ``folded()`` gives it)
    luts: tuple
    tables: list
    writers: frozenset  # members after the first whose tasks write the LUT RAM (no member before reads it)
    start: int
    ops: np.ndarray  # step_batch.OpTable.frozen(): the program's ops (of its members' precision)
    run_ops: Callable  # (step_batch.run_ops, or dpu_plan_fp.batch_runner's for fp16 ops)
    entry: str = INT8  # the members' precision: which module encodes their calls (``_ENTRIES``)
    #: a member reading the LUT RAM before one writing it (int8 only): the steady memo then keeps the RAM's bytes
    #: before the writes - from the same bytes the same stores leave the same RAM at every member, each reading
    #: the table its ops were made for - and its writes are made once that holds (issue 20: ppocr_cls' LUT steps)
    mixed: bool = False
    #: the steady memo (``run``, the module note): what the last full run of every member found and left, or
    #: empty: [puts, the Cbuf's keys and ids before, its values before, the LUT RAM's bytes its members read
    #: (None: none reads it, or the writes store the whole RAM last; ``mixed``: the bytes before the writes), its
    #: values after, the tasks, the LUT writes, (members, the ops' end), the values after of the batch before
    #: (``run``'s ``left``) the Cbuf was last found to hold these objects from, or None; and ``mixed``: the RAM
    #: after the writes, ``_write``'s answer for them]
    steady: list = field(default_factory=list, compare=False)
    #: ``mixed``: the LUT RAM's bytes before this run's writes and the tasks (``_general``'s restore where a
    #: fallback raises: the RAM then as one by one leaves it, the writes of the members up to it made)
    began: list = field(default_factory=list, compare=False)

    @property
    def size(self) -> int:
        return len(self.steps)

    def run(self, tasks: tuple, cbuf: Cbuf, regfile, derived, epoch: int, failed: list, left: list | None = None) -> int:
        """The members in order while ``derived.epoch`` is ``epoch`` (checked before each, as
        ``_run_steps`` does): how many ran. A member whose calls are stale (the LUT RAM gives another
        table) runs as its step, after the calls of the members before it, and the batch goes on after
        it. An exception in a member leaves the Cbuf, memory and LUT RAM as the steps one by one would,
        and ``failed[0]`` its position in the batch. Where the steady memo holds (the module note), the LUT
        writes, then the Cbuf as the memo's run left it instead of the members' Python parts, then the calls.
        ``left``: a one-item list, the steady memo's values after (a dict) of a batch whose steady run set the Cbuf
        with nothing since (``_run_batched``' loop), else None; set for the next batch."""
        memo, written = self.steady, None
        before, = left or (None,)
        if left is not None:
            left[0] = None
        if memo:
            if self.mixed:  # (the RAM before the writes compared; from those bytes the stores leave memo[9])
                if _steady_holds(memo, tasks, cbuf, derived, epoch, before) and _ram_bytes(regfile) == memo[3]:
                    self.began[:] = [memo[3], tasks]
                    regfile.lut.tables[...] = memo[9]
                    return self._steady(cbuf, regfile, failed, memo, memo[10], left)
            elif _steady_holds(memo, tasks, cbuf, derived, epoch, before):
                # (the writes are stores alone: made ahead of the members, as good as among them; the RAM they
                # leave compared, not the one before them: a store is made on every run, as one by one)
                written = (self._write(tasks, regfile, memo[6]) if memo[6] else None,)
                if memo[3] is None or _ram_bytes(regfile) == memo[3]:
                    return self._steady(cbuf, regfile, failed, memo, written[0], left)
            memo.clear()  # (the full path below: its stale members remake their ops, the memo then wrong)
        puts, start, writes = derived.puts, _held(cbuf), self._writes(tasks)
        before_writes = _ram_bytes(regfile) if self.mixed and written is None else None
        if self.mixed:
            self.began[:] = [before_writes, tasks]
        count, saved, clean, ahead = self._full(tasks, cbuf, regfile, derived, epoch, failed, written)
        if clean and writes is not False and count == self.size and derived.epoch == epoch and derived.puts == puts:
            ram = None if all(reads is None for reads in self.luts) else _ram_bytes(regfile)
            if self.mixed:
                ram = before_writes  # (None - no memo - where writes were made ahead of a failed check)
            elif ram is not None and writes and _stored_whole(writes) == ram:
                ram = None  # (the writes end with a store of the whole RAM: after them it holds these bytes, every run)
            if not self.mixed or ram is not None:
                memo[:] = [puts, start, saved, ram, cbuf.__dict__.copy(), tasks, writes,
                           (count, self.start + self.ends[-1]), None]
                if self.mixed:  # (``ahead``: the full path's answer for its writes made in place, ``_write``'s)
                    memo += [regfile.lut.tables.copy(), ahead]
        return count

    def _steady(self, cbuf: Cbuf, regfile, failed: list, memo: list, ram: tuple | None, left: list | None) -> int:
        """``run`` where the steady memo holds (its LUT writes made): the Cbuf as the memo's run left it, then
        every member's calls (``ram``: as ``_ops``'); ``left[0]`` the values set where no call refused."""
        held = cbuf.__dict__
        held.clear()
        held.update(memo[4])
        size, stop = memo[7]
        at = self.run_ops(self.ops, self.start, stop)  # (``_ops``' first call; its loop where one refuses)
        if at < stop:
            self._ops(0, size, cbuf, memo[2], failed, regfile, ram, at)
        elif left is not None:  # (a refusal's general stages may touch the Cbuf: not passed on then)
            left[0] = memo[4]
        return size

    def _writes(self, tasks: tuple) -> tuple | bool:
        """The members' LUT writes (the first's, then ``writers``' in order) as (member, steps), or False
        where one is more than ``RegisterFile.lut_stores``' stores (those cannot raise, and from the same
        LUT RAM leave the same RAM): no steady memo then."""
        writes = tuple((index, tasks[self.first + index][6]) for index in range(self.size)
                       if tasks[self.first + index][6] and (index == 0 or index in self.writers))
        return writes if all(lut_stores_only(steps) for _, steps in writes) else False

    def _write(self, tasks: tuple, regfile, writes: tuple) -> tuple | None:
        """``writes`` (``_writes``') made: the first member after the first that writes and the LUT RAM before
        its writes (``_ops``' ``ram``), or None."""
        ram = None
        for member, steps in writes:
            if member and ram is None:
                ram = (member, regfile.lut.tables.copy())
            regfile.apply_lut(steps, tasks[self.first + member][0])
        return ram

    def _full(self, tasks: tuple, cbuf: Cbuf, regfile, derived, epoch: int, failed: list,
              written: tuple | None = None) -> tuple:
        """``run``'s members one by one: (how many ran, the Cbuf at the start, no member stale, the first member
        after the first whose writes it made and the LUT RAM before them - ``_write``'s answer - or None). ``written``:
        the members' LUT writes already made (``_write``'s answer in a tuple: they are stores alone, and no
        member before a writer reads the RAM), else None."""
        count, low, saved, tables, pending = 0, 0, cbuf.__dict__.copy(), self.tables, True
        start, clean = saved, True
        writers, ram = self.writers, None  # (ram: the member whose writes came first, the LUT RAM before them)
        if written is not None:
            writers, ram = (), written[0]
        try:
            if written is None and tasks[self.first][6]:
                regfile.apply_lut(tasks[self.first][6], tasks[self.first][0])
            for pre, reads in zip(self.pres, self.luts):
                if derived.epoch != epoch:
                    break
                if writers and count in writers:  # (before the earlier members' calls: none of them reads it)
                    task = tasks[self.first + count]
                    ram = ram or (count, regfile.lut.tables.copy())
                    regfile.apply_lut(task[6], task[0])
                if reads is not None and reads[0]() is not tables[count]:  # (stale: the step as it is)
                    pending = False  # (from here an exception has set ``failed``)
                    self._ops(low, count, cbuf, saved, failed, regfile, ram)
                    failed[0] = count
                    self.steps[count](cbuf)
                    failed[0], count = 0, count + 1
                    low, saved, pending, clean = count, cbuf.__dict__.copy(), True, False
                    self._remake(count - 1)
                    continue
                pre(cbuf)
                count += 1
        except Exception as error:
            if pending:  # (the members before it, as run one by one; with its own where its step's calls came first)
                self._ops(low, count + bool(getattr(error, CALLS_BEFORE, False)), cbuf, saved, failed, regfile, ram)
                failed[0] = count
            _ram_back(regfile, ram, count)  # (writes made ahead: the RAM as before the later ones)
            raise
        self._ops(low, count, cbuf, saved, failed, regfile, ram)
        return count, start, clean, ram

    def _ops(self, low: int, count: int, cbuf: Cbuf, saved: dict, failed: list, regfile=None,
             ram: tuple | None = None, at: int | None = None) -> None:
        """Members ``low`` .. ``count - 1``'s compiled calls, each refusal's general stages in its place;
        where those raise, the Cbuf as it was after that member's bookkeeping (``saved``: as at ``low``)
        and the LUT RAM as before the writes of the members after it (``ram``: the first such member and
        the RAM before its writes; ``failed[0]``: the member). ``at``: the op the calls stopped at (the ones
        before it ran), else the first of member ``low``'s."""
        if count <= low:
            return
        table, stop = self.ops, self.start + self.ends[count - 1]
        if at is None:
            at = self.start + (self.ends[low - 1] if low else 0)
        elif at < stop:
            at = self._general(at, low, cbuf, saved, failed, regfile, ram)
        while at < stop:
            at = self.run_ops(table, at, stop)
            if at < stop:
                at = self._general(at, low, cbuf, saved, failed, regfile, ram)

    def _general(self, at: int, low: int, cbuf: Cbuf, saved: dict, failed: list, regfile, ram: tuple | None) -> int:
        """The general stages' call of op ``at``, which its chain refused (``_ops``): the next op."""
        general, *fallback = self.fallbacks[at - self.start]
        try:
            general(*fallback)
        except Exception:
            member = next(index for index, end in enumerate(self.ends) if end > at - self.start)
            if self.mixed and self.began and self.began[0] is not None:
                self._ram_to(regfile, member)
            else:
                _ram_back(regfile, ram, member)
            cbuf.__dict__.clear()
            cbuf.__dict__.update(saved)
            for pre in self.pres[low:member + 1]:  # (a function of the Cbuf's state: the same keeps)
                pre(cbuf)
            failed[0] = member
            raise
        return at + 1

    def _ram_to(self, regfile, member: int) -> None:
        """A mixed batch's LUT RAM as one by one leaves it at member ``member``: the bytes before this run's
        writes (``began``) and the writes of the members up to it."""
        ram, tasks = self.began
        regfile.lut.tables[...] = np.frombuffer(ram, regfile.lut.tables.dtype).reshape(regfile.lut.tables.shape)
        for index in range(member + 1):
            task = tasks[self.first + index]
            if task[6] and (index == 0 or index in self.writers):
                regfile.apply_lut(task[6], task[0])

    def _remake(self, member: int) -> None:
        """Member ``member``'s ops made again for the table the LUT RAM gives now (kept where they encode:
        their arguments then live as long as the table, ``tables``' entry)."""
        folded, calls = self.luts[member]
        table = folded()
        rows = None if table is None else _encoded_calls(calls(table), self.entry)
        low = self.start + (self.ends[member - 1] if member else 0)
        if rows is not None and len(rows) == self.start + self.ends[member] - low:
            self.ops[low:low + len(rows)] = rows
            self.tables[member] = table
            refresh = getattr(self.run_ops, "refresh", None)  # (a runner whose buffers its ops size)
            if refresh is not None:
                refresh()


def _steady_holds(memo: list, tasks: tuple, cbuf: Cbuf, derived, epoch: int, before: dict | None = None) -> bool:
    """Whether a batch's steady memo (``StepBatch.run``) holds now, but for the LUT RAM: the derived values at
    ``epoch`` with no put since, the same tasks, the Cbuf holding the very objects it held. ``before``: the
    values (a memo's dict, never changed, its objects kept alive) the Cbuf was set from with nothing since, or
    None; where the Cbuf was found to hold this memo's objects when set from the very same dict, it holds them
    now (issue 20: the ids' tuple, ~0.5 us, not made again for each batch of silero-vad's steady replay)."""
    if derived.epoch != epoch or derived.puts != memo[0] or tasks is not memo[5]:
        return False
    if before is not None and memo[8] is before:
        return True
    if _held(cbuf) != memo[1]:
        return False
    memo[8] = before
    return True


def _ram_back(regfile, ram: tuple | None, member: int) -> None:
    """The LUT RAM as before the writes of the members after ``member`` (``ram``: the first member whose writes
    came ahead and the RAM before them, or None), where one raised."""
    if ram is not None and ram[0] > member:
        regfile.lut.tables[...] = ram[1]


def _stored_whole(writes: tuple) -> bytes | None:
    """The bytes of the LUT RAM after a batch's writes (``StepBatch._writes``') that end with a store of the whole
    RAM, else None."""
    entries = lut_ram_after(writes[-1][1])
    return None if entries is None else entries.tobytes()


def _ram_bytes(regfile) -> bytes:
    """The LUT RAM's bytes (the steady memo's check: ~0.3 us, once a batch)."""
    return regfile.lut.tables.tobytes()


def _held(cbuf: Cbuf) -> tuple:
    """What the Cbuf holds, by identity (the steady memo keeps the objects: an id names one of them)."""
    held = cbuf.__dict__
    return tuple(held), tuple(map(id, held.values()))


#: task_plan.ChainProgram.runs' first item until they are made
UNMADE = object()


def runs(program) -> tuple | None:
    """``program.runs``, made as the program first runs (issue 20: a process's first inference neither
    imports kernels/step_batch.py nor encodes its ops)."""
    held = program.runs
    if held is None:
        return None
    if held[0] is UNMADE:
        held[:] = [batched(program.steps, held[1])]
    return held[0]


def batched(steps: list, tasks: tuple) -> tuple | None:
    """``ChainProgram.runs`` of ``steps`` (of ``tasks``): each run of consecutive steps of one precision with
    a compiled form (``_fused_rows``' or ``_fused_run``'s ``step.batch``) one StepBatch, each other task
    alone; None without a run of at least BATCH_LEAST steps. A task that writes the LUT RAM joins an fp16 run
    only where no member before it reads the LUT RAM (its writes come before their calls; the calls after it
    see the RAM as one by one), and so does an int8 run that follows a step alone; an int8 run right after another
    run whatever its members read (``StepBatch.mixed``: their ops hold folded copies of the tables they were made
    for, and no fallback reads the RAM)."""
    forms = [_op_form(step) for step in steps]
    if not any(forms):
        return None
    runs, tables, at = [], {}, 0
    while at < len(steps):
        end = at
        # (mixed only right after another batch: one after a step alone - a large layer's, keeping objects
        # of its own run in the Cbuf - finds no steady memo, and a mixed batch's full path runs every member)
        mixed = forms[at] is not None and forms[at][5] == INT8 and bool(runs) and runs[-1][1] is not None
        while end < len(steps) and forms[end] is not None and (end == at or forms[end][5] == forms[at][5] and (
                not tasks[end][6] or mixed or all(form[4] is None for form in forms[at:end]))):
            end += 1
        if end - at < BATCH_LEAST:
            runs.append((at, None, None))
            at += 1
            continue
        entry = forms[at][5]
        ops = tables.setdefault(entry, [])
        start, ends, fallbacks = len(ops), [], []
        for rows, _, fallback, _, _, _ in forms[at:end]:
            for row in rows:
                ops.append(row)
                fallbacks.append(fallback)
            ends.append(len(ops) - start)
        luts = tuple(form[4] for form in forms[at:end])
        runs.append((at, entry, (tuple(steps[at:end]), tuple(form[1] for form in forms[at:end]), tuple(ends),
                                 tuple(fallbacks), tuple(None if lut is None else lut[:2] for lut in luts),
                                 [None if lut is None else lut[2] for lut in luts],
                                 frozenset(index - at for index in range(at + 1, end) if tasks[index][6]), start)))
        at = end
    if not tables:
        return None
    frozen = {entry: _ENTRIES[entry]().frozen(rows) for entry, rows in tables.items()}
    return tuple((first, None if made is None else StepBatch(
        first, *made, frozen[entry], _ENTRIES[entry]().runner(frozen[entry][made[-1]:made[-1] + made[2][-1]]), entry,
        _mixed(made[4], made[6])))
        for first, entry, made in runs)


def _mixed(luts: tuple, writers: frozenset) -> bool:
    """Whether a member that reads the LUT RAM comes before one whose task writes it (``StepBatch.mixed``)."""
    readers = [index for index, reads in enumerate(luts) if reads is not None]
    return bool(readers and writers and min(readers) < max(writers))


class _Int8:
    """kernels/step_batch.py as a batch's entry (imported as a program with such steps first runs)."""

    def __init__(self) -> None:
        from npuemu.emulator.kernels import step_batch
        self.module = step_batch

    def frozen(self, rows: list) -> np.ndarray:
        return np.array(rows, np.int64).reshape(-1, self.module.COLUMNS)

    def runner(self, rows: np.ndarray) -> Callable:
        return self.module.run_ops

    def encoded_calls(self, calls: tuple) -> list | None:
        module, rows = self.module, []
        for call in calls:
            kind = None if call is None else module.kind_of(*call)
            row = module.nothing() if call is None else None if kind is None else module.encoded(kind, call[1])
            if row is None:
                return None
            rows.append(row)
        return rows


class _Fp16:
    """kernels/step_batch_fp16.py as a batch's entry: its ``run_fp16_ops`` with the thread's buffers
    (units/dpu_plan_fp.py ``batch_runner``, each at least what the batch's ops need)."""

    def __init__(self) -> None:
        from npuemu.emulator.kernels import step_batch_fp16
        self.module = step_batch_fp16

    def frozen(self, rows: list) -> np.ndarray:
        return np.array(rows, np.int64).reshape(-1, self.module.COLUMNS)

    def runner(self, rows: np.ndarray) -> Callable:
        from npuemu.emulator.units.dpu_plan_fp import batch_runner
        return batch_runner(rows)

    def encoded_calls(self, calls: tuple) -> list | None:
        return self.module.encoded_calls(calls)


_ENTRIES = {INT8: _Int8, FP16: _Fp16}


def _op_form(step) -> tuple | None:
    """(its ops' table rows, bookkeeping, fallback call, its calls, LUT reads, precision) of a step with a
    compiled form a batch runs (``step.batch``), worked out once per step (kept on it); None for others."""
    if step is None:
        return None
    form = getattr(step, "op_form", False)
    if form is False:
        form, batch = None, getattr(step, "batch", None)
        if batch is not None:
            pre, calls, fallback, lut, *entry = batch
            entry = entry[0] if entry else INT8
            rows = _encoded_calls(calls, entry)
            form = None if rows is None else (rows, pre, fallback, calls, lut, entry)
        step.op_form = form
    elif form is not None and len(form) == 5:  # (a form made without its precision: int8's)
        form = form + (INT8,)
    return form


def _encoded_calls(calls: tuple, entry: str = INT8) -> list | None:
    """The table rows of ``calls`` ((kernel, arguments), or None: a place kept for a call to come) for the
    precision ``entry``'s module, or None where one is no op kind's."""
    return _ENTRIES[entry]().encoded_calls(calls)
