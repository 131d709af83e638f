"""Element-wise layers with a [1, 1, H, W] operand broadcast over [1, C, H, W] on the NPU
(compiler/lower/broadcast_lanes.py, LOWERING.md 16): a 1x1 conv writes the operand into every
lane of one surface with identity registers, then the same-shape element-wise task reads that
surface for every output surface (EW_SURF_STRIDE 0).

Checked: the registers of both tasks; the identity conv is exact on all 256 int8 values (the
lanes tensor in emulated memory holds the operand in every lane); whole layers bit for bit
against the testing kit's independent int8 reference (reference_eltwise, the operands in the
NPU's order: the full map first, through the BS stage) and, in float16, against the fp32
operation rounded once to fp16 - on RK3588, RK3562 and RK3568 (8-byte atoms), channels that are
not a multiple of C2, odd H*W, either operand order; and the broadcasts still run on the CPU
with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st
from onnx import TensorProto, helper

from npuemu.compiler.build import build_model
from npuemu.compiler.lower import ConstPlacement, EltwiseLayer, Quant, feature_placement, lower_layer
from npuemu.compiler.lower.broadcast_lanes import (
    identity_constants, lane_broadcast, lanes_aligns, lanes_constants, replicate_conv,
)
from npuemu.compiler.lower.descriptions import ConvTask, DpuTask
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.passes.partition import decide
from npuemu.compiler.quant import calibrate, float16_graph, quantize_graph
from npuemu.compiler.weight_pack import unpack_bias_blob
from npuemu.emulator.runtime import Runtime
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform
from npuemu.tools.testing_reference import reference_eltwise, reference_graph, reference_model

CHIPS = ("rk3588", "rk3562", "rk3568")
OPS = {"Mul": "mul", "Add": "add", "Sub": "sub"}


def two_input_model(op: str, a_shape, b_shape, out_shape):
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in (("a", a_shape), ("b", b_shape))]
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"], name="ew")], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def compiled(op: str, channels: int, height: int, width: int, chip: str, *, swap=False, fp16=False, seed=0):
    """(graph, model file) of ``y = op(a, b)`` with a [1, C, H, W] and b [1, 1, H, W] (``swap``:
    the broadcast operand first); level 2 keeps the graph one layer (no input identity convs)."""
    full, narrow = [1, channels, height, width], [1, 1, height, width]
    graph = import_onnx(two_input_model(op, *((narrow, full) if swap else (full, narrow)), full))
    platform = load_platform(chip)
    optimize(graph, PassContext(platform, 2))
    return graph, quantized_build(graph, platform, fp16=fp16, seed=seed)


def quantized_build(graph, platform, *, fp16: bool, seed: int):
    """The model file of ``graph`` (after the passes) in float16, or int8 calibrated on two random
    off-centre samples of ``seed``."""
    if fp16:
        float16_graph(graph)
    else:
        rng = np.random.default_rng(seed)
        samples = [{name: rng.normal(rng.uniform(-1, 1), rng.uniform(0.3, 2), graph.tensors[name].shape).astype(np.float32)
                    for name in graph.inputs} for _ in range(2)]
        quantize_graph(graph, calibrate(graph, samples, "normal", progress=False).ranges)
    return build_model(graph, platform)


def run(model, inputs: dict, output: str = "y") -> np.ndarray:
    runtime = Runtime(model)
    for name, value in inputs.items():
        runtime.set_input(name, value)
    runtime.run()
    return np.asarray(runtime.output(output, dequantize=False))


def quant(graph, name) -> Quant:
    q = graph.tensors[name].quant
    return Quant(float(q.scale), int(q.zero_point))


# --- the lowering ---------------------------------------------------------------------------

def test_two_tasks_identity_registers_and_a_zero_operand_surface_stride() -> None:
    platform, regmap = load_platform("rk3588"), load_regmap("rk3588")
    q_a, q_b, q_out = Quant(0.05, 3), Quant(0.004, -128), Quant(0.02, -7)
    shape = (20, 5, 7)
    layer = EltwiseLayer("m", "mul", ("a", "b"), "y", shape, (q_a, q_b), q_out,
                         broadcast=lane_broadcast("y", "int8", platform))
    assert layer.broadcast.tensor == "y_lanes" and layer.broadcast.lanes == 16
    assert layer.shapes == {"a": shape, "b": (1, 5, 7), "y": shape, "y_lanes": (16, 5, 7)}
    assert lanes_aligns([layer], platform) == {"y_lanes": 32}  # a 32-kernel int8 pass on RK3588
    placements = {"a": feature_placement("a", 0x100000, shape, "int8", platform),
                  "b": feature_placement("b", 0x200000, (1, 5, 7), "int8", platform),
                  "y": feature_placement("y", 0x300000, shape, "int8", platform),
                  "y_lanes": feature_placement("y_lanes", 0x400000, (16, 5, 7), "int8", platform, channel_align=32)}
    blobs = lanes_constants(layer, platform)
    address = 0x500000
    for name, blob in blobs.items():
        placements[name] = ConstPlacement(name, address, len(blob))
        address += 0x1000
    lowered = lower_layer(layer, placements, platform, regmap)
    conv, ew = lowered.descriptions
    assert isinstance(conv, ConvTask) and isinstance(ew, DpuTask)
    # task 1: 1 real input channel of b, 16 kernels (a 32-kernel pass writing one surface)
    assert (conv.feature_address, conv.in_channels_real, conv.kernels) == (0x200000, 1, 16)
    assert (conv.cube.dst_address, conv.cube.orig_channels, conv.cube.channels) == (0x400000, 16, 32)
    stages = conv.stages
    assert stages.bs.alu_from_dma and stages.bs.mul_from_dma and stages.bs.mul_shift == 0 and stages.bs_cpend
    assert (stages.out_cvt.scale, stages.out_cvt.shift, stages.out_cvt.offset) == (1, 0, 0)
    assert stages.bn.bypass and stages.ew.bypass and stages.lut is None
    alu, cpend, mul = unpack_bias_blob(blobs["m:lanes_bias"], 16)
    assert not alu.any() and not cpend.any() and (mul == 1).all()
    weights = np.frombuffer(blobs["m:lanes_weights"], np.int8)
    assert weights.sum() == 16 and set(np.unique(weights)) == {0, 1}  # one unit weight per kernel
    # task 2: the same-shape element-wise task with the lanes surface for every surface
    assert (ew.source_address, ew.operand.address, ew.operand.surface_stride) == (0x100000, 0x400000, 0)
    written = {f"{w.block}.{w.register}": regmap.register(w.block, w.register).unpack(w.value)
               for w in lowered.tasks[1].writes}
    assert written["DPU_RDMA.EW_SURF_STRIDE"]["EW_SURF_STRIDE"] == 0
    assert written["DPU_RDMA.EW_BASE_ADDR"]["EW_BASE_ADDR"] == 0x400000
    assert written["DPU.EW_CFG"]["EW_OP_TYPE"] == 1


def test_identity_constants_are_integers_not_float_requantization() -> None:
    """The replicating conv's registers do not depend on the operand's scale: built as integers."""
    platform = load_platform("rk3562")
    blobs = []
    for scale in (1e-3, 0.0371, 7.5):
        layer = EltwiseLayer("m", "add", ("a", "b"), "y", (33, 3, 3), (Quant(0.1, 0), Quant(scale, 5)), Quant(0.2, 1),
                             broadcast=lane_broadcast("y", "int8", platform))
        constants = identity_constants(replicate_conv(layer), platform)
        assert (constants.requant.out_cvt.scale, constants.requant.out_cvt.shift, constants.requant.mul_shift) == (1, 0, 0)
        blobs.append((constants.weights, constants.bias))
    assert blobs[0] == blobs[1] == blobs[2]


@pytest.mark.parametrize("chip", CHIPS)
def test_the_lanes_tensor_holds_the_operand_in_every_lane_for_all_256_values(chip) -> None:
    graph, model = compiled("Mul", 19, 16, 17, chip)  # 272 pixels: every int8 value at least once
    assert [step.kind for step in model.schedule()] == ["npu"]
    b = (np.arange(16 * 17) % 256 - 128).astype(np.int8).reshape(1, 1, 16, 17)
    a = np.random.default_rng(1).integers(-128, 128, (1, 19, 16, 17)).astype(np.int8)
    runtime = Runtime(model)
    runtime.set_input("a", a)
    runtime.set_input("b", b)
    runtime.run()
    lanes = np.asarray(runtime.output("y_lanes", dequantize=False))
    platform = load_platform(chip)
    c2 = platform.c2("int8")
    assert lanes.shape == (1, c2, 16, 17)
    assert (lanes == b).all()  # the identity: out = the stored byte, in every lane
    # the DMA counts the one lanes surface once per output surface it is read for
    replicate, ew = (record.traffic for run_ in runtime.runs for record in run_.tasks)
    surface = 16 * 17 * platform.nc1hwc2.int8
    assert replicate.dpu_write == surface and ew.ew_read == -(-19 // c2) * surface


# --- whole layers, bit for bit ----------------------------------------------------------------

shapes = st.tuples(st.integers(2, 40), st.integers(1, 6), st.integers(1, 7))


@settings(max_examples=40, deadline=None)
@given(chip=st.sampled_from(CHIPS), op=st.sampled_from(sorted(OPS)), shape=shapes, swap=st.booleans(),
       seed=st.integers(0, 2**16))
@example(chip="rk3568", op="Mul", shape=(13, 3, 5), swap=False, seed=1)  # C % C2 != 0, H*W odd, 8-byte atoms
@example(chip="rk3588", op="Add", shape=(17, 1, 7), swap=True, seed=2)
@example(chip="rk3562", op="Sub", shape=(33, 5, 3), swap=False, seed=3)
def test_int8_layer_is_bit_exact_against_the_kit_reference(chip, op, shape, swap, seed) -> None:
    swap = swap and op != "Sub"  # Sub's broadcast first operand is a CPU step (test below)
    channels, height, width = shape
    graph, model = compiled(op, channels, height, width, chip, swap=swap, seed=seed)
    assert [step.kind for step in model.schedule()] == ["npu"] and model.layers()[0].task_count == 2
    full, narrow = ("b", "a") if swap else ("a", "b")
    rng = np.random.default_rng(seed)
    stored = {full: rng.integers(-128, 128, (1, channels, height, width)).astype(np.int8),
              narrow: rng.integers(-128, 128, (1, 1, height, width)).astype(np.int8)}
    got = run(model, stored).reshape(shape)
    want = reference_eltwise(OPS[op], stored[full][0], np.broadcast_to(stored[narrow][0], shape),
                             a_quant=quant(graph, full), b_quant=quant(graph, narrow), output_quant=quant(graph, "y"))
    assert np.array_equal(got, want), (chip, op, shape, swap, int((got != want).sum()))


@settings(max_examples=25, deadline=None)
@given(chip=st.sampled_from(CHIPS), op=st.sampled_from(sorted(OPS)), shape=shapes, seed=st.integers(0, 2**16))
@example(chip="rk3568", op="Mul", shape=(9, 3, 3), seed=1)  # fp16 C2 = 4 on 8-byte atoms
def test_float16_layer_is_the_fp32_operation_rounded_once(chip, op, shape, seed) -> None:
    channels, height, width = shape
    graph, model = compiled(op, channels, height, width, chip, fp16=True)
    assert [step.kind for step in model.schedule()] == ["npu"]
    rng = np.random.default_rng(seed)
    a = rng.normal(0, 3, (1, channels, height, width)).astype(np.float16)
    b = rng.normal(0, 3, (1, 1, height, width)).astype(np.float16)
    got = run(model, {"a": a.astype(np.float32), "b": b.astype(np.float32)})
    operation = {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract}[op]
    want = operation(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)  # exact in fp32
    assert got.dtype == np.float16 and np.array_equal(got.reshape(want.shape), want)


def test_reference_graph_and_reference_model_follow_the_npu() -> None:
    """The kit's graph walk, from the stored inputs and (reference_model, on the built model)
    from their real values, takes the layer as the NPU runs it (broadcast operand second), not
    as a host step: both equal the emulator bit for bit."""
    graph, model = compiled("Add", 21, 3, 5, "rk3562", swap=True, seed=3)
    rng = np.random.default_rng(4)
    stored = {"a": rng.integers(-128, 128, (1, 1, 3, 5)).astype(np.int8),
              "b": rng.integers(-128, 128, (1, 21, 3, 5)).astype(np.int8)}
    got = run(model, stored)
    assert np.array_equal(reference_graph(graph, stored)["y"].reshape(got.shape), got)
    real = {name: quant(graph, name).scale * (value.astype(np.float32) - quant(graph, name).zero_point)
            for name, value in stored.items()}
    predicted = reference_model(graph, model, real)["y"]
    assert np.array_equal(predicted.reshape(got.shape), got)


# --- what stays on the CPU ---------------------------------------------------------------------

def cpu_ops(model) -> list[str]:
    return [step.op for step in model.schedule() if step.kind == "cpu"]


def test_sub_with_the_broadcast_operand_first_runs_on_the_cpu() -> None:
    """The broadcast operand must be the ERDMA's, which is Sub's subtrahend."""
    _, model = compiled("Sub", 5, 2, 3, "rk3588", swap=True)
    assert cpu_ops(model) == ["Sub"]


def test_per_channel_gate_runs_on_the_npu() -> None:
    """The SE block's [1, C, 1, 1] gate: one DPU task, the ERDMA in its per-channel mode (issue 18
    item 2, tests/compiler/test_channel_gate.py; before, a host step)."""
    graph = import_onnx(two_input_model("Mul", [1, 6, 3, 4], [1, 6, 1, 1], [1, 6, 3, 4]))
    optimize(graph, PassContext(load_platform("rk3562"), 2))
    rng = np.random.default_rng(0)
    quantize_graph(graph, calibrate(graph, [{n: rng.normal(size=graph.tensors[n].shape).astype(np.float32)
                                             for n in graph.inputs}], "normal", progress=False).ranges)
    assert graph.nodes[0].target == "NPU"
    model = build_model(graph, load_platform("rk3562"))
    assert cpu_ops(model) == [] and model.layers()[0].task_count == 1


def test_below_four_dimensions_the_partition_keeps_the_cpu_and_says_why() -> None:
    graph = import_onnx(two_input_model("Mul", [6, 3, 4], [3, 4], [6, 3, 4]))
    context = PassContext(load_platform("rk3588"), 2)
    optimize(graph, context)
    decision = decide(graph, graph.nodes[0], context)
    assert decision.target == "CPU" and "operands [[6, 3, 4], [3, 4]]" in decision.reason, decision.reason
