"""Runs of int8 task steps as one compiled call (issue 20, kernels/step_batch.py, task_batches.py
``StepBatch``, core.py ``_run_batched``): a replayed chain whose steps run as one ``run_ops`` call
must leave what the steps one by one (and the full unit path) leave - outputs, task records with
their DMA counters, register state, task counter, interrupts and the Cbuf - also where a chain
refuses mid-batch (its general stages run in its place) and where a member raises mid-batch.
The interpreter itself is checked against the kernels called one by one with their own arguments
(the reference: int8_core_step's calls as the steps make them). Broken variants are caught."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.emulator import task_batches
from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import depthwise_plan, gemm_conv_int8, gemm_int8, step_batch
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.memory import DerivedCache
from tests.emulator.test_derived_cache_index import searching
from npuemu.emulator.units import cna_core
from npuemu.isa.errors import EmulationError
from tests.emulator import test_int8_core_step as core_steps
from tests.emulator import test_task_plans as plans
from tests.emulator.test_kern_int8_passes import depthwise_case
from tests.emulator.test_machine_support import MASK_CONV, conv_task, load_cube

#: layers whose steps take the chained form (each task of the chain one op)
BATCHED = ["pointwise_70_kernels", "depthwise_5x5_s2_80ch", "depthwise_3x3_40ch", "depthwise_3x3_s2_40ch"]
RUNS = 6


def _machines(name: str, tasks: int):
    """(spec, amount, machines: batched, steps one by one, full path) for a chain of ``tasks`` copies of
    layer ``name``."""
    spec = plans._spec(name)
    layer = plans.random_layer(spec, 0)
    made = [plans._machine([(conv_task(spec), MASK_CONV)] * tasks, full, layer, spec) for full in (False, False, True)]
    _one_by_one(made[1][0])
    return spec, made[0][1], [machine for machine, _ in made]


def _one_by_one(machine) -> None:
    """``machine``'s programs run without their batches (``_run_steps``' loop of single steps)."""
    core = machine.cores[0]
    inner = core._run_steps
    core._run_steps = lambda replay, steps, epoch, runs=None: inner(replay, steps, epoch, None)


def _cbuf(machine):
    cbuf = machine.cores[0].cbuf
    return tuple(None if slot is None else (slot.key, slot.array.tobytes()) for slot in (cbuf.feature, cbuf.weights)) \
        + (tuple(cbuf._older_weights),)



def _equal_runs(made: list, specs: list, inputs) -> None:
    """Each input run on every (machine, chain amount) of ``made``: the same records, outputs and end state
    as the first machine's."""
    for x in inputs:
        results = []
        for machine, amount in made:
            load_cube(machine, specs[0].feature, x)
            records = machine.run_chain(plans.ADDRESS, amount).tasks
            results.append((records, [plans._output(machine, spec) for spec in specs], _state(machine)))
        for other in results[1:]:
            assert results[0][0] == other[0] and results[0][2] == other[2]
            for mine, theirs in zip(results[0][1], other[1]):
                np.testing.assert_array_equal(mine, theirs)


def _state(machine):
    core = machine.cores[0]
    return core.regfile.snapshot(), core.tasks_run, core.interrupt_raw, _cbuf(machine), \
        core.regfile.lut.tables.tobytes()


def _batches_run(monkeypatch) -> list:
    """The ``run_ops`` calls made (start, stop) (wrapping step_batch's, which batches made from then on call)."""
    calls, inner = [], step_batch.run_ops

    def counted(table, start, stop):
        calls.append((start, stop))
        return inner(table, start, stop)

    monkeypatch.setattr(step_batch, "run_ops", counted)
    return calls


def _compare(name: str, tasks: int, runs: int = RUNS) -> None:
    spec, amount, machines = _machines(name, tasks)
    rng = np.random.default_rng(5)
    for _ in range(runs):
        x = rng.integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
        results = []
        for machine in machines:
            load_cube(machine, spec.feature, x)
            records = machine.run_chain(plans.ADDRESS, amount).tasks
            results.append((records, plans._output(machine, spec), _state(machine)))
        for other in results[1:]:
            assert results[0][0] == other[0]
            np.testing.assert_array_equal(results[0][1], other[1])
            assert results[0][2] == other[2]
        np.testing.assert_array_equal(results[0][1], plans._expected(spec, x, *plans.random_layer(spec, 0)[1::2]))


