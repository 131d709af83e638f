"""A cached kernel read without importing the modules its helpers' environments name (issue 20:
first call in a fresh process).

A cached kernel's payload holds the Numba ``Environment`` of every function compiled into its
library, its own and those of the helpers it inlines (array constructors of ``numba.np.arrayobj``,
sorting of ``numba.np.arraymath``...). Each is pickled as (module name, constants, name), and
Numba's unpickling (``numba.core.environment._rebuild_env``) imports the module to hand its
``__dict__`` to the environment as its globals: ``numba.np.arrayobj`` (with ``numba.cpython.unicode``
and ``charseq``) costs 12-17 ms of CPU on the dev machine, ``numba.np.arraymath`` with linalg more.

An environment's globals are read by object-mode code only (``PyLowering``: a global name
looked up at run time); nopython code reads its constants (``env.consts``, unpickled as before),
and Python reads the globals' ``__name__`` (``can_cache``, pickling). A payload that
numba_cache_load takes (no object mode, no lifted loops or ``with objmode`` blocks: every function of
the library is nopython code) therefore runs the same with an environment whose globals hold
only ``__name__``, which :func:`load` gives every environment whose module is not imported yet;
one whose module is imported gets the module's ``__dict__`` as Numba does, and an environment
already known (by name) is reused as Numba does. A payload with object-mode or lifted code
that got such a stub is read again by Numba's own load (the stubs dropped first). Reading
follows ``IndexDataCacheFile.load``: the index (``_load_index``: version, source stamp), then the
data file named for the key.
"""

from __future__ import annotations

import functools
import io
import pickle
import sys

_REBUILD_ENV = ("numba.core.environment", "_rebuild_env")


def fits(cache_file) -> bool:
    """Whether a cache file has the private methods :func:`load` reads with."""
    return all(callable(getattr(cache_file, name, None)) for name in ("_load_index", "_data_path"))


def load(cache_file, key):
    """``cache_file.load(key)`` with :func:`rebuild_env` for the environments (module docstring)."""
    name = cache_file._load_index().get(key)
    if name is None:
        return None
    try:
        with open(cache_file._data_path(name), "rb") as f:
            data = f.read()
    except OSError:  # (removed while the index still names it: Numba's load returns None too)
        return None
    unpickler = _Unpickler(io.BytesIO(data))
    payload = unpickler.load()
    if unpickler.stubs and not _nopython(payload):  # (object-mode code may read the globals: Numba's load)
        from numba.core import environment

        for env_name in unpickler.stubs:
            environment.Environment._memo.pop(env_name, None)
        return cache_file.load(key)
    return payload


def _nopython(payload) -> bool:
    """A CompileResult payload (numba CompileResult._reduce) without object mode or lifted code."""
    return isinstance(payload, tuple) and len(payload) == 9 and not payload[4] and not payload[5]


class _Unpickler(pickle.Unpickler):
    def __init__(self, file) -> None:
        super().__init__(file)
        self.stubs: list[str] = []  # environments given a stub for globals by this load

    def find_class(self, module, name):
        if (module, name) == _REBUILD_ENV:
            return functools.partial(rebuild_env, stubs=self.stubs)
        return super().find_class(module, name)


def rebuild_env(modname, consts, env_name, stubs: list | None = None):
    """Numba's ``_rebuild_env`` without importing ``modname`` (module docstring); the names of
    environments made with a stub for globals are appended to ``stubs``."""
    from numba.core import environment

    if environment.lookup_environment(env_name) is not None or modname is None or modname in sys.modules:
        return environment._rebuild_env(modname, consts, env_name)
    env = environment.Environment({"__name__": modname})
    env.consts[:] = consts
    env.env_name = env_name
    environment.Environment._memo[env_name] = env
    if stubs is not None:
        stubs.append(env_name)
    return env
