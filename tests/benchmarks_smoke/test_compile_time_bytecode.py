"""``python -m benchmarks.compile_time`` times compiles with a warm private bytecode cache unless
told not to (benchmarks/compile_time.py docstring); the cache really fills."""

import os
import subprocess
import sys

from benchmarks.compile_time import compile_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_compile_environment_with_and_without_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    warm = compile_env(str(tmp_path), True)
    assert "PYTHONDONTWRITEBYTECODE" not in warm and warm["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    cold = compile_env(str(tmp_path), False)
    assert cold["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in cold
    assert warm["OPENBLAS_NUM_THREADS"] == cold["OPENBLAS_NUM_THREADS"]  # the thread settings stay


def test_a_run_fills_the_private_cache(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", "--models", "tiny", "--samples", "2",
                           "--repeat", "1", "--workdir", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "warm bytecode cache" in proc.stdout
    cached = [name for _, _, files in os.walk(tmp_path / "pycache") for name in files if name.endswith(".pyc")]
    assert any(name.startswith("driver.") for name in cached) and len(cached) > 100
