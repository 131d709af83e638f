"""resolve_name answers a canonical platform name without reading every shipped file for the
alias table (issue 20: a fresh process's Runtime()); aliases still go through the table, which
still rejects an alias that repeats another platform's name."""

from __future__ import annotations

import pytest

from npuemu.platforms import loader
from npuemu.isa.errors import ConfigError


@pytest.fixture
def fresh_tables():
    caches = (loader._name_table, loader._canonical_names, loader._shipped_data)
    for cached in caches:
        cached.cache_clear()
    yield
    for cached in caches:  # (the tests' patched tables are not kept)
        cached.cache_clear()


def test_a_canonical_name_reads_no_platform_file(fresh_tables, monkeypatch):
    read = []
    original = loader._shipped_data.__wrapped__
    monkeypatch.setattr(loader, "_shipped_data", lambda name: read.append(name) or original(name))
    assert loader.resolve_name(" RK3588 ") == "rk3588"
    assert read == []
    alias = next(iter(loader.aliases()))  # (the table reads every file)
    assert loader.resolve_name(alias) == loader.aliases()[alias] and sorted(set(read)) == loader.list_platforms()


def test_an_alias_repeating_a_platform_name_is_still_rejected(fresh_tables, monkeypatch):
    original = loader._shipped_data.__wrapped__

    def with_conflict(name):
        data = dict(original(name))
        if name == "rk3576":
            data["aliases"] = [*(data.get("aliases") or []), "rk3588"]
        return data

    monkeypatch.setattr(loader, "_shipped_data", with_conflict)
    assert loader.resolve_name("rk3588") == "rk3588"
    with pytest.raises(ConfigError, match="already names another platform"):
        loader.aliases()
