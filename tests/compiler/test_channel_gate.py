"""Element-wise layers with a [1, C, 1, 1] operand computed on the NPU - the SE block's gate -
as one DPU-only task whose ERDMA reads the gate per channel (ERDMA_DATA_MODE 0), the way the
vendor runs its se_gate Mul (rknn-fixtures-ops se_gate_int8 / se_gate_fp16 task 5;
compiler/LOWERING.md 17, emulator/REGISTER_SEMANTICS.md 3.4).

Checked: the registers against the vendor's task (ERDMA_CFG, EW_CFG data mode and size,
EW_SURF_STRIDE = the gate's 1-atom surfaces, EW_BASE_ADDR at the gate); the DMA reads the gate
once; whole layers bit for bit against the testing kit's independent int8 reference
(reference_eltwise with the gate broadcast by numpy) and, in float16, against the fp32 operation
rounded once - hypothesis over chips (16- and 8-byte atoms), Mul/Add/Sub/Max/Min, channels not a multiple of C2, either
operand order (Sub with the gate first: test_gate_sub_first.py); an SE block (GAP -> conv + Relu ->
conv + HardSigmoid -> Mul) end to end against onnxruntime and the kit's reference_model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.build import build_model
from npuemu.compiler.lower import EltwiseLayer, Quant, feature_placement, lower_layer
from npuemu.compiler.lower.descriptions import DpuTask
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.quant import calibrate, float16_graph, quantize_graph
from npuemu.emulator.runtime import Runtime
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform
from npuemu.tools.testing_reference import reference_eltwise, reference_graph, reference_model
from tests.compiler.test_broadcast_eltwise import quantized_build, two_input_model

CHIPS = ("rk3588", "rk3562", "rk3568")
OPS = {"Mul": "mul", "Add": "add", "Sub": "sub", "Max": "max", "Min": "min"}


def compiled(op: str, shape: tuple[int, int, int], chip: str, *, swap=False, fp16=False, seed=0):
    """(graph, model file) of ``y = op(a, b)``, a [1, C, H, W] and b the [1, C, 1, 1] gate
    (``swap``: the gate first). Level 2 keeps the graph one layer. Max/Min are put on the NPU by
    hand here (the partition takes their gate form since LOWERING.md 28, checked in
    test_gate_minmax_fp16_activation.py)."""
    channels, height, width = shape
    full, gate = [1, channels, height, width], [1, channels, 1, 1]
    graph = import_onnx(two_input_model(op, *((gate, full) if swap else (full, gate)), full))
    platform = load_platform(chip)
    optimize(graph, PassContext(platform, 2))
    graph.nodes[0].target = "NPU"
    return graph, quantized_build(graph, platform, fp16=fp16, seed=seed)


def run(model, inputs: dict, output: str = "y") -> tuple[np.ndarray, Runtime]:
    runtime = Runtime(model)
    for name, value in inputs.items():
        runtime.set_input(name, value)
    runtime.run()
    return np.asarray(runtime.output(output, dequantize=False)), runtime


def quant(graph, name) -> Quant:
    q = graph.tensors[name].quant
    return Quant(float(q.scale), int(q.zero_point))


def lowered_fields(layer: EltwiseLayer, chip: str) -> tuple[DpuTask, dict[str, dict[str, int]]]:
    """The layer's one task lowered with the gate at 0x200000: its description and register fields."""
    platform, regmap = load_platform(chip), load_regmap(chip)
    placements = {name: feature_placement(name, address, layer.shapes[name], layer.dtype, platform)
                  for name, address in (("a", 0x100000), ("b", 0x200000), ("y", 0x300000))}
    lowered = lower_layer(layer, placements, platform, regmap)
    (description,), (task,) = lowered.descriptions, lowered.tasks
    return description, {f"{w.block}.{w.register}": regmap.register(w.block, w.register).unpack(w.value)
                         for w in task.writes}


# --- the lowering, against the vendor's task ---------------------------------------------------

