"""npuemu's kernels load from Numba's cache without Numba's registry refresh (issue 20, first
call; emulator/numba_cache_load.py): a fresh process whose first run loads every kernel from
the cache computes the same outputs as a process that compiles or refreshes, and (for this
model's kernels: a LUT kernel's environment imports numba.np.arraymath, which pulls in linalg)
leaves Numba's lowering registries (numba.np.linalg, one of the modules refresh imports)
unloaded. Payloads the
fast path does not recognise, or whose code names a symbol only refresh registers, take Numba's
own load; other packages' dispatchers always do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from npuemu.emulator import numba_cache_load

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import json, sys, hashlib
import numpy as np
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
runtime = Runtime(ModelFile.read(sys.argv[1]))
runtime.set_input(runtime.inputs[0], np.load(sys.argv[2]))
runtime.run()
out = runtime.output(runtime.outputs[0], dequantize=False)
from numba.core.registry import CPUDispatcher
modules = [m for name, m in list(sys.modules.items()) if name.startswith("npuemu") and m is not None]
dispatchers = {id(v): v for m in modules for v in vars(m).values() if isinstance(v, CPUDispatcher)}
print("RESULT " + json.dumps({"digest": hashlib.sha256(out.tobytes()).hexdigest(),
    "loads": sum(len(d.stats.cache_hits) for d in dispatchers.values()),
    "compiles": sum(len(d.stats.cache_misses) for d in dispatchers.values()),
    "linalg": "numba.np.linalg" in sys.modules}))
"""


def _child(npu: Path, x: Path, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(npu), str(x)], capture_output=True, text=True,
                          cwd=ROOT, timeout=900, env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_a_warm_first_run_skips_the_refresh_and_computes_the_same(tmp_path):
    from benchmarks.fixed_cost import chain_model
    from npuemu.compiler.build import build_model
    from npuemu.emulator.runtime import Runtime
    from tests.compiler.test_build_e2e import compile_graph

    shape = (1, 16, 8, 8)
    model = build_model(compile_graph(chain_model(2, 0, input_name="x"), shape))
    npu, x_path = tmp_path / "m.npu", tmp_path / "x.npy"
    model.write(npu)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    np.save(x_path, x)
    runtime = Runtime(model)  # this process: kernels compiled or loaded, registries refreshed or not
    runtime.set_input("x", x)
    runtime.run()
    import hashlib

    expected = hashlib.sha256(runtime.output(runtime.outputs[0], dequantize=False).tobytes()).hexdigest()
    rows = [_child(npu, x_path) for _ in range(3)]  # (the first may compile: another test edited a kernel)
    assert all(row["digest"] == expected for row in rows)
    warm = [row for row in rows if row["compiles"] == 0]
    assert warm, rows
    assert all(row["loads"] > 0 and not row["linalg"] for row in warm), warm
    # the escape hatch: Numba's own load (its refresh imports the lowering registries), same output
    full = _child(npu, x_path, {"NPUEMU_NUMBA_FULL_LOAD": "1"})
    assert full["digest"] == expected and full["compiles"] == 0 and full["linalg"], full


def _payload(library=("lib", "object", (b"\x7fELF code", b"BC bitcode")), objectmode=False, lifted=(),
             reload_init=()):
    return (library, "fndesc", "env", "sig", objectmode, lifted, "typeann", list(reload_init), ())


@pytest.mark.parametrize("payload, fast", [
    (_payload(), True),
    (_payload(library=("lib", "bitcode", b"BC")), True),
    (_payload(library=("lib", "object", (b"uses _numba_hashsecret_siphash_k0", b""))), False),
    (_payload(library=("lib", "object", (b"", b"_numba_hashsecret_djbx33a_suffix"))), False),
    (_payload(objectmode=True), False),
    (_payload(lifted=("loop",)), False),
    (_payload(reload_init=(print,)), False),
    (_payload(library=("lib", "other", b"")), False),
    (_payload(library=("lib", "object", ("text", b""))), False),
    (_payload()[:8], False),
    ("not a tuple", False),
])
def test_only_recognised_payloads_skip_the_refresh(payload, fast):
    assert numba_cache_load._links_without_registries(payload) is fast


def test_installed_once_and_only_for_npuemu_functions():
    from numba.core import caching

    assert numba_cache_load.install() and numba_cache_load.install()
    installed = caching.Cache.load_overload
    assert getattr(installed, "npuemu_original", None) is not None
    assert not hasattr(installed.npuemu_original, "npuemu_original")  # (not wrapped twice)

    def outside():
        pass

    outside.__module__ = "somebody_else"
    assert not numba_cache_load._is_npuemu(outside) and not numba_cache_load._is_npuemu(None)
    assert numba_cache_load._is_npuemu(numba_cache_load.install)
