"""Smoke test of ``python -m benchmarks --quick``: the command runs end to end on the tiny model
and its JSON carries every column with plausible values. No timing thresholds."""

import json
import math
import os
import subprocess
import sys

import onnx
import pytest

from benchmarks import models
from benchmarks.__main__ import COLUMNS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_benchmark_json(tmp_path):
    out = tmp_path / "bench.json"
    # (the timeout only guards against a hang: from cold Numba caches the run compiles every kernel the tiny
    # model's int8 and fp16 builds use - 6.4 min alone on session 25's Emerald Rapids host, more with the CI's
    # other test worker compiling beside it; a 600 s limit failed there)
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    assert "emu/ort" in proc.stdout and "scaling" in proc.stdout
    data = json.loads(out.read_text())
    assert data["columns"] == COLUMNS
    (row,) = data["rows"]
    assert set(COLUMNS) <= set(row)
    assert row["model"] == "tiny"
    assert row["macs"] == models.count_macs(models.tiny()[0]) > 0
    for key in ("compile_s", "first_run_s", "emu_int8_ms", "peak_rss_mb", "ort_ms"):
        assert row[key] > 0 and math.isfinite(row[key]), key
    assert math.isclose(row["ratio"], row["emu_int8_ms"] / row["ort_ms"], rel_tol=1e-9)
    # fp16 is either a measured time or a stated reason, never both missing
    assert (row["emu_fp16_ms"] is not None and row["emu_fp16_ms"] > 0) or row["fp16_note"].startswith("n/a")
    assert row["peak_rss_mb"] < 100_000  # kilobytes mistaken for megabytes would show here
    # the fixed cost per NPU task and per host step (benchmarks/fixed_cost.py), printed and in the JSON
    fixed = data["fixed_cost"]
    assert "fixed cost" in proc.stdout and "NPU task" in proc.stdout and "host step" in proc.stdout
    builds = fixed["builds"]
    assert builds["tasks_many"]["tasks"] - builds["tasks_few"]["tasks"] == 100
    assert builds["host_many"]["steps"] - builds["host_few"]["steps"] == 100
    for key in ("us_per_task", "us_per_host_step"):
        assert fixed[key] > 0 and math.isfinite(fixed[key]), key


def test_macs_of_standard_architectures():
    # Published figures: ResNet-18 1.8 GMAC, ResNet-50 4.1 GMAC, MobileNetV2 300 MMAC (224x224)
    for build, expected in ((lambda: models.resnet(18), 1.82e9), (lambda: models.resnet(50), 4.09e9),
                            (models.mobilenetv2, 3.0e8)):
        model, macs = build()
        onnx.checker.check_model(model)
        assert models.count_macs(model) == macs
        assert abs(macs - expected) / expected < 0.02


def test_unknown_model_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--models", "vgg99"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown model 'vgg99'" in proc.stderr


@pytest.mark.models
def test_every_real_model_builds_with_its_input_fixed():
    # `python -m benchmarks --models all` covers the default set and every real model
    assert models.EVERY[:len(models.ALL)] == models.ALL and set(models.PACKAGE_MODELS) <= set(models.EVERY)
    for name, (_, _, dims) in models.PACKAGE_MODELS.items():
        model, macs, reason = models.build(name)
        assert model is not None, reason
        assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == dims
        assert macs > 1e7, name


def test_a_worker_reports_its_own_peak_not_its_parents():
    """``measure._reset_peak``: a child process forked and exec'd by a parent that once held 400 MB reports
    its own peak resident set, not the parent's (session 26: every model after ResNet-50 showed 580 MB)."""
    import subprocess
    import sys

    code = ("import numpy as np; a = np.ones(50_000_000); a[::512] = 2; del a; import subprocess, sys; "
            "print(subprocess.run([sys.executable, '-c', 'import resource; from benchmarks import measure as m; "
            "m._reset_peak(); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "
            "m._peak_kb() / 1024)'], capture_output=True, text=True).stdout)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2])).stdout
    inherited, own = (float(value) for value in out.split()[-2:])
    assert inherited > 350 and own < 200  # (ru_maxrss: the parent's 400 MB; the worker's own peak: its own)