@pytest.mark.parametrize("fp16", [False, True], ids=["int8", "fp16"])
def test_one_dpu_task_programmed_as_the_vendor_se_gate(fp16) -> None:
    """se_gate_int8 task 5: ERDMA_CFG 0x4 (mode 0, size 1), EW_CFG 0x804002c4 (EW_DATA_MODE 0,
    EDATA_SIZE 1, OP_TYPE 1 mul, converter on with offset -zp_gate, EW_TRUNCATE 0),
    EW_SURF_STRIDE 1; se_gate_fp16: ERDMA_CFG 0x8 (size 2), EW_CFG 0x008003c4 (EDATA_SIZE 2,
    converter bypassed), OUT_CVT FP32TOFP16_EN 1. The vendor's shape: [1,64,28,28] x [1,64,1,1]."""
    quants = {} if fp16 else dict(input_quants=(Quant(0.05, -9), Quant(1 / 255, -128)), output_quant=Quant(0.019, 1))
    layer = EltwiseLayer("m", "mul", ("a", "b"), "y", (64, 28, 28), dtype="float16" if fp16 else "int8",
                         channel_gate=True, **quants)
    assert layer.shapes == {"a": (64, 28, 28), "b": (64, 1, 1), "y": (64, 28, 28)}
    description, fields = lowered_fields(layer, "rk3588")
    assert (description.operand.address, description.operand.surface_stride) == (0x200000, 1)
    assert fields["DPU_RDMA.ERDMA_CFG"]["ERDMA_DATA_MODE"] == 0
    assert fields["DPU_RDMA.ERDMA_CFG"]["ERDMA_DATA_SIZE"] == (2 if fp16 else 1)
    assert fields["DPU_RDMA.ERDMA_CFG"]["ERDMA_DISABLE"] == 0
    assert fields["DPU_RDMA.EW_BASE_ADDR"]["EW_BASE_ADDR"] == 0x200000
    assert fields["DPU_RDMA.EW_SURF_STRIDE"]["EW_SURF_STRIDE"] == 1  # the gate's 1x1 surfaces: one atom apart
    ew = fields["DPU.EW_CFG"]
    assert (ew["EW_DATA_MODE"], ew["EDATA_SIZE"], ew["EW_OP_TYPE"], ew["EW_OP_SRC"]) == (0, 2 if fp16 else 1, 1, 1)
    assert (ew["EW_OP_CVT_BYPASS"], ew["EW_CVT_TYPE"]) == ((1, 0) if fp16 else (0, 1))
    if fp16:
        assert fields["DPU.OUT_CVT_SCALE"]["FP32TOFP16_EN"] == 1
        return
    assert fields["DPU.EW_CVT_OFFSET_VALUE"]["EW_OP_CVT_OFFSET"] == 128  # -zp_gate, as the vendor's 128
    assert (fields["DPU.EW_CVT_SCALE_VALUE"]["EW_OP_CVT_SCALE"], fields["DPU.EW_CVT_SCALE_VALUE"]["EW_TRUNCATE"]) == (1, 0)
    assert fields["DPU.BS_ALU_CFG"]["BS_ALU_OPERAND"] == 9  # -zp_a, as the vendor's 9
    assert fields["DPU.OUT_CVT_OFFSET"]["OUT_CVT_OFFSET"] == 1
    out = fields["DPU.OUT_CVT_SCALE"]["OUT_CVT_SCALE"] / 2 ** fields["DPU.OUT_CVT_SHIFT"]["OUT_CVT_SHIFT"]
    assert out == pytest.approx(0.05 / 255 / 0.019, rel=1e-4)  # s_a s_g / s_y (vendor: 19642 / 2^22)


def test_the_gate_is_read_once_per_task() -> None:
    """ERDMA per-channel mode: one atom per gate surface, fetched once (not per pixel or line)."""
    graph, model = compiled("Mul", (40, 6, 5), "rk3588")
    rng = np.random.default_rng(2)
    _, runtime = run(model, {"a": rng.integers(-128, 128, (1, 40, 6, 5)).astype(np.int8),
                             "b": rng.integers(-128, 128, (1, 40, 1, 1)).astype(np.int8)})
    (traffic,) = (record.traffic for run_ in runtime.runs for record in run_.tasks)
    assert traffic.ew_read == 3 * 16  # ceil(40 / 16) surfaces of one 16-byte atom
    assert traffic.main_read == traffic.dpu_write == 3 * 6 * 5 * 16


# --- whole layers, bit for bit ----------------------------------------------------------------

shapes = st.tuples(st.integers(1, 40), st.integers(1, 6), st.integers(2, 7))


@settings(max_examples=40, deadline=None)
@given(chip=st.sampled_from(CHIPS), op=st.sampled_from(sorted(OPS)), shape=shapes, swap=st.booleans(),
       seed=st.integers(0, 2**16))
