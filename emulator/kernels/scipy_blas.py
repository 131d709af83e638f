"""SciPy's BLAS table for Numba without importing ``scipy.linalg`` (issue 20: first call).

At the first compiled call of a process (a cache load included), Numba imports its NumPy
support, which checks for BLAS with ``import scipy.linalg.cython_blas``. That imports the
``scipy.linalg`` package first: measured ~0.15 s of CPU time (~20% of a fresh process's first
inference), although the kernels never call BLAS and ``cython_blas`` alone loads in ~15 ms.

:func:`preload_cython_blas` loads the ``cython_blas`` extension by itself and registers it under
its name, so Numba's check (and its BLAS calls, should a kernel make one) find it. A later
``import scipy.linalg`` still runs the package as usual; only ``scipy.linalg.cython_blas`` as an
attribute of the package is then missing (``from scipy.linalg import cython_blas`` still works).
Anything unexpected (no SciPy, another layout, SciPy's linalg already imported) leaves things
as they are: the cost is then only Numba's usual one.

The check runs when ``numba.np.arraymath`` imports (its ``_check_blas``; ``numba.np.linalg``'s
functions call it too). A process whose kernels all load from the cache never imports either
(emulator/numba_lazy_env.py), so :func:`preload_before_numpy_support` loads the extension (6 ms
of CPU, more wall time: it maps SciPy's OpenBLAS) only when one of them is about to import: an
import hook at the front of ``sys.meta_path`` that preloads and finds nothing itself (the
import goes on as usual), idle afterwards; right away if either is imported already.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

NAME = "scipy.linalg.cython_blas"
#: Numba's modules whose import (or whose functions) run its BLAS check
NUMPY_SUPPORT = ("numba.np.arraymath", "numba.np.linalg")


class _PreloadHook:
    """A ``sys.meta_path`` entry: the preload before the first of ``NUMPY_SUPPORT`` imports. It
    stays in the list, idle (taking an entry out while the import system walks it would skip
    the next finder)."""

    armed = True

    def find_spec(self, name, path=None, target=None):
        if self.armed and name in NUMPY_SUPPORT:
            self.armed = False
            preload_cython_blas()
        return None


def preload_before_numpy_support() -> None:
    """:func:`preload_cython_blas` now if Numba's NumPy support is imported, else just before it
    imports (module docstring); once per process."""
    if any(isinstance(finder, _PreloadHook) for finder in sys.meta_path):
        return
    if any(name in sys.modules for name in NUMPY_SUPPORT):
        preload_cython_blas()
        return
    sys.meta_path.insert(0, _PreloadHook())


def preload_cython_blas() -> bool:
    """Register SciPy's ``cython_blas`` alone; whether it was loaded here."""
    if NAME in sys.modules or "scipy.linalg" in sys.modules:
        return False
    try:
        scipy = importlib.util.find_spec("scipy")
        if scipy is None or not scipy.submodule_search_locations:
            return False
        folder = os.path.join(next(iter(scipy.submodule_search_locations)), "linalg")
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "cython_blas" + suffix)
            if os.path.exists(path):
                spec = importlib.util.spec_from_file_location(NAME, path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules[NAME] = module
                return True
    except Exception:  # noqa: BLE001 - best effort: Numba then imports scipy.linalg itself
        sys.modules.pop(NAME, None)
    return False