@pytest.mark.parametrize("name", BATCHED)
@pytest.mark.parametrize("tasks", [2, 3, 5])
def test_batches_equal_steps_one_by_one_and_the_full_path(monkeypatch, name, tasks):
    calls = _batches_run(monkeypatch)
    _compare(name, tasks)
    assert any(stop - start == tasks for start, stop in calls)  # (the whole chain as one call)


#: the chain's bound on the window sums' magnitude per kind (its argument; -1: every chain refuses)
_TOP = {step_batch.ROWS: 20, step_batch.PLANES: 20, step_batch.WINDOW: 19}


def _refusing(monkeypatch, position: int | None, general_runs: bool = True) -> list:
    """Each batch's op ``position`` (its member's; None: every op) made to refuse, as a chain refuses window sums past
    its bound (its CORE run, nothing of the DPU's written); ``general_runs`` False: a batch that then
    skips the general stages (broken on purpose). The ops made to refuse are listed."""
    refused, inner = [], task_batches.batched

    def batched(steps, tasks):
        runs = inner(steps, tasks)
        for _, batch in runs or ():
            for at in range(batch.size) if batch is not None else ():
                if (position is None or at == position) and batch.ends[at] == at + 1:  # (one op a member)
                    row = batch.ops[batch.start + at]
                    row[1 + step_batch.WORDS * _TOP[int(row[0])]] = -1
                    refused.append(batch.start + at)
        return runs

    monkeypatch.setattr(task_batches, "batched", batched)
    if not general_runs:
        def skipping(self, low, count, cbuf, saved, failed, *rest):
            table, at, stop = self.ops, self.start + (self.ends[low - 1] if low else 0), \
                self.start + (self.ends[count - 1] if count > low else 0)
            while at < stop:
                at = self.run_ops(table, at, stop)
                at += at < stop  # (no general stages for the refused op)
        monkeypatch.setattr(task_batches.StepBatch, "_ops", skipping)
    return refused


@pytest.mark.parametrize("name", ["pointwise_70_kernels", "depthwise_3x3_40ch"])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_a_chain_refusing_mid_batch_runs_its_general_stages_and_the_batch_resumes(monkeypatch, name, position):
    refused = _refusing(monkeypatch, position)
    _compare(name, 4)
    assert refused


def test_the_checks_catch_a_batch_skipping_a_refused_ops_general_stages(monkeypatch):
    refused = _refusing(monkeypatch, None, general_runs=False)  # (the members write the same output: all of them)
    with pytest.raises(AssertionError):
        _compare("depthwise_3x3_40ch", 4)
    assert refused


def refusing_and_raising(batch, at: int, raising: list) -> None:
    """``batch``'s op ``at`` (from its start) made to refuse, its general stages raising while ``raising[0]``."""
    row = batch.ops[batch.start + at]
    row[1 + step_batch.WORDS * _TOP[int(row[0])]] = -1
    general, *arguments = batch.fallbacks[at]

    def failing(*args):
        if raising[0]:
            raise EmulationError("general stages raise")
        return general(*args)
    object.__setattr__(batch, "fallbacks", batch.fallbacks[:at] + ((failing, *arguments),) + batch.fallbacks[at + 1:])


def _raising_at(monkeypatch, call: int) -> None:
    """``DerivedCache.invalidate_rows`` raising at its ``call``-th call from then on (a member's
    bookkeeping: a step and its batch's ``pre`` make it after the Cbuf keeps, in task order)."""
    inner, count = DerivedCache.invalidate_rows, [0]

    def raising(self, *args, **kwargs):
        count[0] += 1
        if count[0] == call:
            raise EmulationError("a member raises")
        return inner(self, *args, **kwargs)

    monkeypatch.setattr(DerivedCache, "invalidate_rows", raising)
    # (a step's drop skips the search while nothing was put since it found its rows clear, memory.py
    # ``rows_drop``: each drop searches again, so each reaches the injected failure)
    searching(monkeypatch)
    return count


