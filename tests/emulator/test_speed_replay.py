"""The core's chain replay (issue 20): a chain run again from a register state it started from
before runs its units from the kept decoded states and restores the end state. It must be
indistinguishable from running every task's writes: outputs, records, register groups and
pointers, task counters and interrupts - also when something changes between runs or a unit
fails mid-chain."""

from dataclasses import replace

import numpy as np
import pytest

import npuemu.emulator.core as core_module
from npuemu.emulator.machine import Machine
from npuemu.emulator.memory import DerivedCache
from tests.emulator.test_derived_cache_index import searching
from npuemu.isa.chain import encode_chain
from npuemu.isa.task import Chain, RegisterWrite
from tests.emulator.test_machine_conv import CASES, random_layer, reference_accumulators
from tests.emulator.test_machine_support import (
    MASK_CONV, REGMAP, bias_blob, conv_task, load_cube, out_cvt_reference, read_cube,
)

ADDRESS = 0xF0_0000


def _machine(spec, tasks: int, replay: bool, monkeypatch=None):
    machine = Machine.for_platform("rk3588", ddr_size=16 << 20)
    x, w, blob, bs = random_layer(spec, 0)
    machine.memory.load(spec.weights, blob.tobytes())
    machine.memory.load(spec.bias, bias_blob(bs.alu, bs.cpend, bs.mul))
    # distinct task objects with equal writes (each reads the feature, writes the output)
    chain = Chain(tuple(conv_task(spec).task(MASK_CONV) for _ in range(tasks)))
    encoded = encode_chain(chain, REGMAP, base_addr=ADDRESS)
    machine.memory.load(ADDRESS, encoded.data)
    core = machine.cores[0]
    core.replayed = 0
    if replay:
        inner = core._replay

        def counted(plan):
            core.replayed += 1
            return inner(plan)

        core._replay = counted
    else:  # the reference: every run through every task's writes
        core.regfile.matches = lambda snapshot: False
    return machine, encoded.first_amount, w, bs


def _state(machine: Machine):
    core = machine.cores[0]
    return core.regfile.snapshot(), core.tasks_run, core.interrupt_raw, core.regfile.lut.tables.tobytes()


SPEC = replace(CASES["direct_3x3_pad1"], bs_shift=14, out_scale=23000, out_offset=-5, out_shift=17)


@pytest.mark.parametrize("tasks", [1, 2, 3])
def test_replayed_runs_equal_full_runs(tasks):
    fast, amount, w, bs = _machine(SPEC, tasks, replay=True)
    slow, _, _, _ = _machine(SPEC, tasks, replay=False)
    rng = np.random.default_rng(1)
    for run in range(6):
        x = rng.integers(-128, 128, (SPEC.in_c, SPEC.in_h, SPEC.in_w)).astype(np.int8)
        results = []
        for machine in (fast, slow):
            load_cube(machine, SPEC.feature, x)
            records = machine.run_chain(ADDRESS, amount).tasks
            results.append((records, read_cube(machine, SPEC.output, SPEC.kernels, SPEC.out_h, SPEC.out_w)))
        (got_records, got), (want_records, want) = results
        expected = out_cvt_reference(reference_accumulators(SPEC, x, w, bs), SPEC.out_scale, SPEC.out_shift,
                                     SPEC.out_offset)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(want, expected)
        assert got_records == want_records
        assert _state(fast)[:3] == _state(slow)[:3]
    # (the first runs fill the groups; an odd chain then alternates between two start states)
    assert fast.cores[0].replayed >= 2
    assert slow.cores[0].replayed == 0


def test_a_register_changed_between_runs_takes_effect():
    fast, amount, w, bs = _machine(SPEC, 2, replay=True)
    x = np.random.default_rng(2).integers(-128, 128, (SPEC.in_c, SPEC.in_h, SPEC.in_w)).astype(np.int8)
    load_cube(fast, SPEC.feature, x)
    accumulators = reference_accumulators(SPEC, x, w, bs)
    dpu = fast.cores[0].regfile.blocks["DPU"]
    offset = REGMAP.register("DPU", "OUT_CVT_SHIFT").offset
    for shift in (17, 17, 17, 16, 16, 16, 17):
        written = REGMAP.pack("DPU", "OUT_CVT_SHIFT", OUT_CVT_SHIFT=shift)
        if dpu.groups[0].get(offset) not in (None, written):  # the chain rewrites it: poke both groups
            for group in dpu.groups:
                group[offset] = written
        fast.run_chain(ADDRESS, amount)
        got = read_cube(fast, SPEC.output, SPEC.kernels, SPEC.out_h, SPEC.out_w)
        np.testing.assert_array_equal(got, out_cvt_reference(accumulators, SPEC.out_scale, SPEC.out_shift,
                                                             SPEC.out_offset))


