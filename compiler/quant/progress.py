"""A one-line progress bar on stderr, silent unless stderr is a terminal (and not switched off).

Library code never prints; this writes only to an interactive terminal, so logs, pipes and CI
output stay clean.
"""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    """``with Progress(total, "calibrating") as bar: ... bar.advance()``."""

    WIDTH = 30

    def __init__(self, total: int, label: str, *, enabled: bool = True, stream: TextIO | None = None):
        self.total, self.label, self.done = max(int(total), 0), label, 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and _is_terminal(self.stream)

    def __enter__(self) -> "Progress":
        self._draw()
        return self

    def advance(self, steps: int = 1) -> None:
        self.done = min(self.done + steps, self.total) if self.total else self.done + steps
        self._draw()

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        if not self.enabled:
            return
        filled = self.WIDTH * self.done // self.total if self.total else 0
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total}")
        self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        return False
