"""The methods ``@dataclass`` writes, compiled once and kept beside the bytecode cache (issue 20:
first call in a fresh process).

``dataclasses`` makes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``...
by writing the function's source text and ``exec``-ing it: a compile from source at every import,
which the bytecode cache does not cover. The runtime's import makes ~100 dataclasses (frozen
register-state records of 20-60 fields among them): ~590 compiles, ~32 ms of CPU on the dev
machine, a fifth of npuemu's import.

Inside :func:`reused`, ``dataclasses``' ``exec`` (a module global put in front of the builtin)
runs a code object compiled from the same text as ``exec`` compiles it (file name
``<string>``, no inherited ``__future__`` flags: ``dataclasses`` has none, the interpreter's
optimisation level), taken from a table keyed by the exact text; so every function is the one
the text gives, only its compile is skipped. The table is read from
``__pycache__/npuemu-dataclass-code.<cache tag>[.opt-N].marshal`` (beside where the bytecode of this
module is written, under ``PYTHONPYCACHEPREFIX`` if set), whose header holds the interpreter's
bytecode magic number and optimisation level: any other header, or a file that does not read,
is an empty table. After the block, if a text was missing, the file is written again
(atomically: the texts used by this import and, up to a bound, those of other imports) unless
bytecode writing is off (``sys.dont_write_bytecode``) or the directory is read-only. Outside the
block, and for calls with anything but a source string, ``exec`` is the builtin.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import importlib.util
import marshal
import os
import sys
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_state = {"depth": 0, "table": None, "used": None, "missed": 0}
#: entries of other imports kept in the file beyond those one import uses
SPARE_ENTRIES = 2000


def _header() -> bytes:
    return importlib.util.MAGIC_NUMBER + bytes([sys.flags.optimize & 0xFF])


def cache_path() -> str:
    """Where the table is kept (module docstring)."""
    folder = os.path.dirname(importlib.util.cache_from_source(os.path.abspath(__file__)))
    level = f".opt-{sys.flags.optimize}" if sys.flags.optimize else ""  # (as .pyc names: -O keeps its own)
    return os.path.join(folder, f"npuemu-dataclass-code.{sys.implementation.cache_tag}{level}.marshal")


def _read_table() -> dict:
    header = _header()
    try:
        with open(cache_path(), "rb") as f:
            data = f.read()
        if not data.startswith(header):
            return {}
        table = marshal.loads(data[len(header):])
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    return table if isinstance(table, dict) else {}


def _exec(source, globals=None, locals=None, /, **kwargs):
    """``dataclasses``' ``exec``: the builtin, with source texts compiled once (module docstring)."""
    if globals is None:  # (the caller's frame is dataclasses': its globals, as the builtin would take)
        globals = vars(dataclasses)
    if not isinstance(source, str) or kwargs:
        return builtins.exec(source, globals, locals, **kwargs)
    with _lock:
        if _state["table"] is None:
            _state["table"], _state["used"] = _read_table(), {}
        code = _state["table"].get(source)
        if code is None:
            code = compile(source, "<string>", "exec", dont_inherit=True)
            _state["table"][source] = code
            _state["missed"] += 1
        _state["used"][source] = code
    return builtins.exec(code, globals, locals)


@contextlib.contextmanager
def reused() -> Iterator[None]:
    """Dataclass methods made inside the block are compiled from the kept table (module docstring)."""
    with _lock:
        theirs = _state["depth"] == 0 and "exec" in vars(dataclasses)  # (someone else's override: left alone)
        if not theirs:
            _state["depth"] += 1
            dataclasses.exec = _exec
    if theirs:
        yield
        return
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                del dataclasses.exec
                if _state["missed"] and not sys.dont_write_bytecode:
                    _write(_state["used"], _state["table"])
                _state.update(table=None, used=None, missed=0)


def _write(used: dict, table: dict) -> None:
    kept = dict(used)
    for source, code in table.items():
        if len(kept) >= len(used) + SPARE_ENTRIES:
            break
        kept.setdefault(source, code)
    path = cache_path()
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(_header() + marshal.dumps(kept))
        os.replace(temporary, path)
    except (OSError, ValueError):  # (a read-only directory, or a code object marshal refuses)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
