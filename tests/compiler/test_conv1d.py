"""1-D layers on [1, C, L] tensors (issue 18 item 5): Conv1d, MaxPool1d, AveragePool1d and
GlobalAveragePool run as height-1 2-D NPU layers on [1, C, 1, L] (passes/lift_1d.py, the vendor's
``unsqueeze_to_4d_conv``, rknn-fixtures-ops conv1d_int8), and element-wise layers on 3-D tensors.

Checked: the pass's graph (the region lifted, Reshapes only at its edges, the float IR equal to
onnxruntime); built models with the 1-D layers as NPU tasks (the 2-D registers: DATAIN_HEIGHT 1,
weight height 1); int8 bit for bit against the testing kit's independent reference of the built
model (tools/testing_reference.reference_model) and by cosine against onnxruntime; float16
against onnxruntime; ``npuemu perf``'s table showing them as NPU layers with cycles."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.build import build_model
from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.quant import calibrate, float16_graph, quantize_graph
from npuemu.emulator.runtime import Runtime
from npuemu.tools.testing_reference import reference_model


def onnx_model(nodes, inits: dict, in_shape, out_shape, extra_inputs=()):
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
              for name, shape in (("x", in_shape), *extra_inputs)]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def ort_run(model, feeds: dict) -> np.ndarray:
    import onnxruntime as ort
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def build(model, mode: str, feeds_shape: dict, seed: int = 0, level: int = 3):
    """(graph, model file) of ``model`` in ``mode`` int8 (calibrated on 4 normal samples) or float16."""
    graph = import_onnx(model)
    optimize(graph, PassContext.for_chip("rk3588", level, element_bytes=1 if mode == "int8" else 2),
             check_every_pass=True)
    rng = np.random.default_rng(seed)
    if mode == "int8":
        samples = [{name: rng.normal(0, 1, shape).astype(np.float32) for name, shape in feeds_shape.items()}
                   for _ in range(4)]
        quantize_graph(graph, calibrate(graph, samples, "normal", progress=False).ranges)
    else:
        float16_graph(graph)
    return graph, build_model(graph)


def run(model, feeds: dict) -> Runtime:
    runtime = Runtime(model)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return runtime


def check_against_references(model_onnx, mode: str, shapes: dict, seed: int = 1, level: int = 3,
                             int8_cosine: float = 0.999):
    """Build, run on the emulator and compare: int8 bit for bit with the kit's reference_model and
    cosine >= ``int8_cosine`` with onnxruntime; float16 cosine >= 0.9999 with onnxruntime.
    Returns (graph, model)."""
    graph, model = build(model_onnx, mode, shapes, level=level)
    rng = np.random.default_rng(seed)
    feeds = {name: rng.normal(0, 1, shape).astype(np.float32) for name, shape in shapes.items()}
    runtime = run(model, feeds)
    got = np.asarray(runtime.output("y"))
    want = ort_run(model_onnx, feeds)
    assert got.shape == want.shape
    assert cosine(got, want) >= (int8_cosine if mode == "int8" else 0.9999), cosine(got, want)
    if mode == "int8":
        stored = np.asarray(runtime.output("y", dequantize=False))
        reference = reference_model(graph, model, feeds)["y"]
        assert np.array_equal(reference.reshape(-1), stored.reshape(-1))
    return graph, model


def conv1d_model(cin: int, cout: int, length: int, *, kernel=3, stride=1, pads=(1, 1), group=1, dilation=1,
                 relu=False, bias=True):
    rng = np.random.default_rng([cin, cout, length, kernel])  # per model, not per test order
    weight = rng.normal(0, 0.3, (cout, cin // group, kernel))
    inits = {"w": weight} | ({"b": rng.normal(0, 0.1, cout)} if bias else {})
    out_len = (length + sum(pads) - dilation * (kernel - 1) - 1) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c" if relu else "y"],
                              kernel_shape=[kernel], strides=[stride], pads=list(pads), group=group,
                              dilations=[dilation])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    return onnx_model(nodes, inits, [1, cin, length], [1, cout, out_len])


CONV_CASES = {
    "k3s1": dict(cin=8, cout=16, length=40),
    "k3s2_pads": dict(cin=8, cout=16, length=41, stride=2, pads=(1, 2)),
    "k5_nopad_nobias": dict(cin=20, cout=24, length=33, kernel=5, pads=(0, 0), bias=False),
    "depthwise": dict(cin=24, cout=24, length=50, group=24, stride=2),
    "relu": dict(cin=8, cout=16, length=40, relu=True),
    "dilated": dict(cin=8, cout=8, length=40, dilation=2, pads=(2, 2)),
}


@pytest.mark.parametrize("mode", ["int8", "float16"])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv1d_runs_on_the_npu(case, mode) -> None:
    params = CONV_CASES[case]
    graph, model = check_against_references(conv1d_model(**params), mode, {"x": [1, params["cin"], params["length"]]})
    conv = next(node for node in graph.nodes if node.op_type == "Conv")
    assert conv.target == "NPU" and conv.attrs["kernel_shape"][0] == 1
    assert graph.tensors[conv.outputs[0]].shape[2] == 1
    if params.get("relu"):
        assert conv.display_op == "Conv+Relu"
    assert sum(step.kind == "npu" for step in model.schedule()) >= 1


@pytest.mark.parametrize("mode", ["int8", "float16"])
def test_grouped_conv1d_is_not_lifted_where_its_2d_form_is_a_host_step(mode) -> None:
    """A grouped conv that is not depthwise has no NPU lowering in 2-D either (partition
    conv_groups): it stays one 3-D host step, without two host Reshapes around it."""
    graph, _ = check_against_references(conv1d_model(16, 32, 30, group=4), mode, {"x": [1, 16, 30]})
    assert [(node.op_type, node.target) for node in graph.nodes] == [("Conv", "CPU")]


POOL_CASES = {
    "maxpool_k3s2_pads": ("MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1]), 40, 20),
    "maxpool_k2s2": ("MaxPool", dict(kernel_shape=[2], strides=[2]), 41, 20),
    "avgpool_k3s1": ("AveragePool", dict(kernel_shape=[3], strides=[1]), 40, 38),
    "avgpool_k4s2_count_pads": ("AveragePool", dict(kernel_shape=[4], strides=[2], pads=[1, 1], count_include_pad=1),
                                40, 20),
    "global_average": ("GlobalAveragePool", {}, 60, 1),
}


@pytest.mark.parametrize("mode", ["int8", "float16"])
@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool1d_runs_on_the_npu(case, mode) -> None:
    op, attrs, length, out_len = POOL_CASES[case]
    channels = 24
    model = onnx_model([helper.make_node(op, ["x"], ["y"], **attrs)], {}, [1, channels, length], [1, channels, out_len])
    # the int8 mean of 60 normal values sits near the output grid's step: the 2-D GAP on [1, 24, 1, 60]
    # gives the same 0.998 (test_1d_layers_equal_their_2d_forms)
    graph, _ = check_against_references(model, mode, {"x": [1, channels, length]},
                                        int8_cosine=0.998 if op == "GlobalAveragePool" else 0.999)
    windowed = [node for node in graph.nodes if node.op_type in (op, "Conv")]  # level 3: GAP as depthwise convs
    assert windowed and all(node.target == "NPU" and len(graph.tensors[node.inputs[0]].shape) == 4
                            for node in windowed)


def audio_front_end(channels: int = 16, length: int = 64):
    """conv1d + Relu -> maxpool -> depthwise conv1d (+ residual Add) -> Sigmoid -> conv1d: a region
    with element-wise layers inside; one Reshape in, one out."""
    rng = np.random.default_rng(channels)
    inits = {"w1": rng.normal(0, 0.3, (channels, 4, 5)), "b1": rng.normal(0, 0.1, channels),
             "w2": rng.normal(0, 0.3, (channels, 1, 3)), "w3": rng.normal(0, 0.2, (8, channels, 1))}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[5], pads=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2], strides=[2]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[3], pads=[1, 1], group=channels),
             helper.make_node("Add", ["c2", "p1"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Conv", ["s", "w3"], ["y"], kernel_shape=[1])]
    return onnx_model(nodes, inits, [1, 4, length], [1, 8, length // 2])


@pytest.mark.parametrize("mode", ["int8", "float16"])
def test_a_1d_region_is_lifted_whole(mode) -> None:
    model = audio_front_end()
    graph, built = check_against_references(model, mode, {"x": [1, 4, 64]})
    reshapes = [node for node in graph.nodes if node.op_type == "Reshape"]
    assert len(reshapes) == 2  # the region's edges: the graph input and output
    inside = [node for node in graph.nodes if node.op_type != "Reshape"]
    assert all(node.target == "NPU" for node in inside), [(n.display_op, n.target) for n in inside]
    assert all(len(graph.tensors[name].shape) == 4 for node in inside for name in node.outputs)


def test_pass_keeps_the_float_result_and_edits_only_rank_3() -> None:
    model = audio_front_end()
    x = np.random.default_rng(3).normal(0, 1, (1, 4, 64)).astype(np.float32)
    for level in (1, 2, 3):
        graph = import_onnx(model)
        optimize(graph, PassContext.for_chip("rk3588", level), check_every_pass=True)
        np.testing.assert_allclose(evaluate(graph, {"x": x})["y"], ort_run(model, {"x": x}), rtol=1e-5, atol=1e-5)
    four_d = onnx_model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 3], pads=[0, 1, 0, 1])],
                        {"w": np.random.default_rng(4).normal(0, 1, (4, 4, 1, 3))}, [1, 4, 1, 10], [1, 4, 1, 10])
    graph = import_onnx(four_d)
    optimize(graph, PassContext.for_chip("rk3588", 3))
    assert [node.op_type for node in graph.nodes] == ["Conv"]


def test_elementwise_layers_on_3d_tensors_run_on_the_npu() -> None:
    """Element-wise layers on [1, C, L] tensors with no 1-D conv around them stay 3-D (laid out
    c x h x w, isa.container_views.tensor_cube) and run on the NPU as they are."""
    shape = [1, 16, 40]
    model = onnx_model([helper.make_node("Add", ["x", "b"], ["y"])], {}, shape, shape, extra_inputs=(("b", shape),))
    for mode in ("int8", "float16"):
        graph, built = check_against_references(model, mode, {"x": shape, "b": shape})
        assert [node.op_type for node in graph.nodes] == ["Add"] and graph.nodes[0].target == "NPU"
        assert [step.kind for step in built.schedule()] == ["npu"]


def test_registers_are_the_vendors_height_1_conv() -> None:
    """The conv task's CNA input cube is 1 x L and its kernel 1 x k, as in the vendor's
    conv1d_int8 regcmd (DATA_SIZE0: DATAIN_WIDTH=400 DATAIN_HEIGHT=1, weights (64,64,1,3))."""
    from npuemu.isa.chain import decode_chain
    from npuemu.isa.regmap_loader import load_regmap

    _, model = build(conv1d_model(64, 64, 400, bias=True), "int8", {"x": [1, 64, 400]})
    (step,) = [step for step in model.schedule() if step.kind == "npu"]
    section, regmap = model.section("regcmd"), load_regmap("rk3588")
    decoded = decode_chain(section.data, regmap, section.load_address, section.load_address + step.chain.offset,
                           step.chain.first_amount)
    checked = 0
    for task in decoded.chain.tasks:
        values = {(w.block, w.register): w.value for w in task.writes}
        if ("CNA", "DATA_SIZE0") not in values:
            continue
        fields = regmap.block("CNA").register("DATA_SIZE0").unpack(values[("CNA", "DATA_SIZE0")])
        assert fields["DATAIN_HEIGHT"] == 1 and fields["DATAIN_WIDTH"] == 400
        weight = regmap.block("CNA").register("WEIGHT_SIZE2").unpack(values[("CNA", "WEIGHT_SIZE2")])
        assert weight["WEIGHT_HEIGHT"] == 1 and weight["WEIGHT_WIDTH"] == 3
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("mode", ["int8", "float16"])
def test_1d_layers_equal_their_2d_forms(mode) -> None:
    """The lifted 1-D model computes exactly what the same network written in 2-D on
    [1, C, 1, L] computes on the emulator (int8 with the same calibration samples)."""
    rng = np.random.default_rng(8)
    weight, bias = rng.normal(0, 0.3, (16, 8, 3)), rng.normal(0, 0.1, 16)
    one_d = onnx_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3], pads=[1, 1], strides=[2]),
                        helper.make_node("Relu", ["c"], ["r"]),
                        helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2], strides=[2])],
                       {"w": weight, "b": bias}, [1, 8, 40], [1, 16, 10])
    two_d = onnx_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 3], pads=[0, 1, 0, 1],
                                         strides=[1, 2]),
                        helper.make_node("Relu", ["c"], ["r"]),
                        helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[1, 2], strides=[1, 2])],
                       {"w": weight[:, :, None, :], "b": bias}, [1, 8, 1, 40], [1, 16, 1, 10])
    x = np.random.default_rng(9).normal(0, 1, (1, 8, 40)).astype(np.float32)
    outputs = []
    for model, shape in ((one_d, [1, 8, 40]), (two_d, [1, 8, 1, 40])):
        _, built = build(model, mode, {"x": shape})
        outputs.append(np.asarray(run(built, {"x": x.reshape(shape)}).output("y", dequantize=False)).reshape(-1))
    assert np.array_equal(*outputs)


def test_perf_shows_the_1d_layers_as_npu_layers_with_cycles() -> None:
    from npuemu.emulator.timing.report import report_npu

    _, model = build(conv1d_model(8, 16, 40, relu=True), "int8", {"x": [1, 8, 40]})
    runtime = run(model, {"x": np.zeros((1, 8, 40), np.float32)})
    rows = [row for row in report_npu(model, runtime.runs, runtime.machine.platform).layers if row.tasks]
    assert len(rows) == 1 and rows[0].target == "NPU"
    assert sum(task.npu_cycles for task in rows[0].tasks) > 0
