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
