"""The compiler's phases as one line on stderr, for the CLI's long steps.

The driver reports each phase through ``CompileOptions.on_phase`` (compiler/driver.py PHASES) and
never prints; this turns the calls into ``compile [2/4] graph passes`` on a terminal, each phase
overwriting the last, the line cleared when the step ends (so the command's own output starts on
a clean line). Nothing is written when stderr is not a terminal (a pipe, a log, CI) or with
``--no-progress``, as compiler/quant/progress.py's calibration bar does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from npuemu.compiler.quant.progress import _is_terminal

#: ANSI "erase to end of line": a shorter phase name leaves nothing of a longer one behind
_CLEAR = "\r\x1b[K"


class PhaseLine:
    """``with PhaseLine("compile", PHASES) as line: options.on_phase = line``."""

    def __init__(self, label: str, phases: Sequence[str], *, enabled: bool = True, stream: TextIO | None = None):
        self.label, self.phases, self.drawn = label, tuple(phases), False
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and _is_terminal(self.stream)

    def __call__(self, phase: str) -> None:
        if not self.enabled:
            return
        # a phase outside the expected list (a caller's own) is shown without a count
        count = f" [{self.phases.index(phase) + 1}/{len(self.phases)}]" if phase in self.phases else ""
        self.stream.write(f"{_CLEAR}{self.label}{count} {phase}")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write(_CLEAR)
            self.stream.flush()
            self.drawn = False

    def __enter__(self) -> "PhaseLine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def expected_phases(precision: str, lowering: bool) -> tuple[str, ...]:
    """The driver phases a build of ``precision`` reports: quantization unless it stays float,
    lowering only when a model file is made."""
    from npuemu.compiler.driver import PHASES

    return tuple(phase for phase in PHASES
                 if (phase != "quantization" or precision != "float") and (phase != "lowering" or lowering))


@contextmanager
def compile_phases(args: argparse.Namespace, precision: str, *, lowering: bool,
                   label: str = "compile") -> Iterator[PhaseLine]:
    """The phase line of a command with the compile flags (``--no-progress`` switches it off)."""
    line = PhaseLine(label, expected_phases(precision, lowering), enabled=not getattr(args, "no_progress", False))
    try:
        yield line
    finally:
        line.close()


__all__ = ["PhaseLine", "compile_phases", "expected_phases"]