@example(chip="rk3568", op="Mul", shape=(13, 3, 5), swap=False, seed=1)  # C % C2 != 0, 8-byte atoms
@example(chip="rk3588", op="Add", shape=(17, 1, 7), swap=True, seed=2)
@example(chip="rk3562", op="Sub", shape=(33, 5, 3), swap=False, seed=3)
@example(chip="rk3588", op="Max", shape=(64, 4, 4), swap=True, seed=4)
@example(chip="rk3588", op="Min", shape=(5, 2, 2), swap=False, seed=5)
def test_int8_layer_is_bit_exact_against_the_kit_reference(chip, op, shape, swap, seed) -> None:
    swap = swap and op != "Sub"  # Sub's gate first is a host step (test below)
    channels, height, width = shape
    graph, model = compiled(op, shape, chip, swap=swap, seed=seed)
    assert [step.kind for step in model.schedule()] == ["npu"] and model.layers()[0].task_count == 1
    full, gate = ("b", "a") if swap else ("a", "b")
    rng = np.random.default_rng(seed)
    stored = {full: rng.integers(-128, 128, (1, channels, height, width)).astype(np.int8),
              gate: rng.integers(-128, 128, (1, channels, 1, 1)).astype(np.int8)}
    got = run(model, stored)[0].reshape(shape)
    want = reference_eltwise(OPS[op], stored[full][0], stored[gate][0], a_quant=quant(graph, full),
                             b_quant=quant(graph, gate), output_quant=quant(graph, "y"))
    assert np.array_equal(got, want), (chip, op, shape, swap, int((got != want).sum()))


@settings(max_examples=25, deadline=None)
@given(chip=st.sampled_from(CHIPS), op=st.sampled_from(sorted(OPS)), shape=shapes, swap=st.booleans(),
       seed=st.integers(0, 2**16))
@example(chip="rk3568", op="Mul", shape=(9, 3, 3), swap=False, seed=1)  # fp16 C2 = 4 on 8-byte atoms
def test_float16_layer_is_the_fp32_operation_rounded_once(chip, op, shape, swap, seed) -> None:
    swap = swap and op != "Sub"
    channels, height, width = shape
    graph, model = compiled(op, shape, chip, swap=swap, fp16=True)
    assert [step.kind for step in model.schedule()] == ["npu"]
    rng = np.random.default_rng(seed)
    full, gate = ("b", "a") if swap else ("a", "b")
    values = {full: rng.normal(0, 3, (1, channels, height, width)).astype(np.float16),
              gate: rng.normal(0, 3, (1, channels, 1, 1)).astype(np.float16)}
    got = run(model, {name: value.astype(np.float32) for name, value in values.items()})[0]
    operation = {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract, "Max": np.maximum, "Min": np.minimum}[op]
    want = operation(values[full].astype(np.float32), values[gate].astype(np.float32)).astype(np.float16)
    assert got.dtype == np.float16 and np.array_equal(got.reshape(want.shape), want)


def test_reference_graph_and_reference_model_follow_the_npu() -> None:
    """The kit's graph walk takes the gated layer as the NPU runs it (gate second), not as a host
    step: from the stored inputs and, on the built model, from their real values."""
    graph, model = compiled("Mul", (21, 3, 5), "rk3562", swap=True, seed=3)
    rng = np.random.default_rng(4)
    stored = {"a": rng.integers(-128, 128, (1, 21, 1, 1)).astype(np.int8),
              "b": rng.integers(-128, 128, (1, 21, 3, 5)).astype(np.int8)}
    got = run(model, stored)[0]
    assert np.array_equal(reference_graph(graph, stored)["y"].reshape(got.shape), got)
    real = {name: quant(graph, name).scale * (value.astype(np.float32) - quant(graph, name).zero_point)
            for name, value in stored.items()}
    assert np.array_equal(reference_model(graph, model, real)["y"].reshape(got.shape), got)


def test_sub_with_the_gate_first_runs_on_the_npu() -> None:
    """gate - map: one DPU task too, BS negating the map (its numerics: test_gate_sub_first.py)."""
    _, model = compiled("Sub", (6, 3, 4), "rk3588", swap=True)
    assert [step.kind for step in model.schedule()] == ["npu"] and model.layers()[0].task_count == 1


