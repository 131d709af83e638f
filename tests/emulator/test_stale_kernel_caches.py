"""Numba drops a cached kernel only when the kernel's own file changes; kernels that inline
another module's functions (numerics.py, or one kernel module calling another's) keep the old
arithmetic otherwise. ``kernels/stale_cache.py`` keeps a digest of numerics.py and every kernel
module beside each cache directory and empties the caches when it changes."""

from __future__ import annotations

import importlib
import os
import sys

from npuemu.emulator.kernels import stale_cache


def _cached_module(tmp_path, name: str):
    (tmp_path / f"{name}.py").write_text(
        "from numba import njit\n\n@njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
    assert module.twice(3) == 6  # compiled and written to the cache
    return module


def test_unchanged_sources_are_not_read_and_a_touched_one_is(tmp_path, monkeypatch):
    """The digest is worked out only when the sources' stat differs from the one recorded with it;
    a file touched but not changed keeps the caches and records the new stat."""
    module = _cached_module(tmp_path, "npuemu_stale_cache_stat_probe")
    directory = next(tmp_path.rglob("*.nbi")).parent
    digests = []
    monkeypatch.setattr(stale_cache, "_sources_digest", lambda: digests.append(1) or "digest-1")
    monkeypatch.setattr(stale_cache, "_sources_state", lambda: "state-1")
    stale_cache.drop_caches_built_on_old_sources([module])
    assert digests == [1] and (directory / stale_cache._STAT_STAMP).read_text() == "state-1\ndigest-1"
    assert module.twice(5) == 10
    index = sorted(directory.glob("*.nbi"))
    stale_cache.drop_caches_built_on_old_sources([module])
    assert digests == [1] and sorted(directory.glob("*.nbi")) == index  # (not hashed again, kept)
    monkeypatch.setattr(stale_cache, "_sources_state", lambda: "state-touched")
    stale_cache.drop_caches_built_on_old_sources([module])
    assert digests == [1, 1] and sorted(directory.glob("*.nbi")) == index
    assert (directory / stale_cache._STAT_STAMP).read_text() == "state-touched\ndigest-1"
    (directory / stale_cache._STAMP).write_text("digest-0")  # (a stamp not the one the stat was recorded with)
    stale_cache.drop_caches_built_on_old_sources([module])
    assert digests == [1, 1, 1] and not list(directory.glob("*.nbi"))


def test_the_state_follows_size_and_modification_time(tmp_path, monkeypatch):
    (tmp_path / "dpu.py").write_text("# dpu\n")
    monkeypatch.setattr(stale_cache, "__file__", str(tmp_path / "stale_cache.py"))
    first = stale_cache._sources_state()
    assert stale_cache._sources_state() == first
    os.utime(tmp_path / "dpu.py", ns=(1, 10**18))
    touched = stale_cache._sources_state()
    (tmp_path / "dpu.py").write_text("# dpu, longer\n")
    os.utime(tmp_path / "dpu.py", ns=(1, 10**18))
    assert len({first, touched, stale_cache._sources_state()}) == 3


def test_a_changed_source_empties_the_cache_and_stamps_it(tmp_path, monkeypatch):
    module = _cached_module(tmp_path, "npuemu_stale_cache_probe")
    directory = next(tmp_path.rglob("*.nbi")).parent
    (directory / "other_module.f-1.py311.nbi").write_bytes(b"index of a module not imported")
    monkeypatch.setattr(stale_cache, "_sources_digest", lambda: "digest-1")
    monkeypatch.setattr(stale_cache, "_sources_state", lambda: "state-1")
    stale_cache.drop_caches_built_on_old_sources([module])
    assert not list(directory.glob("*.nbi"))
    assert (directory / stale_cache._STAMP).read_text() == "digest-1"
    assert module.twice(4) == 8
    index = list(directory.glob("*.nbi"))
    stale_cache.drop_caches_built_on_old_sources([module])  # same digest: kept
    assert list(directory.glob("*.nbi")) == index
    monkeypatch.setattr(stale_cache, "_sources_digest", lambda: "digest-2")
    monkeypatch.setattr(stale_cache, "_sources_state", lambda: "state-2")
    stale_cache.drop_caches_built_on_old_sources([module])
    assert not list(directory.glob("*.nbi"))


def test_the_digest_covers_every_kernel_module(tmp_path, monkeypatch):
    for name in ("lut.py", "dpu.py"):
        (tmp_path / name).write_text(f"# {name}\n")
    monkeypatch.setattr(stale_cache, "__file__", str(tmp_path / "stale_cache.py"))
    first = stale_cache._sources_digest()
    (tmp_path / "dpu.py").write_text("# dpu.py, its stage functions changed\n")
    second = stale_cache._sources_digest()
    (tmp_path / "new_kernel.py").write_text("")
    assert len({first, second, stale_cache._sources_digest()}) == 3
