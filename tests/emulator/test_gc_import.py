"""The collector stays off the heap while the runtime's modules import (issue 20, first call;
emulator/gc_import.py): in a fresh process the import leaves the collector on and the heap
frozen as gc_steady's own freeze (so a Runtime's later freezes and releases work as before),
and leaves a caller's choices alone: the collector disabled, ``NPUEMU_GC_FREEZE=0``, a frozen set
of its own. Checked in fresh interpreters (this one imported the runtime long ago)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import gc, json, sys
import numpy as np
if sys.argv[1] == "disabled":
    gc.disable()
elif sys.argv[1] == "caller_froze":
    gc.freeze()
caller = gc.get_freeze_count()
from npuemu.emulator.runtime import Runtime
from npuemu.emulator import gc_steady
state = {"enabled": gc.isenabled(), "caller": caller, "frozen": gc.get_freeze_count(), "ours": gc_steady._state.ours}
if len(sys.argv) > 2:
    from npuemu.isa.container import ModelFile
    runtime = Runtime(ModelFile.read(sys.argv[2]))
    x = np.load(sys.argv[3])
    for _ in range(3):
        runtime.set_input(runtime.inputs[0], x)
        runtime.run()
    state["after_runs"] = gc_steady._state.ours and gc.get_freeze_count() > state["frozen"]
    del runtime
    state["after_drop"] = gc.get_freeze_count()
print("RESULT " + json.dumps(state))
"""


def _child(mode: str, *model: str, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, mode, *model], capture_output=True, text=True, cwd=ROOT,
                          timeout=900, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[str, str]:
    import numpy as np

    from benchmarks.fixed_cost import chain_model
    from npuemu.compiler.build import build_model
    from tests.compiler.test_build_e2e import compile_graph

    folder = tmp_path_factory.mktemp("gc_import")
    shape = (1, 16, 8, 8)
    npu, x = folder / "m.npu", folder / "x.npy"
    build_model(compile_graph(chain_model(1, 0, input_name="x"), shape)).write(npu)
    np.save(x, np.random.default_rng(2).standard_normal(shape).astype(np.float32))
    return str(npu), str(x)


def test_the_import_freezes_the_heap_as_ours_and_runtimes_freeze_and_release_as_before(model):
    state = _child("plain", *model, env={"NPUEMU_GC_FREEZE": "1"})
    assert state["enabled"] and state["caller"] == 0 and state["frozen"] > 0 and state["ours"], state
    assert state["after_runs"], state  # (the Runtime's own freeze after its second run, on top)
    assert state["after_drop"] == 0, state  # (dropping it gives the whole heap back, as before)


def test_opt_out_freezes_nothing():
    state = _child("plain", env={"NPUEMU_GC_FREEZE": "0"})
    assert state == {"enabled": True, "caller": 0, "frozen": 0, "ours": False}


def test_a_disabled_collector_stays_disabled_and_nothing_is_frozen():
    state = _child("disabled", env={"NPUEMU_GC_FREEZE": "1"})
    assert state == {"enabled": False, "caller": 0, "frozen": 0, "ours": False}


def test_a_callers_frozen_set_is_left_to_the_caller():
    state = _child("caller_froze", env={"NPUEMU_GC_FREEZE": "1"})
    assert state["enabled"] and state["caller"] > 0 and not state["ours"]
    assert state["frozen"] <= state["caller"], state  # (nothing of the import added to it; only deaths)
