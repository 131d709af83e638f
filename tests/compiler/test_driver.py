"""The compiler driver (compiler/driver.py): one pipeline for the CLI and the library.

- ``compile_model`` writes the same bytes as ``npuemu compile`` for the same options;
- ``prepare`` + ``build`` are ``compile_model`` split in two (the graph readable in between);
- samples in memory calibrate like a dataset file of the same arrays;
- every option a build cannot honour is a ConfigError naming it, before any work.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build, build_graph, compile_model, prepare
from npuemu.emulator.runtime import Runtime
from npuemu.isa.errors import CompileError, ConfigError
from npuemu.tools.cli import main


def _model(seed: int = 0):
    """Conv+Relu -> Sigmoid -> MaxPool on a [1, 3, 12, 10] input."""
    rng = np.random.default_rng(seed)
    weights = numpy_helper.from_array(rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["r"], ["s"], name="sigmoid"),
             helper.make_node("MaxPool", ["s"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weights, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("driver")
    model = folder / "net.onnx"
    model.write_bytes(_model().SerializeToString())
    rng = np.random.default_rng(5)
    lines = []
    for i in range(3):
        np.save(folder / f"s{i}.npy", rng.normal(0, 1, (1, 3, 12, 10)).astype(np.float32))
        lines.append(f"s{i}.npy")
    (folder / "ds.txt").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.parametrize("flags, options", [
    (["--quantize", "--dataset", "{ds}"], {"dataset": "{ds}"}),
    (["--fp16"], {"precision": "fp16"}),
    (["--quantize", "--dataset", "{ds}", "--core-mask", "0_1_2", "--sram", "-O", "1", "--algorithm", "mmse"],
     {"dataset": "{ds}", "core_mask": "0_1_2", "sram": True, "optimization_level": 1, "algorithm": "mmse"}),
    (["--quantize", "--dataset", "{ds}", "--batch-size", "2", "--mean", "1,2,3", "--std", "2"],
     {"dataset": "{ds}", "batch_size": 2, "mean": ("1,2,3",), "std": ("2",)}),
])
def test_compile_model_writes_the_cli_bytes(files, flags, options, capsys):
    ds = str(files / "ds.txt")
    out = files / "cli.npu"
    flags = [flag.replace("{ds}", ds) for flag in flags]
    assert main(["compile", str(files / "net.onnx"), *flags, "--no-progress", "-o", str(out)]) == 0
    capsys.readouterr()
    options = {key: value.replace("{ds}", ds) if isinstance(value, str) else value for key, value in options.items()}
    model = compile_model(files / "net.onnx", "rk3588", CompileOptions(name="net", **options))
    path = files / "api.npu"
    model.write(path)
    assert path.read_bytes() == out.read_bytes()


def test_prepare_then_build_is_compile_model(files):
    options = CompileOptions(dataset=files / "ds.txt")
    front = prepare(files / "net.onnx", "rk3588", options)
    assert front.quantization is not None and front.partition.count("NPU") >= 2
    assert [t for t in front.graph.tensors.values() if t.quant is not None]  # quantized in place
    split = build(front).to_bytes()
    whole = compile_model(files / "net.onnx", "rk3588", options).to_bytes()
    assert split == whole


def test_samples_in_memory_calibrate_like_the_dataset_file(files):
    samples = [{"x": np.load(files / f"s{i}.npy")} for i in range(3)]
    from_memory = compile_model(files / "net.onnx", "rk3588", CompileOptions(dataset=samples)).to_bytes()
    from_file = prepare(files / "net.onnx", "rk3588", CompileOptions(dataset=files / "ds.txt"))
    from_file.preprocess = {}  # a dataset file records its (identity) preprocessing; memory samples have none
    assert from_memory == build(from_file).to_bytes()


def test_fp16_samples_in_memory_and_the_model_runs(files):
    samples = [{"x": np.load(files / "s0.npy")}]
    model = compile_model(files / "net.onnx", "rk3588", CompileOptions(precision="fp16", dataset=samples))
    runtime = Runtime(model)
    runtime.set_input("x", samples[0]["x"])
    runtime.run()
    assert runtime.output("y").shape == (1, 8, 6, 5)


def test_build_graph_takes_a_prepared_graph_and_its_options(files):
    front = prepare(files / "net.onnx", "rk3588", CompileOptions(dataset=files / "ds.txt"))
    model = build_graph(front.graph, "rk3588", CompileOptions(core_mask="0_1", name="probe"))
    assert model.trailer["graph"]["name"] == "probe"
    assert model.trailer["compiler"]["options"]["core_mask"] == "0_1"
    assert {step.core for step in model.schedule() if step.kind == "npu"} == {0, 1}


def test_a_float_front_builds_no_model_file(files):
    front = prepare(files / "net.onnx", "rk3588", CompileOptions(precision="float"))
    assert front.quantization is None
    with pytest.raises(CompileError, match="needs a quantized graph"):
        build(front)


@pytest.mark.parametrize("options, message", [
    ({"precision": "int4"}, "precision 'int4'"),
    ({"precision": "hybrid"}, "quant config"),
    ({"quant_config": "c.yaml"}, "quant config"),
    ({"batch_size": 0}, "batch size 0"),
    ({"batch_size": 2, "core_mask": "0_1"}, "cannot be combined"),
])
def test_options_a_build_cannot_honour_are_refused_at_once(options, message):
    with pytest.raises(ConfigError, match=message):
        CompileOptions(**options)


@pytest.mark.parametrize("options, message", [
    ({}, "needs a calibration dataset"),
    ({"precision": "fp16", "dataset": "{ds}"}, "--fp16 does not calibrate"),
    ({"precision": "fp16", "algorithm": "mmse"}, "--fp16 does not calibrate"),
    ({"precision": "float", "per_channel": False}, "apply to calibration"),
    ({"dataset": [{"x": np.zeros((1, 3, 12, 10), np.float32)}], "mean": ("1",)}, "used as they are"),
    ({"dataset": "{ds}", "core_mask": "0_1_2_3"}, "core-mask"),
])
def test_calibration_and_core_options_are_checked(files, options, message):
    options = {key: str(files / "ds.txt") if value == "{ds}" else value for key, value in options.items()}
    with pytest.raises(ConfigError, match=message):
        compile_model(files / "net.onnx", "rk3588", CompileOptions(**options))


def test_an_unknown_target_fails_before_the_import(tmp_path):
    with pytest.raises(ConfigError):
        prepare(tmp_path / "missing.onnx", "rk9999", CompileOptions(precision="float"))
