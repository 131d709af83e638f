"""Smoke test of ``python -m benchmarks.compile_time`` on the tiny model: the command runs end to
end, prints its table and writes every figure to JSON. No timing thresholds."""

import json
import math
import os
import subprocess
import sys

from benchmarks.compile_time import VENDOR_BUILD_S, format_row

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_compile_time_runs_on_the_tiny_model(tmp_path):
    out = tmp_path / "compile.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", "--models", "tiny", "--samples", "2",
                           "--repeat", "2", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "vendor s" in proc.stdout and "tiny" in proc.stdout
    (row,) = json.loads(out.read_text())
    assert row["model"] == "tiny" and row["samples"] == 2 and len(row["runs"]) == 2 and row["vendor_s"] is None
    for run in row["runs"]:
        assert 0 < run["cpu_s"] and 0 < run["wall_s"] and math.isfinite(run["wall_s"])
        assert 1 < run["rss_mb"] < 100_000  # kilobytes mistaken for megabytes would show here
    assert row["ort_s"] > 0


def test_row_states_the_target():
    runs = [{"wall_s": 1.5, "cpu_s": 1.2, "rss_mb": 300.0}, {"wall_s": 1.9, "cpu_s": 1.3, "rss_mb": 310.0}]
    line = format_row({"model": "mobilenetv2", "runs": runs, "vendor_s": VENDOR_BUILD_S["mobilenetv2"], "ort_s": 0.4})
    assert "1.50-1.90" in line and "1.20-1.30" in line and " 310 " in line and "2.2" in line and "meets" in line
    slow = format_row({"model": "resnet50", "runs": [{"wall_s": 16.4, "cpu_s": 9.0, "rss_mb": 900.0}],
                       "vendor_s": VENDOR_BUILD_S["resnet50"], "ort_s": 3.0})
    assert "2.0x the target" in slow


def test_unknown_model_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", "--models", "vgg99"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown model 'vgg99'" in proc.stderr
