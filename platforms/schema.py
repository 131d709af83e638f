"""Validate plain YAML data against the platform dataclasses and build the frozen objects.

The dataclass type hints are the schema: a field's annotation gives its type (``int``,
``float``, ``str``, ``bool``, ``X | None``, ``tuple[X, ...]`` or a nested dataclass) and its
``figure(...)`` metadata gives its range. Every failure raises :class:`ConfigError` naming
the origin (file), the key path and what was expected.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from npuemu.isa.errors import ConfigError

from .spec import Spec, spec_of

MAX_LIST_ITEMS = 1000  # a platform list is a handful of names; more means a broken file


@dataclass(frozen=True)
class Leaf:
    """One non-group figure: its key path, value, type annotation and constraint."""

    path: str
    value: Any
    hint: Any
    spec: Spec


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def fail(origin: str, path: str, message: str) -> ConfigError:
    where = f"{origin}: {path}" if path else origin
    return ConfigError(f"{where}: {message}")


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """(inner type, allows None) for ``X | None``; other hints pass through."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def describe(hint: Any, spec: Spec) -> str:
    """What a value of this field must look like, for error messages."""
    inner, optional = unwrap_optional(hint)
    if typing.get_origin(inner) is tuple:
        text = "a list, each item " + spec.describe(_kind(typing.get_args(inner)[0]))
    else:
        text = spec.describe(_kind(inner))
    return f"{text} or null" if optional else text


def _kind(hint: Any) -> str:
    if dataclasses.is_dataclass(hint):
        return "a mapping"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}[hint]


def show(value: Any) -> str:
    """A short rendering of a user value (hostile inputs can be huge)."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def build(cls: type, data: Any, origin: str, path: str = "") -> Any:
    """Check ``data`` (plain YAML data) against dataclass ``cls`` and construct it."""
    if not isinstance(data, Mapping):
        raise fail(origin, path, f"expected a mapping, got {show(data)}")
    fields = dataclasses.fields(cls)
    names = [field.name for field in fields]
    for key in data:
        if not isinstance(key, str) or key not in names:
            raise fail(origin, join(path, str(key)), f"unknown key; expected one of: {', '.join(names)}")
    values = {}
    for field in fields:
        hint, spec = type_hints(cls)[field.name], spec_of(field)
        key_path = join(path, field.name)
        if field.name not in data:
            if field.default is dataclasses.MISSING:
                raise fail(origin, key_path, f"missing key; expected {describe(hint, spec)}")
            continue
        values[field.name] = convert(hint, spec, data[field.name], origin, key_path)
    instance = cls(**values)
    for key, message in instance.problems() if hasattr(instance, "problems") else ():
        raise fail(origin, join(path, key), message)
    return instance


def convert(hint: Any, spec: Spec, value: Any, origin: str, path: str, shown: str | None = None) -> Any:
    """Check one value against its field's type and range; return it in Python form.

    ``shown`` replaces the value in error messages (an override's original text).
    """
    inner, optional = unwrap_optional(hint)
    if value is None:
        if optional:
            return None
        raise fail(origin, path, f"expected {describe(hint, spec)}, got null")
    if dataclasses.is_dataclass(inner):
        return build(inner, value, origin, path)
    if typing.get_origin(inner) is tuple:
        return _convert_list(inner, spec, value, origin, path, optional)
    checked = _scalar(inner, value)
    if checked is _BAD or spec.violation(checked):
        raise fail(origin, path, f"expected {describe(hint, spec)}, got {shown or show(value)}")
    return checked


_BAD = object()


def _scalar(kind: Any, value: Any) -> Any:
    if kind is bool:
        return value if isinstance(value, bool) else _BAD
    if isinstance(value, bool):  # YAML 'true' must not pass as 1
        return _BAD
    if kind is int:
        return value if isinstance(value, int) else _BAD
    if kind is float:
        ok = isinstance(value, (int, float)) and math.isfinite(value)
        return float(value) if ok else _BAD
    if kind is str:
        return value if isinstance(value, str) else _BAD
    raise TypeError(f"unsupported field type {kind!r}")  # a schema bug, not a user error


def _convert_list(hint: Any, spec: Spec, value: Any, origin: str, path: str, optional: bool) -> tuple:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_LIST_ITEMS:
        expected = describe(hint, spec) + (" or null" if optional else "")
        limit = f" (at most {MAX_LIST_ITEMS} items)" if isinstance(value, (list, tuple)) else ""
        raise fail(origin, path, f"expected {expected}{limit}, got {show(value)}")
    item_hint = typing.get_args(hint)[0]
    return tuple(convert(item_hint, spec, item, origin, f"{path}[{index}]") for index, item in enumerate(value))


# ---- key paths, leaves and override values --------------------------------------------------

def field_at(cls: type, path: str, origin: str) -> tuple[Any, Spec]:
    """Type hint and constraint of the field a dotted key path names."""
    hint: Any = cls
    spec = Spec()
    walked = ""
    for part in path.split("."):
        inner, _ = unwrap_optional(hint)
        if not dataclasses.is_dataclass(inner):
            raise fail(origin, path, f"unknown key path: {walked!r} is a single figure, not a group")
        fields = {field.name: field for field in dataclasses.fields(inner)}
        if part not in fields:
            raise fail(origin, path, f"unknown key path: no key {part!r} in "
                       f"{walked or 'a platform'}; expected one of: {', '.join(fields)}")
        hint, spec = type_hints(inner)[part], spec_of(fields[part])
        walked = join(walked, part)
    return hint, spec


def parse_text(hint: Any, spec: Spec, text: str, origin: str, path: str) -> Any:
    """Turn an override's text into a value of the field's type, then check it like YAML."""
    inner, optional = unwrap_optional(hint)
    stripped = text.strip()
    if optional and stripped.lower() in ("null", "none", "~"):
        return None
    try:
        value = _parse_as(inner, stripped)
    except ValueError:
        raise fail(origin, path, f"expected {describe(hint, spec)}, got {show(text)}") from None
    return convert(hint, spec, value, origin, path, shown=show(text))


def _parse_as(kind: Any, text: str) -> Any:
    if dataclasses.is_dataclass(kind) or typing.get_origin(kind) is tuple:
        if typing.get_origin(kind) is tuple and not text.startswith("["):
            return [item.strip() for item in text.split(",") if item.strip()]
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ValueError(text) from error
    if kind is bool:
        table = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
        if text.lower() not in table:
            raise ValueError(text)
        return table[text.lower()]
    if kind is int:
        return int(text.replace("_", ""), 0)
    if kind is float:
        value = float(text.replace("_", ""))
        if not math.isfinite(value):
            raise ValueError(text)
        return value
    return text


def iter_leaves(obj: Any, prefix: str = "") -> Iterator[Leaf]:
    """Every figure below ``obj`` (groups are walked, ``source``/``note`` included), in order."""
    hints = type_hints(type(obj))
    for field in dataclasses.fields(obj):
        value, path = getattr(obj, field.name), join(prefix, field.name)
        if dataclasses.is_dataclass(value):
            yield from iter_leaves(value, path)
        else:
            yield Leaf(path, value, hints[field.name], spec_of(field))
