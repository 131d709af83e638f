"""One timeline (emulator/timing/timeline.py): every schedule step on one time axis, read by
`npuemu run`'s summary, `perf`, `trace` and `calibrate`, which give the same total; host steps on
their own trace track; graph layers label the spans and do not move them."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from npuemu.compiler.build import build_model
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.timing.host_model import cpu_step_us
from npuemu.emulator.timing.report import report_npu
from npuemu.emulator.timing.task_time import TaskFigures, time_task
from npuemu.emulator.timing.timeline import concurrent_cycles, timeline_npu
from npuemu.platforms import load_platform
from npuemu.tools.cli import main
from tests.compiler.test_build_e2e import Net, compile_graph

SHAPE = (1, 3, 32, 32)


def conv_resize_conv():
    """conv+relu (NPU, split over the cores) -> align_corners bilinear Resize x2 (a host step) -> conv
    (NPU, split)."""
    net = Net(4)
    net.conv("c1", "x", "a", 3, 16)
    net.node("Relu", ["a"], ["a1"], "r1")
    net.const("roi", np.zeros(0))
    net.const("scales", [1, 1, 2, 2])
    # nearest and the other bilinear modes run on the NPU; align_corners does not
    net.node("Resize", ["a1", "roi", "scales"], ["u"], "up", mode="linear",
             coordinate_transformation_mode="align_corners")
    net.conv("c2", "u", "y", 16, 16)
    return net.model(list(SHAPE), "y")


@pytest.fixture(scope="module")
def graph():
    return compile_graph(conv_resize_conv(), SHAPE)


@pytest.fixture(scope="module")
def three_core(graph, tmp_path_factory):
    """The model built for cores 0-2, written with an input file."""
    directory = tmp_path_factory.mktemp("timeline")
    built = build_model(graph, cores=(0, 1, 2))
    built.write(directory / "m.npu")
    np.save(directory / "x.npy", np.random.default_rng(1).normal(size=SHAPE).astype(np.float32))
    return built, str(directory / "m.npu"), str(directory / "x.npy"), directory


def _run(model, x=None):
    runtime = Runtime(model)
    runtime.set_input("x", np.random.default_rng(1).normal(size=SHAPE).astype(np.float32) if x is None else x)
    runtime.run()
    return runtime


def test_run_perf_and_trace_give_one_total(three_core, capsys):
    built, npu, x, directory = three_core
    steps = built.schedule()
    assert [s.kind for s in steps].count("cpu") == 1 and len({s.core for s in steps if s.kind == "npu"}) == 3
    assert main(["perf", npu, "-i", x, "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert main(["run", npu, "-i", x]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("timing:"))
    assert main(["trace", npu, "-i", x, "-o", str(directory / "t.json")]) == 0
    printed = capsys.readouterr().out
    trace = json.loads((directory / "t.json").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    end = max(e["ts"] + e["dur"] for e in events)
    # the same frame time everywhere, to the microsecond (and the trace to the float)
    assert trace["otherData"]["total_time_us"] == totals["time_us"]
    assert end == pytest.approx(totals["time_us"], abs=1e-6)
    assert f"= {totals['time_us']:.1f} us at" in line and f"= {totals['time_us']:.1f} us at" in printed
    assert f"{totals['cycles']} cycles" in line and f"{totals['cycles']} cycles" in printed
    # the host step is in the total: NPU cycles at the clock plus its host time
    host = totals["cpu_time_us"]
    assert host > 0 and "in 1 host step(s)" in line
    assert totals["time_us"] == pytest.approx(totals["cycles"] / trace["otherData"]["npu_mhz"] + host, abs=1e-9)


def test_the_trace_has_a_host_track_between_the_split_layers(three_core, capsys):
    built, npu, x, directory = three_core
    assert main(["trace", npu, "-i", x, "-o", str(directory / "t2.json")]) == 0
    capsys.readouterr()
    trace = json.loads((directory / "t2.json").read_text())
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    host = [e for e in events if names[(e["pid"], e["tid"])] == "host"]
    assert [e["name"] for e in host] == ["Resize (host)"] and host[0]["args"]["layers"] == ["up"]
    tasks = [e for e in events if e["cat"] == "task"]
    assert {names[(e["pid"], e["tid"])] for e in tasks} == {"core 0", "core 1", "core 2"}
    start, stop = host[0]["ts"], host[0]["ts"] + host[0]["dur"]
    before = [e for e in tasks if e["ts"] < start]
    after = [e for e in tasks if e["ts"] >= start]
    assert before and after  # one split layer on each side
    assert max(e["ts"] + e["dur"] for e in before) <= start + 1e-9
    assert min(e["ts"] for e in after) == pytest.approx(stop, abs=1e-9)
    # the host step waits for the slowest core; both groups show their barrier
    barriers = [e for e in events if e["cat"] == "barrier"]
    assert len(barriers) == 2 and all(e["args"]["cores"] == [0, 1, 2] for e in barriers)
    assert barriers[0]["ts"] + barriers[0]["dur"] == pytest.approx(start, abs=1e-9)


def test_groups_start_together_and_end_at_their_barrier(three_core):
    built, *_ = three_core
    runtime = _run(built)
    platform = runtime.machine.platform
    timeline = timeline_npu(built, runtime.runs, platform)
    npu_segments = [seg for seg in timeline.segments if seg.kind == "npu"]
    assert [seg.grouped for seg in npu_segments] == [True, True]
    for seg in npu_segments:
        tasks = [span for span in seg.spans if span.kind == "npu"]
        per_core: dict[int, int] = {}
        for span in tasks:
            per_core[span.lane] = per_core.get(span.lane, 0) + span.cycles
        assert {min(s.start for s in tasks if s.lane == core) for core in per_core} == {seg.start}
        moved = sum(s.time.ddr_read_bytes + s.time.ddr_write_bytes for s in tasks)
        assert seg.end.cycles - seg.start.cycles == concurrent_cycles(per_core, moved,
                                                                      platform.ddr.shared_bytes_per_cycle)
    (host,) = timeline.spans("cpu")
    tensors = {t.name: t for t in built.tensors()}
    assert host.host_us == cpu_step_us([tensors["a1"].shape], platform)
    # each task span carries the task formula's figures, whatever layer labels it
    records = [record for run in runtime.runs for record in run.tasks]
    assert [span.time for span in timeline.task_spans()] == [time_task(r, platform) for r in records]


def test_a_shared_ddr_bound_stretches_the_group_in_every_reader(three_core):
    """With a shared DDR rate below what the cores move, the group ends when the DDR is done:
    the timeline, perf's total and its split layer rows agree (the trace used to leave it out)."""
    built, *_ = three_core
    runtime = _run(built)
    base = runtime.machine.platform
    slow = dataclasses.replace(base, ddr=dataclasses.replace(base.ddr, shared_bytes_per_cycle=1.0))
    report = report_npu(built, runtime.runs, slow)
    timeline = report.timeline
    barriers = timeline.spans("barrier")
    assert barriers and all(span.name == "shared DDR" for span in barriers)
    for span in barriers:
        assert span.cycles == span.args["ddr_bytes"]  # at 1 B/cycle
    assert report.totals()["cycles"] == timeline.npu_cycles == sum(s.cycles for s in barriers)
    split = [layer for layer in report.layers if layer.split]
    assert sum(layer.cycles for layer in split) == timeline.npu_cycles


