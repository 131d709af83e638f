"""report_npu's rows made on first use (issue 20: the timing report after every inference).
A report whose rows were never read answers totals() from its memoised rows: the figures must be
those of the same report with its rows made, key by key, for every DDR model, with a per-layer
overhead, and after the caller edits what totals reads (rows, unassigned tasks, timeline).
The rows themselves are the dataclass field they were: equality, repr, copy, pickle,
dataclasses.replace and asdict see them."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest

from benchmarks.fixed_cost import chain_model
from npuemu.compiler.build import build_model
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.timing.report import LayerTime, PerfReport, report_npu
from tests.compiler.test_build_e2e import compile_graph

SHAPE = (1, 16, 8, 8)


@pytest.fixture(scope="module")
def runtime():
    runtime = Runtime(build_model(compile_graph(chain_model(3, 1, input_name="x"), SHAPE)))
    runtime.set_input("x", np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32))
    runtime.run()
    return runtime


def _report(runtime: Runtime, ddr_model: str = "board") -> PerfReport:
    return report_npu(runtime.model, runtime.runs, runtime.machine.platform, ddr_model)


def _made(report: PerfReport) -> PerfReport:
    report.layers  # noqa: B018 - reading the field makes this report's rows
    return report


def _by_rows(report: PerfReport) -> dict:
    """The totals worked out over the report's rows (made first): the reference."""
    return _made(report).totals()


@pytest.mark.parametrize("ddr_model", ["board", "vendor"])
@pytest.mark.parametrize("overhead", [0.0, 12.5])
def test_totals_before_the_rows_equal_totals_over_them(runtime, ddr_model, overhead):
    for _ in range(3):  # the first computes and keeps them, the later ones reuse them
        lazy = _report(runtime, ddr_model)
        lazy.layer_overhead_us = overhead
        made = _report(runtime, ddr_model)
        made.layer_overhead_us = overhead
        totals, reference = lazy.totals(), _by_rows(made)
        assert set(totals) == set(reference)
        for key in reference:
            assert totals[key] == reference[key] and type(totals[key]) is type(reference[key]), key
        assert lazy.speedup() == made.speedup()


def test_the_rows_are_the_field_they_were(runtime):
    lazy, made = _report(runtime), _made(_report(runtime))
    assert lazy == made and repr(lazy) == repr(made)
    assert [f.name for f in dataclasses.fields(PerfReport)][3] == "layers"
    assert dataclasses.asdict(lazy)["layers"] == dataclasses.asdict(made)["layers"]
    assert all(isinstance(row, LayerTime) for row in lazy.layers) and lazy.layers is lazy.layers
    replaced = dataclasses.replace(_report(runtime), model="other")
    assert replaced.layers == made.layers and replaced.model == "other"
    assert pickle.loads(pickle.dumps(_report(runtime))).to_json() == made.to_json()
    original = _report(runtime)
    shallow = copy.copy(original)
    assert shallow.layers is original.layers  # (a shallow copy shares the field, as before)
    assert _report(runtime).layers is not made.layers  # each report has rows of its own
    assert all(a is not b for a, b in zip(_report(runtime).layers, made.layers))


def test_edits_reach_totals(runtime):
    expected = _report(runtime).totals()
    edited = _report(runtime)
    edited.layers[0].host_us = 1e6  # a row edited: its report's totals follow it
    edited.layers[0].vendor_ddr = 10 ** 9
    assert edited.totals() == _reference_totals(edited)
    assert _report(runtime).totals() == expected  # and the next report does not see it
    grown = _report(runtime)
    grown.unassigned.append(grown.timeline.task_spans()[0].time)
    assert grown.totals()["tasks"] == expected["tasks"] + 1
    assert grown.totals() == _reference_totals(grown)
    replaced = _report(runtime)
    replaced.layers = replaced.layers[:1]
    assert replaced.totals() == _reference_totals(replaced)
    untimed = _report(runtime)
    untimed.timeline = None
    assert untimed.totals() == _reference_totals(untimed)
    assert untimed.totals()["cycles"] == sum(layer.cycles for layer in untimed.layers)


def _reference_totals(report: PerfReport) -> dict:
    """The report's totals without its memoised source (a report built from its fields)."""
    return PerfReport(report.model, report.platform, report.npu_mhz, report.layers, report.unassigned,
                      ddr_model=report.ddr_model, layer_overhead_us=report.layer_overhead_us,
                      timeline=report.timeline).totals()
