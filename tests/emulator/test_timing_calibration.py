"""Calibration of the timing model against the real-board rows of calibration.md (issue 5).

Every row is compiled and emulated once (module fixture, ~6 s). Targets of the issue: NPU cycles
within 2% on every conv row, DDR cycles within 5% on every row, time within 25% median. What is
not met is asserted as it stands, row by row, with the reason (emulator/TIMING.md "Calibration"):
- rows npuemu cannot build or run yet have no figures (none today);
- B144 (Mul by a [1, 60, 80] map) is not fitted: npuemu's build adds a conv task that replicates
  the operand across the lanes of one surface (compiler/LOWERING.md 16), the vendor's profile has
  no conv task (0 NPU cycles); its DDR (-13%) and NPU gaps are asserted as they stand;
- A5 is not fitted and misses the DDR target: its 16-channel output is written as 32 channels,
  by npuemu's build and by the vendor's own 2.5.0 build of that layer (mobilenet_v2 conv_18,
  compiler/LOWERING.md 15), while the board's DDR figure fits 16 (tools/calibration.py reports
  it as a layout difference against 16 channels);
- rows whose tasks the vendor builds otherwise (LUT upload task, Concat) are not fitted.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import replace

import numpy as np
import pytest

from tests.shared_data import SHARED
from npuemu.platforms import load_platform
from npuemu.emulator.timing.task_time import TaskWork
from npuemu.tools import calibration as cal
from npuemu.tools.calibration_rows import CPU_ROWS, ROWS
from npuemu.tools.cli import main

CALIBRATION_MD = SHARED / "docs" / "calibration.md"

NOT_RUNNABLE: dict[str, str] = {}
LAYOUT_DIFFERS = {"B117": "uploads the LUT in a DPU task of its own", "B122": "uploads the LUT in a DPU task of its own",
                  "B8": "no vendor listing shows how its Concat is built",
                  "B144": "replicates the broadcast operand across the lanes of one surface with a 1x1 conv task"}
DDR_GAP: dict[str, float] = {}  # |error| bound asserted where the 5% target is not met (none today)
# rows whose build moves other bytes than the vendor's tasks by design: (low, high) |DDR error|
# (B144: r 76.8 + 921.6 KB, w 76.8 + 460.8 KB against the board's fit r 537.6 KB, w 921.6 KB; TIMING.md)
STRUCTURE_DDR_GAP = {"B144": (0.12, 0.14)}
HELPER_CONV_NPU = {"B144": 4800}  # the lane-replicating conv: one MAC pass per pixel of 60 x 80
TIME_MEDIAN_GAP: dict[str, float] = {}  # median |time error| bound asserted where the 25% target is not met


def label(row) -> str:
    return f"{row.table}{row.id}"


@pytest.fixture(scope="module")
def runs():
    return {label(row): cal.run_row(row) for row in ROWS}


def chip_runs(runs, chip):
    return [run for run in runs.values() if run.row.chip == chip]


def results(runs, chip):
    figures = cal.Figures.of(load_platform(chip))
    return {label(r.run.row): r for r in cal.report(chip, chip_runs(runs, chip), figures).results}


# --- the data ------------------------------------------------------------------------------

def _md_rows() -> list[list[str]]:
    text = CALIBRATION_MD.read_text()
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[0].isdigit():
            rows.append(cells)
    return rows


def _ints(cell: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", cell)]


def test_rows_are_the_markdown_tables_cell_by_cell():
    md = _md_rows()
    assert len(md) == len(ROWS) == 21
    for row, cells in zip(ROWS, md):
        id_, op, inp, weight, out, stride, ddr, npu, max_, time = cells
        assert row.id == int(id_) and op.startswith(row.op) and row.uint8_input == ("uint8 input" in op)
        assert list(row.out) == _ints(out)
        assert (list(row.weight) if row.weight else []) == _ints(weight)
        assert (row.stride or 0) == (int(stride) if stride.isdigit() else 0)
        assert (row.ddr, row.npu, row.max, row.time_us) == (int(ddr), int(npu), int(max_), float(time))
        if inp.startswith("2 x"):
            assert row.inputs == (tuple(_ints(inp)[1:]),) * 2
        elif " and " in inp:
            assert [list(s) for s in row.inputs] == [_ints(part) for part in inp.split(" and ")]
        else:
            assert list(row.inputs[0]) == _ints(inp)
    text = CALIBRATION_MD.read_text()
    for op, _, us in CPU_ROWS:
        assert f"{op} " in text and f"{us:g} us" in text


# --- agreement -----------------------------------------------------------------------------

def test_every_row_is_reported_and_the_unrunnable_ones_say_why(runs):
    missing = {name: run.reason for name, run in runs.items() if not run.on_npu}
    assert set(missing) == set(NOT_RUNNABLE)
    for name, reason in missing.items():
        assert NOT_RUNNABLE[name].split()[0] in reason or NOT_RUNNABLE[name] in reason, (name, reason)
    layouts = {name: run.layout for name, run in runs.items() if run.on_npu and run.layout}
    assert set(layouts) == set(LAYOUT_DIFFERS)
    for name, text in layouts.items():
        assert LAYOUT_DIFFERS[name] in text, (name, text)
    text = "\n".join(cal.report(chip, chip_runs(runs, chip), cal.Figures.of(load_platform(chip))).format_text()
                     for chip in ("rk3588", "rk3562"))
    for name in runs:
        assert re.search(rf"^{name}\s", text, re.M), f"row {name} missing from the report"


def test_npu_cycles_within_2_percent_on_every_conv_row(runs):
    checked = 0
    for chip in ("rk3588", "rk3562"):
        for name, result in results(runs, chip).items():
            if result.run.on_npu and result.run.row.is_conv:
                assert abs(result.error("npu")) <= cal.NPU_TARGET, (name, result.npu, result.run.row.npu)
                checked += 1
            elif name in HELPER_CONV_NPU:  # the build's helper conv; the profile says 0
                assert result.npu == HELPER_CONV_NPU[name] and result.run.row.npu == 0
            elif result.run.on_npu:  # element-wise rows: the profile and the model both say 0
                assert result.npu == result.run.row.npu == 0
    assert checked == 16


def test_ddr_cycles_within_5_percent_on_every_fitted_row_and_the_gaps_as_they_stand(runs):
    for chip in ("rk3588", "rk3562"):
        for name, result in results(runs, chip).items():
            if not result.run.on_npu:
                continue
            error = abs(result.error("ddr"))
            if name in STRUCTURE_DDR_GAP:
                low, high = STRUCTURE_DDR_GAP[name]
                assert not result.run.fit_row and low < error <= high, (name, error)
            elif not result.run.fit_row and "task structure" in result.run.layout:
                assert error <= cal.DDR_TARGET, (name, error)  # same bytes; the time differs by a task
            elif not result.run.fit_row:
                assert error > cal.DDR_TARGET, f"{name} now meets the DDR target: make it a fit row"
            elif name in DDR_GAP:
                assert cal.DDR_TARGET < error <= DDR_GAP[name], (name, error)
            else:
                assert error <= cal.DDR_TARGET, (name, error)


def test_time_within_25_percent_median_per_chip(runs):
    for chip in ("rk3588", "rk3562"):
        errors = [abs(r.error("time")) for r in results(runs, chip).values() if r.run.on_npu]
        assert len(errors) >= 4
        if chip in TIME_MEDIAN_GAP:
            assert cal.TIME_MEDIAN_TARGET < statistics.median(errors) <= TIME_MEDIAN_GAP[chip], (chip, errors)
        else:
            assert statistics.median(errors) <= cal.TIME_MEDIAN_TARGET, (chip, errors)


def test_the_yaml_figures_are_the_fit_of_these_rows(runs):
    for chip, rows in (("rk3588", "A2, A3, A4, A5"), ("rk3562", "B1, B2, B3, B4, B5, B6, B7, B9, B10, B11, B118, B120, B121")):
        platform = load_platform(chip)
        fitted = cal.fit(chip_runs(runs, chip), cal.Figures.of(platform))
        assert fitted == cal.Figures.of(platform), \
            f"{chip}: the YAML is not the fit of today's build; run npuemu calibrate --fit and record {fitted}"
        source = f"fitted to calibration.md rows {rows} by npuemu calibrate --fit"
        assert source in platform.ddr.source and source in platform.launch.source


# --- the fit itself ------------------------------------------------------------------------

def test_fit_recovers_known_figures_from_synthetic_rows():
    """Rows whose 'board' figures are generated from known figures (by an independent evaluation
    of the formulas below) give those figures back."""
    truth = cal.Figures(4.0, 2.5, 300, 120.0, 1000.0, 0.5)
    rng = np.random.default_rng(5)
    runs = []
    for i in range(12):
        n = int(rng.integers(1, 9))
        tasks = [TaskWork(0, 0, int(rng.integers(0, 400000)), 0, int(rng.integers(50000, 900000)),
                                 int(rng.integers(20000, 600000)), 1040) for _ in range(n)]
        ddr = npu = cycles = 0
        for t in tasks:
            d = int(np.ceil(t.data_read_bytes / 4.0 + t.write_bytes / 2.5))
            ddr += d
            npu += t.npu_cycles
            cycles += max(t.npu_cycles, d) + round(0.5 * min(t.npu_cycles, d)) + 300 + int(np.ceil(1040 / 4.0))
        row = replace(ROWS[1], id=100 + i, ddr=ddr, npu=npu, max=0, time_us=cycles / 1000.0 + 120.0)
        runs.append(cal.RowRun(row, True, tasks=tasks))
    got = cal.fit(runs, cal.Figures(1.0, 1.0, 0, 0.0, 1000.0, 1.0))
    assert got.read_bytes_per_cycle == pytest.approx(4.0, rel=2e-3)
    assert got.write_bytes_per_cycle == pytest.approx(2.5, rel=2e-3)
    assert got.compute_overlap == pytest.approx(0.5, abs=0.01)
    assert got.task_overhead_cycles == pytest.approx(300, abs=15)
    assert got.host_submit_overhead_us == pytest.approx(120.0, abs=1.0)


def test_fit_recovers_a_conv_output_bound_and_leaves_it_out_when_there_is_none():
    """Synthetic conv rows whose compute is max(MAC cycles, written bytes / 1.2): the fit picks the
    candidate rate next to 1.2 and the other figures; the same rows without the bound give none."""
    def rows(rate):
        rng = np.random.default_rng(9)
        runs = []
        for i in range(12):
            tasks = [TaskWork(0, 0, int(rng.integers(0, 300000)), 0, int(rng.integers(50000, 900000)),
                                     int(rng.integers(20000, 600000)), 1040) for _ in range(int(rng.integers(1, 9)))]
            ddr = npu = cycles = 0
            for t in tasks:
                d = int(np.ceil(t.data_read_bytes / 4.0 + t.write_bytes / 2.5))
                compute = max(t.npu_cycles, int(np.ceil(t.write_bytes / rate)) if rate else 0)
                ddr, npu = ddr + d, npu + t.npu_cycles
                cycles += max(compute, d) + round(0.5 * min(compute, d)) + 300 + int(np.ceil(1040 / 4.0))
            row = replace(ROWS[1], id=200 + i, ddr=ddr, npu=npu, max=0, time_us=cycles / 1000.0 + 120.0)
            runs.append(cal.RowRun(row, True, tasks=tasks))
        return runs
    got = cal.fit(rows(1.2), cal.Figures(1.0, 1.0, 0, 0.0, 1000.0, 1.0))
    assert got.conv_write_bytes_per_cycle == pytest.approx(1.2, rel=0.03)
    assert got.compute_overlap == pytest.approx(0.5, abs=0.05)
    assert got.host_submit_overhead_us == pytest.approx(120.0, abs=5.0)
    assert cal.fit(rows(None), cal.Figures(1.0, 1.0, 0, 0.0, 1000.0, 1.0)).conv_write_bytes_per_cycle is None


def test_bounded_least_squares_holds_its_bounds():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert cal._bounded_lstsq(a, np.array([2.0, -1.0, 1.0]), [0, 0], [10, 10]) == pytest.approx([1.5, 0.0])
    assert cal._bounded_lstsq(a, np.array([5.0, 1.0, 6.0]), [0, 0], [3, 10]) == pytest.approx([3.0, 2.0])


# --- the command ---------------------------------------------------------------------------

def test_calibrate_cli_json_and_errors(capsys):
    assert main(["calibrate", "-t", "rk3588", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (chip,) = report["chips"]
    assert chip["chip"] == "rk3588" and [r["row"] for r in chip["rows"]] == ["A2", "A3", "A4", "A5"]
    a3 = chip["rows"][1]
    assert a3["measured"] == {"npu_cycles": 50176, "ddr_cycles": 139965, "max_cycles": 135965, "time_us": 351}
    assert a3["model"]["npu_cycles"] == 50176 and a3["fit_row"]
    assert chip["figures"]["ddr.read_bytes_per_cycle"] == load_platform("rk3588").ddr.read_bytes_per_cycle
    assert main(["calibrate", "-t", "rk3576"]) == 2
    err = capsys.readouterr().err
    assert "no board rows for 'rk3576'" in err and "Traceback" not in err


def test_calibrate_fit_prints_the_yaml_lines(capsys):
    assert main(["calibrate", "-t", "rk3588", "--fit"]) == 0
    out = capsys.readouterr().out
    platform = load_platform("rk3588")
    assert "fitted figures for platforms/rk3588.yaml (fitted to calibration.md rows A2, A3, A4, A5 by npuemu calibrate --fit)" in out
    assert f"  read_bytes_per_cycle: {platform.ddr.read_bytes_per_cycle:g}\n" in out
    assert f"  host_submit_overhead_us: {platform.launch.host_submit_overhead_us:g}\n" in out
    assert re.search(r"^A3\s+ConvRelu\s+2\s+50176/50176\s+\+0\.0%", out, re.M)


def test_perf_time_band_is_the_calibration_residuals(runs):
    """emulator/timing/explain.py's per-chip error band (perf's header and JSON, issue 24 item 5)
    equals the time residuals of the fit rows as calibrate computes them now."""
    from npuemu.emulator.timing.explain import TIME_BANDS

    for chip, band in TIME_BANDS.items():
        fit = {name: r.error("time") for name, r in results(runs, chip).items() if r.run.fit_row}
        assert tuple(fit) == band.rows, chip
        assert abs(min(fit.values()) - band.low) < 5e-4 and abs(max(fit.values()) - band.high) < 5e-4, (chip, fit)
        assert abs(statistics.median(abs(e) for e in fit.values()) - band.median_abs) < 5e-4, (chip, fit)
