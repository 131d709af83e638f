"""A cached kernel's helper environments are read without importing their modules (issue 20,
first call; emulator/numba_lazy_env.py), and npuemu's dispatchers leave Numba's extension entry
points to the first compile (emulator/numba_deferred_extensions.py).

- ``rebuild_env``: an environment whose module is not imported gets globals holding only its
  ``__name__`` (its constants and name as pickled); one whose module is imported, or a name
  already known, is Numba's.
- ``load``: a payload naming a module that does not even exist loads (Numba's own load would
  fail importing it); one with object-mode code is handed to Numba's load, stubs dropped.
- A fresh process's warm first run imports neither ``numba.np.arrayobj`` nor runs the entry
  points, and computes the same output; an extension's ``init`` hook (a distribution made in
  the test) still runs before a later compile of another function, which calls a kernel loaded
  with stub environments and gets the result the kernel gives when called directly.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba.core import environment

from npuemu.emulator import numba_deferred_extensions, numba_lazy_env

ROOT = Path(__file__).resolve().parents[2]


def _env(modname: str, name: str, consts=()) -> environment.Environment:
    env = environment.Environment({"__name__": modname})
    env.consts[:] = list(consts)
    env.env_name = name
    return env


def test_rebuild_env_stubs_only_modules_not_imported():
    stubs: list[str] = []
    env = numba_lazy_env.rebuild_env("npuemu_no_such_module_a", [1, "two"], "_ZN08NumbaEnvTestA", stubs)
    assert env.globals == {"__name__": "npuemu_no_such_module_a"} and list(env.consts) == [1, "two"]
    assert env.env_name == "_ZN08NumbaEnvTestA" and stubs == ["_ZN08NumbaEnvTestA"]
    assert environment.lookup_environment("_ZN08NumbaEnvTestA") is env and env.can_cache()
    assert numba_lazy_env.rebuild_env("npuemu_no_such_module_a", [], "_ZN08NumbaEnvTestA", stubs) is env
    imported = numba_lazy_env.rebuild_env("numpy", [3], "_ZN08NumbaEnvTestB", stubs)
    assert imported.globals is np.__dict__ and list(imported.consts) == [3] and stubs == ["_ZN08NumbaEnvTestA"]
    assert "npuemu_no_such_module_a" not in sys.modules


class _CacheFile:
    """The two private methods numba_lazy_env.load reads with, and Numba's ``load`` for the hand-off."""

    def __init__(self, folder: Path, payload) -> None:
        self.folder = folder
        (folder / "k.1.nbc").write_bytes(pickle.dumps(payload))
        self.fallbacks = 0

    def _load_index(self):
        return {"key": "k.1.nbc", "gone": "k.2.nbc"}

    def _data_path(self, name):
        return str(self.folder / name)

    def load(self, key):
        self.fallbacks += 1
        return "numba's load"


def _payload(env, objectmode=False, lifted=()):
    return ("library", "fndesc", env, "sig", objectmode, lifted, "typeann", (), (env,))


def test_load_reads_a_payload_whose_environment_module_does_not_exist(tmp_path):
    env = _env("npuemu_no_such_module_b", "_ZN08NumbaEnvTestC", consts=[7])
    cache_file = _CacheFile(tmp_path, _payload(env))
    environment.Environment._memo.pop("_ZN08NumbaEnvTestC", None)
    assert numba_lazy_env.fits(cache_file)
    payload = numba_lazy_env.load(cache_file, "key")
    loaded = payload[2]
    assert loaded is payload[8][0] and loaded.globals == {"__name__": "npuemu_no_such_module_b"}
    assert list(loaded.consts) == [7] and cache_file.fallbacks == 0
    assert numba_lazy_env.load(cache_file, "missing") is None and numba_lazy_env.load(cache_file, "gone") is None
    with pytest.raises(ModuleNotFoundError):  # (what Numba's own unpickling does with it)
        environment._rebuild_env("npuemu_no_such_module_b", [], "_ZN08NumbaEnvTestD")


@pytest.mark.parametrize("objectmode, lifted", [(True, ()), (False, ("a lifted loop",))])
def test_object_mode_payloads_go_to_numbas_load(tmp_path, objectmode, lifted):
    name = f"_ZN08NumbaEnvTestE{int(objectmode)}"
    cache_file = _CacheFile(tmp_path, _payload(_env("npuemu_no_such_module_c", name), objectmode, lifted))
    environment.Environment._memo.pop(name, None)
    assert numba_lazy_env.load(cache_file, "key") == "numba's load" and cache_file.fallbacks == 1
    assert environment.lookup_environment(name) is None  # (the stub is not left for Numba's load to find)


