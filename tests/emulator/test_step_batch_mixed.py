"""Mixed int8 batches: a member reading the LUT RAM before a member whose task writes it (issue 20,
task_batches.py ``batched`` / ``StepBatch.mixed``, NUMERICS.md 87). The batch is a replayed chain of LUT
convolutions, each uploading its own tables, with a plain convolution among them. It must leave what the
steps one by one and the full unit path leave (outputs, records, register state, Cbuf, LUT RAM), on its
full runs and on its steady ones.

- On a steady run the writes are made as one copy of the RAM they leave, and only where the RAM before them
  is the memo's bytes. Other bytes take the members one by one again.
- Where a refused chain's general stages raise mid-batch, the LUT RAM is as the one-by-one loop leaves it
  (the writes of the members up to the raising one, not the later ones): end to end, and ``_ram_to`` per
  member against the tables the chain's tasks upload (end to end the core's ``_replay_failed`` uploads the
  raising task's and earlier tasks' tables again, whole tables here, so it alone cannot tell).
- The batching rule is checked on its own. Broken variants are caught."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator import task_batches
from npuemu.emulator.kernels import step_batch
from npuemu.isa.errors import EmulationError
from tests.emulator import test_task_plans as plans
from tests.emulator.test_machine_support import MASK_CONV, conv_task, load_cube
from tests.emulator.test_step_batch import (RUNS, _Step, _equal_runs, _one_by_one, _raising_at, _state,
                                          refusing_and_raising)


def _chain():
    """(specs, amount, machines: batched, one by one, full path): three LUT convolutions, a plain convolution
    and a LUT convolution, each LUT task uploading its own tables - the first a batch alone (the second's writes
    come after its read, and no batch before it), the other four one mixed batch (writers at members 1 and 3)."""
    from tests.emulator.test_task_plans_lut import _chain as lut_chain
    from tests.emulator.test_task_plans_lut_folded import _folding

    specs, layer, chain, settings = lut_chain("pointwise_70_kernels", "identity", 5)
    # (_folding's seeds 0-2: tables that fold - a wider one's span would not - and their own uploads each)
    chain = [(_folding(task, spec, seed), mask) for seed, ((task, mask), spec) in zip((0, 1, 2, 0, 0),
                                                                                       zip(chain, specs))]
    chain[3] = (conv_task(specs[3]), MASK_CONV)
    made = [plans._machine(chain, full, layer, specs[0]) for full in (False, False, True)]
    _one_by_one(made[1][0])
    _chain.tables = [None if index == 3 else one[2] for index, one in enumerate(settings)]  # (each task's uploads)
    return specs, made[0][1], [machine for machine, _ in made]


def _paths(monkeypatch) -> dict:
    """Counts of the mixed batches' steady runs and full runs (wrapping ``StepBatch``'s paths)."""
    counts = {"steady": 0, "full": 0, "mixed": set()}
    steady, full = task_batches.StepBatch._steady, task_batches.StepBatch._full

    def counted_steady(self, *args):
        if self.mixed:
            counts["steady"] += 1
            counts["mixed"].add(self.size)
            counts["batch"] = self
        return steady(self, *args)

    def counted_full(self, *args, **kwargs):
        if self.mixed:
            counts["full"] += 1
            counts["mixed"].add(self.size)
            counts["batch"] = self
        return full(self, *args, **kwargs)

    monkeypatch.setattr(task_batches.StepBatch, "_steady", counted_steady)
    monkeypatch.setattr(task_batches.StepBatch, "_full", counted_full)
    return counts


def test_a_mixed_batch_equals_steps_one_by_one_and_the_full_path(monkeypatch):
    counts = _paths(monkeypatch)
    specs, amount, machines = _chain()
    inputs = list(plans.int8_inputs(3, (specs[0].in_c, specs[0].in_h, specs[0].in_w)))
    _equal_runs([(machine, amount) for machine in machines], specs, inputs)
    assert counts["mixed"] == {4}  # (the four members after the first as one batch)
    assert counts["steady"] >= 1 and counts["full"] >= 1
    # other RAM bytes before the writes than the memo's take the members one by one again (the memo's made
    # to differ: the batch before stores the whole RAM, so a RAM changed between runs never reaches it)
    full, batch = counts["full"], counts["batch"]
    batch.steady[3] = bytes(len(batch.steady[3]))
    _equal_runs([(machine, amount) for machine in machines], specs, inputs[:2])
    assert counts["full"] == full + 1 and batch.steady[3] != bytes(len(batch.steady[3]))


def test_the_checks_catch_a_steady_run_skipping_its_writes(monkeypatch):
    """A steady mixed run that leaves the RAM as it found it (the writes not made) differs in the RAM."""
    counts = _paths(monkeypatch)
    inner = task_batches.StepBatch._steady

    def unwritten(self, cbuf, regfile, failed, memo, ram, left):
        if self.mixed:
            regfile.lut.tables[...] = np.frombuffer(memo[3], regfile.lut.tables.dtype).reshape(
                regfile.lut.tables.shape)
        return inner(self, cbuf, regfile, failed, memo, ram, left)

    monkeypatch.setattr(task_batches.StepBatch, "_steady", unwritten)
    specs, amount, machines = _chain()
    with pytest.raises(AssertionError):
        _equal_runs([(machine, amount) for machine in machines], specs,
                    plans.int8_inputs(3, (specs[0].in_c, specs[0].in_h, specs[0].in_w)))
    assert counts["steady"] >= 1


def _raised_rams(monkeypatch) -> list:
    """The states of a batched and a one-by-one machine whose fourth task raised: in the batch, the plain
    convolution's chain made to refuse and its general stages raising (after every member's writes were
    made: the last member's too, a writer after the first writer); one by one, its bookkeeping raising."""
    specs, amount, machines = _chain()
    raising, inner = [False], task_batches.batched

    def batched(steps, tasks):
        runs = inner(steps, tasks)
        for _, batch in runs or ():
            if batch is not None and batch.mixed:
                # (the plain convolution's op: member 2, after the second writer's)
                refusing_and_raising(batch, batch.ends[1], raising)
        return runs

    monkeypatch.setattr(task_batches, "batched", batched)
    x = np.random.default_rng(4).integers(-128, 128, (specs[0].in_c, specs[0].in_h, specs[0].in_w)).astype(np.int8)
    for machine in machines[:2]:
        for _ in range(RUNS):
            load_cube(machine, specs[0].feature, x)
            machine.run_chain(plans.ADDRESS, amount)
    ends = []
    with monkeypatch.context() as patch:
        raising[0] = True
        for machine, call in zip(machines[:2], (None, 4)):
            if call is not None:
                _raising_at(patch, call)
            with pytest.raises(EmulationError):
                machine.run_chain(plans.ADDRESS, amount)
            ends.append(_state(machine))
    return ends


