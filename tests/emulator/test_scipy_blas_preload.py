"""emulator/kernels/scipy_blas.py: importing the emulator registers SciPy's cython_blas alone, so
Numba's first compiled call does not import scipy.linalg (issue 20: first call), and BLAS from
Numba and a later ``import scipy.linalg`` still work. Fresh interpreters: the state is per process."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("scipy")

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

ALREADY_IMPORTED = """
import sys
import scipy.linalg
from npuemu.emulator.kernels.scipy_blas import preload_cython_blas
assert not preload_cython_blas()  # scipy.linalg is there: nothing to do
print("ok")
"""


@pytest.mark.parametrize("script", [FIRST_CALL, ALREADY_IMPORTED], ids=["fresh", "scipy-linalg-first"])
def test_preload(script):
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
