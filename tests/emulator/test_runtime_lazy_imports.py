"""Importing the runtime loads only what a run of a model file needs (issue 20: first call in a
fresh process). ND host tensors' module and its ml_dtypes are imported only for a model that has
one; host-step ops, vendor readers and the timing report only when used. Checked in fresh interpreters, so a
new eager import cannot slip in unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_LOADED = """
import json, sys
{body}
print("LOADED " + json.dumps(sorted(sys.modules)))
"""

#: not imported by ``import npuemu.emulator.runtime`` (each is imported where first used)
LAZY = ("ml_dtypes", "npuemu.emulator.cpu_ops", "npuemu.emulator.cpu_ops_tensors", "npuemu.emulator.timing.report",
        "npuemu.isa.rknn", "npuemu.emulator.rknn_runner", "npuemu.compiler")


def loaded_modules(body: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", _LOADED.format(body=body)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("LOADED "))
    return set(json.loads(line[len("LOADED "):]))


def test_importing_the_runtime_leaves_the_lazy_modules_out() -> None:
    loaded = loaded_modules("import npuemu.emulator.runtime")
    assert "npuemu.emulator.machine" in loaded  # (the check sees what the runtime imports)
    assert not [name for name in loaded if any(name == lazy or name.startswith(lazy + ".") for lazy in LAZY)]


def test_the_check_sees_an_eager_import() -> None:
    loaded = loaded_modules("import npuemu.emulator.runtime, npuemu.emulator.cpu_ops_tensors")
    assert "ml_dtypes" in loaded and "npuemu.emulator.cpu_ops_tensors" in loaded
