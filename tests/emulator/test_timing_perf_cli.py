"""``npuemu perf`` on a vendor .rknn fixture and on an npuemu .npu file (from ``npuemu demo``)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import numpy as np

from tests.shared_data import RKNN_FIXTURES
from npuemu.tools.cli import main

FIXTURES = RKNN_FIXTURES
COLUMNS = ["ID", "OpType", "DataType", "Target", "InputShape", "OutputShape", "DDRCycles", "NPUCycles",
           "MaxCycles", "Time(us)", "MacUsage(%)", "WorkLoad(0/1/2)", "TaskNumber", "RW(KB)", "FullName"]


def test_perf_rknn_table_and_json(tmp_path, capsys):
    model = str(FIXTURES / "rep12_resblock_convadd_3x3_64_56" / "model.rknn")
    assert main(["perf", model]) == 0
    out = capsys.readouterr().out
    assert "no --input given: all inputs are zeros" in out
    header = next(line for line in out.splitlines() if line.startswith("ID"))
    assert header.split() == COLUMNS
    assert "Conv:" in out and "Total" in out

    with lzma.open(FIXTURES / "rep12_resblock_convadd_3x3_64_56" / "input_0.npy.xz") as handle:
        np.save(tmp_path / "x.npy", np.load(handle))
    assert main(["perf", model, "--input", str(tmp_path / "x.npy"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["notes"] == []
    vendor = json.loads((FIXTURES / "rep12_resblock_convadd_3x3_64_56" / "meta.json").read_text())["librknnc"]["layers"]
    assert [layer["npu_cycles"] for layer in report["layers"]] == [row["npu_cycles"] for row in vendor]
    for key in ("npu_cycles", "ddr_cycles", "ddr_read_bytes", "ddr_write_bytes", "time_us", "tasks"):
        assert key in report["layers"][1] and key in report["totals"]
    assert report["totals"]["tasks"] == sum(layer["tasks"] for layer in report["layers"]) + report["unassigned_tasks"]
    assert report["totals"]["npu_cycles"] == sum(layer["npu_cycles"] for layer in report["layers"])


def test_perf_npu_and_user_errors(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    npu = str(tmp_path / "demo_cnn.npu")
    assert main(["perf", npu, "--input", str(tmp_path / "image.npy"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    layers = report["layers"]
    assert sum(layer["tasks"] for layer in layers) == report["totals"]["tasks"] > 0
    assert any(layer["npu_cycles"] > 0 for layer in layers)
    assert all(abs(layer["time_us"] * report["npu_mhz"] - layer["cycles"]) < 1e-6 for layer in layers)
    assert main(["perf", npu]) == 0
    assert "zeros" in capsys.readouterr().out

    np.save(tmp_path / "wrong.npy", np.zeros((1, 3, 8, 8), np.float32))
    np.save(tmp_path / "other.npy", np.zeros((1, 3, 8, 8), np.float32))
    assert main(["perf", npu, "-i", str(tmp_path / "wrong.npy"), "-i", str(tmp_path / "other.npy")]) == 2
    err = capsys.readouterr().err
    assert "2 --input file(s) given" in err and "Traceback" not in err
    (tmp_path / "junk.bin").write_bytes(b"nothing")
    assert main(["perf", str(tmp_path / "junk.bin")]) == 2
    assert "not a .rknn file" in capsys.readouterr().err


def test_perf_csv_has_the_json_names_and_the_ranking_adds_up(tmp_path, capsys):
    """The issue's report list: --csv with the JSON's raw names (one schema), the frame totals and the
    "Operator Time Consuming Ranking Table" under the layer table."""
    import csv
    import io

    model = str(FIXTURES / "rep12_resblock_convadd_3x3_64_56" / "model.rknn")
    assert main(["perf", model, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["perf", model, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["id"] for row in rows] == [str(layer["id"]) for layer in report["layers"]] + ["total"]
    flat = set(report["layers"][0]) - {"workload"}
    assert flat <= set(rows[0]) and any(name.startswith("workload_core") for name in rows[0])
    for row, layer in zip(rows, report["layers"]):
        for key in ("npu_cycles", "ddr_cycles", "ddr_read_bytes", "ddr_write_bytes", "sram_hit_bytes", "tasks"):
            assert int(row[key]) == layer[key]
        assert float(row["time_us"]) == layer["time_us"]
    assert int(rows[-1]["npu_cycles"]) == report["totals"]["npu_cycles"]
    ranking = report["ranking"]
    assert sum(row["calls"] for row in ranking) == len(report["layers"])
    assert abs(sum(row["time_ratio_percent"] for row in ranking) - 100.0) < 1e-6
    assert [row["total_time_us"] for row in ranking] == sorted((row["total_time_us"] for row in ranking), reverse=True)
    assert main(["perf", model]) == 0
    out = capsys.readouterr().out
    assert "Total Operator Elapsed Per Frame Time(us)" in out and "Operator Time Consuming Ranking Table" in out
    lines = out.splitlines()
    title = lines.index("Operator Time Consuming Ranking Table")
    assert lines[title + 1].split() == ["OpType", "CallNumber", "CPUTime(us)", "GPUTime(us)", "NPUTime(us)",
                                        "TotalTime(us)", "TimeRatio(%)"]
    assert [line.split()[0] for line in lines[title + 2:title + 2 + len(ranking)]] == [r["op_type"] for r in ranking]
    assert main(["perf", model, "--json", "--csv"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_perf_workload_column_follows_the_chip(tmp_path, capsys):
    """WorkLoad(0/1) on a 2-core chip (guide 3.2.3), and a batch of 2 on rk3576 shares every layer
    50/50 between its cores with the gain over one core."""
    from npuemu.compiler.build import build_model
    from tests.compiler.test_build_e2e import MODELS, compile_graph

    model, shape = MODELS["conv_relu"]()
    path = tmp_path / "b2.npu"
    build_model(compile_graph(model, shape), "rk3576", batch=2).write(path)
    assert main(["perf", str(path)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("ID"))
    assert "WorkLoad(0/1)" in header.split() and "WorkLoad(0/1/2)" not in header
    assert "50.0%/50.0% - Up:100.0%" in out


def test_perf_says_which_ddr_model_and_the_time_error_band(capsys):
    """Issue 24 items 3 and 5: the header and the JSON name the DDR model, what it is fitted to and
    how to get the other, and the time figures' error band from the calibration residuals."""
    model = str(FIXTURES / "rep12_resblock_convadd_3x3_64_56" / "model.rknn")
    assert main(["perf", model]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("ID"))
    header = "\n".join(lines[:table])
    assert "DDR model: board (default)" in header and "calibration.md rows A2, A3, A4, A5" in header
    assert "--ddr-model vendor" in header and "4.0x those of the vendor's static estimate (23.654 B/cycle)" in header
    assert "Time(us) error band:" in header and "-26.2% .. +18.5%" in header and "17.4%" in header
    assert main(["perf", model, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ddr_model_info"]["name"] == "board" and "A2, A3, A4, A5" in report["ddr_model_info"]["source"]
    band = report["time_band"]
    assert band["calibrated"] and band["rows"] == ["A2", "A3", "A4", "A5"]
    assert band["board_low"] < 0 < band["board_high"]  # the board may be faster or slower than the model
    assert main(["perf", model, "--ddr-model", "vendor", "--json"]) == 0
    vendor = json.loads(capsys.readouterr().out)
    assert vendor["ddr_model_info"]["name"] == "vendor" and "Default --ddr-model board" in vendor["ddr_model_info"]["text"]
    assert vendor["time_band"]["calibrated"] is False
    from npuemu.emulator.timing.explain import time_band
    from npuemu.platforms import load_platform

    for chip in ("rk3576", "rk3568", "rv1106"):  # no board rows: no band, said so
        band = time_band(load_platform(chip), "board")
        assert band["calibrated"] is False and "no board rows" in band["text"], chip