def _raised_ends(monkeypatch, member: int) -> list:
    """(output, state, output bytes) of a batched and a one-by-one machine after their 4-task chain's
    member ``member`` (from 1) raised in its bookkeeping on a new input."""
    spec, amount, machines = _machines("depthwise_3x3_40ch", 4)
    x = np.random.default_rng(2).integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
    ends = []
    for machine in machines[:2]:
        with monkeypatch.context() as patch:
            for _ in range(RUNS):
                load_cube(machine, spec.feature, x)
                machine.run_chain(plans.ADDRESS, amount)
            load_cube(machine, spec.feature, np.roll(x, 1))
            _raising_at(patch, member)
            with pytest.raises(EmulationError):
                machine.run_chain(plans.ADDRESS, amount)
        ends.append((plans._output(machine, spec), _state(machine), bytes(machine.memory.dump(spec.output, 4096))))
    return ends


@pytest.mark.parametrize("member", [1, 2, 4])
def test_an_exception_mid_batch_leaves_what_the_steps_one_by_one_leave(monkeypatch, member):
    """The members before the raising one ran (their outputs written); the register file, counters,
    interrupts and Cbuf as the one-by-one loop leaves them."""
    ends = _raised_ends(monkeypatch, member)
    np.testing.assert_array_equal(ends[0][0], ends[1][0])
    assert ends[0][1:] == ends[1][1:]
    assert ends[0][1][1] == RUNS * 4 + member - 1  # (the tasks before it counted)


def test_the_checks_catch_a_batch_dropping_the_members_before_an_exception(monkeypatch):
    """A batch that raises without running the compiled calls of the members before the raising one."""
    def careless(self, tasks, cbuf, regfile, derived, epoch, failed, left=None):
        count = 0
        try:
            for pre in self.pres:
                pre(cbuf)
                count += 1
        except Exception:
            failed[0] = count
            raise
        self._ops(0, count, cbuf, cbuf.__dict__.copy(), failed)
        return count

    monkeypatch.setattr(task_batches.StepBatch, "run", careless)
    ends = _raised_ends(monkeypatch, 3)
    assert not np.array_equal(ends[0][0], ends[1][0])


class _Step:
    def __init__(self, form) -> None:
        self.op_form = form


def test_a_task_writing_the_lut_joins_a_batch_only_where_no_member_before_it_reads_the_lut():
    """(Runs that start after a step alone, or first: a run right after another batch mixes readers and
    writers, test_step_batch_mixed.py.)"""
    form = ([np.zeros(step_batch.COLUMNS, np.int64)] * 2, None, (None,), (), None)
    reading = form[:4] + ((None, None, None),)
    steps = [_Step(form), _Step(form), _Step(form), None, _Step(reading), _Step(form), _Step(None), _Step(form)]
    tasks = [(None,) * 6 + (lut,) for lut in ((), (), ("write",), (), (), ("write",), (), ())]
    runs = task_batches.batched(steps, tasks)
    assert [(first, None if batch is None else batch.size) for first, batch in runs] \
        == [(0, 3), (3, None), (4, 1), (5, 1), (6, None), (7, 1)]
    assert [batch.start for _, batch in runs if batch is not None] == [0, 6, 8, 10]
    assert runs[0][1].ends == (2, 4, 6) and runs[0][1].writers == {2}
    assert runs[0][1].ops.shape == (12, step_batch.COLUMNS)


def test_arguments_off_the_spec_make_no_op():
    arguments = tuple(0 if dtype is None else np.zeros((1,) * ndim, dtype)
                      for dtype, ndim in step_batch._PARSED[step_batch.WINDOW])
    assert step_batch.encoded(step_batch.WINDOW, arguments) is not None
    for at, other in ((0, np.zeros(1, np.int8)), (2, np.zeros((2, 2), np.uint8)[:, :1]), (15, True),
                      (15, np.zeros(1, np.int64)), (3, np.zeros((1, 1), np.int8))):
        changed = arguments[:at] + (other,) + arguments[at + 1:]
        assert step_batch.encoded(step_batch.WINDOW, changed) is None
    assert step_batch.encoded(step_batch.WINDOW, arguments[:-1]) is None


