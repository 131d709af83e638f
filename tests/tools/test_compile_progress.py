"""Progress during a compile (issue 21 item 2): the driver reports its phases through
``CompileOptions.on_phase`` and never prints; the CLI draws them as one line on a terminal
(tools/progress_cli.py), clears it before its own output, and writes nothing when stderr is
piped or with ``--no-progress``."""

from __future__ import annotations

import io
import sys

import pytest

from npuemu.compiler.driver import CompileOptions, build, build_graph, prepare
from npuemu.tools.progress_cli import PhaseLine
from tests.compiler.test_build_e2e import small_cnn

CLEAR = "\r\x1b[K"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    model, _ = small_cnn()
    path = tmp_path_factory.mktemp("progress") / "net.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_driver_reports_the_phases_in_order(onnx_path) -> None:
    seen: list[str] = []
    front = prepare(onnx_path, "rk3588", CompileOptions(precision="fp16", on_phase=seen.append))
    assert seen == ["import", "graph passes", "quantization"]
    build(front)
    assert seen == ["import", "graph passes", "quantization", "lowering"]


def test_float_prepare_has_no_quantization_phase_and_build_graph_lowers(onnx_path) -> None:
    seen: list[str] = []
    prepare(onnx_path, "rk3588", CompileOptions(precision="float", on_phase=seen.append))
    assert seen == ["import", "graph passes"]
    front = prepare(onnx_path, "rk3588", CompileOptions(precision="fp16"))
    lowered: list[str] = []
    build_graph(front.graph, "rk3588", CompileOptions(precision="fp16", on_phase=lowered.append))
    assert lowered == ["lowering"]


def test_the_callback_changes_no_build(onnx_path) -> None:
    plain = build(prepare(onnx_path, "rk3588", CompileOptions(precision="fp16")))
    watched = build(prepare(onnx_path, "rk3588", CompileOptions(precision="fp16", on_phase=lambda _: None)))
    assert plain.to_bytes() == watched.to_bytes()


def test_phase_line_counts_overwrites_and_clears() -> None:
    terminal = _Terminal()
    with PhaseLine("compile", ("import", "lowering"), stream=terminal) as line:
        line("import")
        line("lowering")
        line("something else")
    assert terminal.getvalue() == (f"{CLEAR}compile [1/2] import{CLEAR}compile [2/2] lowering"
                                   f"{CLEAR}compile something else{CLEAR}")
    piped = io.StringIO()
    with PhaseLine("compile", ("import",), stream=piped) as line:
        line("import")
    assert piped.getvalue() == ""


def _compile(onnx_path, tmp_path, stderr, monkeypatch, *extra: str) -> int:
    from npuemu.tools.cli import main

    monkeypatch.setattr(sys, "stderr", stderr)
    return main(["compile", str(onnx_path), "--fp16", "-o", str(tmp_path / "net.npu"), *extra])


def test_compile_draws_the_phases_on_a_terminal(onnx_path, tmp_path, monkeypatch, capsys) -> None:
    terminal = _Terminal()
    assert _compile(onnx_path, tmp_path, terminal, monkeypatch) == 0
    drawn = terminal.getvalue()
    steps = [f"{CLEAR}compile [{i}/4] {phase}"
             for i, phase in enumerate(("import", "graph passes", "quantization", "lowering"), 1)]
    assert drawn == "".join(steps) + CLEAR  # in order, then cleared before the summary
    assert "wrote" in capsys.readouterr().out


def test_compile_is_silent_when_piped_or_switched_off(onnx_path, tmp_path, monkeypatch) -> None:
    piped = io.StringIO()
    assert _compile(onnx_path, tmp_path, piped, monkeypatch) == 0
    assert piped.getvalue() == ""
    terminal = _Terminal()
    assert _compile(onnx_path, tmp_path, terminal, monkeypatch, "--no-progress") == 0
    assert terminal.getvalue() == ""


def test_phase_line_is_cleared_before_an_error(tmp_path, monkeypatch) -> None:
    """A failing compile leaves no half-drawn line in front of its error message."""
    terminal = _Terminal()
    missing = tmp_path / "absent.onnx"
    from npuemu.tools.cli import main

    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["compile", str(missing), "--fp16", "-o", str(tmp_path / "x.npu")]) == 2
    drawn = terminal.getvalue()
    assert "npuemu compile: error:" in drawn
    head = drawn.split("npuemu compile: error:")[0]
    assert head == "" or head.endswith(CLEAR)