def test_a_changed_register_the_chain_does_not_write_stops_the_replay():
    spec = SPEC
    fast, amount, w, bs = _machine(spec, 2, replay=True)
    for _ in range(4):
        fast.run_chain(ADDRESS, amount)
    assert fast.cores[0].replayed >= 2
    before = fast.cores[0].replayed
    # a register of the PPU (not started by the chain) changes: the start state differs
    fast.cores[0].regfile.blocks["PPU"].groups[0][REGMAP.register("PPU", "DATA_CUBE_IN_WIDTH").offset] = 7
    fast.run_chain(ADDRESS, amount)
    assert fast.cores[0].replayed == before


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_a_unit_failing_mid_replay_leaves_the_state_of_a_full_run(monkeypatch, fail_at):
    fast, amount, _, _ = _machine(SPEC, 3, replay=True)
    slow, _, _, _ = _machine(SPEC, 3, replay=False)
    for machine in (fast, slow):
        for _ in range(5):
            machine.run_chain(ADDRESS, amount)
    assert fast.cores[0].replayed >= 2
    # the DPU's output write drops the derived values it covers, on the full path (TaskDma.claim_rows)
    # and in a task program's step (units/dpu_plan.py) alike: the failure is injected there
    inner = DerivedCache.invalidate_rows
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == fail_at + 1:
            raise core_module.EmulationError("injected")
        return inner(*args, **kwargs)

    monkeypatch.setattr(DerivedCache, "invalidate_rows", failing)
    # (a step's drop skips the search while nothing was put since it found its rows clear, memory.py
    # ``rows_drop``: each drop searches again, so each reaches the injected failure)
    searching(monkeypatch)
    before = fast.cores[0].replayed
    for machine in (fast, slow):
        calls["n"] = 0
        with pytest.raises(core_module.EmulationError, match="injected"):
            machine.run_chain(ADDRESS, amount)
    assert fast.cores[0].replayed == before + 1  # the failing run was a replay
    assert _state(fast) == _state(slow)
    monkeypatch.setattr(DerivedCache, "invalidate_rows", inner)
    for machine in (fast, slow):  # and both go on alike
        machine.run_chain(ADDRESS, amount)
    assert _state(fast) == _state(slow)


def _lut_chain(machine: Machine, first: list[int], second: list[int]):
    from tests.emulator.test_machine_support import MASK_FLYING, flying_task

    tasks = []
    for values in (first, second):
        t = flying_task(2, 2, 16, src=0x10000, dst=0x20000)
        t.set("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=0, LUT_ADDR=0)
        for value in values:
            t.set("DPU", "LUT_ACCESS_DATA", LUT_ACCESS_DATA=value)
        t.set("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=0)  # back to read-type, as the compiler leaves it
        tasks.append(t.task(MASK_FLYING))
    encoded = encode_chain(Chain(tuple(tasks)), REGMAP, base_addr=ADDRESS)
    machine.memory.load(ADDRESS, encoded.data)
    return encoded.first_amount


def test_lut_uploads_mid_chain_are_replayed_in_order(monkeypatch):
    seen = []
    inner = core_module.run_dpu

    def watching(state, rdma, source, dma, lut_tables, where):
        seen.append(lut_tables[0, :3].tolist())
        return inner(state, rdma, source, dma, lut_tables, where)

    monkeypatch.setattr(core_module, "run_dpu", watching)
    # replays through the units, where run_dpu sees each task's tables (a program's flying-DPU
    # steps read the LUT RAM themselves: tests/emulator/test_task_plans_lut.py)
    monkeypatch.setattr(core_module, "build_program", lambda *args: None)
    runs = []
    for replay in (True, False):
        machine = Machine.for_platform("rk3588", ddr_size=16 << 20)
        amount = _lut_chain(machine, [1, 2, 3], [7, 8, 9])
        core = machine.cores[0]
        core.replayed = 0
        if replay:
            plain = core._replay

            def counted(plan, core=core, plain=plain):
                core.replayed += 1
                return plain(plan)

            core._replay = counted
        else:
            core.regfile.matches = lambda snapshot: False
        seen.clear()
        for _ in range(5):
            machine.run_chain(ADDRESS, amount)
        runs.append((core.replayed, list(seen), _state(machine)))
    (replayed, fast_seen, fast_state), (_, slow_seen, slow_state) = runs
    assert replayed >= 2
    assert fast_seen == slow_seen == [[1, 2, 3], [7, 8, 9]] * 5
    assert fast_state == slow_state  # registers, pointers, LUT port and RAM


def test_lut_inert_only_for_read_type_ports():
    from npuemu.emulator.regfile import RegisterFile

    regs = RegisterFile(REGMAP)
    read = regs.resolve([RegisterWrite("DPU", "LUT_ACCESS_CFG", 0), RegisterWrite("DPU", "LUT_ACCESS_DATA", 5)])
    write = regs.resolve([RegisterWrite("DPU", "LUT_ACCESS_CFG",
                                        REGMAP.pack("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1)),
                          RegisterWrite("DPU", "LUT_ACCESS_DATA", 5)])
    start = regs.snapshot()
    assert RegisterFile.lut_inert(start, RegisterFile.lut_steps(read))
    assert not RegisterFile.lut_inert(start, RegisterFile.lut_steps(write))
    regs.write("DPU", "LUT_ACCESS_CFG", REGMAP.pack("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1), "t")
    assert not RegisterFile.lut_inert(regs.snapshot(), RegisterFile.lut_steps(read))  # a write-type port at the start
