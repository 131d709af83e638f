"""`npuemu accuracy` wording and plot labels (issue 21 item 2): the output lines say which column
is the float fake-quant simulator and which the bit-exact emulated NPU; the PNG's x axis names
layers (thinned when there are many), not tensor ids."""

from __future__ import annotations

from npuemu.tools import accuracy


def _row(name: str, tensor: str) -> accuracy.LayerRow:
    return accuracy.LayerRow(name, "Conv", "int8", tensor, 0.99, 1.0, 0.99, 1.0, 0.99, 1.0,
                             runtime_vs_simulator=0.99999)


def _report(rows, outputs=()) -> accuracy.AccuracyReport:
    return accuracy.AccuracyReport("m.onnx", "rk3588", "int8", rows, list(outputs))


def test_output_line_names_each_column() -> None:
    match = accuracy.OutputMatch("y", 0.98, 0.97, 0.9995, 56.0)
    text = accuracy.format_table(_report([_row("conv_1", "12")], [match]))
    assert "simulator (fake-quant, float arithmetic) 0.98000" in text
    assert "emulated NPU (bit-exact) 0.97000" in text
    assert "max difference 56.0 LSB of the output scale (the simulator's float rounding, not an emulation error" in text
    assert "it is not the exact prediction" in text  # the header says it once for the table


def test_ticks_are_layer_names_thinned_when_many() -> None:
    few = [_row(f"conv_{i}", str(100 + i)) for i in range(5)]
    assert accuracy.tick_layers(few) == [(i, f"conv_{i}") for i in range(5)]
    many = [_row(f"layer_{i}", str(i)) for i in range(250)]
    ticks = accuracy.tick_layers(many)
    assert len(ticks) <= accuracy.MAX_TICK_LABELS + 1
    assert ticks[0] == (0, "layer_0") and ticks[-1] == (249, "layer_249")
    assert all(name.startswith("layer_") for _, name in ticks)


def test_plot_labels_layers(tmp_path) -> None:
    import pytest

    if not accuracy.plot_available():
        pytest.skip("matplotlib (the plot extra) is not installed")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = [_row(f"conv_{i}", str(100 + i)) for i in range(3)]
    figure, axes = pyplot.subplots()
    accuracy._layer_ticks(axes, rows)
    assert [label.get_text() for label in axes.get_xticklabels()] == ["conv_0", "conv_1", "conv_2"]
    assert axes.get_xticklabels()[0].get_rotation() == 60
    pyplot.close(figure)
    accuracy.write_plot(_report(rows), tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
