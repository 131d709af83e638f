"""An fp16 DPU step with the LUT on reads the LUT RAM as each run finds it (issue 20,
units/dpu_plan_fp.py): the step keeps the RAM's bytes of its last run and the tables
``lut_fp.prepared`` made from them, and must make them again whenever the chain's LUT port writes
changed the RAM in place - to other tables, by one entry, or back to tables an earlier run had.
Each run must leave memory as the full unit path (``units.dpu.run_dpu``) with the same RAM."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.memory import Memory, TaskDma
from npuemu.emulator.units import dpu
from npuemu.emulator.units.dpu_plan_fp import prepare_fp_dpu
from npuemu.emulator.units.state import FP16, LutState, LutTableState, OutCvtState
from tests.emulator.test_dpu_int_to_fp16_step import _EW_OFF, _OFF, _states

MEMORY, WHERE = 1 << 20, "test task"


def _lut_task(channels: int, height: int, width: int, select: int, priorities: tuple):
    """A flying fp16 copy through the LUT (LE below 0, LO above, each 512 steps of 2^select)."""
    span = 512 << select
    le = LutTableState(start=-span, end=0, index_select=select, uflow_scale=0, uflow_shift=0, oflow_scale=0,
                       oflow_shift=0)
    lo = LutTableState(start=0, end=span, index_select=select, uflow_scale=0, uflow_shift=0, oflow_scale=16384,
                       oflow_shift=13)
    cvt = OutCvtState(scale=1, shift=0, offset=0, round_bit=0, fp32_to_fp16=True, minus_exp=0)
    ew = _EW_OFF.__class__(**{**vars(_EW_OFF), "bypass": False, "lut_bypass": False})
    state, rdma = _states(channels, height, width, FP16, _OFF, _OFF, ew, cvt)
    lut = LutState(le=le, lo=lo, hybrid_priority=priorities[0], uflow_priority=priorities[1],
                   oflow_priority=priorities[2])
    state = state.__class__(**{**vars(state), "in_precision": FP16, "proc_precision": FP16, "lut": lut})
    return state, rdma


def _memory(seed: int) -> Memory:
    rng = np.random.default_rng(seed)
    memory = Memory(MEMORY)
    halves = rng.integers(0, 1 << 16, MEMORY // 2, dtype=np.uint16)
    halves[(halves >> 10 & 0x1F) == 0x1F] &= 0xBFFF  # (finite values, mostly)
    memory.load(0, halves.view(np.uint8))
    return memory


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 24), st.integers(1, 3), st.integers(1, 19), st.integers(0, 8),
       st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1)),
       st.lists(st.sampled_from(["same", "new", "one entry", "first"]), min_size=1, max_size=5),
       st.integers(0, 2**31))
def test_each_run_reads_the_lut_ram_as_it_finds_it(channels, height, width, select, priorities, changes, seed):
    state, rdma = _lut_task(channels, height, width, select, priorities)
    rng = np.random.default_rng(seed)
    ram = rng.integers(-(2**15), 2**15, (2, 513)).astype(np.int16)  # (the core's LUT RAM: written in place)
    first = ram.copy()
    full, fast = _memory(seed), _memory(seed)
    step = prepare_fp_dpu(state, rdma, fast, WHERE, ram)
    assert step is not None
    for change in ["same", *changes]:
        if change == "new":
            ram[:] = rng.integers(-(2**15), 2**15, (2, 513))
        elif change == "one entry":
            ram[int(rng.integers(0, 2)), int(rng.integers(0, 513))] += 1
        elif change == "first":
            ram[:] = first
        dpu.run_dpu(state, rdma, None, TaskDma(full, WHERE), ram, WHERE)
        step(None)
        assert np.array_equal(full.dump(0, MEMORY), fast.dump(0, MEMORY))
