"""Shipped register maps' parsed YAML kept beside the bytecode cache (issue 20, first call;
isa/yaml_cache.py): the data read back equals the parser's for every shipped map (types and
the sharing of aliased objects included), a second load does not parse, a changed text or a
foreign header parses again, nothing is written with bytecode writing off, and the register
maps built through it equal those built from the parser directly."""

from __future__ import annotations

import sys

import pytest
import yaml

from npuemu.isa import regmap_loader, yaml_cache

LOADER = regmap_loader._SHIPPED_LOADER
SHIPPED = sorted(regmap_loader.REGMAP_DIR.glob("*.yaml"))


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """The kept files go to tmp_path; bytecode writing on."""
    monkeypatch.setattr(yaml_cache, "cache_path", lambda path: str(tmp_path / "cache" / f"{path.name}.marshal"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    return tmp_path / "cache"


def _same(a, b) -> bool:
    """Equal with the same types all the way down (1 == 1.0 == True would pass ==)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_kept_data_is_the_parsers(path, kept, monkeypatch):
    text = path.read_text(encoding="utf-8")
    reference = yaml.load(text, Loader=LOADER)  # noqa: S506 - libyaml's safe loader
    first = yaml_cache.load(text, LOADER, path)
    assert (kept / f"{path.name}.marshal").exists()
    monkeypatch.setattr(yaml, "load", lambda *a, **k: pytest.fail("parsed although kept"))
    second = yaml_cache.load(text, LOADER, path)
    assert _same(first, reference) and _same(second, reference)
    assert second is not first  # (each call its own objects)


def test_aliases_stay_shared(kept, tmp_path):
    text = "a: &f {x: 1, y: [1, 2.5, true, null, 'z']}\nb: *f\n"
    path = tmp_path / "aliases.yaml"
    yaml_cache.load(text, LOADER, path)
    doc = yaml_cache.load(text, LOADER, path)
    assert doc["a"] is doc["b"] and doc["a"] == {"x": 1, "y": [1, 2.5, True, None, "z"]}


def test_a_changed_text_or_a_foreign_header_parses_again(kept, tmp_path):
    path = tmp_path / "map.yaml"
    assert yaml_cache.load("a: 1\n", LOADER, path) == {"a": 1}
    assert yaml_cache.load("a: 2\n", LOADER, path) == {"a": 2}  # (same file name, other text)
    kept_file = kept / "map.yaml.marshal"
    kept_file.write_bytes(b"\x00" * 20 + kept_file.read_bytes()[20:])
    assert yaml_cache.load("a: 2\n", LOADER, path) == {"a": 2}
    assert kept_file.read_bytes().startswith(yaml_cache._header("a: 2\n", LOADER))
    assert yaml_cache.load("a: 2\n", yaml.SafeLoader, path) == {"a": 2}  # (another loader: its own key)
    assert kept_file.read_bytes().startswith(yaml_cache._header("a: 2\n", yaml.SafeLoader))


def test_parse_errors_are_the_parsers_and_nothing_is_kept(kept, tmp_path):
    with pytest.raises(yaml.YAMLError):
        yaml_cache.load("a: [1, 2\n", LOADER, tmp_path / "bad.yaml")
    assert not (kept / "bad.yaml.marshal").exists()


def test_nothing_written_with_bytecode_writing_off(kept, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert yaml_cache.load("a: 1\n", LOADER, tmp_path / "m.yaml") == {"a": 1}
    assert not kept.exists()


@pytest.mark.parametrize("family", [p.stem for p in SHIPPED])
def test_register_maps_built_through_it_equal_the_parsers(family, kept, monkeypatch):
    regmap_loader._load_cached.cache_clear()
    try:
        kept_map = regmap_loader.load_regmap(family)
        regmap_loader._load_cached.cache_clear()
        read_back = regmap_loader.load_regmap(family)  # (from the kept data)
        regmap_loader._load_cached.cache_clear()
        monkeypatch.setattr(regmap_loader.yaml_cache, "load", lambda text, loader, path: yaml.load(text, Loader=loader))
        parsed = regmap_loader.load_regmap(family)
    finally:
        regmap_loader._load_cached.cache_clear()
    assert kept_map == parsed and read_back == parsed
