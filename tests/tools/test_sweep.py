"""``npuemu sweep`` with the local backend (tools/cmd_sweep.py, sweep_*.py): the issue's example
gives 8 rows and its int8/auto/6.0 row equals `npuemu compile --set ... ` + `npuemu perf`; builds
are shared by points differing only in timing figures; failing points become error rows; a rerun
skips finished rows; a worker that dies has its point retried once."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from npuemu.tools.cli import main
from npuemu.tools.sweep_rows import read_rows

EXAMPLE = """models: [net.onnx]
target: rk3588
dtype: [int8, fp16]
dataset: ds/dataset.txt
core_mask: [auto, 0_1_2]
set:
  ddr.read_bytes_per_cycle: [3.0, 6.0]
  ddr.write_bytes_per_cycle: [3.0]
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """net.onnx (the demo network) and a two-sample calibration set, as a user would lay them out."""
    import onnx

    from npuemu.tools.demo_network import demo_images, demo_network

    root = tmp_path_factory.mktemp("sweep")
    onnx.save(demo_network(), root / "net.onnx")
    (root / "ds").mkdir()
    for index, image in enumerate(demo_images(2, 0)):
        np.save(root / "ds" / f"s{index}.npy", image)
    (root / "ds" / "dataset.txt").write_text("s0.npy\ns1.npy\n")
    return root


def _sweep(folder, text: str, name: str, *extra) -> tuple[int, list[dict]]:
    spec = folder / f"{name}.yaml"
    spec.write_text(text)
    code = main(["sweep", str(spec), "-o", str(folder / f"{name}.csv"), *map(str, extra)])
    return code, read_rows(folder / f"{name}.csv")