def test_an_exception_in_a_refused_ops_general_stages_leaves_what_the_steps_one_by_one_leave(monkeypatch):
    """Member 2 (from 0) of a 4-task batch refuses and its general stages raise (the later members'
    bookkeeping already done): the Cbuf, registers, counters and outputs as where the one-by-one loop
    raises in that member's bookkeeping after its Cbuf keeps (``_raised_ends``' third call)."""
    spec, amount, machines = _machines("depthwise_3x3_40ch", 4)
    raising, inner = [False], task_batches.batched

    def batched(steps, tasks):
        runs = inner(steps, tasks)
        for _, batch in runs or ():
            if batch is not None and batch.size == 4:
                refusing_and_raising(batch, 2, raising)
        return runs

    monkeypatch.setattr(task_batches, "batched", batched)
    x = np.random.default_rng(2).integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
    machine = machines[0]
    for _ in range(RUNS):
        load_cube(machine, spec.feature, x)
        machine.run_chain(plans.ADDRESS, amount)
    load_cube(machine, spec.feature, np.roll(x, 1))
    raising[0] = True
    with pytest.raises(EmulationError):
        machine.run_chain(plans.ADDRESS, amount)
    got = (plans._output(machine, spec), _state(machine), bytes(machine.memory.dump(spec.output, 4096)))
    raising[0] = False
    want = _raised_ends(monkeypatch, 3)[1]  # (the one-by-one machine's)
    np.testing.assert_array_equal(got[0], want[0])
    # (the Cbuf's slots by key: member 2's feature buffer holds this run's rows in the batch - its CORE
    # ran before its chain refused - and the last run's where the one-by-one loop raised before its kernel)
    assert got[2] == want[2] and got[1][:3] + got[1][4:] == want[1][:3] + want[1][4:]
    assert [slot[0] for slot in got[1][3][:2]] == [slot[0] for slot in want[1][3][:2]]
    assert got[1][3][2] == want[1][3][2]



def _lut_chain(tasks: int, name: str = "pointwise_70_kernels"):
    """(specs, amount, machines: batched, one by one, full path) for test_task_plans_lut_folded's chain:
    ``tasks`` convolutions storing through the folded LUT table, each uploading its own tables first
    (each its own batch of two ops: the CORE step and the folded store)."""
    from tests.emulator.test_task_plans_lut import _chain
    from tests.emulator.test_task_plans_lut_folded import _folding

    specs, layer, chain, _ = _chain(name, "identity", tasks)
    chain = [(_folding(task, spec, index), mask) for index, ((task, mask), spec) in enumerate(zip(chain, specs))]
    made = [plans._machine(chain, full, layer, specs[0]) for full in (False, False, True)]
    _one_by_one(made[1][0])
    return specs, made[0][1], [machine for machine, _ in made]


def _lut_runs(monkeypatch, tasks: int = 3) -> tuple[int, int]:
    """The LUT chain's runs on the three machines compared (outputs, records, states with the LUT RAM):
    (folded store ops run, members found stale and made again)."""
    specs, amount, machines = _lut_chain(tasks)
    folded, remade, inner_ops, inner_remake = [0], [0], step_batch.run_ops, task_batches.StepBatch._remake

    def counted(table, start, stop):
        folded[0] += int(np.isin(table[start:stop, 0], (step_batch.FOLDED64, step_batch.FOLDED32)).sum())
        return inner_ops(table, start, stop)

    def remake(self, member):
        remade[0] += 1
        inner_remake(self, member)

    monkeypatch.setattr(step_batch, "run_ops", counted)
    monkeypatch.setattr(task_batches.StepBatch, "_remake", remake)
    _equal_runs([(machine, amount) for machine in machines], specs,
                plans.int8_inputs(2, (specs[0].in_c, specs[0].in_h, specs[0].in_w)))
    return folded[0], remade[0]


def test_folded_lut_steps_batched_equal_steps_one_by_one_and_the_full_path(monkeypatch):
    """Each task's table comes with its uploads: a member's store made at build time for the LUT RAM
    then (the chain's last tables) is found stale at its first run, runs as its step and is made again."""
    folded, remade = _lut_runs(monkeypatch)
    assert folded >= 3 * (plans.RUNS - 4) and remade >= 1


def test_the_checks_catch_a_folded_store_run_for_a_stale_table(monkeypatch):
    """A batch whose LUT members never find their calls stale runs the store with the table of the LUT
    RAM at build time."""
    inner = cna_core._lut_batch

    def blind(*args):
        pre, calls, fallback, (folded, remake, table) = inner(*args)
        return pre, calls, fallback, (lambda: table, remake, table)  # (always the table its calls are for)

    monkeypatch.setattr(cna_core, "_lut_batch", blind)
    with pytest.raises(AssertionError):
        _lut_runs(monkeypatch)


