"""Issue 20's fixed-cost caches hand out the same values a fresh machine computes: DMA traffic
objects shared by equal counts, task records reused across runs (also by chains whose tasks
change register group every run), timing memoised per record, BLAS threads restored after
calibration. No timing assertions: benchmarks/fixed_cost.py measures the speed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from benchmarks.fixed_cost import chain_model, table
from npuemu.compiler.build import build_model
from npuemu.compiler.quant import blas_threads
from npuemu.emulator.memory import Memory, TaskDma, Traffic
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.timing import task_time, timeline
from npuemu.emulator.timing.report import report_npu
from npuemu.emulator.timing.task_time import TaskFigures, time_task
from npuemu.platforms import load_platform
from tests.compiler.test_build_e2e import compile_graph

SHAPE = (1, 16, 8, 8)


def test_equal_counts_give_the_same_traffic_object():
    memory = Memory(4096)
    first, second, other = TaskDma(memory, "a"), TaskDma(memory, "b"), TaskDma(memory, "c")
    for dma in (first, second):
        dma.count(Traffic.REGCMD_READ, 64)
        dma.count(Traffic.FEATURE_READ, 100)
        dma.count(Traffic.FEATURE_READ, 28)
    other.count(Traffic.REGCMD_READ, 64)
    other.count(Traffic.FEATURE_READ, 129)
    assert first.traffic() is second.traffic()
    assert first.traffic().feature_read == 128 and first.traffic().read_bytes == 192
    assert other.traffic() is not first.traffic() and other.traffic().feature_read == 129


@pytest.fixture(scope="module", params=[3, 4], ids=["4-tasks", "5-tasks"])
def chain(request):
    """A chain of 1 + N 1x1 convs: with N = 3 the chain has 4 tasks, with N = 4 five."""
    return build_model(compile_graph(chain_model(request.param, 0, input_name="x"), SHAPE))


def _run(runtime: Runtime, x: np.ndarray):
    runtime.set_input("x", x)
    runtime.run()
    records = [task for run in runtime.runs for task in run.tasks]
    return runtime.output("output", dequantize=False), records


def test_repeated_runs_reuse_records_and_match_a_fresh_machine(chain):
    rng = np.random.default_rng(3)
    x1, x2 = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2))
    inputs = (x1, x1, x1, x2)
    runtime = Runtime(chain)
    outputs = [_run(runtime, x) for x in inputs]
    for i, (out, records) in enumerate(outputs):
        # the same history on another machine (the register groups persist between runs), its
        # last run with the per-task caches emptied: decoded and recorded afresh
        fresh = Runtime(chain)
        for x in inputs[:i]:
            _run(fresh, x)
        for core in fresh.machine.cores:
            core._tasks.clear()
        fresh_out, fresh_records = _run(fresh, inputs[i])
        assert np.array_equal(out, fresh_out)
        assert records == fresh_records  # every field, traffic and decoded states included
    # whatever group each task ran from on run 1, run 3 runs it from the same one again
    # (an odd chain flips every block's group between runs): the very same records
    assert all(a is b for a, b in zip(outputs[0][1], outputs[2][1]))


def test_memoised_timing_equals_timing_worked_out_afresh(chain):
    runtime = Runtime(chain)
    platform = runtime.machine.platform
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    timelines = []
    for _ in range(3):  # (a 5-task chain alternates between two sets of records)
        _run(runtime, x)
        timelines.append(timeline.timeline_npu(runtime.model, runtime.runs, platform))
        memoised = report_npu(runtime.model, runtime.runs, platform).totals()
        for memo in (task_time._WORK, timeline._TIMED, timeline._HOST_US, timeline._TIMELINES):
            memo.clear()
        afresh = report_npu(runtime.model, runtime.runs, platform).totals()
        assert memoised == afresh
        assert timeline.timeline_npu(runtime.model, runtime.runs, platform) == timelines[-1]
    assert timelines[0] == timelines[2]  # the same register groups (runs 2 and 3 may differ in them)
    assert timelines[0].npu_cycles == timelines[1].npu_cycles
    assert TaskFigures.of(platform) is TaskFigures.of(platform)
    for record in (task for run in runtime.runs for task in run.tasks):
        timed = time_task(record, platform)
        assert timed.cycles == timed.max_cycles + timed.overhead_cycles
        assert timed.max_cycles == max(timed.npu_cycles, timed.unit_cycles, timed.ddr_cycles) + timed.serial_cycles


def test_a_timeline_is_handed_out_again_only_for_the_very_same_records(chain):
    """timeline_npu's memo: the same tuples of records (a replay's, handed out again), or the same records in
    other tuples, give the timeline placed before; an equal record that is another object is placed again."""
    runtime = Runtime(chain)
    platform = runtime.machine.platform
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    for _ in range(4):
        _run(runtime, x)
    runs = runtime.runs
    first = timeline.timeline_npu(runtime.model, runs, platform)
    assert timeline.timeline_npu(runtime.model, runs, platform) is first
    copied = tuple(replace(run, tasks=tuple(list(run.tasks))) for run in runs)
    assert copied[0].tasks is not runs[0].tasks
    assert timeline.timeline_npu(runtime.model, copied, platform) is first
    records = list(runs[0].tasks)
    records[-1] = replace(records[-1])  # (equal, not the same object)
    other = (replace(runs[0], tasks=tuple(records)),) + runs[1:]
    placed = timeline.timeline_npu(runtime.model, other, platform)
    assert placed is not first and placed == first


def test_figures_of_another_platform_are_its_own():
    rk3588, rk3566 = load_platform("rk3588"), load_platform("rk3566")
    assert TaskFigures.of(rk3566).read_bytes_per_cycle == rk3566.ddr.read_bytes_per_cycle
    assert TaskFigures.of(rk3588).task_overhead_cycles == rk3588.launch.task_overhead_cycles


def test_calibration_blas_scope_restores_the_thread_count(monkeypatch):
    for key in blas_threads._ENVIRONMENT:
        monkeypatch.delenv(key, raising=False)
    functions = blas_threads._openblas()
    before = int(functions[1]()) if functions else None
    with blas_threads.single_threaded_blas() as changed:
        assert changed == (functions is not None)
        if functions:
            assert int(functions[1]()) == 1
    if functions:
        assert int(functions[1]()) == before
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")  # the user's choice is left alone
    with blas_threads.single_threaded_blas() as changed:
        assert not changed


def test_fixed_cost_models_and_table():
    model = chain_model(5, 3)
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Conv") == 6 and ops.count("Abs") == 3 and ops.count("Relu") == 6
    result = {"us_per_task": 50.0, "us_per_host_step": 30.0, "ort_us_per_task": 0.5, "ort_us_per_host_step": 0.0,
              "builds": {"tasks_few": {"tasks": 9}, "tasks_many": {"tasks": 109},
                         "host_few": {"steps": 6}, "host_many": {"steps": 106}}}
    text = table(result)
    assert "100 tasks / 100 host steps" in text
    assert "NPU task" in text and "100x" in text and "n/a" in text  # no ratio against a zero reference
