"""Numba's type of a NumPy array without importing ``numpy.ma`` (issue 20: first call in a
fresh process).

The first time a Numba dispatcher sees an array of a new type it asks ``typeof``, whose array
rule starts with ``isinstance(value, np.ma.MaskedArray)`` (masked arrays are refused). NumPy 2
imports ``numpy.ma`` lazily, at that first attribute access: 13-25 ms of CPU, a tenth of a small
model's first inference, for a check no array can pass while ``numpy.ma`` was never imported
(a masked array's class lives there). :func:`install` registers an array rule that answers the
same: while ``numpy.ma`` is not in ``sys.modules`` it builds the type from the dtype, the
number of dimensions, the layout and the writeable flag as Numba's rule does; otherwise, and
whenever that raises (an unsupported dtype: Numba's rule turns it into its own error), it calls
Numba's rule. Only the import is saved; every answer and error is Numba's. If Numba's module is
not the expected shape, nothing is installed.
"""

from __future__ import annotations

import sys

import numpy as np

_installed = False


def install() -> bool:
    """Register the array rule (idempotent); False if Numba's ``typeof`` is not the expected shape."""
    global _installed
    if _installed:
        return True
    try:
        from numba.core import types
        from numba.core.typing import typeof as numba_typeof
        from numba.np import numpy_support
    except ImportError:  # pragma: no cover - numba is a hard dependency
        return False
    registry = getattr(numba_typeof, "typeof_impl", None)
    if registry is None or not hasattr(registry, "registry") or not all(
            hasattr(numpy_support, name) for name in ("from_dtype", "map_layout")):
        return False
    numba_rule = registry.registry.get(np.ndarray)
    if numba_rule is None:
        return False

    def typeof_array(value, context):
        if "numpy.ma" in sys.modules:  # (a masked array may exist: Numba's rule checks)
            return numba_rule(value, context)
        try:
            dtype = numpy_support.from_dtype(value.dtype)
        except Exception:  # noqa: BLE001 - Numba's rule raises its own error for it
            return numba_rule(value, context)
        return types.Array(dtype, value.ndim, numpy_support.map_layout(value), readonly=not value.flags.writeable)

    typeof_array.numba_rule = numba_rule
    registry.register(np.ndarray)(typeof_array)
    _installed = True
    return True
