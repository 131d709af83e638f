"""npuemu's dispatchers make their Numba cache at first use (issue 20, first call;
emulator/numba_deferred_cache.py): after the runtime's import most kernels hold a deferred
cache that made nothing yet; the cache it makes is Numba's own for that function (same
directory, index and source stamp); a source file changed after the import gives a disabled
cache (the code in memory compiles, nothing mismatched loads or is saved); other packages'
functions keep Numba's eager cache."""

from __future__ import annotations

import os
import sys
import textwrap

from numba import njit
from numba.core.caching import FunctionCache
from numba.core.registry import CPUDispatcher

from npuemu.emulator import numba_deferred_cache
from npuemu.emulator.numba_deferred_cache import DeferredCache


def _dispatchers() -> list[CPUDispatcher]:
    from npuemu.emulator import runtime  # noqa: F401  (every kernel module the runtime imports)

    modules = [m for name, m in list(sys.modules.items()) if name.startswith("npuemu.") and m is not None]
    return list({id(v): v for m in modules for v in vars(m).values() if isinstance(v, CPUDispatcher)}.values())


def test_npuemu_kernels_hold_deferred_caches_that_make_numbas_own():
    deferred = [d for d in _dispatchers() if isinstance(d._cache, DeferredCache)]
    assert len(deferred) > 100
    for dispatcher in deferred[:40]:
        made = dispatcher._cache.materialize()
        assert made is dispatcher._cache.materialize()  # (made once)
        reference = FunctionCache(dispatcher.py_func)
        assert made._cache_path == reference._cache_path and made._enabled
        assert made._cache_file._index_path == reference._cache_file._index_path
        assert made._cache_file._source_stamp == reference._cache_file._source_stamp


def _module_in(folder, name: str):
    source = folder / f"{name}.py"
    source.write_text(textwrap.dedent("""
        def plus_one(x):
            return x + 1
    """))
    sys.path.insert(0, str(folder))
    try:
        module = __import__(name)
    finally:
        sys.path.remove(str(folder))
    return module, source


def test_a_source_changed_after_decoration_gives_a_disabled_cache(tmp_path):
    assert numba_deferred_cache.install()
    module, source = _module_in(tmp_path, "npuemu_deferred_probe")
    module.plus_one.__module__ = "npuemu.test_probe"  # (an npuemu function for the installed rule)
    dispatcher = njit(cache=True)(module.plus_one)
    assert isinstance(dispatcher._cache, DeferredCache) and dispatcher._cache._npuemu_cache is None
    stat = source.stat()
    source.write_text(source.read_text() + "\n# edited\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert dispatcher(1) == 2  # compiled from the code in memory
    assert not dispatcher._cache.materialize()._enabled
    assert not list((tmp_path / "__pycache__").glob("*plus_one*.nbi"))  # nothing saved for it


def test_an_unchanged_source_caches_as_numba_does(tmp_path):
    assert numba_deferred_cache.install()
    module, _ = _module_in(tmp_path, "npuemu_deferred_probe_same")
    module.plus_one.__module__ = "npuemu.test_probe"
    dispatcher = njit(cache=True)(module.plus_one)
    assert dispatcher(1) == 2
    assert dispatcher._cache.materialize()._enabled
    assert list((tmp_path / "__pycache__").glob("*plus_one*.nbi"))  # saved


def test_other_packages_functions_keep_numbas_eager_cache(tmp_path):
    assert numba_deferred_cache.install()
    module, _ = _module_in(tmp_path, "somebody_elses_module")
    dispatcher = njit(cache=True)(module.plus_one)
    assert isinstance(dispatcher._cache, FunctionCache)


_IMPORT_CHILD = """
import json
from numba.core import caching
made = []
real_init = caching.FunctionCache.__init__
def counting_init(self, py_func):
    made.append(py_func.__module__ + "." + py_func.__name__)
    real_init(self, py_func)
caching.FunctionCache.__init__ = counting_init
import npuemu.emulator.runtime
from npuemu.emulator import memory
from npuemu.emulator.numba_deferred_cache import DeferredCache
print("RESULT " + json.dumps({"made": made, "memory_deferred": isinstance(memory._gather_rows._cache, DeferredCache)}))
"""


def test_the_runtimes_import_makes_one_numba_cache():
    """memory.py's kernels (imported before the kernels package) get deferred caches too, and the
    stale-cache check asks one kernel's cache for the kernels' directory: the import makes one."""
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_CHILD], capture_output=True, text=True, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result["memory_deferred"] and len(result["made"]) == 1, result
    assert result["made"][0].startswith("npuemu.emulator.kernels."), result
