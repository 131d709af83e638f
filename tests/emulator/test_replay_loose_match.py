"""A chain replay from a start state that differs from the recorded one only where no task can see
it (emulator/replay_match.py, issue 20: the steady state sooner): registers the chain writes before
the block runs from their group, groups the block never runs from, a pointer state the chain's own
S_POINTER writes take the same course. Every run must equal a run of every task's writes (outputs,
records, register file, counters, interrupts), and a start state that differs in a register a task
reads before the chain writes it must never replay."""

from dataclasses import replace

import numpy as np
import pytest

import npuemu.emulator.core as core_module
from npuemu.emulator.machine import Machine
from npuemu.emulator.memory import DerivedCache
from tests.emulator.test_derived_cache_index import searching
from tests.emulator.test_machine_conv import CASES
from tests.emulator.test_machine_support import MASK_CONV, REGMAP, conv_task, load_cube, read_cube
from tests.emulator.test_speed_replay import ADDRESS
from tests.emulator.test_speed_replay import _machine as speed_replay_machine

SPEC = replace(CASES["direct_3x3_pad1"], bs_shift=14, out_scale=23000, out_offset=-5, out_shift=17)


def _machine(tasks: int, replay: bool):
    """test_speed_replay's machine (a chain of ``tasks`` equal convs; ``replay`` False: the
    reference that never replays) for SPEC."""
    machine, amount, _, _ = speed_replay_machine(SPEC, tasks, replay)
    return machine, amount


def _state(machine: Machine):
    core = machine.cores[0]
    return core.regfile.snapshot(), core.tasks_run, core.interrupt_raw, core.regfile.lut.tables.tobytes()


def _offset(block: str, register: str) -> int:
    return REGMAP.register(block, register).offset


#: (block, register offset) of every write of the chain's tasks
_WRITTEN_BY_TASKS = {(w.block, _offset(w.block, w.register)) for w in conv_task(SPEC).task(MASK_CONV).writes}


#: a register the chain writes in every task (before the DPU runs from its group)
WRITTEN = ("DPU", _offset("DPU", "OUT_CVT_SHIFT"))
#: registers of started blocks the chain never writes (a task's view holds them as they are)
UNWRITTEN = [(block, reg.offset) for block in ("CNA", "CORE", "DPU", "DPU_RDMA")
             for reg in REGMAP.block(block).registers
             if (block, reg.offset) not in _WRITTEN_BY_TASKS and reg.name not in ("S_POINTER", "OPERATION_ENABLE")
             and not reg.name.startswith("LUT_")]


def _poke_written(machine: Machine, value: int) -> None:
    for group in machine.cores[0].regfile.blocks[WRITTEN[0]].groups:
        group[WRITTEN[1]] = value


def _reset_dpu_pp(machine: Machine) -> None:
    for name in ("DPU", "DPU_RDMA"):  # the chain's first DPU writes set them again (S_POINTER 0xe)
        pingpong = machine.cores[0].regfile.blocks[name]
        pingpong.pointer_pp = pingpong.executer_pp = False


def _run_both(fast, slow, amount, x):
    results = []
    for machine in (fast, slow):
        load_cube(machine, SPEC.feature, x)
        records = machine.run_chain(ADDRESS, amount).tasks
        results.append((records, read_cube(machine, SPEC.output, SPEC.kernels, SPEC.out_h, SPEC.out_w)))
    (got_records, got), (want_records, want) = results
    np.testing.assert_array_equal(got, want)
    assert got_records == want_records
    assert _state(fast) == _state(slow)


@pytest.mark.parametrize("tasks", [1, 2, 3])
def test_replays_from_the_second_start_state_on(tasks):
    fast, amount = _machine(tasks, replay=True)
    slow, _ = _machine(tasks, replay=False)
    rng = np.random.default_rng(tasks)
    for _ in range(6):
        _run_both(fast, slow, amount, rng.integers(-128, 128, (SPEC.in_c, SPEC.in_h, SPEC.in_w)).astype(np.int8))
    # run 0 records from reset; the ones after it differ from it only in what the chain writes
    # first and in the PP bits its S_POINTER writes set (an odd chain: run 1 starts on the other
    # group of the CNA and CORE, a course of its own, and records too)
    assert fast.cores[0].replayed >= (5 if tasks % 2 == 0 else 4)
    assert slow.cores[0].replayed == 0


@pytest.mark.parametrize("tasks", [1, 2, 3])
def test_start_states_that_differ_where_no_task_sees_replay_exactly(tasks):
    fast, amount = _machine(tasks, replay=True)
    slow, _ = _machine(tasks, replay=False)
    rng = np.random.default_rng(10 + tasks)
    changes = [None, None, "written", "pp", "written", None, "pp", "both", None]
    for change in changes:
        before = fast.cores[0].replayed
        value = int(rng.integers(0, 1 << 31))
        for machine in (fast, slow):
            if change in ("written", "both"):
                _poke_written(machine, value)
            if change in ("pp", "both"):
                _reset_dpu_pp(machine)
        _run_both(fast, slow, amount, rng.integers(-128, 128, (SPEC.in_c, SPEC.in_h, SPEC.in_w)).astype(np.int8))
        if change is not None:
            assert fast.cores[0].replayed == before + 1