# --- an SE block end to end -------------------------------------------------------------------

def se_block(channels: int = 24, squeeze: int = 8, size: int = 14, seed: int = 7):
    """x -> GAP -> 1x1 conv + Relu -> 1x1 conv + HardSigmoid -> Mul(x, gate)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, shape).astype(np.float32), name) for name, shape in
             (("w1", (squeeze, channels, 1, 1)), ("b1", (squeeze,)), ("w2", (channels, squeeze, 1, 1)), ("b2", (channels,)))]
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
             helper.make_node("Conv", ["g", "w1", "b1"], ["s1"], name="squeeze"),
             helper.make_node("Relu", ["s1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["s2"], name="excite"),
             helper.make_node("HardSigmoid", ["s2"], ["gate"], name="hsig", alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["x", "gate"], ["y"], name="scale")]
    shape = [1, channels, size, size]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), tuple(shape)


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("mode", ["int8", "float16"])
def test_se_block_runs_on_the_npu_and_matches_onnxruntime(mode) -> None:
    import onnxruntime as ort

    onnx_model, shape = se_block()
    graph = import_onnx(onnx_model)
    optimize(graph, PassContext.for_chip("rk3588", 3, element_bytes=1 if mode == "int8" else 2))
    rng = np.random.default_rng(0)
    if mode == "int8":
        samples = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(4)]
        quantize_graph(graph, calibrate(graph, samples, "normal", progress=False).ranges)
    else:
        float16_graph(graph)
    model = build_model(graph)
    assert [step.kind for step in model.schedule()] == ["npu"]  # the gate's Mul is no host step
    x = rng.normal(0, 1, shape).astype(np.float32)
    runtime = Runtime(model)
    runtime.set_input("x", x)
    runtime.run()
    got = runtime.output(graph.outputs[0])
    want = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert cosine(got, want) >= (0.999 if mode == "int8" else 0.99999), cosine(got, want)
    if mode == "int8":  # the kit's reference of the built model is the emulator's output, bit for bit
        stored = np.asarray(runtime.output(graph.outputs[0], dequantize=False))
        reference = reference_model(graph, model, {"x": x})[graph.outputs[0]]
        assert np.array_equal(reference.reshape(-1), stored.reshape(-1))


def test_perf_counts_the_gate_task_as_a_dpu_only_task() -> None:
    """``npuemu perf``'s report (report_npu): the gated Mul is one NPU task with the unit cycles of
    a same-shape Mul (the DPU streams the main cube either way) and DDR reads smaller by the full
    operand less the gate's atoms; the same bytes written."""
    from npuemu.emulator.timing.report import report_npu

    def layer_time(model, inputs):
        _, runtime = run(model, inputs)
        (layer,) = [entry for entry in report_npu(model, runtime.runs, runtime.machine.platform).layers if entry.tasks]
        return layer

    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (1, 48, 10, 12)).astype(np.int8)
    _, gated = compiled("Mul", (48, 10, 12), "rk3588")
    same = compiled_same_shape((48, 10, 12))
    gate_time = layer_time(gated, {"a": x, "b": x[:, :, :1, :1].copy()})
    same_time = layer_time(same, {"a": x, "b": x})
    assert gate_time.target == "NPU" and len(gate_time.tasks) == 1
    (g,), (s,) = gate_time.tasks, same_time.tasks
    assert g.unit_cycles == s.unit_cycles == 48 * 10 * 12 // 16 and g.npu_cycles == 0
    assert g.ddr_write_bytes == s.ddr_write_bytes == 48 * 10 * 12
    assert s.ddr_read_bytes - g.ddr_read_bytes == 48 * 10 * 12 - 3 * 16
    assert 0 < g.ddr_cycles < s.ddr_cycles


def compiled_same_shape(shape: tuple[int, int, int]):
    """A same-shape Mul built like ``compiled``'s (the timing comparison's baseline)."""
    channels, height, width = shape
    full = [1, channels, height, width]
    graph = import_onnx(two_input_model("Mul", full, full, full))
    platform = load_platform("rk3588")
    optimize(graph, PassContext(platform, 2))
    rng = np.random.default_rng(0)
    samples = [{name: rng.normal(size=full).astype(np.float32) for name in graph.inputs} for _ in range(2)]
    quantize_graph(graph, calibrate(graph, samples, "normal", progress=False).ranges)
    return build_model(graph, platform)
