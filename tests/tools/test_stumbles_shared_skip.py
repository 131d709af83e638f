"""Without ../shared (a plain clone), tests that read it skip with the reason instead of failing
(issue 21 item 2; tests/conftest.py, tests/shared_data.py); the others still run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import shared_data

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["tests/emulator/test_timing_models.py", "tests/emulator/test_rknn_fixtures_run.py",
           "tests/emulator/test_timing_mem_trace.py"]


def test_missing_root_only_for_paths_inside_an_absent_shared_folder(tmp_path) -> None:
    assert shared_data.missing_root(tmp_path / "x") is None  # not shared data
    assert shared_data.missing_root("rk3588") is None


def test_tests_reading_shared_data_skip_when_it_is_absent(tmp_path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("NPUEMU_")}
    env["NPUEMU_SHARED"] = str(tmp_path / "nonexistent")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                             "-rs", *MODULES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-3000:]
    assert "failed" not in summary and "error" not in summary and "passed" in summary, summary
    assert f"{shared_data.MISSING_REASON}: {tmp_path / 'nonexistent'}" in result.stdout