def _mixed_chain():
    """(specs, amount, machines: batched, one by one, full path) for two plain convolutions (chained
    steps) and then one storing through the folded LUT table after uploading its tables: one batch of
    three members, the LUT writes mid-batch (no member before reads the LUT RAM)."""
    from tests.emulator.test_task_plans_lut import _chain
    from tests.emulator.test_task_plans_lut_folded import _folding

    specs, layer, chain, _ = _chain("pointwise_70_kernels", "identity", 3)
    chain = [(conv_task(specs[0]), MASK_CONV), (conv_task(specs[1]), MASK_CONV),
             (_folding(chain[2][0], specs[2], 2), chain[2][1])]
    made = [plans._machine(chain, full, layer, specs[0]) for full in (False, False, True)]
    _one_by_one(made[1][0])
    return specs, made[0][1], [machine for machine, _ in made]


def test_lut_writes_mid_batch_equal_steps_one_by_one_and_the_full_path(monkeypatch):
    calls = _batches_run(monkeypatch)
    specs, amount, machines = _mixed_chain()
    _equal_runs([(machine, amount) for machine in machines], specs,
                plans.int8_inputs(3, (specs[0].in_c, specs[0].in_h, specs[0].in_w)))
    assert (0, 4) in calls  # (the three members' four ops as one call)


def _lut_raised_ends(monkeypatch) -> list:
    """The states of a batched and a one-by-one machine whose mixed chain raised in its first member (the
    batch: in its general stages, after the third member's LUT writes)."""
    specs, amount, machines = _mixed_chain()
    raising, inner = [False], task_batches.batched

    def batched(steps, tasks):
        runs = inner(steps, tasks)
        for _, batch in runs or ():
            if batch is not None and batch.size == 3:
                refusing_and_raising(batch, 0, raising)
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
        for machine, call in zip(machines[:2], (None, 1)):
            machine.cores[0].regfile.lut.tables[...] = 7  # (other tables than the third task uploads)
            if call is not None:
                _raising_at(patch, call)
            with pytest.raises(EmulationError):
                machine.run_chain(plans.ADDRESS, amount)
            ends.append(_state(machine))
    return ends


def test_an_exception_before_mid_batch_lut_writes_leaves_the_lut_ram_as_one_by_one(monkeypatch):
    """The LUT RAM, registers, counters and Cbuf as where the one-by-one loop raises in the first member."""
    ends = _lut_raised_ends(monkeypatch)
    assert ends[0][4] == ends[1][4]  # (the LUT RAM: without the third task's uploads)
    assert ends[0][:4] == ends[1][:4] and ends[0][1] == RUNS * 3


def test_the_checks_catch_a_batch_keeping_later_lut_writes_after_an_exception(monkeypatch):
    inner = task_batches.StepBatch._ops
    monkeypatch.setattr(task_batches.StepBatch, "_ops", lambda self, *args: inner(self, *args[:5]))
    ends = _lut_raised_ends(monkeypatch)
    assert ends[0][4] != ends[1][4]


