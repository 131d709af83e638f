"""Compile then run: ONNX -> import -> passes -> int8 quantization -> build (lowering, memory
plan, one chain, model file) -> write -> the emulator runtime loads the file and runs it.

The two halves meet only through the ``.npu`` bytes. Checks per model:
- the emulator's int8 output against the compiler's fake-quant prediction (quantized on the
  output grid): within 1 LSB on >= 99% of the elements;
- the dequantized output against onnxruntime float: cosine >= 0.99.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, Front, build, build_graph, prepare
from npuemu.compiler.quant import fake_quant_evaluate
from npuemu.emulator import cpu_ops
from npuemu.emulator.runtime import Runtime, run_model_file
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import CompileError, EmulationError, InputError, NpuemuError, UnsupportedOpError


# --- model builders ------------------------------------------------------------------------

class Net:
    """A tiny ONNX model builder: convolutions get He-initialized weights from one seed."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def conv(self, name, x, y, cin, cout, kernel=3, stride=1, group=1):
        weights = self.rng.normal(0, (2.0 / (cin // group * kernel * kernel)) ** 0.5,
                                  (cout, cin // group, kernel, kernel)).astype(np.float32)
        bias = self.rng.normal(0, 0.1, cout).astype(np.float32)
        self.inits += [numpy_helper.from_array(weights, f"{name}_W"), numpy_helper.from_array(bias, f"{name}_B")]
        self.node("Conv", [x, f"{name}_W", f"{name}_B"], [y], name, pads=[kernel // 2] * 4,
                  kernel_shape=[kernel, kernel], strides=[stride, stride], group=group)

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))

    def node(self, op, inputs, outputs, name, **attrs):
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))

    def model(self, shape, output) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def conv_relu() -> tuple[onnx.ModelProto, tuple]:
    net = Net(0)
    net.conv("conv1", "x", "c", 3, 8)
    net.node("Relu", ["c"], ["y"], "relu1")
    return net.model([1, 3, 12, 12], "y"), (1, 3, 12, 12)


def small_cnn() -> tuple[onnx.ModelProto, tuple]:
    """conv+relu -> conv+relu -> conv+add(first)+relu -> maxpool -> depthwise+relu -> 1x1 conv."""
    net = Net(1)
    net.conv("c1", "x", "a", 3, 16)
    net.node("Relu", ["a"], ["a1"], "r1")
    net.conv("c2", "a1", "b", 16, 16)
    net.node("Relu", ["b"], ["b1"], "r2")
    net.conv("c3", "b1", "c", 16, 16)
    net.node("Add", ["c", "a1"], ["d"], "add")
    net.node("Relu", ["d"], ["d1"], "r3")
    net.node("MaxPool", ["d1"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2])
    net.conv("dw", "p", "e", 16, 16, group=16)
    net.node("Relu", ["e"], ["e1"], "r4")
    net.conv("c4", "e1", "f", 16, 32, kernel=1)
    return net.model([1, 3, 16, 16], "f"), (1, 3, 16, 16)


def activations_cnn() -> tuple[onnx.ModelProto, tuple]:
    """stride-2 conv+relu6, conv+leaky, 1x1 conv + add (fused residual), avg pool, global avg pool."""
    net = Net(2)
    net.const("lo", 0.0)
    net.const("hi", 6.0)
    net.conv("c1", "x", "a", 3, 16, stride=2)
    net.node("Clip", ["a", "lo", "hi"], ["a1"], "clip")
    net.conv("c2", "a1", "b", 16, 16)
    net.node("LeakyRelu", ["b"], ["b1"], "leaky", alpha=0.1)
    net.conv("c3", "a1", "c", 16, 16, kernel=1)
    net.node("Add", ["b1", "c"], ["d"], "add")
    net.node("AveragePool", ["d"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2])
    net.node("GlobalAveragePool", ["p"], ["g"], "gap")
    return net.model([1, 3, 32, 32], "g"), (1, 3, 32, 32)


def pools_add() -> tuple[onnx.ModelProto, tuple]:
    """Two max pools of one conv output added by a standalone element-wise layer."""
    net = Net(3)
    net.conv("c1", "x", "a", 3, 16)
    net.node("Relu", ["a"], ["a1"], "r1")
    net.node("MaxPool", ["a1"], ["p1"], "p1", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    net.node("MaxPool", ["a1"], ["p2"], "p2", kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    net.node("Add", ["p1", "p2"], ["y"], "add")
    return net.model([1, 3, 12, 12], "y"), (1, 3, 12, 12)


def classifier() -> tuple[onnx.ModelProto, tuple]:
    """conv+relu -> GlobalAveragePool (rewritten as depthwise convs) -> Flatten -> Gemm (a 1x1 conv)
    -> a [1, 10] output viewed from the 1x1 map."""
    net = Net(8)
    net.conv("c1", "x", "a", 3, 16)
    net.node("Relu", ["a"], ["a1"], "r1")
    net.node("GlobalAveragePool", ["a1"], ["g"], "gap")
    net.node("Flatten", ["g"], ["flat"], "flatten", axis=1)
    net.const("fc_w", net.rng.normal(0, 0.3, (10, 16)))
    net.const("fc_b", net.rng.normal(0, 0.1, (10,)))
    net.node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], "fc", transB=1)
    return net.model([1, 3, 8, 8], "y"), (1, 3, 8, 8)


def tiled_cnn() -> tuple[onnx.ModelProto, tuple]:
    """Feature maps large enough that lowering splits layers into several tasks (CBUF tiling)."""
    net = Net(7)
    net.conv("c1", "x", "a", 3, 32, stride=2)
    net.node("Relu", ["a"], ["a1"], "r1")
    net.conv("c2", "a1", "b", 32, 64)
    net.node("Relu", ["b"], ["b1"], "r2")
    net.conv("dw", "b1", "c", 64, 64, group=64)
    net.node("Relu", ["c"], ["c1"], "r3")
    net.conv("c3", "c1", "e", 64, 64)
    net.node("Add", ["e", "b1"], ["f"], "add")
    net.node("Relu", ["f"], ["f1"], "r4")
    net.node("MaxPool", ["f1"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2])
    net.conv("c4", "p", "y", 64, 32, kernel=1)
    return net.model([1, 3, 160, 320], "y"), (1, 3, 160, 320)


# --- the pipeline --------------------------------------------------------------------------

def compile_front(model: onnx.ModelProto, shape: tuple, seed: int = 0, **options) -> Front:
    """The driver's front half (import, level-3 passes, int8 calibrated on 4 normal samples) for
    rk3588; ``options`` are further CompileOptions (sram, batch_size, core_mask...) for build()."""
    rng = np.random.default_rng(seed)
    samples = [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(4)]
    return prepare(model, "rk3588", CompileOptions(dataset=samples, **options))


def compile_graph(model: onnx.ModelProto, shape: tuple, seed: int = 0):
    """The quantized graph of :func:`compile_front` (build it with ``driver.build_graph``)."""
    return compile_front(model, shape, seed).graph


def onnxruntime_float(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def compare(model, shape, path, seed=0):
    """Build, write, run from the file; returns (fraction within 1 LSB, cosine, emulator int8, graph)."""
    front = compile_front(model, shape, seed)
    graph = front.graph
    build(front).write(path)
    x = np.random.default_rng(seed + 100).normal(size=shape).astype(np.float32)
    output = graph.outputs[0]
    stored = run_model_file(path, {"x": x}, dequantize=False)[output]
    quant = graph.tensor(output).quant
    scale, zero_point = float(quant.scale), int(quant.zero_point)
    predicted = np.clip(np.rint(fake_quant_evaluate(graph, {"x": x})[output] / scale) + zero_point, -128, 127)
    within = float(np.mean(np.abs(stored.astype(np.int64) - predicted) <= 1))
    dequantized = scale * (stored.astype(np.float64) - zero_point)
    return within, cosine(dequantized, onnxruntime_float(model, x)), stored, graph


MODELS = {"conv_relu": conv_relu, "small_cnn": small_cnn, "activations_cnn": activations_cnn, "pools_add": pools_add,
          "classifier": classifier, "tiled_cnn": tiled_cnn}


@pytest.mark.parametrize("case", MODELS)
def test_compiled_model_matches_fake_quant_and_float(case, tmp_path) -> None:
    model, shape = MODELS[case]()
    within, cos, stored, graph = compare(model, shape, tmp_path / f"{case}.npu")
    assert stored.dtype == np.int8 and stored.shape == tuple(graph.tensor(graph.outputs[0]).shape)
    assert within >= 0.99, f"{case}: only {within:.4f} of the elements within 1 LSB of fake-quant"
    assert cos >= 0.99, f"{case}: cosine {cos:.5f} against onnxruntime float"
    assert np.unique(stored).size > 4, "a degenerate (near-constant) output would pass trivially"


def test_model_file_contents(tmp_path) -> None:
    model, shape = small_cnn()
    front = compile_front(model, shape)
    graph, built = front.graph, build(front)
    built.write(tmp_path / "m.npu")
    read = ModelFile.read(tmp_path / "m.npu")
    assert read == built
    assert [s.name for s in read.sections] == ["regcmd", "weights"]
    steps = read.schedule()
    assert len(steps) == 1 and steps[0].kind == "npu"
    layers = read.layers()
    assert [layer.name for layer in layers] == [node.layer_name for node in graph.nodes]
    assert sum(layer.task_count for layer in layers) == steps[0].chain.tasks
    regcmd = read.section("regcmd")
    regions = read.memory_map().regions
    assert regions[0].base <= regcmd.load_address < regions[0].base + regions[0].size
    x = read.tensor("x")
    assert x.layout == "NC1HWC2" and x.dtype == "int8" and x.shape == (1, 3, 16, 16)
    assert x.quantization.scale[0] == pytest.approx(float(graph.tensor("x").quant.scale))
    # every feature map lies inside the memory map, and tensors live at the same time never overlap
    tensors = {t.name: t for t in read.tensors()}
    assert set(tensors) >= {"x", graph.outputs[0]}
    assert tensors["x"].address + tensors["x"].size <= tensors[graph.outputs[0]].address or \
        tensors[graph.outputs[0]].address + tensors[graph.outputs[0]].size <= tensors["x"].address


def test_tiled_layers_and_views_in_the_model_file() -> None:
    model, shape = tiled_cnn()
    built = build(compile_front(model, shape))
    counts = {layer.name: layer.task_count for layer in built.layers()}
    assert max(counts.values()) > 1, f"no layer was split into several tasks: {counts}"
    assert built.schedule()[0].chain.tasks == sum(counts.values())
    model, shape = classifier()
    built = build(compile_front(model, shape))
    views = [layer for layer in built.layers() if layer.task_count == 0]
    assert len(views) == 1 and views[0].op_type == "Reshape"
    output, source = built.tensor("y"), built.tensor(views[0].inputs[0])
    assert output.shape == (1, 10) and output.address == source.address and output.native_shape == source.native_shape


def test_int8_input_equals_float_input(tmp_path) -> None:
    model, shape = conv_relu()
    front = compile_front(model, shape)
    graph = front.graph
    build(front).write(tmp_path / "m.npu")
    x = np.random.default_rng(5).normal(size=shape).astype(np.float32)
    scale, zero_point = float(graph.tensor("x").quant.scale), int(graph.tensor("x").quant.zero_point)
    stored = np.clip(np.rint(x / scale) + zero_point, -128, 127).astype(np.int8)
    from_float = run_model_file(tmp_path / "m.npu", {"x": x}, dequantize=False)["y"]
    from_int8 = run_model_file(tmp_path / "m.npu", {"x": stored}, dequantize=False)["y"]
    assert np.array_equal(from_float, from_int8)
    # a different input gives a different output: the runtime really writes the input
    other = run_model_file(tmp_path / "m.npu", {"x": -x}, dequantize=False)["y"]
    assert not np.array_equal(other, from_float)


def test_runtime_native_layout_round_trip(tmp_path) -> None:
    model, shape = small_cnn()  # the 16-channel tensors have C2 padding lanes and a 32-aligned output
    build(compile_front(model, shape)).write(tmp_path / "m.npu")
    runtime = Runtime(ModelFile.read(tmp_path / "m.npu"))
    for name in ("x", "f"):
        tensor = runtime.model.tensor(name)
        values = np.random.default_rng(1).integers(-128, 128, tensor.shape).astype(np.int8)
        runtime.write_native(name, values)
        assert np.array_equal(runtime.read_native(name), values)


def test_runtime_input_errors(tmp_path) -> None:
    model, shape = conv_relu()
    build(compile_front(model, shape)).write(tmp_path / "m.npu")
    x = np.zeros(shape, np.float32)
    with pytest.raises(InputError, match="no value given for input"):
        run_model_file(tmp_path / "m.npu", {})
    with pytest.raises(InputError, match="'z'"):
        run_model_file(tmp_path / "m.npu", {"x": x, "z": x})
    with pytest.raises(InputError, match=r"input 'x': expected shape \[1, 3, 12, 12\]"):
        run_model_file(tmp_path / "m.npu", {"x": np.zeros((1, 3, 12, 13), np.float32)})
    with pytest.raises(InputError, match="int32"):
        run_model_file(tmp_path / "m.npu", {"x": np.zeros(shape, np.int32)})
    with pytest.raises(NpuemuError, match="cannot read"):
        run_model_file(tmp_path / "missing.npu", {"x": x})


def _with_cpu_step(model: ModelFile, step: dict) -> ModelFile:
    trailer = json.loads(json.dumps(model.trailer))
    trailer["schedule"].append(step)
    return ModelFile(model.sections, trailer)


def test_cpu_step_runs_after_the_chain(tmp_path) -> None:
    model, shape = conv_relu()
    built = build(compile_front(model, shape))
    x = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    plain = Runtime(built)
    plain.set_input("x", x)
    plain.run()
    npu = plain.output("y").astype(np.float64)
    with_sigmoid = Runtime(_with_cpu_step(built, {"kind": "cpu", "op": "Sigmoid", "inputs": ["y"], "outputs": ["y"]}))
    with_sigmoid.set_input("x", x)
    with_sigmoid.run()
    scale, zero_point = with_sigmoid.quantization("y")
    expected = np.clip(np.rint(1 / (1 + np.exp(-npu)) / scale) + zero_point, -128, 127)
    assert np.array_equal(with_sigmoid.output("y", dequantize=False), expected)
    unknown = Runtime(_with_cpu_step(built, {"kind": "cpu", "op": "Frobnicate", "inputs": ["y"], "outputs": ["y"]}))
    with pytest.raises(EmulationError, match="'Frobnicate' is not implemented"):
        unknown.run()
    assert "Sigmoid" in cpu_ops.OPS


def test_unquantized_graph_is_a_compile_error() -> None:
    model, _ = conv_relu()
    graph = prepare(model, "rk3588", CompileOptions(precision="float")).graph  # imported and fused only
    with pytest.raises(CompileError, match="conv1_fuse_relu.*not int8 quantized"):
        build_graph(graph)


def test_cli_compile_writes_a_model_file(tmp_path, capsys) -> None:
    from npuemu.tools.cli import main

    model, shape = conv_relu()
    onnx.save(model, tmp_path / "net.onnx")
    rng = np.random.default_rng(0)
    lines = []
    for i in range(3):
        np.save(tmp_path / f"s{i}.npy", rng.normal(size=shape).astype(np.float32))
        lines.append(f"s{i}.npy")
    (tmp_path / "ds.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "net.npu"
    code = main(["compile", str(tmp_path / "net.onnx"), "--quantize", "--dataset", str(tmp_path / "ds.txt"),
                 "--no-progress", "-o", str(out)])
    assert code == 0 and out.exists()
    assert "wrote" in capsys.readouterr().out
    x = rng.normal(size=shape).astype(np.float32)
    got = run_model_file(out, {"x": x})["y"]
    assert cosine(got, onnxruntime_float(model, x)) >= 0.99
    # without quantization -o is refused with the reason
    code = main(["compile", str(tmp_path / "net.onnx"), "-o", str(tmp_path / "other.npu")])
    assert code != 0 and not (tmp_path / "other.npu").exists()
    assert "-o needs a quantized graph" in capsys.readouterr().err
    # --fp16 builds a float16 model file
    half = tmp_path / "half.npu"
    assert main(["compile", str(tmp_path / "net.onnx"), "--fp16", "-o", str(half)]) == 0
    got = run_model_file(half, {"x": x})["y"]
    assert cosine(got, onnxruntime_float(model, x)) >= 0.99999