def test_the_entry_point_hook_is_skipped_for_npuemu_only(monkeypatch):
    from numba import njit
    from numba.core import entrypoints

    assert numba_deferred_extensions.install() and numba_deferred_extensions.install()
    calls = []
    monkeypatch.setattr(entrypoints, "init_all", lambda: calls.append(1))

    def ours(x):
        return x + 1

    def theirs(x):
        return x + 2

    ours.__module__ = "npuemu.test_probe"
    theirs.__module__ = "somebody_else"
    njit(ours)._compilation_chain_init_hook()
    assert calls == []
    njit(theirs)._compilation_chain_init_hook()
    assert calls == [1]


_CHILD = """
import hashlib, json, sys
import numpy as np
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
from numba.core import entrypoints
runtime = Runtime(ModelFile.read(sys.argv[1]))
runtime.set_input(runtime.inputs[0], np.load(sys.argv[2]))
runtime.run()
out = runtime.output(runtime.outputs[0], dequantize=False)
from numba.core.registry import CPUDispatcher
modules = [m for name, m in list(sys.modules.items()) if name.startswith("npuemu") and m is not None]
dispatchers = {id(v): v for m in modules for v in vars(m).values() if isinstance(v, CPUDispatcher)}
result = {"digest": hashlib.sha256(out.tobytes()).hexdigest(),
          "compiles": sum(len(d.stats.cache_misses) for d in dispatchers.values()),
          "arrayobj": "numba.np.arrayobj" in sys.modules, "entry_points": entrypoints._already_initialized,
          "extension_ran": "npuemu_probe_extension" in sys.modules}
from numba import njit
from npuemu.emulator.kernels import lut_folded
table = np.array([5, 5, 1, 2, 2, 2, 7], np.int8)
direct = [tuple(int(v) for v in lut_folded._run_around(table, i)) for i in range(7)]  # (loaded: stubs)
result["arrayobj_after_kernel"] = "numba.np.arrayobj" in sys.modules
# (a kernel compiled here, its cache entry missing, imports what its compile needs: not a warm load)
result["kernel_compiled"] = len(lut_folded._run_around.stats.cache_misses)

@njit
def later(table, n):
    a, b = lut_folded._run_around(table, n)
    return np.zeros(n, np.int64).sum() + n + 10 * a + b

result["later"] = [int(later(table, i)) == i + 10 * direct[i][0] + direct[i][1] for i in range(7)]
result["extension_after_compile"] = sys.modules.get("npuemu_probe_extension") is not None and \\
    sys.modules["npuemu_probe_extension"].CALLS
print("RESULT " + json.dumps(result))
"""


def _extension(folder: Path) -> None:
    """A distribution with a ``numba_extensions`` ``init`` entry point (importlib.metadata finds it on the path)."""
    info = folder / "npuemu_probe_extension-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: npuemu-probe-extension\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[numba_extensions]\ninit = npuemu_probe_extension:init\n")
    (folder / "npuemu_probe_extension.py").write_text("CALLS = 0\n\ndef init():\n    global CALLS\n    CALLS += 1\n")


def _child(folder: Path, npu: Path, x: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", str(ROOT))]))
    env.pop("NPUEMU_NUMBA_FULL_LOAD", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(npu), str(x)], capture_output=True, text=True,
                          cwd=ROOT, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def test_a_warm_first_run_imports_no_helper_module_and_defers_the_extensions(tmp_path):
    from benchmarks.fixed_cost import chain_model
    from npuemu.compiler.build import build_model
    from npuemu.emulator.runtime import Runtime
    from tests.compiler.test_build_e2e import compile_graph

    shape = (1, 16, 8, 8)
    model = build_model(compile_graph(chain_model(2, 0, input_name="x"), shape))
    npu, x_path = tmp_path / "m.npu", tmp_path / "x.npy"
    model.write(npu)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    np.save(x_path, x)
    runtime = Runtime(model)
    runtime.set_input("x", x)
    runtime.run()
    import hashlib

    expected = hashlib.sha256(runtime.output(runtime.outputs[0], dequantize=False).tobytes()).hexdigest()
    from npuemu.emulator.kernels import lut_folded

    lut_folded._run_around(np.array([5, 5, 1, 2, 2, 2, 7], np.int8), 0)  # (its cache entry, for the children)
    _extension(tmp_path)
    rows = [_child(tmp_path, npu, x_path) for _ in range(2)]  # (the first may compile: a kernel edited meanwhile)
    assert all(row["digest"] == expected and all(row["later"]) for row in rows), rows
    warm = [row for row in rows if row["compiles"] == 0 and not row["kernel_compiled"]]
    assert warm, rows
    for row in warm:
        assert not row["arrayobj"] and not row["arrayobj_after_kernel"], row
        assert not row["entry_points"] and not row["extension_ran"], row
        assert row["extension_after_compile"] == 1, row
