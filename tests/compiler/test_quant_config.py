"""The per-layer quantization config (compiler/quant/config.py) and the command line around it
(``npuemu quant-config``, ``npuemu compile --quantize / --fp16 / --quant-config``): write,
edit, read back, build, and every refusal naming the file, line and key path."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import helper

from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.quant import convert_op
from npuemu.compiler.quant.calibrate import calibrate
from npuemu.compiler.quant.config import config_from_ranges, dump_config, read_config, write_config
from npuemu.compiler.quant.images import encode_png
from npuemu.compiler.quant.pipeline import quantize_from_config
from npuemu.compiler.quant.preprocess import InputPreprocess
from npuemu.compiler.quant.quantize import quantize_graph
from npuemu.compiler.quant.synthetic import synthetic_image
from npuemu.isa.errors import ConfigError
from npuemu.tools.cli import main


@pytest.fixture
def model(onnx_case):
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Conv", ["p1", "w3"], ["c3"], pads=[1, 1, 1, 1], name="conv3"),
             helper.make_node("Concat", ["c2", "c3"], ["y"], axis=1, name="cat")]
    inits = {"w1": rng.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32), "b1": rng.normal(0, 0.1, 6).astype(np.float32),
             "w2": rng.normal(0, 0.2, (4, 6, 3, 3)).astype(np.float32)}
    inits["w3"] = inits["w2"][::-1] * np.float32(1.1)
    return onnx_case.model(nodes, {"x": [1, 3, 8, 8]}, ["y"], inits)


def samples():
    return [{"x": np.random.default_rng(seed).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)} for seed in range(4)]


@pytest.fixture
def config_file(model, tmp_path):
    graph = import_onnx(model)
    ranges = calibrate(graph, samples(), "normal", progress=False).ranges
    config = config_from_ranges(graph, ranges, preprocess={"x": InputPreprocess((127.5,), (127.5,))},
                                algorithm="normal", model="net.onnx", target="rk3588")
    path = tmp_path / "cfg.yaml"
    write_config(config, graph, path)
    return path, ranges


def test_round_trip_builds_what_calibration_would(model, config_file):
    path, ranges = config_file
    text = path.read_text()
    assert '"p1": {shares: "r1"}' in text and '"c3": {shares: "c2"}' in text and "dtype: int8" in text
    direct = import_onnx(model)
    quantize_graph(direct, ranges)
    graph = import_onnx(model)
    config = read_config(path, graph)
    assert config.preprocess["x"] == InputPreprocess((127.5,), (127.5,)) and config.algorithm == "normal"
    assert dump_config(config, graph) == text  # read + write is the identity
    result = quantize_from_config(graph, config)
    for name, tensor in direct.tensors.items():
        ours = graph.tensors[name].quant
        assert (ours is None) == (tensor.quant is None), name
        if ours is not None:
            assert np.array_equal(ours.scale, tensor.quant.scale) and np.array_equal(ours.zero_point, tensor.quant.zero_point)
    assert result.preprocess["x"].mean == (127.5,)


def test_edits_a_layer_to_float16_and_a_range(model, config_file):
    path, _ = config_file
    text = path.read_text()
    text = text.replace('  "conv2":\n    op: "Conv"\n    dtype: int8', '  "conv2":\n    op: "Conv"\n    dtype: float16')
    text = re.sub(r'"r1": \{min: [^}]*\}', '"r1": {min: 0.0, max: 0.5}', text)
    path.write_text(text)
    graph = import_onnx(model)
    config = read_config(path, graph)
    result = quantize_from_config(graph, config)
    assert result.layer_dtypes["conv2"] == "float16" and result.mode == "hybrid"
    assert float(graph.tensors["r1"].quant.scale) == pytest.approx(0.5 / 255)
    assert float(graph.tensors["p1"].quant.scale) == pytest.approx(0.5 / 255)  # shares r1's edited range
    converts = [node for node in graph.nodes if node.op_type == convert_op.OP_TYPE]
    assert [(node.inputs[0], node.attrs["to"]) for node in converts] == [("p1", "float16"), ("c2", "int8")]


def test_scale_and_zero_point_alone(model, config_file):
    path, _ = config_file
    text = re.sub(r'"c1": \{min: [^}]*\}', '"c1": {scale: 0.01, zero_point: 3}', path.read_text())
    path.write_text(text)
    graph = import_onnx(model)
    quantize_from_config(graph, read_config(path, graph))
    quant = graph.tensors["c1"].quant
    assert float(quant.scale) == pytest.approx(0.01) and int(quant.zero_point) == 3


def edit(path, old: str, new: str, *, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, count))


def line_of(path, needle: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize("old,new,needle,message", [
    ('  "pool1":', '  "pool9":', '"pool9"', "layers.pool9: no layer of that name in the model"),
    ('    dtype: int8\n    outputs:\n      "c1"', '    dtype: int8\n    dtyp: int8\n    outputs:\n      "c1"', "dtyp: ",
     "layers.conv1.dtyp: unknown key; expected one of op, dtype, outputs"),
    ('weights: per-channel', 'weights: per-channel\nextra: 1', "extra", "extra: unknown key; expected one of version"),
    ('    dtype: int8\n    outputs:\n      "c1"', '    dtype: int4\n    outputs:\n      "c1"', "int4",
     "layers.conv1.dtype: 'int4'; expected one of int8, float16"),
    ('"p1": {shares: "r1"}', '"p1": {shares: "r1", min: 0.0}', '"p1"', "'shares' stands alone"),
    ('"p1": {shares: "r1"}', '"p1": {shares: "nope"}', None, "tensor 'p1' shares 'nope', which has no entry"),
    ('"p1": {shares: "r1"}', '"p1": {mean: 1}', '"p1"', "layers.pool1.outputs.p1.mean: unknown key; expected one of min"),
    ('op: "MaxPool"', 'op: "AveragePool"', "AveragePool", "layers.pool1.op: 'AveragePool' does not match the model's layer (MaxPool)"),
    ('"p1": {shares: "r1"}', '"p9": {shares: "r1"}', '"p9"', "layers.pool1.outputs.p9: not an output of this layer"),
    ('"p1": {shares: "r1"}', '"p1": {min: 1.0, max: 2.0}', '"p1"', "min 1.0 / max 2.0: expected min <= 0 <= max"),
    ('"p1": {shares: "r1"}', '"p1": {min: -1.0, max: 2.0, scale: 0.5, zero_point: 0}', '"p1"',
     "scale/zero_point 0.5/0 do not match min/max"),
    ('"p1": {shares: "r1"}', '"p1": {min: -1.0}', '"p1"', "'min' needs its partner 'max'"),
    ('"p1": {shares: "r1"}', '"p1": {min: low, max: 2.0}', '"p1"', "layers.pool1.outputs.p1.min: 'low'; expected a finite number"),
    ('"p1": {shares: "r1"}', '"p1": {scale: 0.1, zero_point: 300}', '"p1"', "an integer zero_point in -128..127"),
    ('version: 1', 'version: 7', "version", "version: 7 is not supported; expected 1"),
    ('weights: per-channel', 'weights: per-tensor', "weights:", "weights: 'per-tensor'; expected one of per-channel, per-layer"),
    ('  "x":\n', '  "z":\n', '"z"', "inputs.z: the model has no float input of that name"),
    ('mean: [127.5]', 'mean: [1.0, 2.0]', "preprocess", "mean has 2 values; the input has 3 channels"),
    ('  "pool1":', '  "conv1":', None, "duplicate key 'conv1'"),
    ('version: 1', 'version: [1', None, "invalid YAML"),
])
def test_config_errors_name_file_line_and_key(model, config_file, old, new, needle, message):
    path, _ = config_file
    edit(path, old, new)
    with pytest.raises(ConfigError) as caught:
        read_config(path, import_onnx(model))
    text = str(caught.value)
    assert text.startswith(str(path)) and message in text, text
    if needle is not None:
        assert f"line {line_of(path, needle)}:" in text, text


def test_missing_layer_or_tensor(model, config_file):
    path, _ = config_file
    text = path.read_text()
    start = text.index('  "conv3":')
    path.write_text(text[:start] + text[text.index('  "cat":'):])
    with pytest.raises(ConfigError, match=re.escape("layers: missing layer(s) ['conv3']")):
        read_config(path, import_onnx(model))
    path.write_text(text.replace('      "c1": {', '      # "c1": {'))
    with pytest.raises(ConfigError, match=re.escape("layers.conv1.outputs: missing tensor 'c1'")):
        read_config(path, import_onnx(model))
    with pytest.raises(ConfigError, match="no such quant config file"):
        read_config(path.with_name("none.yaml"), import_onnx(model))


# ---- command line ------------------------------------------------------------------------------

@pytest.fixture
def files(model, tmp_path):
    onnx.save(model, str(tmp_path / "net.onnx"))
    lines = []
    for index in range(4):
        (tmp_path / f"{index}.png").write_bytes(encode_png(synthetic_image(8, 8, index)))
        lines.append(f"{index}.png")
    (tmp_path / "ds.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_quant_config_then_compile(files, capsys):
    model, dataset, config = files / "net.onnx", files / "ds.txt", files / "cfg.yaml"
    assert main(["quant-config", str(model), "-t", "rk3568", "--dataset", str(dataset), "--mean", "127.5",
                 "--std", "127.5", "--algorithm", "mmse", "-o", str(config)]) == 0
    # conv1 + relu1 fused by the passes; the 4+4 channel Concat is two placement convs (concat_as_convs)
    assert "cfg.yaml: 6 layers" in capsys.readouterr().out
    text = config.read_text()
    assert 'target: "rk3568"' in text and 'algorithm: "mmse"' in text and "weight_clipping: mmse" in text
    edit(config, '  "conv3":\n    op: "Conv"\n    dtype: int8', '  "conv3":\n    op: "Conv"\n    dtype: float16')
    assert main(["compile", str(model), "--quant-config", str(config), "--dump-ir", "-"]) == 0
    out = capsys.readouterr().out
    assert "DataConvert" in out and "c3 f32[1,4,4,4] q=f16" in out


def test_compile_quantize_and_fp16(files, capsys):
    model, dataset = files / "net.onnx", files / "ds.txt"
    assert main(["compile", str(model), "--quantize", "--dataset", str(dataset), "--per-layer", "--bgr"]) == 0
    assert "quantized int8: 6 int8 layer(s), 0 float16 layer(s), weights per-layer, calibration normal" in \
        capsys.readouterr().out
    assert main(["compile", str(model), "--fp16", "--dump-ir", "-"]) == 0
    assert "y f32[1,8,4,4] q=f16(s=1,zp=0)" in capsys.readouterr().out


@pytest.mark.parametrize("arguments,message", [
    (["compile", "{model}", "--quantize"], "--quantize needs a calibration dataset"),
    (["compile", "{model}", "--fp16", "--dataset", "{dataset}"], "--fp16 does not calibrate"),
    (["compile", "{model}", "--quant-config", "{dataset}", "--mean", "1"], "--quant-config already holds the ranges"),
    (["compile", "{model}", "--algorithm", "mmse"], "apply to calibration: add --quantize --dataset"),
    (["compile", "{model}", "--quant-config", "{dir}/none.yaml"], "none.yaml: no such quant config file"),
    (["compile", "{model}", "--dataset", "{dir}/none.txt"], "none.txt: no such dataset file"),
    (["quant-config", "{model}", "-o", "{dir}/c.yaml"], "quant-config calibrates the model: give --dataset"),
])
def test_command_line_errors(files, capsys, arguments, message):
    values = {"model": files / "net.onnx", "dataset": files / "ds.txt", "dir": files}
    assert main([argument.format(**values) for argument in arguments]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
