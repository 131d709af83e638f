"""`npuemu accuracy` (tools/accuracy.py, tools/cmd_accuracy.py) on the bundled demo CNN: the
vendor-layout table, CSV and plot, the emulated NPU's column checked against a plain build
run separately, hybrid quantization improving a deliberately bad layer, and the errors."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.compiler.float_eval import evaluate
from npuemu.emulator.runtime import Runtime
from npuemu.tools import accuracy
from npuemu.tools.cli import main
from npuemu.tools.demo_network import demo_images, demo_network


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("accuracy")
    onnx.save(demo_network(), folder / "demo.onnx")
    lines = []
    for index, image in enumerate(demo_images(6, seed=100)):
        np.save(folder / f"calib_{index}.npy", image)
        lines.append(f"calib_{index}.npy")
    (folder / "dataset.txt").write_text("\n".join(lines) + "\n")
    np.save(folder / "test.npy", demo_images(1, seed=7)[0])
    return {"folder": folder, "model": folder / "demo.onnx", "dataset": folder / "dataset.txt",
            "input": folder / "test.npy"}


def _cli(demo, *extra: str) -> int:
    return main(["accuracy", str(demo["model"]), "--dataset", str(demo["dataset"]), "-t", "rk3588",
                 "--no-progress", *extra])


def _quantized(demo):
    return prepare(demo["model"], "rk3588", CompileOptions(dataset=demo["dataset"]))


def test_table_csv_and_plot(demo, capsys, tmp_path):
    assert _cli(demo, "--input", str(demo["input"]), "-o", str(tmp_path / "out")) == 0
    printed = capsys.readouterr().out
    assert "simulator_error" in printed and "runtime_error" in printed and "single" in printed
    graph = _quantized(demo).graph
    tensors = list(graph.inputs) + [name for node in graph.nodes for name in node.outputs]
    with open(tmp_path / "out" / "accuracy.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["tensor"] for row in rows] == tensors
    assert list(rows[0]) == list(accuracy.CSV_COLUMNS)
    for row in rows[1:]:  # every layer has the emulated NPU's figure: the build is int8
        assert 0.99 < float(row["runtime_entire_cos"]) <= 1.0 + 1e-9
        assert float(row["simulator_single_euc"]) >= 0
    # each table row is "[Op] tensor" followed by three cos | euc pairs
    for tensor in tensors[1:]:
        line = next(line for line in printed.splitlines() if re.match(rf"\[[^\]]+\] {re.escape(tensor)}\s", line))
        assert line.count("|") == 3
    assert (tmp_path / "out" / "accuracy.txt").read_text() in printed
    if accuracy.plot_available():
        assert (tmp_path / "out" / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "accuracy.png" in printed
    else:
        assert "matplotlib is not installed" in printed


def test_without_matplotlib_a_note_not_an_error(demo, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(accuracy, "plot_available", lambda: False)
    assert _cli(demo, "--no-emulator", "-o", str(tmp_path)) == 0
    printed = capsys.readouterr().out
    assert "note: matplotlib is not installed" in printed and "pip install" in printed
    assert (tmp_path / "accuracy.csv").is_file() and not (tmp_path / "accuracy.png").exists()
    assert "emulator not run" in printed


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_runtime_column_matches_a_plain_build_run_separately(demo):
    """The probe build keeps every layer output alive; its final output must be the plain
    build's, bit for bit, and the table's runtime figure the cosine of that output."""
    front = _quantized(demo)
    graph = front.graph
    image = np.load(demo["input"])
    report = accuracy.analyze(graph, front.platform, {"image": image}, model="demo")
    plain = Runtime(build(front))
    plain.set_input("image", image)
    plain.run()
    output = graph.outputs[0]
    golden = evaluate(graph, {"image": image})[output]
    row = next(row for row in report.rows if row.tensor == output)
    assert row.runtime_cosine == pytest.approx(_cosine(plain.output(output), golden), abs=1e-12)
    assert row.runtime_euclidean == pytest.approx(float(np.linalg.norm(plain.output(output).ravel() - golden.ravel())))
    match = report.outputs[0]
    stored = plain.output(output, dequantize=False).astype(np.int64)
    scale, zero = plain.quantization(output)
    simulated = np.rint(accuracy.fake_quant_evaluate(graph, {"image": image})[output] / scale) + zero
    assert match.max_difference_lsb == pytest.approx(np.abs(stored.ravel() - simulated.ravel()).max(), abs=1e-3)
    # the first layer sees the stored graph input either way: single equals entire
    first = report.rows[1]
    assert first.single_cosine == pytest.approx(first.entire_cosine, abs=1e-12)
    assert report.runtime_note == ""
    # on this small CNN the emulated NPU stays with the simulator on every layer
    assert report.first_departure() is None
    assert min(row.runtime_vs_simulator for row in report.rows[1:]) > 0.9999


def _config_with_bad_range(demo, tmp_path) -> str:
    assert main(["quant-config", str(demo["model"]), "--dataset", str(demo["dataset"]), "--no-progress",
                 "-o", str(tmp_path / "cfg.yaml")]) == 0
    text = (tmp_path / "cfg.yaml").read_text()
    # a1's range 1000x too wide: int8 stores it in a handful of steps (a layer worth moving)
    bad, count = re.subn(r'"a1": \{min: 0\.0, max: ([0-9.e+-]+),[^}]*\}',
                         lambda m: f'"a1": {{min: 0.0, max: {float(m.group(1)) * 1000}}}', text)
    assert count == 1
    return bad


def test_hybrid_config_shows_the_improvement(demo, tmp_path, capsys):
    """All-int8 with a bad range on a1, then the same config with a1's producer and reader
    in float16: the a1 row and the output improve. The model-file build is int8 only, so the
    hybrid run is analysed at the fake-quant level (the runtime columns say so)."""
    int8 = tmp_path / "int8.yaml"
    int8.write_text(_config_with_bad_range(demo, tmp_path))
    hybrid = tmp_path / "hybrid.yaml"
    text = int8.read_text()
    for layer in ("block_a", "block_b"):
        text, count = re.subn(rf'("{layer}":\n    op: "[^"]+"\n    dtype: )int8', r"\1float16", text)
        assert count == 1
    hybrid.write_text(text)

    results = {}
    for name, config in (("int8", int8), ("hybrid", hybrid)):
        assert _cli_config(demo, config, tmp_path / name) == 0
        printed = capsys.readouterr().out
        with open(tmp_path / name / "accuracy.csv", newline="") as handle:
            results[name] = ({row["tensor"]: row for row in csv.DictReader(handle)}, printed)
    rows_int8, printed_int8 = results["int8"]
    rows_hybrid, printed_hybrid = results["hybrid"]
    assert float(rows_int8["a1"]["simulator_entire_cos"]) < 0.99  # the bad range hurts
    assert float(rows_hybrid["a1"]["simulator_entire_cos"]) > 0.9999
    assert float(rows_hybrid["logits"]["simulator_entire_cos"]) > float(rows_int8["logits"]["simulator_entire_cos"])
    assert rows_hybrid["a1"]["dtype"] == "float16" and rows_int8["a1"]["dtype"] == "int8"
    assert "(hybrid)" in printed_hybrid and "fake-quant level" in printed_hybrid
    assert rows_hybrid["a1"]["runtime_entire_cos"] == ""
    assert float(rows_int8["a1"]["runtime_entire_cos"]) < 0.99  # the emulated NPU shows the loss too
    assert "worst single: [Conv+Relu] a1" in printed_int8


def _cli_config(demo, config: Path, out: Path) -> int:
    return main(["accuracy", str(demo["model"]), "--dataset", str(demo["dataset"]), "--quant-config", str(config),
                 "--input", str(demo["input"]), "-o", str(out)])


@pytest.mark.parametrize("extra, message", [
    (["--sample", "99"], "--sample 99"),
    (["--input", "missing.npy"], "no such file: missing.npy"),
    (["--algorithm", "mmse", "--quant-config", "x.yaml"], "--quant-config already holds"),
])
def test_bad_options_are_named(demo, capsys, extra, message):
    assert _cli(demo, *extra) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_dataset_is_required(demo, capsys):
    assert main(["accuracy", str(demo["model"])]) == 2
    assert "needs --dataset" in capsys.readouterr().err


def _row(tensor, single, zero=False):
    return accuracy.LayerRow(tensor, "Conv", "int8", tensor, 0.5, 1.0, single, 1.0, golden_zero=zero)


def test_worst_leaves_out_inputs_and_all_zero_tensors():
    rows = [accuracy.LayerRow("x", "Input", "int8", "x", 0.1, 1.0, 0.1, 1.0), _row("dead", 0.0, zero=True),
            _row("a", 0.97), _row("b", 0.99), _row("c", 0.95)]
    report = accuracy.AccuracyReport("m", "rk3588", "int8", rows)
    assert [row.tensor for row in report.worst(2)] == ["c", "a"]
    table = accuracy.format_table(report)
    assert "(float value all zero)" in table and "worst single: [Conv] c 0.95000, [Conv] a 0.97000" in table


def test_plot_leaves_gaps_for_all_zero_tensors(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra is not installed (pip install 'npuemu[plot]')")
    rows = [_row("a", 0.97), _row("dead", 0.0, zero=True), _row("b", 0.99)]
    accuracy.write_plot(accuracy.AccuracyReport("m", "rk3588", "int8", rows), tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_first_departure_of_the_emulator_from_the_simulator():
    rows = [accuracy.LayerRow(t, "Conv", "int8", t, 0.9, 1.0, 0.99, 1.0, 0.9, 1.0, runtime_vs_simulator=value)
            for t, value in (("a", 0.99999), ("b", None), ("c", 0.9990), ("d", 0.5))]
    report = accuracy.AccuracyReport("m", "rk3588", "int8", rows)
    assert report.first_departure().tensor == "c"
    assert "emulated NPU vs simulator: first below 0.9999 at [Conv] c (cos 0.999000;" in accuracy.format_table(report)
    report.rows[2:] = []
    assert report.first_departure() is None and "first below" not in accuracy.format_table(report)


@pytest.mark.parametrize("value, text", [(0.0, "0.0"), (37.6744, "37.674"), (2.578, "2.5780"), (13.2351, "13.235"),
                                         (0.19812, "0.19812"), (12345.6, "12346")])
def test_euclidean_has_five_significant_digits_like_the_vendor(value, text):
    assert accuracy._euc(value) == text
