"""``npuemu sweep`` with ``values: true`` (tools/sweep_values.py): every row of a build carries the
cosine and the largest absolute error of its emulated outputs against the float ONNX model on the
dataset's first samples; points differing only in a timing figure share them; without a dataset
the sweep file is refused."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.tools.cli import main
from npuemu.tools.sweep_rows import read_rows
from tests.tools.test_sweep import _sweep, folder  # noqa: F401 (the module's layout of net.onnx and ds/)


VALUES = """models: [net.onnx]
dtype: [int8, fp16]
dataset: ds/dataset.txt
values: true
values_samples: 2
set:
  ddr.read_bytes_per_cycle: [3.0, 6.0]
"""


def test_values_give_output_cosine_per_row(folder):
    code, rows = _sweep(folder, VALUES, "values", "--workers", "2")
    assert code == 0 and len(rows) == 4 and not any(row["error"] for row in rows)
    for row in rows:
        assert row["output_cosine"] and row["output_max_abs_error"]
        assert float(row["output_max_abs_error"]) >= 0.0
    by_dtype: dict[str, list[dict]] = {}
    for row in rows:
        by_dtype.setdefault(row["dtype"], []).append(row)
    assert all(float(row["output_cosine"]) >= 0.999 for row in by_dtype["fp16"])
    assert all(float(row["output_cosine"]) >= 0.9 for row in by_dtype["int8"])
    for pair in by_dtype.values():  # only the DDR figure differs: one build, one emulation, equal values
        assert len(pair) == 2 and pair[0]["build"] == pair[1]["build"]
        assert pair[0]["ddr_cycles"] != pair[1]["ddr_cycles"]
        assert (pair[0]["output_cosine"], pair[0]["output_max_abs_error"]) == \
            (pair[1]["output_cosine"], pair[1]["output_max_abs_error"])


def test_values_equal_the_float_model_by_hand(folder):
    """The fp16 row's figures are those of `Runtime` against `evaluate` on the first sample."""
    from npuemu.compiler.driver import CompileOptions, compile_model
    from npuemu.compiler.float_eval import evaluate
    from npuemu.compiler.onnx_import import import_onnx
    from npuemu.emulator.runtime import Runtime
    from npuemu.isa.container import ModelFile

    code, rows = _sweep(folder, "models: [net.onnx]\ndtype: fp16\ndataset: ds/dataset.txt\nvalues: true\n",
                        "values_one")
    assert code == 0 and len(rows) == 1
    sample = np.load(folder / "ds" / "s0.npy").astype(np.float32)
    graph = import_onnx(str(folder / "net.onnx"))
    name = graph.inputs[0]
    sample = sample.reshape(graph.tensors[name].shape)
    expected = evaluate(graph, {name: sample})
    runtime = Runtime(ModelFile.from_bytes(compile_model(str(folder / "net.onnx"), "rk3588",
                                                         CompileOptions(precision="fp16", name="net")).to_bytes()))
    runtime.set_input(name, sample)
    runtime.run()
    out = runtime.outputs[0]
    a, b = runtime.output(out).astype(np.float64).ravel(), np.asarray(expected[out], np.float64).ravel()
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert float(rows[0]["output_cosine"]) == pytest.approx(cosine, abs=2e-6)
    assert float(rows[0]["output_max_abs_error"]) == pytest.approx(float(np.abs(a - b).max()), abs=2e-6)


def test_without_values_there_are_no_value_columns(folder):
    _, rows = _sweep(folder, "models: [net.onnx]\ndtype: fp16\n", "no_values")
    assert "output_cosine" not in rows[0] and "output_max_abs_error" not in rows[0]


def test_values_without_a_dataset_is_refused(folder, capsys):
    spec = folder / "values_no_dataset.yaml"
    spec.write_text("models: [net.onnx]\ndtype: fp16\nvalues: true\n")
    code = main(["sweep", str(spec), "-o", str(folder / "values_no_dataset.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "values: true" in err and "dataset:" in err
    assert not (folder / "values_no_dataset.csv").exists()


@pytest.mark.parametrize("text, words", [("values: yes please\n", "values: expected true or false"),
                                          ("values: true\nvalues_samples: 0\n", "values_samples")])
def test_bad_values_keys_are_refused(folder, capsys, text, words):
    spec = folder / "values_bad.yaml"
    spec.write_text("models: [net.onnx]\ndtype: fp16\ndataset: ds/dataset.txt\n" + text)
    code = main(["sweep", str(spec), "-o", str(folder / "values_bad.csv")])
    assert code == 2 and words in capsys.readouterr().err


def test_batch_builds_are_fed_the_sample_per_slice(folder):
    code, rows = _sweep(folder, "models: [net.onnx]\ndtype: fp16\ndataset: ds/dataset.txt\nvalues: true\n"
                        "batch_size: [1, 2]\n", "values_batch")
    assert code == 0 and not any(row["error"] for row in rows), rows
    assert rows[0]["output_cosine"] == rows[1]["output_cosine"]
    assert read_rows(folder / "values_batch.csv") == rows


def test_ray_backend_gives_the_local_values(folder):
    """The value columns are computed in the build task, where the build is emulated: the Ray
    backend gives the local rows' values."""
    pytest.importorskip("ray")
    text = "models: [net.onnx]\ndtype: [int8, fp16]\ndataset: ds/dataset.txt\nvalues: true\n"
    _, local = _sweep(folder, text, "values_local", "--workers", "1")
    code, on_ray = _sweep(folder, text, "values_ray", "--backend", "ray", "--workers", "2")
    figures = ("point", "output_cosine", "output_max_abs_error", "cycles", "error")
    assert code == 0 and len(on_ray) == 2
    assert sorted(tuple(r[k] for k in figures) for r in on_ray) == sorted(tuple(r[k] for k in figures) for r in local)
    assert all(r["output_cosine"] for r in on_ray)
