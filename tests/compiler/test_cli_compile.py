"""``npuemu compile``: input shapes, IR and JSON dumps, errors without tracebacks."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from npuemu.tools.cli import main


@pytest.fixture
def model_path(onnx_case, rand, tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = onnx_case.model(nodes, {"x": ["N", 3, "H", "W"]}, ["y"], {"w": rand([4, 3, 3, 3])})
    path = tmp_path / "net.onnx"
    onnx.save(model, str(path))
    return path


def test_dump_ir_to_stdout(model_path, capsys):
    # -O 0: the imported graph as it is (the passes' own CLI tests are in test_pass_cli.py)
    assert main(["compile", str(model_path), "--input-shape", "x=1,3,8,8", "--dump-ir", "-", "-O", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("graph 'test'")
    assert "0 Conv  conv  (x f32[1,3,8,8], w const f32[4,3,3,3]) -> (c f32[1,4,8,8])" in out
    assert "1 Relu  relu  (c f32[1,4,8,8]) -> (y f32[1,4,8,8])" in out


def test_dump_ir_without_value_means_stdout(model_path, capsys):
    assert main(["compile", str(model_path), "--input-shape", "1,3,4,4", "--dump-ir"]) == 0
    assert "x f32[1,3,4,4]" in capsys.readouterr().out


def test_dump_files_and_summary(model_path, tmp_path, capsys):
    ir_file, json_file = tmp_path / "net.ir", tmp_path / "net.json"
    code = main(["compile", str(model_path), "-t", "rk3568", "--input-shape", "x=2,3,6,10",
                 "--dump-ir", str(ir_file), "--dump-json", str(json_file), "--optimization-level", "0"])
    assert code == 0
    assert "y f32[2,4,6,10]" in ir_file.read_text()
    document = json.loads(json_file.read_text())
    assert document["input_names"] == ["x"] and len(document["layers"]) == 2
    assert "2 layers" in capsys.readouterr().out


def test_missing_dynamic_dims_is_a_clean_error(model_path, capsys):
    assert main(["compile", str(model_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("npuemu compile: error: ")
    assert "input 'x' dim 0 ('N') is dynamic" in err and "Traceback" not in err


def test_malformed_file_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(np.arange(64, dtype=np.uint8).tobytes())
    assert main(["compile", str(bad), "--dump-ir", "-"]) == 2
    assert "bad.onnx" in capsys.readouterr().err


def test_bad_shape_spec_is_an_argument_error(model_path, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["compile", str(model_path), "--input-shape", "x=1,three"])
    assert caught.value.code == 2
    assert "expected NAME=D0,D1" in capsys.readouterr().err


def test_unnamed_shape_needs_a_single_input(model_path, capsys):
    assert main(["compile", str(model_path), "--input-shape", "1,3,8,8", "--input-shape", "x=1,3,8,8"]) == 2
    assert "only allowed once" in capsys.readouterr().err


def test_unknown_target_chip_is_a_clean_error(model_path, capsys):
    assert main(["compile", str(model_path), "-t", "rk9999", "--input-shape", "x=1,3,8,8"]) == 2
    err = capsys.readouterr().err
    assert "rk9999" in err and "Traceback" not in err
