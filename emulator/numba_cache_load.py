"""Loading npuemu's kernels from Numba's on-disk cache without Numba's one-time ``refresh``
(issue 20: the first call in a fresh process).

Numba's ``Cache.load_overload`` calls ``target_context.refresh()`` before it reads a cached
kernel. The first refresh of a process imports and registers every typing and lowering module
Numba has (``numba.np.arrayobj``, ``linalg``, ``random``, ``typed``, ``unicode``...): 120-130 ms
of CPU on the dev machine, more than the five kernel loads of a small model's first run
together. A kernel read from the cache is finished machine code; what it needs at load time is
the symbols it links against:

- Numba's C helpers, ``_Py_NoneStruct``, ``PyExc_*`` and the C math functions: registered when
  the CPU target context is created, before any load;
- the NRT (``NRT_*``): registered by ``rtsys.initialize``, called here as refresh would;
- the string-hash secrets (``_numba_hashsecret_*``): registered by importing
  ``numba.cpython.hashing``, which refresh does. A library that names one is loaded with the
  full refresh, as is anything this module does not recognise (a payload of another shape,
  ``reload_init`` hooks, object mode or lifted loops).

So the machine code, its entry point and its environment are exactly what Numba's own load
builds; only the registries are left for the first compile, whose pipeline refreshes the
contexts itself (``CompilerBase.__init__``). Only dispatchers of npuemu's own modules take this
path; any other Numba user in the process loads as Numba does. If Numba's internals differ from
what this expects (another Numba version), nothing is installed; ``NPUEMU_NUMBA_FULL_LOAD=1``
in the environment keeps Numba's own load too (an escape hatch should a Numba release load a
kernel differently).

Two more parts of a load wait until something needs them (session 18): the kernel's linking
bitcode is parsed when a later compile links against it (emulator/numba_lazy_link.py), and the
NRT's small LLVM library, which ``rtsys.initialize`` would compile, is compiled at its first use
(emulator/numba_nrt_deferred.py); both are installed with this load and left out with it.
Session 20 added two more, installed and left out the same way: the modules that the
environments of a kernel's helpers name are not imported by the load (emulator/numba_lazy_env.py),
and npuemu's dispatchers leave Numba's extension entry points to the first compile
(emulator/numba_deferred_extensions.py).
"""

from __future__ import annotations

import os

from npuemu.emulator import numba_deferred_extensions, numba_lazy_env, numba_lazy_link, numba_nrt_deferred

#: symbols that only a refresh-time import registers (numba/cpython/hashing.py ``inject``)
REFRESH_ONLY_SYMBOLS = (b"_numba_hashsecret_",)

_installed = False


def install() -> bool:
    """Install the npuemu-only cache load (idempotent); False if this Numba is not the expected shape."""
    global _installed
    if _installed:
        return True
    if os.environ.get("NPUEMU_NUMBA_FULL_LOAD") == "1":
        return False
    try:
        from numba.core import caching
        from numba.core.runtime import rtsys
    except ImportError:  # pragma: no cover - numba is a hard dependency
        return False
    cache = caching.Cache
    needed = ("load_overload", "_load_overload", "_guard_against_spurious_io_errors", "_index_key")
    if not all(hasattr(cache, name) for name in needed):
        return False
    original = cache.load_overload

    def load_overload(self, sig, target_context):
        parts = [getattr(self, name, None) for name in ("_py_func", "_cache_file", "_impl", "_enabled")]
        if not _is_npuemu(parts[0]) or None in parts[1:]:  # (another user's function, or other internals)
            numba_nrt_deferred.ensure()  # (its code may name the NRT library's symbols)
            return original(self, sig, target_context)
        _, cache_file, impl, enabled = parts
        rtsys.initialize(target_context)  # (refresh's first step; idempotent)
        with self._guard_against_spurious_io_errors():
            if not enabled:
                return None
            key = self._index_key(sig, target_context.codegen())
            data = numba_lazy_env.load(cache_file, key) if numba_lazy_env.fits(cache_file) else cache_file.load(key)
            if data is None:
                return None
            if not _links_without_registries(data):
                target_context.refresh()
            return numba_lazy_link.rebuild(impl, target_context, data)

    load_overload.npuemu_original = original
    cache.load_overload = load_overload
    numba_nrt_deferred.install()
    numba_deferred_extensions.install()
    _installed = True
    return True


def _is_npuemu(py_func) -> bool:
    return py_func is not None and str(getattr(py_func, "__module__", "")).startswith("npuemu.")


def _links_without_registries(data) -> bool:
    """Whether a cached CompileResult payload (numba CompileResult._reduce: library data, fndesc,
    environment, signature, objectmode, lifted, type annotation, reload_init, referenced envs)
    loads with the symbols registered before any refresh (module docstring)."""
    if not isinstance(data, tuple) or len(data) != 9:
        return False
    library, _, _, _, objectmode, lifted, _, reload_init, _ = data
    if objectmode or lifted or reload_init:
        return False
    if not (isinstance(library, tuple) and len(library) == 3):
        return False
    _, kind, payload = library
    if kind == "object" and isinstance(payload, tuple):
        blobs = payload
    elif kind == "bitcode":
        blobs = (payload,)
    else:
        return False
    if not all(isinstance(blob, (bytes, bytearray)) for blob in blobs):
        return False
    return not any(symbol in blob for blob in blobs for symbol in REFRESH_ONLY_SYMBOLS)
