"""A shipped YAML file's parsed data kept beside the bytecode cache (issue 20: first call in a
fresh process).

Parsing the rk3588 register map (libyaml's parser, PyYAML's Python constructor) is ~8 ms of CPU
of a fresh process's ``Runtime()`` on the dev machine; its data (mappings, lists, strings,
numbers) read back with ``marshal`` takes ~0.15 ms. :func:`load` keeps the data of a parse in
``__pycache__/<file name>.<cache tag>.marshal`` beside the YAML file (under
``PYTHONPYCACHEPREFIX`` if set), headed by the interpreter's bytecode magic number and a SHA-256
of the loader's name and the exact text: any other header, or a file that does not read, is a
miss, which parses the text and writes the file again (not with bytecode writing off,
``sys.dont_write_bytecode``, nor in a read-only directory; nor data ``marshal`` cannot hold).
``marshal`` keeps the types and the sharing of the parsed objects (YAML aliases); every call
gets objects of its own. Errors are the parser's: only a parse that succeeded is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import os
import sys
from pathlib import Path
from typing import Any

import yaml


def cache_path(path: Path) -> str:
    """Where the data of ``path`` is kept (module docstring)."""
    folder = os.path.dirname(importlib.util.cache_from_source(str(Path(path).with_suffix(".py"))))
    return os.path.join(folder, f"{Path(path).name}.{sys.implementation.cache_tag}.marshal")


def _header(text: str, loader: type) -> bytes:
    digest = hashlib.sha256(f"{loader.__module__}.{loader.__qualname__}\0".encode())
    digest.update(text.encode("utf-8", "surrogatepass"))
    return importlib.util.MAGIC_NUMBER + digest.digest()


def load(text: str, loader: type, path: Path) -> Any:
    """``yaml.load(text, Loader=loader)`` of the file at ``path``, from the kept data when it is
    that of this text (module docstring)."""
    header, where = _header(text, loader), cache_path(path)
    with contextlib.suppress(OSError, ValueError, EOFError, TypeError):
        with open(where, "rb") as f:
            data = f.read()
        if data.startswith(header):
            return marshal.loads(data[len(header):])
    doc = yaml.load(text, Loader=loader)  # noqa: S506 - the callers' loaders are safe loaders
    if not sys.dont_write_bytecode:
        _write(where, header, doc)
    return doc


def _write(where: str, header: bytes, doc: Any) -> None:
    temporary = f"{where}.{os.getpid()}.tmp"
    try:
        blob = marshal.dumps(doc)
        os.makedirs(os.path.dirname(where), exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(header + blob)
        os.replace(temporary, where)
    except (OSError, ValueError):  # (a read-only directory, or a value marshal cannot hold)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
