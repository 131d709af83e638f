"""The steady memo of task_batches.StepBatch (issue 20): a batch whose last full run found the Cbuf holding the
very objects it holds now, no put into the derived cache since, the same epoch and the same LUT RAM skips its
members' Python parts and LUT checks. Small fp16 models (test_step_batch_fp16's) run by three runtimes - batched,
the steps one by one and the full unit path - must give the same outputs, task records, registers, counters, LUT
RAM and (batched and one by one) Cbuf when the memo is taken, and when it must not be: the Cbuf changed between
runs, a put into the derived cache over rows a member writes, a host write that moves the epoch, the LUT RAM
changed under a LUT member (which then finds its tables stale). Broken memos are caught."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator import regfile, task_batches
from npuemu.emulator.memory import DerivedCache
from npuemu.emulator.regfile import RegisterFile
from npuemu.emulator.units import cna_core
from tests.emulator import test_step_batch_fp16 as fp16

pytestmark = fp16.pytestmark

#: runs after a change before the memo is back: a full run of each replay's program (these chains alternate
#: between two start states), then one that takes it
RUNS = 5
#: an older weight set no load of these models overlaps (its banks far past the CBUF's)
FAR = ((("address", 0xDEAD0),), np.zeros(4, np.int8), range(1000, 1001))


class _Paths:
    """Counts batch runs and those that took the members one by one (``StepBatch._full``)."""

    def __init__(self, monkeypatch) -> None:
        self.runs = self.full = 0
        run, full = task_batches.StepBatch.run, task_batches.StepBatch._full

        def counted_run(batch, *args):
            self.runs += 1
            return run(batch, *args)

        def counted_full(batch, *args):
            self.full += 1
            return full(batch, *args)

        monkeypatch.setattr(task_batches.StepBatch, "run", counted_run)
        monkeypatch.setattr(task_batches.StepBatch, "_full", counted_full)

    def steady(self) -> int:
        return self.runs - self.full

    def reset(self) -> None:
        self.runs = self.full = 0


def _warm(monkeypatch, tmp_path, name: str = "gate") -> tuple:
    """The three runtimes after their warm-up runs (each compared), a path counter, the shapes and a generator."""
    paths = _Paths(monkeypatch)
    runtimes, shapes = fp16._compare(tmp_path, name)
    paths.reset()
    return runtimes, shapes, paths, np.random.default_rng(5)


def _run(runtimes, shapes, rng) -> None:
    fp16._check_equal(runtimes, fp16._run_all(runtimes, fp16._feeds(rng, shapes)))


def _run_two(runtimes, shapes, rng) -> None:
    """``_run`` comparing the batched and one-by-one runtimes alone (the full path takes no LUT writes as
    steps: a change made in ``apply_lut`` is not its)."""
    outputs = fp16._run_all(runtimes, fp16._feeds(rng, shapes))
    batched, one, _ = runtimes
    assert outputs[0] == outputs[1]
    assert [run.tasks for run in batched.runs] == [run.tasks for run in one.runs]
    assert fp16._state(batched) == fp16._state(one) and fp16._cbufs(batched) == fp16._cbufs(one)


def _derived(runtime) -> DerivedCache:
    return runtime.machine.memory.derived


@pytest.mark.parametrize("name", ["gate", "flying", "conv_bias_lut"])
def test_a_steady_run_takes_the_memo_and_equals_the_other_paths(monkeypatch, tmp_path, name):
    runtimes, shapes, paths, rng = _warm(monkeypatch, tmp_path, name)
    for _ in range(3):
        _run(runtimes, shapes, rng)
    assert paths.runs >= 3 and paths.full == 0


def test_a_cbuf_changed_between_runs_takes_the_members_again(monkeypatch, tmp_path, paths_checked: bool = True):
    """Another chain's load left an older weight set beside the slots (kept by every keep after it, as the steps
    one by one keep it), then a feature slot holding an equal copy: the batch takes its members one by one.
    (``paths_checked``: False to check the results alone, for the broken memos below.)"""
    runtimes, shapes, paths, rng = _warm(monkeypatch, tmp_path)
    for runtime in runtimes:
        for core in runtime.machine.cores:
            core.cbuf._older_weights = [FAR]
    _run(runtimes, shapes, rng)
    assert FAR[0] in [key for key, _, _ in runtimes[0].machine.cores[0].cbuf._older_weights]
    assert paths.full >= 1 or not paths_checked
    _run(runtimes, shapes, rng)  # (steady again, with the older set)
    paths.reset()
    cbuf = runtimes[0].machine.cores[0].cbuf
    cbuf.feature = cna_core._Resident(*cbuf.feature)
    _run(runtimes, shapes, rng)
    assert paths.full >= 1 or not paths_checked


def test_the_checks_catch_a_memo_blind_to_the_cbuf(monkeypatch, tmp_path):
    monkeypatch.setattr(task_batches, "_held", lambda cbuf: ())
    with pytest.raises(AssertionError):
        test_a_cbuf_changed_between_runs_takes_the_members_again(monkeypatch, tmp_path, False)


def _member_rows(monkeypatch, runtime, shapes, rng) -> tuple[int, int]:
    """[low, high) of the rows the last batch member to drop derived values writes (a put far from every row
    first: each member's drop then searches once)."""
    seen, inside = [], [False]
    drop, full = DerivedCache.invalidate_rows, task_batches.StepBatch._full

    def spied_drop(self, starts, row_bytes, bounds=None):
        if inside[0]:
            seen.append(bounds or (int(starts.min()), int(starts.max()) + row_bytes))
        return drop(self, starts, row_bytes, bounds)

    def spied_full(batch, *args):
        inside[0] = True
        try:
            return full(batch, *args)
        finally:
            inside[0] = False

    with monkeypatch.context() as patch:
        patch.setattr(DerivedCache, "invalidate_rows", spied_drop)
        patch.setattr(task_batches.StepBatch, "_full", spied_full)
        _derived(runtime).put(("far",), 1 << 40, (1 << 40) + 1, None)
        fp16._run_all((runtime,), fp16._feeds(rng, shapes))
    assert seen
    return seen[-1]


def test_a_put_over_a_members_rows_takes_the_members_again(monkeypatch, tmp_path, broken=None):
    """A value put over rows a member writes: its drop drops it (the epoch moves, the rest of the chain goes
    through the replay's checks), in every runtime. (``broken(monkeypatch)``: breaks the memo once the rows are
    found; the results alone are checked then.)"""
    runtimes, shapes, paths, rng = _warm(monkeypatch, tmp_path)
    low, high = _member_rows(monkeypatch, runtimes[0], shapes, rng)
    for runtime in runtimes[1:]:
        fp16._run_all((runtime,), fp16._feeds(np.random.default_rng(0), shapes))  # (as many runs as the first)
    _run(runtimes, shapes, rng)
    _run(runtimes, shapes, rng)
    paths.reset()
    if broken is not None:
        broken(monkeypatch)
    for runtime in runtimes:
        _derived(runtime).put(("stale",), low, high, "a value the member's write makes stale")
    _run(runtimes, shapes, rng)
    assert [_derived(runtime).get(("stale",)) for runtime in runtimes] == [None] * 3
    assert paths.full >= 1 or broken is not None
    _run(runtimes, shapes, rng)


def test_the_checks_catch_a_memo_blind_to_puts(monkeypatch, tmp_path):
    def holds(memo, tasks, cbuf, derived, epoch, before=None):
        return derived.epoch == epoch and tasks is memo[5] and task_batches._held(cbuf) == memo[1]

    with pytest.raises(AssertionError):
        test_a_put_over_a_members_rows_takes_the_members_again(
            monkeypatch, tmp_path, lambda patch: patch.setattr(task_batches, "_steady_holds", holds))


def test_a_host_write_that_moves_the_epoch_takes_no_memo(monkeypatch, tmp_path):
    """A value over every address, dropped by the next host write (the inputs): that run's batches wait for the
    replay's checks; later runs take their members again (each replay's program, one per start state the chain
    alternates between), then the memo."""
    runtimes, shapes, paths, rng = _warm(monkeypatch, tmp_path)
    for runtime in runtimes:
        _derived(runtime).put(("everywhere",), 0, 1 << 41, None)
    epochs = [_derived(runtime).epoch for runtime in runtimes]
    _run(runtimes, shapes, rng)
    assert [_derived(runtime).epoch for runtime in runtimes] > epochs and paths.steady() == 0
    for _ in range(RUNS):
        _run(runtimes, shapes, rng)
    assert paths.full >= 1 and paths.steady() >= 1


def test_a_lut_ram_changed_under_a_lut_member_takes_the_members_again(monkeypatch, tmp_path,
                                                                     paths_checked: bool = True):
    """The LUT RAM changed after the chain's LUT writes, differently each run, then as it was: the LUT members
    find their tables stale (made again), and the memo comes back once the RAM holds still."""
    # (the writes taken as stores of part of the RAM, so that it is compared after them: a store of the whole
    # RAM leaves its bytes, which no change after it can be in a real run - test_whole_ram_writes_...)
    monkeypatch.setattr(task_batches, "lut_ram_after", lambda steps: None)
    runtimes, shapes, paths, rng = _warm(monkeypatch, tmp_path, "flying")
    remade = fp16._remakes(monkeypatch)
    change, inner = [None], RegisterFile.apply_lut

    def apply_lut(self, steps, where):
        inner(self, steps, where)
        if change[0] is not None:
            self.lut.tables[:, 3 + change[0]] += 7

    monkeypatch.setattr(RegisterFile, "apply_lut", apply_lut)
    for change[0] in range(3):
        _run_two(runtimes, shapes, rng)
        assert paths.full >= change[0] + 1 or not paths_checked
    assert len(remade) >= 3 or not paths_checked
    change[0] = None
    paths.reset()
    for _ in range(RUNS):
        _run_two(runtimes, shapes, rng)
    assert paths.steady() >= 1


def test_the_checks_catch_a_memo_blind_to_the_lut_ram(monkeypatch, tmp_path):
    monkeypatch.setattr(task_batches, "_ram_bytes", lambda regfile: b"")
    with pytest.raises(AssertionError):
        test_a_lut_ram_changed_under_a_lut_member_takes_the_members_again(monkeypatch, tmp_path, False)


def test_whole_ram_writes_leave_the_ram_unread(monkeypatch, tmp_path):
    """A LUT batch whose writes end with a store of the whole RAM: its memo keeps no RAM bytes (after the writes
    the RAM holds the store's), its steady runs read none, and the three runtimes still agree."""
    runtimes, shapes, paths, rng = _warm(monkeypatch, tmp_path, "flying")
    for _ in range(RUNS):
        _run(runtimes, shapes, rng)
    batches = [batch for core in runtimes[0].machine.cores for entry in core._replays._entries.values()
               for replay in entry[1] if replay.program[0] for _, batch in task_batches.runs(replay.program[0]) or ()
               if batch is not None and batch.steady]
    whole = [batch for batch in batches if any(reads is not None for reads in batch.luts) and batch.steady[6]
             and task_batches.lut_ram_after(batch.steady[6][-1][1]) is not None]
    assert whole and all(batch.steady[3] is None for batch in whole)
    monkeypatch.setattr(task_batches, "_ram_bytes", lambda regfile: pytest.fail("the RAM read"))
    paths.reset()
    for _ in range(3):
        _run(runtimes, shapes, rng)
    assert paths.steady() >= 3 and paths.full == 0


def test_only_a_whole_store_last_leaves_known_bytes(monkeypatch):
    whole = np.arange(2 * 513, dtype=np.int16).reshape(2, 513)
    part = (regfile._LUT_STORE, 1, 5, np.full(4, 9, np.int16))
    store = (regfile._LUT_STORE, None, 0, whole)
    assert task_batches._stored_whole(((0, (store,)),)) == whole.tobytes()
    assert task_batches._stored_whole(((0, (part, store)),)) == whole.tobytes()
    assert task_batches._stored_whole(((0, (store, part)),)) is None  # (a store after it: the RAM not known)
    assert task_batches._stored_whole(((0, (store,)), (2, (part,)))) is None  # (a later member's store)
    assert task_batches._stored_whole(((0, (part,)),)) is None


def test_the_checks_catch_a_whole_store_found_anywhere(monkeypatch):
    def anywhere(steps):
        return next((step[3] for step in steps if step[0] == regfile._LUT_STORE and step[1] is None), None)

    monkeypatch.setattr(task_batches, "lut_ram_after", anywhere)
    with pytest.raises(AssertionError):
        test_only_a_whole_store_last_leaves_known_bytes(monkeypatch)
