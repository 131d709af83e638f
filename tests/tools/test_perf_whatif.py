"""``npuemu perf`` with --core-mask / --sram / --batch-size (tools/cmd_perf.py): a .npu is checked
against what it was built with; an ONNX model is compiled in memory with them, and its report
equals that of ``npuemu compile -o`` + ``npuemu perf`` on the written file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.shared_data import RKNN_FIXTURES
from npuemu.tools.cli import main


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (16, 8, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.2, (16, 16, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.zeros(16, np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "whatif", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path_factory.mktemp("whatif") / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def _perf_json(capsys, *argv) -> dict:
    assert main(["perf", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _error(capsys, *argv) -> str:
    assert main(["perf", *map(str, argv)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_onnx_what_if_equals_compile_then_perf(onnx_model, tmp_path, capsys):
    whatif = _perf_json(capsys, onnx_model, "--fp16", "--core-mask", "0_1_2")
    assert whatif["notes"][0].startswith("compiled in memory for rk3588 with --core-mask 0_1_2 (cores 0, 1, 2)")
    assert all(set(layer["workload"]) == {"0", "1", "2"} for layer in whatif["layers"])
    npu = tmp_path / "m3.npu"
    assert main(["compile", str(onnx_model), "--fp16", "--core-mask", "0_1_2", "-o", str(npu)]) == 0
    capsys.readouterr()
    built = _perf_json(capsys, npu, "--core-mask", "0_1_2")  # the flags match the build: runs as today
    assert [layer | {"full_name": ""} for layer in built["layers"]] == \
        [layer | {"full_name": ""} for layer in whatif["layers"]]
    assert built["totals"] == whatif["totals"]
    one_core = _perf_json(capsys, onnx_model, "--fp16")
    assert one_core["totals"]["cycles"] > whatif["totals"]["cycles"]
    assert all(set(layer["workload"]) <= {"0"} for layer in one_core["layers"])


def test_npu_with_other_settings_names_the_build_and_the_command(onnx_model, tmp_path, capsys):
    npu = tmp_path / "m.npu"
    assert main(["compile", str(onnx_model), "--fp16", "-o", str(npu)]) == 0
    capsys.readouterr()
    assert _perf_json(capsys, npu, "--core-mask", "0")["totals"]["tasks"] == 2  # auto = core 0, as built
    err = _error(capsys, npu, "--core-mask", "0_1")
    assert "m.npu was built with --core-mask auto (core 0), without --sram" in err
    assert "npuemu compile MODEL.onnx -t rk3588 --core-mask 0_1" in err
    assert "npuemu perf MODEL.onnx -t rk3588 --core-mask 0_1" in err
    err = _error(capsys, npu, "--sram")
    assert "without --sram" in err and "--core-mask auto --sram" in err
    assert "with --core-mask auto (core 0), without --sram, --batch-size 2" in _error(capsys, npu, "--batch-size", "2")
    assert "--fp16: options for compiling an ONNX model" in _error(capsys, npu, "--fp16")
    assert "--target: options for compiling an ONNX model" in _error(capsys, npu, "-t", "rk3562")


def test_onnx_int8_with_sram_on_rk3562(onnx_model, tmp_path, capsys):
    np.save(tmp_path / "s.npy", np.random.default_rng(1).normal(size=(1, 8, 24, 24)).astype(np.float32))
    (tmp_path / "ds.txt").write_text("s.npy\n")
    common = (onnx_model, "-t", "rk3562", "--dataset", tmp_path / "ds.txt", "--no-progress")
    sram = _perf_json(capsys, *common, "--sram")
    ddr = _perf_json(capsys, *common)
    assert sram["platform"] == "rk3562" and "with --sram" in sram["notes"][0]
    assert sram["totals"]["sram_hit_bytes"] > 0 == ddr["totals"]["sram_hit_bytes"]
    assert sram["totals"]["ddr_read_bytes"] < ddr["totals"]["ddr_read_bytes"]


def test_onnx_user_errors(onnx_model, capsys):
    assert "needs a precision: --quantize --dataset ds.txt, --fp16" in _error(capsys, onnx_model)
    assert "rk3562 has 1 NPU core(s)" in _error(capsys, onnx_model, "-t", "rk3562", "--fp16", "--core-mask", "0_1")
    assert "chip given with -t CHIP" in _error(capsys, onnx_model, "--fp16", "--platform", "rk3562")
    assert "no such ONNX file" in _error(capsys, onnx_model.with_name("missing.onnx"), "--fp16")
    rknn = RKNN_FIXTURES / "rep01_conv3x3s1_32to32_56_relu" / "model.rknn"
    assert "a vendor .rknn file runs as built" in _error(capsys, rknn, "--sram")
