"""`npuemu conformance` shows a progress bar on a terminal and nothing when piped (issue 21
item 2), with the calibration bar (compiler/quant/progress.py)."""

from __future__ import annotations

import io
import sys

from npuemu.tools import conformance


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_conformance_draws_a_bar_on_a_terminal_only(monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    report = conformance.run_conformance("rk3588", "int8", ["Relu"], bar=True)
    total = len(report.cases)
    assert total >= 1 and f"conformance rk3588 int8 [{'#' * 30}] {total}/{total}" in terminal.getvalue()
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    conformance.run_conformance("rk3588", "int8", ["Relu"], bar=True)
    assert piped.getvalue() == ""


def test_conformance_cli_has_no_progress_switch(monkeypatch, capsys) -> None:
    from npuemu.tools.cli import main

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["conformance", "--ops", "Relu", "--no-progress"]) == 0
    assert "conformance rk3588" not in terminal.getvalue()
