"""Drop the kernels' Numba disk caches when ``numerics.py`` or any kernel module changes.

The kernels inline the functions of ``npuemu.emulator.numerics`` and of each other (the fused
LUT kernels of ``lut.py`` call ``dpu.py``'s stages, ``dpu_fp_chain.py`` ``numerics``'), but Numba
invalidates a cached kernel only when the kernel's own file changes, so after an edit to one of
those files the cached kernels of the others would silently keep the old arithmetic. This module
keeps a digest of numerics.py and every module of this package next to each cache directory and,
when the digest differs, removes every cache index in the given kernel modules' cache
directories (theirs and those of kernel modules imported later, e.g. ``dpu_pixel``).

A first call in a fresh process pays little for the check (issue 20): the cache directory is
asked of one dispatcher per source directory (each dispatcher's Numba cache is made at its first
use, emulator/numba_deferred_cache.py; all of a directory's kernels share its cache directory),
and the sources are read and hashed only when their sizes and modification times (the stamp
Numba itself keeps for a kernel's own file) differ from those recorded beside the digest.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path
from types import ModuleType

from numba.core.registry import CPUDispatcher

from npuemu.emulator import numerics

_STAMP = "npuemu-numerics.sha256"
#: the sources' (name, size, modification time) when the digest in _STAMP was last worked out
_STAT_STAMP = "npuemu-numerics.stat"


def drop_caches_built_on_old_sources(modules: list[ModuleType]) -> None:
    directories = _cache_directories(modules)
    if not directories:
        return
    try:
        state = _sources_state()
    except OSError:  # (a source gone while listed: the digest decides)
        state = None
    digest = None
    for directory in directories:
        stamp = directory / _STAMP
        try:
            recorded = stamp.read_text() if stamp.exists() else None
            if state and recorded is not None and _read(directory / _STAT_STAMP) == f"{state}\n{recorded}":
                continue  # (the sources' stat as at the last digest: the digest is unchanged)
            digest = digest or _sources_digest()
            if recorded != digest:
                for index in directory.glob("*.nbi"):  # (every kernel module's index, imported or not)
                    index.unlink(missing_ok=True)
                directory.mkdir(parents=True, exist_ok=True)
                stamp.write_text(digest)
            if state:
                (directory / _STAT_STAMP).write_text(f"{state}\n{digest}")
        except OSError:
            continue  # a read-only cache directory: Numba does not write there either


def _cache_directories(modules: list[ModuleType]) -> list[Path]:
    """The Numba cache directories of the modules' dispatchers: one dispatcher's cache asked per
    source directory (the cache locators place a file's caches by its directory)."""
    by_source: dict[str, Path | None] = {}
    for module in modules:
        for value in vars(module).values():
            if not isinstance(value, CPUDispatcher) or getattr(value, "_cache", None) is None:
                continue
            try:
                source = os.path.dirname(inspect.getfile(value.py_func))
            except TypeError:
                continue
            if by_source.get(source) is None:
                by_source[source] = Path(value._cache._cache_path) if hasattr(value._cache, "_cache_path") else None
    return list(dict.fromkeys(path for path in by_source.values() if path is not None))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _sources() -> list[Path]:
    return [Path(numerics.__file__), *sorted(Path(__file__).parent.glob("*.py"))]


def _sources_state() -> str:
    """Names, sizes and modification times of the digest's sources (one line)."""
    parts = []
    for source in _sources():
        stat = source.stat()
        parts.append(f"{source.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256(" ".join(parts).encode()).hexdigest()


def _sources_digest() -> str:
    numerics_source, *kernel_sources = _sources()
    digest = hashlib.sha256(numerics_source.read_bytes())
    for source in kernel_sources:
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()
