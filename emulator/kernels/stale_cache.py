"""Drop the kernels' Numba disk caches when ``numerics.py`` or any kernel module changes.

The kernels inline the functions of ``npuemu.emulator.numerics`` and of each other (the fused
LUT kernels of ``lut.py`` call ``dpu.py``'s stages, ``dpu_fp_chain.py`` ``numerics``'), but Numba
invalidates a cached kernel only when the kernel's own file changes, so after an edit to one of
those files the cached kernels of the others would silently keep the old arithmetic. This module
keeps a digest of numerics.py and every module of this package next to each cache directory and,
when the digest differs, empties the cache indexes of the given kernel modules and removes every
other cache index in their directories (kernel modules imported later, e.g. ``dpu_pixel``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType

from numba.core.registry import CPUDispatcher

from npuemu.emulator import numerics

_STAMP = "npuemu-numerics.sha256"


def drop_caches_built_on_old_sources(modules: list[ModuleType]) -> None:
    digest = _sources_digest()
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
            for index in directory.glob("*.nbi"):  # (kernels of modules not imported yet)
                index.unlink(missing_ok=True)
            directory.mkdir(parents=True, exist_ok=True)
            stamp.write_text(digest)
        except OSError:
            continue  # a read-only cache directory: Numba does not write there either


def _sources_digest() -> str:
    digest = hashlib.sha256(Path(numerics.__file__).read_bytes())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()
