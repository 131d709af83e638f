"""The report's per-inference work (issue 20): ``PerfReport.totals`` sums in one pass what the
layer rows' properties give, and ``report_npu`` hands each report its own copies of rows it
works out once per timeline."""

import random

from npuemu.emulator.timing.report import LayerTime, PerfReport
from npuemu.emulator.timing.task_time import TaskTime


def _task(rng: random.Random, index: int) -> TaskTime:
    return TaskTime(core=0, index=index, npu_cycles=rng.randrange(10**6), ddr_cycles=rng.randrange(10**6),
                    ddr_read_bytes=rng.randrange(10**7), ddr_write_bytes=rng.randrange(10**7),
                    overhead_cycles=rng.randrange(5000), macs=rng.randrange(10**8),
                    unit_cycles=rng.randrange(10**5), serial_cycles=rng.randrange(1000),
                    sram_hit_bytes=rng.randrange(1000))


def _reference(report: PerfReport) -> dict:
    """The totals by the rows' own properties (the rule the one-pass sum must keep)."""
    parts = list(report.layers) + list(report.unassigned)
    tasks = [t for layer in report.layers for t in layer.tasks] + list(report.unassigned)
    return {"npu_cycles": sum(p.npu_cycles for p in parts), "ddr_cycles": sum(p.ddr_cycles for p in parts),
            "max_cycles": sum(p.max_cycles for p in parts),
            "ddr_read_bytes": sum(t.ddr_read_bytes for t in tasks),
            "ddr_write_bytes": sum(t.ddr_write_bytes for t in tasks),
            "sram_hit_bytes": sum(t.sram_hit_bytes for t in tasks),
            "single_core_cycles": sum(p.single_core_cycles if isinstance(p, LayerTime) else p.cycles for p in parts),
            "tasks": len(tasks)}


def test_totals_equal_the_sums_of_the_row_properties():
    rng = random.Random(0)
    for trial in range(30):
        layers = []
        for index in range(rng.randrange(1, 8)):
            tasks = [_task(rng, i) for i in range(rng.randrange(0, 5))]
            layer = LayerTime(index, "Conv", "INT8", "NPU", "1x1", "1x1", f"l{index}", tasks, 1024)
            kind = rng.randrange(4)
            if kind == 1 and len(tasks) > 1:  # split over cores, a shared DDR rate or none
                layer.cores = [i % 3 for i in range(len(tasks))]
                layer.shared_ddr_rate = rng.choice([None, 1.0, 64.0])
            elif kind == 2:  # the vendor's estimate
                layer.vendor_ddr, layer.vendor_npu = rng.randrange(10**6), rng.randrange(10**6)
            elif kind == 3:
                layer.host_us = rng.random() * 100
            layers.append(layer)
        unassigned = [_task(rng, 100 + i) for i in range(rng.randrange(3))]
        report = PerfReport("m", "rk3588", 1000.0, layers, unassigned, ddr_model=rng.choice(["board", "vendor"]))
        totals = report.totals()
        expected = _reference(report)
        assert {key: totals[key] for key in expected} == expected, trial


def test_each_report_gets_rows_of_its_own():
    import numpy as np

    from benchmarks.fixed_cost import chain_model
    from npuemu.compiler.build import build_model
    from npuemu.emulator.runtime import Runtime
    from npuemu.emulator.timing.report import report_npu
    from tests.compiler.test_build_e2e import compile_graph

    shape = (1, 16, 8, 8)
    runtime = Runtime(build_model(compile_graph(chain_model(2, 0, input_name="x"), shape)))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    reports = []

    def report():
        runtime.set_input("x", x)
        runtime.run()
        reports.append(report_npu(runtime.model, runtime.runs, runtime.machine.platform))
        return reports[-1]

    for _ in range(5):
        report()
    # a 3-task chain starts each run on the other register group: every other run repeats
    first, second = reports[-3], reports[-1]
    assert first.timeline is second.timeline  # the same records: the same timeline, the rows kept
    assert first.layers == second.layers and first.totals() == second.totals()
    assert all(a is not b and a.tasks is not b.tasks for a, b in zip(first.layers, second.layers))
    expected = second.totals()
    second.layers[0].tasks.clear()  # a caller editing its report's rows leaves the next report alone
    second.layers[1].host_us = 1e6
    report()
    assert report().totals() == expected


def test_each_report_gets_explain_dicts_of_its_own():
    """``explain``'s texts are worked out once per (platform, DDR model); a report changing its dicts (or their
    lists) leaves the next report's as the explain functions give them."""
    from npuemu.emulator.timing.explain import ddr_model_info, time_band
    from npuemu.platforms import load_platform

    platform = load_platform("rk3588")
    for ddr_model in ("board", "vendor"):
        first = PerfReport("m", platform.name, 1000.0, [], [], ddr_model=ddr_model).explain(platform)
        first.ddr_info["text"] = "changed"
        first.time_band.setdefault("rows", []).append("X")
        first.time_band["text"] = "changed"
        second = PerfReport("m", platform.name, 1000.0, [], [], ddr_model=ddr_model).explain(platform)
        assert second.ddr_info == ddr_model_info(platform, ddr_model)
        assert second.time_band == time_band(platform, ddr_model)
