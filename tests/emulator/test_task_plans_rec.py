"""PP-OCRv4 rec's per-task costs (issue 20): its attention's fp16 convs read weights the chain
writes every run (a MatMul of two activations). Their steps gather the weights from the bytes as
they are each run and do not put them in the derived cache (units/cna_core.py ``_weights_fetcher``),
and the cache's index drops entries a write dropped once searches keep meeting them
(emulator/memory.py ``_WASTED_SEARCHES_MAX``). Both must never let a stale value through: the runs
equal the full path's with new operands every run, and the cache keeps exactly the entries a plain
list of ranges keeps, whatever the rebuild threshold. An fp16 build's unpooling tasks (ppocr_det)
are steps too (emulator/task_plan.py), and chains whose tasks write the LUT RAM run in core.py's one
loop of steps, equal to the full path; CNA steps skip the CBUF bookkeeping only where it would
change nothing."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st
import numpy as np

import npuemu.emulator.core as core_module
from npuemu.emulator import memory
from npuemu.emulator.memory import DerivedCache
from npuemu.emulator.units import cna_core, dpu_plan
from tests.compiler.test_build_e2e import Net
from tests.emulator import test_task_plans_lut as lut_plans
from tests.emulator.test_derived_cache_index import OPS, _check
from tests.emulator.test_task_plans import RUNS as RUNS_INT8
from tests.emulator.test_task_plans_fp16 import (MODELS, RUNS, _compare, _compare_or_records, _mismatches,
                                                 _weights_dropped_at_build)


@settings(max_examples=200, deadline=None)
@given(st.lists(OPS, max_size=200), st.sampled_from([0, 1, memory._WASTED_SEARCHES_MAX]))
def test_kept_values_exact_whatever_the_rebuild_threshold(ops, wasted):
    """(0: the index rebuilt on every search that meets a dropped entry.)"""
    memory._WASTED_SEARCHES_MAX, kept = wasted, memory._WASTED_SEARCHES_MAX
    try:
        _check(ops)
    finally:
        memory._WASTED_SEARCHES_MAX = kept


def test_searches_stop_meeting_dropped_entries_and_new_puts_are_found(monkeypatch):
    """1000 values; 50 dropped, then writes near them that overlap nothing live (what rec's runs do
    once its MatMul weights leave the cache): past the threshold the index is rebuilt and the writes
    are answered without a search. Values put there afterwards are still found and dropped."""
    cache = DerivedCache()
    for key in range(1000):
        cache.put(key, key * 100, key * 100 + 50, key)
    cache.invalidate(0, 1)  # builds the index (drops key 0)
    cache.invalidate(10_000, 15_000)  # drops keys 100..149
    searches = []
    inner = cache._overlapping
    monkeypatch.setattr(cache, "_overlapping", lambda low, high: searches.append(1) or inner(low, high))
    for _ in range(200):
        cache.invalidate(12_010, 12_040)  # over dropped key 120's bytes, overlapping no live value
    assert len(searches) <= memory._WASTED_SEARCHES_MAX + 2
    assert len(cache) == 949 and all(cache.get(k) == k for k in range(150, 1000))
    cache.put("new", 12_020, 12_030, "v")
    cache.invalidate(12_010, 12_025)
    assert cache.get("new") is None
    cache.invalidate(14_950, 15_001)  # touches key 150's range [15000, 15050)
    assert cache.get(150) is None and cache.get(151) == 151


def test_weights_written_every_run_stay_out_of_the_cache_and_equal_the_full_path(monkeypatch, tmp_path):
    """The MatMul's fp16 convs, their weights (the second operand) new every run: the steps gather
    them each run, never put them in the derived cache, and every run equals the full path's."""
    _weights_dropped_at_build(monkeypatch)
    fetched, puts = [], {}
    inner = cna_core._weights_fetcher

    def fetcher(*args):
        fetch = inner(*args)
        return lambda: fetched.append(1) or fetch()

    monkeypatch.setattr(cna_core, "_weights_fetcher", fetcher)
    put = DerivedCache.put

    def counted_put(self, key, *rest):
        if isinstance(key, tuple) and len(key) == 3 and isinstance(key[2], tuple) and key[2][:1] == ("CNA weights",):
            puts[id(self)] = puts.get(id(self), 0) + 1
        put(self, key, *rest)

    monkeypatch.setattr(DerivedCache, "put", counted_put)
    outputs, _ = _compare(tmp_path, "matmul", seed=3)
    assert _mismatches(outputs) == 0
    assert len(fetched) >= RUNS - 2
    # the full path (the slow runtime) puts the weights every run, the steps (the fast one from its
    # second run) never
    fast, slow = sorted(puts.values())
    assert slow >= RUNS and fast * 2 <= slow


def test_the_checks_catch_weights_gathered_from_a_copy_made_at_build_time(monkeypatch, tmp_path):
    """A fetch that gathers from a copy of the bytes taken when the step was made (not the memory as
    it is each run): caught."""
    inner = cna_core._weights_fetcher

    def from_copy(*args):
        fetch = inner(*args)
        first = fetch()
        return lambda: first.copy()

    monkeypatch.setattr(cna_core, "_weights_fetcher", from_copy)
    _weights_dropped_at_build(monkeypatch)
    outputs, _ = _compare_or_records(tmp_path, "matmul")
    assert outputs


