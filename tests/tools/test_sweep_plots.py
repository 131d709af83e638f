"""The plot extra's sweep plots (tools/sweep_plots.py): `npuemu sweep plot` (Pareto fronts) and
`npuemu perf --roofline`."""

from __future__ import annotations

import pytest

from npuemu.tools.cli import main
from npuemu.tools.sweep_plots import pareto_front, roofline_points

pytest.importorskip("matplotlib", reason='the plot extra: pip install -e ".[plot]"')


def test_pareto_front_keeps_the_undominated():
    pairs = [(1, 9), (2, 5), (3, 6), (4, 2), (5, 2), (2, 7), (6, 1)]
    assert pareto_front(pairs) == [(1, 9), (2, 5), (4, 2), (6, 1)]


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    import onnx

    from npuemu.tools.demo_network import demo_network

    path = tmp_path_factory.mktemp("plots") / "net.onnx"
    onnx.save(demo_network(), path)
    return path


def _png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_plot(onnx_path, capsys):
    spec = onnx_path.with_name("s.yaml")
    spec.write_text("models: [net.onnx]\ndtype: fp16\ncore_mask: [auto, 0_1]\n"
                    "set:\n  ddr.read_bytes_per_cycle: [2, 4, 8]\n  cbuf.banks: [6, 12]\n")
    results = onnx_path.with_name("s.csv")
    assert main(["sweep", str(spec), "-o", str(results), "--workers", "1"]) == 0
    assert main(["sweep", "plot", str(results)]) == 0
    assert "12 points, 7 Pareto line(s)" in capsys.readouterr().out  # 2 masks + 3 rates + 2 bank counts
    assert _png(results.with_suffix(".png"))
    out = onnx_path.with_name("cycles.png")
    assert main(["sweep", "plot", str(results), "--x", "ddr_read_bytes", "--y", "cycles", "-o", str(out)]) == 0
    assert _png(out)
    assert main(["sweep", "plot", str(results), "--x", "nope"]) == 2
    assert "no column 'nope'" in capsys.readouterr().err


def test_perf_roofline(onnx_path, tmp_path, capsys):
    import json

    out = tmp_path / "roof.png"
    assert main(["perf", str(onnx_path), "--fp16", "--roofline", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["totals"]["cycles"] > 0 and "under the compute and DDR roofs" in captured.err
    assert _png(out)


def test_roofline_points_sit_under_the_roofs(onnx_path):
    from npuemu.compiler.driver import CompileOptions, compile_model
    from npuemu.emulator.runtime import Runtime
    from npuemu.emulator.timing.report import report_npu

    model = compile_model(str(onnx_path), "rk3588", CompileOptions(precision="fp16"))
    runtime = Runtime(model)
    for name in runtime.inputs:
        runtime.set_input(name, runtime.zero_input(name))
    runtime.run()
    platform = runtime.machine.platform
    points = roofline_points(report_npu(model, runtime.runs, platform))
    assert points
    hertz = platform.clock.npu_mhz * 1e6
    for point in points:
        assert point["macs_per_s"] <= point["rate"] * point["cores"] * hertz * 1.0001