def test_layers_label_the_timeline_without_moving_it(three_core):
    """Dropping the graph-layer records changes no span: the layers only label."""
    built, *_ = three_core
    runtime = _run(built)
    platform = runtime.machine.platform
    labelled = timeline_npu(built, runtime.runs, platform)
    unlabelled_model = type(built)(built.sections, {**built.trailer, "graph": {**built.trailer["graph"], "layers": []}})
    bare = timeline_npu(unlabelled_model, runtime.runs, platform)
    assert [(s.kind, s.lane, s.start, s.end) for s in bare.spans()] == \
        [(s.kind, s.lane, s.start, s.end) for s in labelled.spans()]
    assert bare.total_us == labelled.total_us
    assert any(s.layers for s in labelled.task_spans()) and not any(s.layers for s in bare.task_spans())


def test_batch_host_steps_of_a_wave_run_side_by_side(graph):
    """A batch of 3 on rk3588 (3 contexts): the three slices' host steps run at once, one per
    context track, so the wave costs one host step (TIMING.md, multi-batch)."""
    built = build_model(graph, batch=3)
    runtime = Runtime(built)
    runtime.set_input("x", np.random.default_rng(2).normal(size=(3, *SHAPE[1:])).astype(np.float32))
    runtime.run()
    timeline = timeline_npu(built, runtime.runs, runtime.machine.platform)
    hosts = timeline.spans("cpu")
    assert sorted(span.lane for span in hosts) == [0, 1, 2] and len({span.start for span in hosts}) == 1
    assert timeline.host_us == max(span.host_us for span in hosts)
    assert report_npu(built, runtime.runs, runtime.machine.platform).totals()["time_us"] == timeline.total_us


def test_calibration_reads_the_timeline_with_candidate_figures(graph):
    """calibrate times a row's executed schedule with the figures being fitted: the timeline
    with the platform's figures is the one perf reports."""
    from npuemu.emulator.timing.timeline import plan_npu
    from npuemu.tools import calibration as cal
    from npuemu.tools.calibration_rows import ROWS

    built = build_model(graph)
    runtime = _run(built)
    platform = load_platform("rk3588")

    plan = plan_npu(built, runtime.runs, platform, keep_records=False)
    row = cal.RowRun(ROWS[0], True, tasks=[t.work for step in plan.steps for t in step.tasks], plan=plan)
    figures = cal.Figures.of(platform)
    result = cal.model_row(row, figures)
    assert result.time_us == report_npu(built, runtime.runs, platform).totals()["time_us"] + \
        platform.launch.host_submit_overhead_us
    slower = cal.model_row(row, dataclasses.replace(figures, read_bytes_per_cycle=1.0, write_bytes_per_cycle=1.0))
    assert slower.ddr > result.ddr and slower.time_us > result.time_us
    assert TaskFigures.of(platform) == figures.task_figures()


def test_run_line_without_host_steps_keeps_its_form(graph):
    from npuemu.tools.cmd_run import timeline_text

    single = build_model(compile_graph(_conv_only(), SHAPE))
    runtime = _run(single)
    timeline = timeline_npu(single, runtime.runs, runtime.machine.platform)
    text = timeline_text(timeline, runtime.machine.platform)
    assert re.fullmatch(r"\d+ tasks, \d+ cycles = [\d.]+ us at [\d.]+ MHz \(rk3588\)", text)


def _conv_only():
    net = Net(7)
    net.conv("c1", "x", "y", 3, 8)
    return net.model(list(SHAPE), "y")
