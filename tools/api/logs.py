"""Logging of the RKNN-compatible API (``npuemu.api``): vendor-style one-line messages.

rknn-toolkit2 prints ``I build: ...`` / ``W ...`` / ``E ...`` lines on the terminal and, with
``RKNN(verbose=True, verbose_file=...)``, writes its debug log to a file too (guide 3.1.1).
Each API method logs through ``npuemu.api.<method>``; one handler on ``npuemu.api`` formats
the records as ``<level letter> <method>: <message>`` on the current ``sys.stderr``.
"""

from __future__ import annotations

import logging
import sys

ROOT = "npuemu.api"


class _Format(logging.Formatter):
    """``E build: message`` - the vendor's level letter and the API method's name."""

    def format(self, record: logging.LogRecord) -> str:
        method = record.name[len(ROOT) + 1:] if record.name.startswith(ROOT + ".") else record.name
        return f"{record.levelname[:1]} {method}: {record.getMessage()}"


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at emit time (a script may redirect it later)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


def method_log(method: str) -> logging.Logger:
    """The logger of one API method (its name shows in every line)."""
    return logging.getLogger(f"{ROOT}.{method}")


def setup(verbose: bool, verbose_file: str | None) -> logging.Handler | None:
    """Configure the API's terminal handler (INFO, DEBUG when ``verbose``) and, when ``verbose``
    and ``verbose_file`` are given, a file handler at DEBUG; returns the file handler so that
    ``release()`` can close it. The records do not propagate to the root logger, so a script that
    configured logging itself does not see every line twice (as the vendor's own logger)."""
    root = logging.getLogger(ROOT)
    root.propagate = False
    root.setLevel(logging.DEBUG)
    terminal = next((h for h in root.handlers if isinstance(h, _StderrHandler)), None)
    if terminal is None:
        terminal = _StderrHandler()
        terminal.setFormatter(_Format())
        root.addHandler(terminal)
    terminal.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not (verbose and verbose_file):
        return None
    handler = logging.FileHandler(verbose_file, mode="w", encoding="utf-8")
    handler.setFormatter(_Format())
    handler.setLevel(logging.DEBUG)
    root.addHandler(handler)
    return handler


def close(handler: logging.Handler | None) -> None:
    """Detach and close a file handler made by :func:`setup`."""
    if handler is None:
        return
    logging.getLogger(ROOT).removeHandler(handler)
    handler.close()