@pytest.mark.parametrize("pick", range(0, len(UNWRITTEN), max(1, len(UNWRITTEN) // 12)))
def test_a_register_read_before_the_chain_writes_it_stops_the_replay(pick):
    block, offset = UNWRITTEN[pick]
    fast, amount = _machine(2, replay=True)
    slow, _ = _machine(2, replay=False)
    x = np.random.default_rng(pick).integers(-128, 128, (SPEC.in_c, SPEC.in_h, SPEC.in_w)).astype(np.int8)
    for _ in range(4):
        _run_both(fast, slow, amount, x)
    assert fast.cores[0].replayed >= 2
    before = fast.cores[0].replayed
    # a value no earlier run left there, in the group the chain's first task runs the block from
    group = fast.cores[0].regfile.blocks[block].executer
    for machine in (fast, slow):
        machine.cores[0].regfile.blocks[block].groups[group][offset] = 0x5A5A_0000 + pick
    records = []
    for machine in (fast, slow):
        try:
            records.append(machine.run_chain(ADDRESS, amount).tasks)
        except core_module.EmulationError as error:  # (a value the decoder refuses: refused alike)
            records.append(str(error))
    assert fast.cores[0].replayed == before
    assert records[0] == records[1]
    assert _state(fast) == _state(slow)


def test_a_pointer_the_chain_does_not_set_stops_the_replay():
    fast, amount = _machine(2, replay=True)
    slow, _ = _machine(2, replay=False)
    x = np.random.default_rng(5).integers(-128, 128, (SPEC.in_c, SPEC.in_h, SPEC.in_w)).astype(np.int8)
    for _ in range(4):
        _run_both(fast, slow, amount, x)
    before = fast.cores[0].replayed
    for machine in (fast, slow):  # the DPU's writes and starts now go to the other groups
        dpu = machine.cores[0].regfile.blocks["DPU"]
        dpu.pointer ^= 1
        dpu.executer ^= 1
    _run_both(fast, slow, amount, x)
    assert fast.cores[0].replayed == before


def test_a_unit_failing_in_a_replay_from_another_start_leaves_the_state_of_a_full_run(monkeypatch):
    fast, amount = _machine(3, replay=True)
    slow, _ = _machine(3, replay=False)
    x = np.random.default_rng(7).integers(-128, 128, (SPEC.in_c, SPEC.in_h, SPEC.in_w)).astype(np.int8)
    for _ in range(5):
        _run_both(fast, slow, amount, x)
    inner = DerivedCache.invalidate_rows
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise core_module.EmulationError("injected")
        return inner(*args, **kwargs)

    before = fast.cores[0].replayed
    for machine in (fast, slow):
        _poke_written(machine, 0x1234)  # a start state no run had, which the chain overwrites
    monkeypatch.setattr(DerivedCache, "invalidate_rows", failing)
    # (a step's drop skips the search while nothing was put since it found its rows clear, memory.py
    # ``rows_drop``: each drop searches again, so each reaches the injected failure)
    searching(monkeypatch)
    for machine in (fast, slow):
        calls["n"] = 0
        with pytest.raises(core_module.EmulationError, match="injected"):
            machine.run_chain(ADDRESS, amount)
    assert fast.cores[0].replayed == before + 1
    assert _state(fast) == _state(slow)  # the poked value where the failing task left it
    monkeypatch.setattr(DerivedCache, "invalidate_rows", inner)
    _run_both(fast, slow, amount, x)


def _without_middle_step(monkeypatch):
    """Programs whose middle task has no step (as a form no ``prepare_*`` takes): it runs the full
    unit path inside ``_run_steps``' loop (core.py ``_run_full``). Counts the full-path tasks."""
    inner, units = core_module.build_program, core_module._run_units
    full = {"n": 0}

    def build(tasks, *args):
        program = inner(tasks, *args)
        if program is None or len(program.steps) < 3:
            return program
        steps = list(program.steps)
        steps[len(steps) // 2] = None
        return replace(program, steps=tuple(steps), plain=False)

    def counted(*args):
        full["n"] += 1
        return units(*args)

    monkeypatch.setattr(core_module, "build_program", build)
    monkeypatch.setattr(core_module, "_run_units", counted)
    return full


def test_a_task_without_a_step_runs_the_full_path_in_the_steps_loop(monkeypatch):
    full = _without_middle_step(monkeypatch)
    fast, amount = _machine(3, replay=True)
    slow, _ = _machine(3, replay=False)
    rng = np.random.default_rng(21)
    for _ in range(6):
        _run_both(fast, slow, amount, rng.integers(-128, 128, (SPEC.in_c, SPEC.in_h, SPEC.in_w)).astype(np.int8))
    replayed = fast.cores[0].replayed
    assert replayed >= 3
    # slow: 3 tasks a run through the units; fast: 3 a full run, 1 a replay
    assert full["n"] == 3 * 6 + 3 * (6 - replayed) + replayed


def test_a_full_path_task_failing_in_the_steps_loop_leaves_the_state_of_a_full_run(monkeypatch):
    _without_middle_step(monkeypatch)
    fast, amount = _machine(3, replay=True)
    slow, _ = _machine(3, replay=False)
    x = np.random.default_rng(22).integers(-128, 128, (SPEC.in_c, SPEC.in_h, SPEC.in_w)).astype(np.int8)
    for _ in range(5):
        _run_both(fast, slow, amount, x)
    units = core_module._run_units

    def failing(states, dma, cbuf, tables, where):
        if "task 1 " in where:
            raise core_module.EmulationError("injected")
        return units(states, dma, cbuf, tables, where)

    monkeypatch.setattr(core_module, "_run_units", failing)
    before = fast.cores[0].replayed
    for machine in (fast, slow):
        with pytest.raises(core_module.EmulationError, match="injected"):
            machine.run_chain(ADDRESS, amount)
    assert fast.cores[0].replayed == before + 1
    assert _state(fast) == _state(slow)
    monkeypatch.setattr(core_module, "_run_units", units)
    _run_both(fast, slow, amount, x)
