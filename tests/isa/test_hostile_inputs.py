"""Hostile inputs end in a one-line error or a normal result - never a traceback, a memory
error or a hang (issue 23).

``hostile_gen`` writes ~1900 command lines over CRC-valid mutated model files (trailer,
header, section table, register payload), broken ONNX attributes, hostile platform YAML and
assembly directives; ``hostile_runner`` runs them in one subprocess under a 2 GiB address-space
cap (RLIMIT_AS) with a time limit per case. A new trailer field that is used without a bound
shows up here as a failing case.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import hostile_gen  # noqa: E402

MEMORY_CAP = 2 << 30
SECONDS_PER_CASE = 10


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("hostile")
    cases = hostile_gen.write_cases(folder)
    completed = subprocess.run(
        [sys.executable, str(HERE / "hostile_runner.py"), str(folder / "cases.json"), str(MEMORY_CAP),
         str(SECONDS_PER_CASE)],
        capture_output=True, text=True, timeout=300, cwd=folder)
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = json.loads(completed.stdout.splitlines()[-1])
    assert len(found) == len(cases)
    return found


def test_no_hostile_input_escapes_as_a_traceback(results):
    failures = [f"{r['label']}: npuemu {' '.join(Path(a).name for a in r['argv'])}: {r['failure']}"
                for r in results if r["failure"]]
    assert not failures, f"{len(failures)} of {len(results)} cases failed:\n" + "\n".join(failures[:20])


def test_the_generator_reaches_every_command_and_the_semantic_checks(results):
    commands = {r["argv"][0] for r in results}
    assert commands == {"run", "perf", "trace", "mem", "inspect", "compile", "platforms", "asm"}
    trailer_refusals = [r for r in results if "trailer at offset" in r["error"]]
    assert len(trailer_refusals) > 300  # the CRCs were valid: the schema and bounds refused them
    assert len(results) > 900
