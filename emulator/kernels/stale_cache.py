"""Drop the kernels' Numba disk caches when ``numerics.py`` changes.

The kernels inline the functions of ``npuemu.emulator.numerics``, but Numba invalidates a
cached kernel only when the kernel's own file changes, so after an edit to numerics.py the
cached kernels would silently keep the old arithmetic. This module keeps a digest of
numerics.py next to each cache directory and empties the cache indexes of the given kernel
modules when the digest differs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType

from numba.core.registry import CPUDispatcher

from npuemu.emulator import numerics

_STAMP = "npuemu-numerics.sha256"


def drop_caches_built_on_old_numerics(modules: list[ModuleType]) -> None:
    digest = hashlib.sha256(Path(numerics.__file__).read_bytes()).hexdigest()
    by_directory: dict[Path, list[CPUDispatcher]] = {}
    for module in modules:
        for value in vars(module).values():
            cache = getattr(value, "_cache", None) if isinstance(value, CPUDispatcher) else None
            if cache is not None and hasattr(cache, "_cache_path"):
                by_directory.setdefault(Path(cache._cache_path), []).append(value)
    for directory, dispatchers in by_directory.items():
        stamp = directory / _STAMP
        try:
            if stamp.exists() and stamp.read_text() == digest:
                continue
            for dispatcher in dispatchers:
                dispatcher._cache.flush()
            directory.mkdir(parents=True, exist_ok=True)
            stamp.write_text(digest)
        except OSError:
            continue  # a read-only cache directory: Numba does not write there either
