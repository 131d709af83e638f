"""emulator/kernels/scipy_blas.py: SciPy's cython_blas is registered alone just before Numba's NumPy
support imports (not at the emulator's import: a cached first call never imports it), so
Numba's first compile does not import scipy.linalg (issue 20: first call), and BLAS from
Numba and a later ``import scipy.linalg`` still work; without SciPy (CI installs only the required
packages) the preload does nothing and Numba works as before. Fresh interpreters: the state is per
process. The two SciPy cases are collected only where SciPy is installed; the no-SciPy case runs
everywhere (with SciPy hidden from the import system where it is installed)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

HAS_SCIPY = importlib.util.find_spec("scipy") is not None

FIRST_CALL = """
import sys
import numpy as np
import npuemu.emulator.kernels
from numba import njit

@njit
def dot(a):
    return np.dot(a, a)

assert dot(np.arange(4.0)) == 14.0  # Numba's BLAS through the preloaded table
assert "scipy.linalg" not in sys.modules, "Numba imported scipy.linalg"
import scipy.linalg
from scipy.linalg import cython_blas
assert cython_blas is sys.modules["scipy.linalg.cython_blas"]
assert np.allclose(scipy.linalg.solve(np.eye(2) * 2, np.ones(2)), 0.5)
print("ok")
"""

DEFERRED = """
import sys
import numpy as np
import npuemu.emulator.kernels
from npuemu.emulator.kernels import scipy_blas
assert "numba.np.arraymath" not in sys.modules  # (the runtime's import leaves Numba's NumPy support out)
assert "scipy.linalg.cython_blas" not in sys.modules, "preloaded before Numba's check needs it"
hooks = [f for f in sys.meta_path if isinstance(f, scipy_blas._PreloadHook)]
assert len(hooks) == 1 and hooks[0].armed
scipy_blas.preload_before_numpy_support()  # (once per process)
assert sum(isinstance(f, scipy_blas._PreloadHook) for f in sys.meta_path) == 1
import numba.np.arraymath  # Numba's BLAS check runs here
assert "scipy.linalg.cython_blas" in sys.modules and "scipy.linalg" not in sys.modules
assert numba.np.arraymath._HAVE_BLAS and not hooks[0].armed
import json  # (later imports pass the idle hook)
print("ok")
"""

ALREADY_IMPORTED = """
import sys
import scipy.linalg
from npuemu.emulator.kernels.scipy_blas import preload_cython_blas
assert not preload_cython_blas()  # scipy.linalg is there: nothing to do
print("ok")
"""


HIDE_SCIPY = """
import importlib.abc
import sys

class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "scipy" or name.startswith("scipy."):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, _Hide())
"""

NO_SCIPY = """
import sys
from npuemu.emulator.kernels.scipy_blas import preload_cython_blas
assert not preload_cython_blas()  # nothing to load: things are left as they are
assert not any(name == "scipy" or name.startswith("scipy.") for name in sys.modules)
from numba import njit

@njit
def twice(a):
    return a * 2

assert twice(3) == 6  # Numba's first compiled call works without SciPy
print("ok")
"""

SCRIPTS = {"no-scipy": (HIDE_SCIPY if HAS_SCIPY else "") + NO_SCIPY}
if HAS_SCIPY:
    SCRIPTS |= {"fresh": FIRST_CALL, "scipy-linalg-first": ALREADY_IMPORTED, "deferred": DEFERRED}


@pytest.mark.parametrize("script", list(SCRIPTS.values()), ids=list(SCRIPTS))
def test_preload(script):
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