# -- the interpreter against the kernels called one by one -------------------------------------------------
def _core_ops(seed: int, count: int) -> list:
    """``count`` int8 CORE steps (depthwise, and VNNI convolutions where the CPU has them) with their
    arguments as ``_fused_int8`` makes them, over memory rows of their own: (kernel, arguments)."""
    rng, made = np.random.default_rng(seed), []
    while len(made) < count:
        channels = int(rng.integers(1, 40))
        surfaces = -(-channels // 16)
        if rng.integers(2) or not gemm_int8.available():
            geometry, x, w = depthwise_case(int(rng.integers(1 << 30)), (3, 3), int(rng.integers(1, 3)), 1, channels)
            w.flags.writeable = False
            shape = (surfaces, x.shape[1], x.shape[2], 16)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(depthwise_plan, "OWN_BUFFER_ELEMENTS", 1 << 30)
                core = depthwise_plan.prepare_depthwise_int8_atoms(shape, w, geometry, int(rng.integers(-128, 128)),
                                                                   0, nm.ROUND_HALF_AWAY, surfaces * 16 + 7)
        else:
            shape, out = (surfaces, 4, 5, 16), int(rng.integers(1, 40))
            w = rng.integers(-128, 128, (out, channels, 2, 2)).astype(np.int8)
            w.flags.writeable = False
            core = gemm_conv_int8.prepare(shape, channels, channels, w, ConvGeometry(2, 2, 3, 4, 1, 1, 1, 1, 0, 0),
                                          0, 0, 0, out + 3, lambda name, size, dtype: np.empty(size, dtype))
        data, offsets = core_steps._memory(rng, rng.integers(-128, 128, shape).astype(np.int8), int(rng.integers(9)))
        buffer = np.zeros(shape, np.int8)
        target = buffer.view(np.uint8).reshape(shape[0] * shape[1], -1)
        fused = cna_core._fused_int8(data, offsets, target, buffer, divmod(int(rng.integers(1, channels + 1)), 16),
                                     core)
        if fused is not None:
            made.append(fused[:2])
    return made


def _arrays(arguments: tuple) -> list:
    return [value for value in arguments if isinstance(value, np.ndarray)]


@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 5))
def test_run_ops_equals_the_kernels_called_one_by_one(seed, count):
    """Ops of random CORE steps as one ``run_ops`` call leave every argument array (features, buffers,
    outputs, window sums) as calling each kernel on its own arguments does; a row whose feature offsets
    point one element off is caught."""
    ops = _core_ops(seed, count)
    arrays = [array for _, arguments in ops for array in _arrays(arguments)]
    before = [array.copy() for array in arrays]

    def restore():  # (the arrays as made: views of one buffer agree, so the order does not matter)
        for array, was in zip(arrays, before):
            if array.flags.writeable:
                array[...] = was

    for kernel, arguments in ops:  # the reference: each kernel on its own arguments, in order
        kernel(*arguments)
    expected = [array.copy() for array in arrays]
    restore()
    table = np.array([step_batch.encoded(step_batch.kind_of(*op), op[1]) for op in ops])
    assert step_batch.run_ops(table, 0, count) == count
    for got, want in zip(arrays, expected):
        np.testing.assert_array_equal(got, want)
    offsets = ops[-1][1][1]
    if offsets.size > 1 and not np.array_equal(offsets[1:], offsets[:-1]):
        restore()
        spare = np.concatenate([offsets, offsets[-1:]])  # (the last op's offsets one element on: in bounds)
        table[-1, 1 + step_batch.WORDS] = spare.ctypes.data + 8
        step_batch.run_ops(table, 0, count)
        assert any(not np.array_equal(got, want) for got, want in zip(arrays, expected))


def test_a_member_stale_on_every_run_runs_as_its_step_and_the_batch_goes_on(monkeypatch):
    """A LUT member whose table is never the one its calls were made for (a ``folded()`` giving a new
    object each time) runs as its step every run; the members after it still run as the batch's calls,
    the whole batch counted, and everything equals the steps one by one and the full path."""
    from tests.emulator.test_task_plans_lut import _chain
    from tests.emulator.test_task_plans_lut_folded import _folding

    inner = cna_core._lut_batch

    def never(*args):
        pre, calls, fallback, (folded, remake, table) = inner(*args)
        return pre, calls, fallback, (lambda: (folded(), object()), lambda now: remake(now[0]), table)

    monkeypatch.setattr(cna_core, "_lut_batch", never)
    calls, ran, run = _batches_run(monkeypatch), [], task_batches.StepBatch.run

    def counted(self, *args):
        ran.append((self.size, run(self, *args)))
        return ran[-1][1]

    monkeypatch.setattr(task_batches.StepBatch, "run", counted)
    specs, layer, chain, _ = _chain("pointwise_70_kernels", "identity", 3)
    chain = [(_folding(chain[0][0], specs[0], 0), chain[0][1]), (conv_task(specs[1]), MASK_CONV),
             (conv_task(specs[2]), MASK_CONV)]
    made = [plans._machine(chain, full, layer, specs[0]) for full in (False, False, True)]
    _one_by_one(made[1][0])
    _equal_runs(made, specs, plans.int8_inputs(5, (specs[0].in_c, specs[0].in_h, specs[0].in_w)))
    assert ran and all(size == done == 3 for size, done in ran)
    assert calls and all(start == 2 and stop == 4 for start, stop in calls)  # (members 1 and 2: ops 2, 3)
