"""Find, read and override platform YAML files.

``load_platform('rk3566')`` resolves the alias to ``rk3568.yaml`` shipped in this package;
``load_platform('my/chip.yaml')`` reads a user file with the same schema. Overrides such as
``'ddr.read_bytes_per_cycle=8'`` replace single figures before validation; the text is parsed
with the target field's type and checked like a YAML value.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from npuemu.isa.errors import ConfigError

from .model import Platform, to_plain
from .schema import build, convert, fail, field_at, parse_text

log = logging.getLogger(__name__)

PLATFORM_DIR = Path(__file__).resolve().parent
MAX_YAML_BYTES = 256 * 1024  # a platform file is ~7 KiB; this bounds a hostile file's parse to ~1 s

Overrides = Sequence[str] | Mapping[str, Any]


# The pure-Python safe loader on purpose: libyaml's CSafeLoader segfaults on deeply nested
# flow collections, while this one raises RecursionError, which we report.
class _StrictLoader(yaml.SafeLoader):
    """The safe loader, plus: a duplicated key is an error instead of silently winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        self.flatten_mapping(node)
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base class reports it with its position
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, origin: str, loader: type | None = None) -> Any:
    """Plain data from YAML text; syntax errors become ConfigError with the line. ``loader``: a
    subclass of the strict loader (``npuemu sweep`` keeps core masks such as 0_1_2 as text)."""
    try:
        return yaml.load(text, Loader=loader or _StrictLoader)  # noqa: S506 - a safe loader subclass
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{origin}: {where}invalid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{origin}: invalid YAML: {error}") from None
    except RecursionError:
        raise ConfigError(f"{origin}: invalid YAML: nested too deeply") from None


#: libyaml's loader for the files shipped with npuemu (about 7x faster: it is most of a fresh
#: process's Runtime() time); user files keep the strict pure-Python loader. The shipped files are
#: checked with the strict one by tests/platforms/test_shipped_yaml.py (no duplicate keys, same data).
SHIPPED_LOADER = getattr(yaml, "CSafeLoader", None) or _StrictLoader


def parse_shipped_yaml(text: str, origin: str) -> Any:
    return parse_yaml(text, origin, SHIPPED_LOADER)


def read_yaml(path: Path, origin: str, loader: type | None = None) -> Any:
    if not path.is_file():
        raise ConfigError(f"{origin}: no such platform file")
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ConfigError(f"{origin}: file is {size} bytes; expected a platform YAML of at most {MAX_YAML_BYTES}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{origin}: expected UTF-8 text, found byte {error.start}: {error.reason}") from None
    return parse_yaml(text, origin, loader)


def list_platforms() -> list[str]:
    """Canonical names of the shipped platforms."""
    return sorted(path.stem for path in PLATFORM_DIR.glob("*.yaml"))


@functools.cache
def _shipped_data(name: str) -> Any:
    # Cached raw data: callers never mutate it (overrides work on a deep copy).
    return read_yaml(PLATFORM_DIR / f"{name}.yaml", f"{name}.yaml", SHIPPED_LOADER)


@functools.cache
def _name_table() -> dict[str, str]:
    table = {name: name for name in list_platforms()}
    for name in list_platforms():
        data = _shipped_data(name)
        listed = data.get("aliases") if isinstance(data, Mapping) else None
        for alias in listed if isinstance(listed, list) else ():
            if str(alias).lower() in table:
                raise ConfigError(f"{name}.yaml: aliases: {alias!r} already names another platform")
            table[str(alias).lower()] = name
    return table


def aliases() -> dict[str, str]:
    """Alias -> canonical name for the shipped platforms (canonical names excluded)."""
    return {alias: name for alias, name in _name_table().items() if alias != name}


@functools.cache
def _canonical_names() -> frozenset[str]:
    return frozenset(list_platforms())


def resolve_name(name: str) -> str:
    """Canonical platform name for a name or alias (case-insensitive). A canonical name is its
    own answer without reading every shipped file for the alias table (issue 20: ~6 ms of a fresh
    process's Runtime()); an alias that repeats a canonical name is still reported when the table
    is built (any alias, aliases(), tests/platforms/test_shipped.py)."""
    key = name.strip().lower()
    if key in _canonical_names():
        return key
    table = _name_table()
    if key not in table:
        known = ", ".join(f"{n} (alias {', '.join(a for a, c in aliases().items() if c == n)})"
                          if n in aliases().values() else n for n in list_platforms())
        raise ConfigError(f"unknown platform {name!r}; expected one of: {known}; or a path to a .yaml file")
    return table[key]


def _looks_like_path(name_or_path: str | Path) -> bool:
    if isinstance(name_or_path, Path):
        return True
    return "/" in name_or_path or "\\" in name_or_path or name_or_path.lower().endswith((".yaml", ".yml"))


def load_platform(name_or_path: str | Path, overrides: Overrides = ()) -> Platform:
    """Load a shipped platform by name/alias, or a user YAML by path, then apply overrides."""
    if _looks_like_path(name_or_path):
        origin = str(name_or_path)
        data = read_yaml(Path(name_or_path).expanduser(), origin)
    else:
        canonical = resolve_name(str(name_or_path))
        origin = f"{canonical}.yaml"
        data = _shipped_data(canonical)
        if isinstance(data, Mapping) and data.get("name") != canonical:
            raise ConfigError(f"{origin}: name: expected {canonical!r} (the file name), got {data.get('name')!r}")
    platform = platform_from_dict(data, origin, overrides)
    log.debug("loaded platform %s from %s with %d override(s)", platform.name, origin, len(overrides))
    return platform


def platform_from_dict(data: Any, origin: str = "<data>", overrides: Overrides = ()) -> Platform:
    """Validate plain data (as YAML would give it) into a Platform, after applying overrides."""
    if overrides:
        data = _apply(data, overrides, origin)
        origin = f"{origin} (with overrides)"
    return build(Platform, data, origin)


def apply_overrides(platform: Platform, overrides: Overrides) -> Platform:
    """A copy of ``platform`` with single figures replaced (same syntax and checks as loading)."""
    return platform_from_dict(platform.to_dict(), f"{platform.name} platform", overrides)


def split_overrides(overrides: Overrides) -> list[tuple[str, str, Any]]:
    """(original text, key path, value) for each override; 'key=value' strings or a mapping."""
    if isinstance(overrides, Mapping):
        return [(f"{key}={value}", str(key).strip(), value) for key, value in overrides.items()]
    if isinstance(overrides, str):  # one 'key=value' given bare
        overrides = [overrides]
    result = []
    for text in overrides:
        key, equals, value = str(text).partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. ddr.read_bytes_per_cycle=8")
        result.append((text, key.strip(), value))
    return result


def _apply(data: Any, overrides: Overrides, origin: str) -> Any:
    data = copy.deepcopy(data)
    for text, path, raw in split_overrides(overrides):
        where = f"{origin}: override {text!r}"
        hint, spec = field_at(Platform, path, where)
        if isinstance(raw, str):
            value = parse_text(hint, spec, raw, where, path)
        else:
            value = convert(hint, spec, raw, where, path)
        node, parts = data, path.split(".")
        for depth, part in enumerate(parts[:-1]):
            node = node.get(part) if isinstance(node, Mapping) else None
            if not isinstance(node, dict):
                group = ".".join(parts[: depth + 1])
                raise fail(where, path, f"cannot set a figure inside {group!r}: it is null or missing "
                           f"here; set it as a whole instead, e.g. '{group}={{...}}'")
        if not isinstance(node, dict):
            raise fail(where, path, "the platform data is not a mapping")
        node[parts[-1]] = to_plain(value)
    return data