def _upsample() -> tuple:
    """conv, nearest x2 Resize (the DPU's unpooling, a flying task), conv: ppocr_det's FPN upsampling."""
    net = Net(7)
    net.conv("c1", "x", "a", 8, 16)
    net.const("scales", np.array([1, 1, 2, 2], np.float32))
    net.node("Resize", ["a", "", "scales"], ["u"], "up", mode="nearest")
    net.conv("c2", "u", "y", 16, 8, kernel=1)
    return net.model([1, 8, 6, 7], "y"), None


def test_fp16_unpooling_runs_as_a_step_and_equals_the_full_path(monkeypatch, tmp_path):
    """An fp16 build's unpooling task (atoms copied whatever the precision) is a step, every run equal."""
    monkeypatch.setitem(MODELS, "upsample", _upsample)
    made = []
    inner = dpu_plan._prepare_unpool

    def prepare(*args):
        run = inner(*args)
        made.append(run is not None)
        return run

    monkeypatch.setattr(dpu_plan, "_prepare_unpool", prepare)
    outputs, _ = _compare(tmp_path, "upsample", seed=5)
    assert _mismatches(outputs) == 0
    assert any(made)


def test_the_checks_catch_fp16_unpooling_rows_read_when_the_step_was_built(monkeypatch, tmp_path):
    monkeypatch.setitem(MODELS, "upsample", _upsample)
    inner = dpu_plan._prepare_unpool

    def once(*args):
        run = inner(*args)
        if run is None:
            return None
        gather = dpu_plan.gather_rows
        first = []

        def stale(cbuf):  # the source rows as they were at the first run
            def copy(data, offsets, rows):
                if not first:
                    gather(data, offsets, rows)
                    first.append(rows.copy())
                rows[...] = first[0]
            monkeypatch.setattr(dpu_plan, "gather_rows", copy)
            try:
                run(cbuf)
            finally:
                monkeypatch.setattr(dpu_plan, "gather_rows", gather)
        stale.held = run.held
        return stale

    monkeypatch.setattr(dpu_plan, "_prepare_unpool", once)
    outputs, _ = _compare_or_records(tmp_path, "upsample")
    assert outputs


def _lut_chain_runs(monkeypatch, tasks: int = 3):
    """test_task_plans_lut's chain (each task uploads its own LUT tables): (mismatches against the
    full path, tasks run by core.py ``_run_steps``)."""
    ran = []
    inner = core_module.NpuCore._run_steps

    def counted(self, *args):
        done = inner(self, *args)
        ran.append(done)
        return done

    monkeypatch.setattr(core_module.NpuCore, "_run_steps", counted)
    outputs, _ = lut_plans._compare(monkeypatch, "direct_3x3_pad1", "identity", tasks)
    return sum(int(not np.array_equal(got, want)) for got, want, _ in outputs), sum(ran)


def test_chains_writing_the_lut_run_in_the_one_loop_and_equal_the_full_path(monkeypatch):
    """ppocr_rec's fp16 chains write the LUT RAM in almost every task: such a program is plain, its
    steps run in ``_run_steps`` with each task's LUT writes first, and equal the full path's."""
    mismatches, ran = _lut_chain_runs(monkeypatch)
    assert mismatches == 0
    assert ran >= 3 * (RUNS_INT8 - 3)


def test_the_checks_catch_the_one_loop_skipping_the_lut_writes(monkeypatch):
    """The loop without the LUT port writes (every task then reads the tables the chain's last
    upload left): the outputs differ."""
    monkeypatch.setattr(core_module.NpuCore, "_run_steps", _without_lut(core_module.NpuCore._run_steps))
    mismatches, ran = _lut_chain_runs(monkeypatch)
    assert ran > 0 and mismatches > 0


def _without_lut(inner):
    def run_steps(self, *args):
        apply = self.regfile.apply_lut
        self.regfile.apply_lut = lambda steps, where: None
        try:
            return inner(self, *args)
        finally:
            del self.regfile.apply_lut
            assert self.regfile.apply_lut == apply
    return run_steps


def _older_keys(cbuf) -> list:
    return [key for key, _, _ in cbuf._older_weights]


def test_a_steps_feature_keep_evicts_again_from_each_new_list_of_older_sets():
    """The CNA steps skip the CBUF bookkeeping only for the very list of older weight sets a keep of
    theirs left unchanged (cna_core ``_feature_keeper``): each round brings a new list holding A's
    weights (bank 1) and B's (bank 4); a 40000-byte feature (banks 0-1) must evict A's every round,
    as ``Cbuf.keep`` does, and a second keep over the list it left changes nothing."""
    a, b = (("address", 1), ("banks", "1/11")), (("address", 2), ("banks", "4/8"))
    key = (("address", 3), ("banks", "1/11"))
    feature = np.zeros(40000, np.int8)
    keep, mine, plain = cna_core._feature_keeper(key, "t"), cna_core.Cbuf(), cna_core.Cbuf()
    for _ in range(3):
        for cbuf in (mine, plain):
            cbuf._older_weights = [(a, np.zeros(64, np.int8), range(1, 2)), (b, np.zeros(64, np.int8), range(4, 5))]
        for _ in range(2):
            keep(mine, cna_core._Resident(key, feature, "t"))
            plain.keep("feature", key, feature, "t")
            assert _older_keys(mine) == _older_keys(plain) == [b]
            assert mine.feature == plain.feature