def test_example_row_equals_compile_then_perf(folder, capsys):
    code, rows = _sweep(folder, EXAMPLE, "example", "--workers", "2")
    assert code == 0 and len(rows) == 8 and not any(row["error"] for row in rows)
    assert len({row["point"] for row in rows}) == 8
    assert len({row["build"] for row in rows}) == 4  # the DDR figure is timing-only: one build per pair
    row = next(r for r in rows if (r["dtype"], r["core_mask"], r["ddr.read_bytes_per_cycle"]) == ("int8", "auto", "6.0"))
    npu = folder / "a.npu"
    assert main(["compile", str(folder / "net.onnx"), "-t", "rk3588", "--quantize", "--dataset",
                 str(folder / "ds" / "dataset.txt"), "--set", "ddr.read_bytes_per_cycle=6.0",
                 "--set", "ddr.write_bytes_per_cycle=3.0", "-o", str(npu)]) == 0
    capsys.readouterr()
    assert main(["perf", str(npu), "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    for key in ("cycles", "npu_cycles", "ddr_cycles", "ddr_read_bytes", "ddr_write_bytes", "sram_hit_bytes", "tasks"):
        assert int(row[key]) == totals[key], key
    assert float(row["time_us"]) == pytest.approx(totals["time_us"], abs=1e-3)
    slower = next(r for r in rows if (r["dtype"], r["core_mask"], r["ddr.read_bytes_per_cycle"]) == ("int8", "auto", "3.0"))
    assert int(slower["ddr_cycles"]) > int(row["ddr_cycles"]) and slower["ddr_read_bytes"] == row["ddr_read_bytes"]


def test_failing_points_become_rows_and_rerun_skips_finished(folder, capsys):
    text = ("models: [net.onnx, missing.onnx]\ndtype: fp16\ncore_mask: [auto]\nbatch_size: [1, 2]\n"
            "set:\n  cbuf.banks: [8, 99]\n  ddr.read_bytes_per_cycle: [4, -1]\n")
    code, rows = _sweep(folder, text, "faults", "--workers", "2", "--layers", folder / "layers.csv")
    assert code == 0 and len(rows) == 16
    errors = {(r["model"], r["cbuf.banks"], r["ddr.read_bytes_per_cycle"]): r["error"] for r in rows}
    assert all(errors[("missing.onnx", banks, rate)] for banks in ("8", "99") for rate in ("4", "-1"))
    assert "cbuf.banks" in errors[("net.onnx", "99", "4")]  # out of range: the loader's message
    assert "ddr.read_bytes_per_cycle" in errors[("net.onnx", "8", "-1")]
    good = [r for r in rows if not r["error"]]
    assert len(good) == 2 and {r["batch_size"] for r in good} == {"1", "2"}
    layers = read_rows(folder / "layers.csv")
    assert {layer["point"] for layer in layers} == {r["point"] for r in good}
    # an interrupted sweep: drop the last rows, cut the next one in half; a rerun runs only those
    lines = (folder / "faults.csv").read_text().splitlines(keepends=True)
    (folder / "faults.csv").write_text("".join(lines[:13]) + lines[13][:20])
    capsys.readouterr()
    code, again = _sweep(folder, text, "faults", "--workers", "1", "--layers", folder / "layers.csv")
    out = capsys.readouterr().out
    assert code == 0 and "4 point(s) run" in out and "12 already there" in out
    assert sorted(r["point"] for r in again) == sorted(r["point"] for r in rows)
    assert len(read_rows(folder / "layers.csv")) == len(layers)  # no duplicated layer rows


def test_other_sweep_in_the_same_csv_is_refused(folder, capsys):
    _sweep(folder, "models: [net.onnx]\ndtype: fp16\n", "mixed")
    other = folder / "other.yaml"  # written here: the tests of this module may run in other processes
    other.write_text(EXAMPLE)
    code = main(["sweep", str(other), "-o", str(folder / "mixed.csv")])
    assert code == 2 and "rows of another sweep" in capsys.readouterr().err


def test_sample_draws_points_of_the_grid(folder):
    from npuemu.tools.sweep_spec import load_spec, points

    spec = folder / "big.yaml"
    spec.write_text("models: [net.onnx]\ndtype: fp16\nset:\n  ddr.read_bytes_per_cycle: [1, 2, 3, 4, 5, 6, 7, 8]\n"
                    "  clock.npu_mhz: [500, 800, 1000]\n  launch.task_overhead_cycles: [0, 100, 200]\nsample: 5\n")
    drawn = points(load_spec(spec))
    assert len(drawn) == 5 and len({p.id for p in drawn}) == 5
    grid = {p.id for p in points(load_spec(spec).__class__(**{**load_spec(spec).__dict__, "sample": None}))}
    assert len(grid) == 72 and {p.id for p in drawn} <= grid


def test_worker_death_is_retried_once(folder, monkeypatch, capsys):
    """A point kills its worker on its first run only: retried, it gives its row; a point that
    kills it every time becomes an error row, and the other points are unharmed."""
    from npuemu.tools import sweep_worker

    marker = folder / "died_once"
    real = sweep_worker.point

    def dying(job, source):
        rate = dict(job.overrides)["ddr.read_bytes_per_cycle"]
        if rate == 2 and not marker.exists():
            marker.write_text("x")
            os._exit(1)
        if rate == 3:
            os._exit(1)
        return real(job, source)

    monkeypatch.setattr(sweep_worker, "point", dying)  # the pool forks: workers see the patch
    code, rows = _sweep(folder, "models: [net.onnx]\ndtype: fp16\nset:\n  ddr.read_bytes_per_cycle: [1, 2, 3, 4]\n",
                        "deaths", "--workers", "2")
    assert code == 0 and len(rows) == 4 and marker.exists()
    by_rate = {row["ddr.read_bytes_per_cycle"]: row for row in rows}
    assert "died" in by_rate["3"]["error"]
    assert all(not by_rate[rate]["error"] and int(by_rate[rate]["cycles"]) > 0 for rate in ("1", "2", "4"))
