"""BLAS threads while calibration evaluates the float graph (issue 20).

The float evaluator's convolutions are many small float64 matrix products (einsum). Measured on
the shared 2-core development machine: MobileNetV2 with 20 calibration samples compiled in 48 s
with OpenBLAS's default two threads and 7.3 s with one (spinning BLAS threads fighting other
processes for the cores), with byte-identical model files: OpenBLAS splits a product's output
among threads, never its sums, so the values do not depend on the count.

:func:`single_threaded_blas` sets numpy's OpenBLAS to one thread for the duration of a ``with``
block and restores the previous count after it, unless the user chose a count in the
environment (``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS``), which is then left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

#: (setter, getter) symbol pairs of the OpenBLAS builds numpy ships or links against
_SYMBOLS = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
            ("scipy_openblas_set_num_threads_64_", "scipy_openblas_get_num_threads_64_"),
            ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
            ("openblas_set_num_threads", "openblas_get_num_threads"))
_ENVIRONMENT = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def _openblas() -> tuple | None:
    """(set, get) of the OpenBLAS loaded in this process, or None (none loaded, or no symbols)."""
    import numpy  # noqa: F401  - loads the BLAS numpy uses

    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    except OSError:  # not Linux: leave the BLAS as it is
        return None
    for path in paths:
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for setter, getter in _SYMBOLS:
            if hasattr(library, setter) and hasattr(library, getter):
                return getattr(library, setter), getattr(library, getter)
    return None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[bool]:
    """One OpenBLAS thread inside the block; yields whether the count was changed."""
    functions = None if any(key in os.environ for key in _ENVIRONMENT) else _openblas()
    if functions is None:
        yield False
        return
    setter, getter = functions
    before = int(getter())
    setter(ctypes.c_int(1))
    try:
        yield True
    finally:
        setter(ctypes.c_int(before))
