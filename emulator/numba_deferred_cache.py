"""npuemu's Numba dispatchers find their on-disk cache at their first compile or cache load, not
when the module defining them imports (issue 20: first call in a fresh process).

``@njit(cache=True)`` makes a ``FunctionCache`` per function as it decorates: the cache locator
creates the cache directory if needed and proves it writable by creating a temporary file in
it, then stats and hashes the source file. For the runtime's ~190 kernels that is ~190 file
creations, ~6 ms of CPU (more wall time on a busy disk), while a small model's first run uses 6
of them. :func:`install` makes ``Dispatcher.enable_caching`` give npuemu's functions a
:class:`DeferredCache` instead, which makes the same ``FunctionCache`` at the first use of any
of its attributes (a compile or cache load, ``stats``, ``stale_cache``'s look at the
directory) and hands everything to it.

The one thing that could differ is the source stamp (a hash of the source file) that Numba
takes when it makes the cache: a file edited between the import and the first call would stamp
the old code in memory with the new file's hash. So the deferred cache keeps the file's size
and modification time at decoration; if they changed by the first use, the cache it makes is
disabled (the kernel compiles from the code in memory and is not saved: never a mismatched
load). A function Numba cannot cache at all (no cache locator for its file) raises Numba's error at
that first use instead of at decoration; one whose file was there at decoration and is gone by the
first use gets no cache (Numba's, made at decoration, would still run it). Other packages'
functions, and any Numba whose dispatcher is not the expected shape, keep Numba's own behaviour.
"""

from __future__ import annotations

import inspect
import os

_installed = False


class DeferredCache:
    """Stands for a dispatcher's ``FunctionCache`` until it is first needed (module docstring)."""

    __slots__ = ("_npuemu_py_func", "_npuemu_file_state", "_npuemu_cache")

    def __init__(self, py_func) -> None:
        self._npuemu_py_func = py_func
        self._npuemu_file_state = _file_state(py_func)
        self._npuemu_cache = None

    def materialize(self):
        if self._npuemu_cache is None:
            from numba.core.caching import FunctionCache, NullCache

            state = _file_state(self._npuemu_py_func)
            if state is None and self._npuemu_file_state is not None:
                # (the source is gone since the import, e.g. the package replaced under a running process:
                # FunctionCache would raise for want of a locator; Numba's, made at the import, runs the code)
                self._npuemu_cache = NullCache()
                return self._npuemu_cache
            cache = FunctionCache(self._npuemu_py_func)
            if self._npuemu_file_state is None or state != self._npuemu_file_state:
                cache.disable()  # (the source changed since the import: its stamp would not match the code)
            self._npuemu_cache = cache
        return self._npuemu_cache

    def __getattr__(self, name):
        if name.startswith("_npuemu_"):  # (an unset slot, e.g. in copy's or pickle's bare instance: no recursion)
            raise AttributeError(name)
        return getattr(self.materialize(), name)


def _file_state(py_func) -> tuple | None:
    try:
        state = os.stat(inspect.getfile(py_func))
    except (OSError, TypeError):
        return None
    return state.st_mtime_ns, state.st_size


def install() -> bool:
    """Defer npuemu's function caches (idempotent); False if Numba is not the expected shape."""
    global _installed
    if _installed:
        return True
    try:
        from numba.core import caching, dispatcher
    except ImportError:  # pragma: no cover - numba is a hard dependency
        return False
    cls = dispatcher.Dispatcher
    if not hasattr(cls, "enable_caching") or not hasattr(caching, "FunctionCache") \
            or not all(hasattr(caching.FunctionCache, name) for name in ("disable", "load_overload")):
        return False
    original = cls.enable_caching

    def enable_caching(self):
        py_func = getattr(self, "py_func", None)
        if not str(getattr(py_func, "__module__", "")).startswith("npuemu."):
            return original(self)
        self._cache = DeferredCache(py_func)

    enable_caching.npuemu_original = original
    cls.enable_caching = enable_caching
    _installed = True
    return True