def test_an_exception_mid_mixed_batch_leaves_the_lut_ram_as_one_by_one(monkeypatch):
    ends = _raised_rams(monkeypatch)
    assert ends[0][4] == ends[1][4]  # (the third task's tables: not the fifth's)
    assert ends[0][1] == ends[1][1]


def _ram_at_members(monkeypatch, ram_to) -> list:
    """The LUT RAM ``ram_to`` leaves for each member of the mixed batch after its runs (``began``: the RAM
    before the last one's writes), and the tables one by one leaves there: those of the last task up to the member that
    uploads (the chain's own settings)."""
    counts = _paths(monkeypatch)
    specs, amount, machines = _chain()
    machine = machines[0]
    x = np.random.default_rng(6).integers(-128, 128, (specs[0].in_c, specs[0].in_h, specs[0].in_w)).astype(np.int8)
    for _ in range(RUNS):
        load_cube(machine, specs[0].feature, x)
        machine.run_chain(plans.ADDRESS, amount)
    batch, regfile = counts["batch"], machine.cores[0].regfile
    got, want = [], []
    for member in range(batch.size):
        ram_to(batch, regfile, member)
        got.append(regfile.lut.tables.copy())
        task = max(index for index in range(batch.first + member + 1) if _chain.tables[index] is not None)
        want.append(np.asarray(_chain.tables[task], np.int16))
    return got, want


def test_the_ram_one_by_one_leaves_at_each_member_of_a_mixed_batch(monkeypatch):
    """``_ram_to``: the RAM before the run's writes and the writes of the members up to the one that raised
    (its own and the earlier ones', not the later ones'), for each member of the batch."""
    got, want = _ram_at_members(monkeypatch, task_batches.StepBatch._ram_to)
    for mine, theirs in zip(got, want):
        np.testing.assert_array_equal(mine, theirs)


def test_the_checks_catch_a_restore_making_every_write(monkeypatch):
    def every_write(batch, regfile, member):
        task_batches.StepBatch._ram_to(batch, regfile, batch.size - 1)
    got, want = _ram_at_members(monkeypatch, every_write)
    assert any(not np.array_equal(mine, theirs) for mine, theirs in zip(got, want))


def test_an_int8_run_after_another_mixes_readers_and_writers():
    """A run right after another batch takes writers after readers (mixed); one after a step alone, or an
    fp16 run, ends before them."""
    form = ([np.zeros(step_batch.COLUMNS, np.int64)] * 2, None, (None,), (), None)
    reading = form[:4] + ((None, None, None),)
    steps = [_Step(reading), _Step(form), _Step(form), _Step(reading), _Step(form), None, _Step(reading),
             _Step(form)]
    tasks = [(None,) * 6 + (lut,) for lut in (("write",), (), ("write",), (), ("write",), (), (), ("write",))]
    runs = task_batches.batched(steps, tasks)
    assert [(first, None if batch is None else (batch.size, batch.mixed)) for first, batch in runs] \
        == [(0, (2, False)), (2, (3, True)), (5, None), (6, (1, False)), (7, (1, False))]
    assert runs[1][1].writers == {2}
    from npuemu.emulator.kernels import step_batch_fp16

    fp16 = ([np.zeros(step_batch_fp16.COLUMNS, np.int64)] * 2,) + form[1:] + (task_batches.FP16,)
    reading16 = fp16[:4] + ((None, None, None), task_batches.FP16)
    runs = task_batches.batched([_Step(reading16), _Step(fp16), _Step(fp16), _Step(reading16), _Step(fp16)],
                                tasks[:5])
    assert [(first, None if batch is None else batch.size) for first, batch in runs] == [(0, 2), (2, 2), (4, 1)]
