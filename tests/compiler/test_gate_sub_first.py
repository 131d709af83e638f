"""Sub with the [1, C, 1, 1] gate first, ``gate - map``, as one DPU-only task (LOWERING.md 33.2):
the ERDMA reads the gate per channel as for ``map - gate`` (LOWERING.md 17) and the BS multiplier
negates the map (int8: the requantizing multiplier negated; fp16: -1.0), the EW ALU adds.

References written here: the int8 arithmetic from NUMERICS.md 4.1/4.4/4.5 as integer numpy
(BS: -(q_map - zp) * 2^14 or the coarser-gate form rounded half away; the EW converter on the gate
rounded half even; add; OUT_CVT half even), and fp16 as the fp32 difference rounded once.
Hypothesis over chips, shapes and seeds; the registers; an SE-like model end to end against
onnxruntime in both precisions with no host step; perf's one DPU task."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import example, given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.compiler.lower import EltwiseLayer, Quant
from npuemu.emulator.runtime import Runtime
from npuemu.isa.errors import CompileError
from npuemu.tools.testing_reference import (
    BS_MUL_SHIFT, BS_SHIFT_MAX, EW_CVT_SHIFT_MAX, OUT_CVT_SHIFT_MAX, scale_shift,
)
from tests.compiler.test_channel_gate import CHIPS, compiled, lowered_fields, quant, run


def _rshift(v: np.ndarray, shift: int, half_away: bool) -> np.ndarray:
    """v / 2^shift rounded to nearest; ties away from zero or to even."""
    v = np.asarray(v, np.int64)
    if shift == 0:
        return v
    floor = v >> shift
    rest = v - (floor << shift)
    half = 1 << (shift - 1)
    tie_up = (v >= 0) if half_away else (floor & 1) == 1
    return floor + ((rest > half) | ((rest == half) & tie_up))


def gate_first_reference(q_map: np.ndarray, q_gate: np.ndarray, s_map: Quant, s_gate: Quant, s_out: Quant):
    """int8 ``gate - map`` as the DPU computes it: [C, H, W] map, [C, 1, 1] gate."""
    a, b = float(s_map.scale), float(s_gate.scale)
    if b < 2 * a:  # units a / 2^14: the map times 2^14, the gate rescaled by the converter
        ew_scale, ew_shift = scale_shift(2**BS_MUL_SHIFT * b / a, EW_CVT_SHIFT_MAX)
        factor, shift, unit = 2**BS_MUL_SHIFT, 0, a / 2**BS_MUL_SHIFT
    else:  # units b / 2^14: the gate times 2^14, the map scaled down in BS
        ew_scale, ew_shift, unit = 2**BS_MUL_SHIFT, 0, b / 2**BS_MUL_SHIFT
        factor, shift = scale_shift(2**BS_MUL_SHIFT * a / b, BS_SHIFT_MAX)
    negated = _rshift(-(q_map.astype(np.int64) - s_map.zero_point) * factor, shift, half_away=True)
    gate = _rshift((q_gate.astype(np.int64) - s_gate.zero_point) * ew_scale, ew_shift, half_away=False)
    out_scale, out_shift = scale_shift(unit / float(s_out.scale), OUT_CVT_SHIFT_MAX)
    out = _rshift((negated + gate) * out_scale, out_shift, half_away=False) + s_out.zero_point
    return np.clip(out, -128, 127).astype(np.int8)


shapes = st.tuples(st.integers(1, 40), st.integers(1, 6), st.integers(2, 7))


@settings(max_examples=30, deadline=None)
@given(chip=st.sampled_from(CHIPS), shape=shapes, seed=st.integers(0, 2**16))
@example(chip="rk3568", shape=(13, 3, 5), seed=1)  # C % C2 != 0, 8-byte atoms
@example(chip="rk3588", shape=(33, 5, 3), seed=3)
def test_int8_gate_minus_map_is_bit_exact(chip, shape, seed) -> None:
    channels, height, width = shape
    graph, model = compiled("Sub", shape, chip, swap=True, seed=seed)  # a: the gate, b: the map
    assert [step.kind for step in model.schedule()] == ["npu"] and model.layers()[0].task_count == 1
    rng = np.random.default_rng(seed)
    stored = {"b": rng.integers(-128, 128, (1, channels, height, width)).astype(np.int8),
              "a": rng.integers(-128, 128, (1, channels, 1, 1)).astype(np.int8)}
    got = run(model, stored)[0].reshape(shape)
    want = gate_first_reference(stored["b"][0], stored["a"][0], quant(graph, "b"), quant(graph, "a"), quant(graph, "y"))
    assert np.array_equal(got, want), (chip, shape, int((got != want).sum()))


def test_the_testing_kit_follows_the_npu() -> None:
    """The kit's graph walk takes the gate-first Sub as the NPU runs it (not as a host step), and
    its reference_eltwise(gate_first=True) equals the reference written here."""
    from npuemu.tools.testing_reference import reference_eltwise, reference_graph

    graph, model = compiled("Sub", (21, 3, 5), "rk3562", swap=True, seed=3)
    rng = np.random.default_rng(4)
    stored = {"a": rng.integers(-128, 128, (1, 21, 1, 1)).astype(np.int8),
              "b": rng.integers(-128, 128, (1, 21, 3, 5)).astype(np.int8)}
    got = run(model, stored)[0]
    assert np.array_equal(reference_graph(graph, stored)["y"].reshape(got.shape), got)
    for s_map, s_gate in ((Quant(0.02, -3), Quant(0.03, 7)), (Quant(0.01, 4), Quant(0.05, -9))):
        kit = reference_eltwise("sub", stored["b"][0], stored["a"][0], a_quant=s_map, b_quant=s_gate,
                                output_quant=Quant(0.04, 2), gate_first=True)
        mine = gate_first_reference(stored["b"][0], stored["a"][0], s_map, s_gate, Quant(0.04, 2))
        assert np.array_equal(kit, mine)


def test_int8_with_a_coarse_gate_uses_the_scaled_map_form() -> None:
    """s_gate >= 2 s_map: BS scales the (negated) map by 2^14 s_map / s_gate with a shift
    (quant_regs.eltwise_requant's second form): a negative multiplier, shift for negative products."""
    layer = EltwiseLayer("s", "sub", ("b", "a"), "y", (16, 3, 4), (Quant(0.01, 3), Quant(0.05, -7)), Quant(0.06, 2),
                         channel_gate=True, gate_first=True)
    _, fields = lowered_fields(layer, "rk3588")
    mul = fields["DPU.BS_MUL_CFG"]
    operand = mul["BS_MUL_OPERAND"] - (1 << 16)  # the signed 16-bit field
    assert -(1 << 15) <= operand <= -(1 << 14) and mul["BS_MUL_SHIFT_VALUE"] > 0
    assert fields["DPU.DATA_FORMAT"]["BS_MUL_SHIFT_VALUE_NEG"] == mul["BS_MUL_SHIFT_VALUE"]
    factor, shift = scale_shift(2**BS_MUL_SHIFT * 0.01 / 0.05, BS_SHIFT_MAX)
    assert (operand, mul["BS_MUL_SHIFT_VALUE"]) == (-factor, shift)


@pytest.mark.parametrize("fp16", [False, True], ids=["int8", "fp16"])
def test_registers_negate_the_map_and_add_the_gate(fp16) -> None:
    """One task: ERDMA per-channel mode at the gate (as map - gate), EW ALU add (2), BS MUL the
    negated int8 multiplier -2^14 or fp16 -1.0 (0xBC00)."""
    quants = {} if fp16 else dict(input_quants=(Quant(0.05, -9), Quant(0.04, 5)), output_quant=Quant(0.07, 1))
    layer = EltwiseLayer("s", "sub", ("a", "b"), "y", (24, 5, 6), dtype="float16" if fp16 else "int8",
                         channel_gate=True, gate_first=True, **quants)
    description, fields = lowered_fields(layer, "rk3588")
    assert (description.operand.address, description.operand.surface_stride) == (0x200000, 1)
    assert fields["DPU_RDMA.ERDMA_CFG"]["ERDMA_DATA_MODE"] == 0 and fields["DPU.EW_CFG"]["EW_DATA_MODE"] == 0
    assert fields["DPU.EW_CFG"]["EW_ALU_ALGO"] == 2 and fields["DPU.EW_CFG"]["EW_OP_TYPE"] == 0
    bs = fields["DPU.BS_CFG"]
    assert (bs["BS_BYPASS"], bs["BS_MUL_BYPASS"]) == (0, 0)
    assert fields["DPU.BS_MUL_CFG"]["BS_MUL_OPERAND"] == (0xBC00 if fp16 else (1 << 16) - (1 << 14))
    if not fp16:
        assert fields["DPU.BS_ALU_CFG"]["BS_ALU_OPERAND"] == 9  # -zp of the map, as map - gate


def test_gate_first_is_only_for_a_gated_sub() -> None:
    with pytest.raises(CompileError, match="gate first"):
        EltwiseLayer("s", "add", ("a", "b"), "y", (4, 2, 2), dtype="float16", channel_gate=True, gate_first=True)
    with pytest.raises(CompileError, match="gate first"):
        EltwiseLayer("s", "sub", ("a", "b"), "y", (4, 2, 2), dtype="float16", gate_first=True)


@settings(max_examples=20, deadline=None)
@given(chip=st.sampled_from(CHIPS), shape=shapes, seed=st.integers(0, 2**16))
def test_float16_gate_minus_map_is_the_fp32_difference_rounded_once(chip, shape, seed) -> None:
    channels, height, width = shape
    _, model = compiled("Sub", shape, chip, swap=True, fp16=True)
    assert [step.kind for step in model.schedule()] == ["npu"]
    rng = np.random.default_rng(seed)
    values = {"b": rng.normal(0, 3, (1, channels, height, width)).astype(np.float16),
              "a": rng.normal(0, 3, (1, channels, 1, 1)).astype(np.float16)}
    got = run(model, {name: value.astype(np.float32) for name, value in values.items()})[0]
    want = (values["a"].astype(np.float32) - values["b"].astype(np.float32)).astype(np.float16)
    assert got.dtype == np.float16 and np.array_equal(got.reshape(want.shape), want)


def se_sub_model(channels: int = 24, size: int = 10, seed: int = 3):
    """x -> conv 3x3 -> m; m -> GAP -> 1x1 conv -> gate; y = gate - m (a centring block)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (channels, 3, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.normal(0, 0.3, (channels, channels, 1, 1)).astype(np.float32), "w1")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["m"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["m"], ["g0"]),
             helper.make_node("Conv", ["g0", "w1"], ["gate"]),
             helper.make_node("Sub", ["gate", "m"], ["y"])]
    graph = helper.make_graph(nodes, "gsub", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_a_gate_minus_map_block_runs_on_the_npu_end_to_end(precision) -> None:
    model = se_sub_model()
    x = np.random.default_rng(5).normal(size=(1, 3, 10, 10)).astype(np.float32)
    samples = [{"x": np.random.default_rng(i).normal(size=(1, 3, 10, 10)).astype(np.float32)} for i in range(4)]
    options = CompileOptions(precision="fp16") if precision == "fp16" else CompileOptions(dataset=samples)
    built = compile_model(model, "rk3588", options)
    assert [step.kind for step in built.schedule()] == ["npu"]
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    got = np.asarray(runtime.output("y"), np.float64).ravel()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = want.astype(np.float64).ravel()
    cosine = float(got @ want / np.linalg.norm(got) / np.linalg.norm(want))
    assert cosine >= (0.9999 if precision == "fp16" else 0.999), cosine


def test_perf_counts_one_dpu_task_reading_the_gate_once() -> None:
    from npuemu.emulator.timing.report import report_npu

    _, model = compiled("Sub", (40, 6, 5), "rk3588", swap=True)
    rng = np.random.default_rng(2)
    _, runtime = run(model, {"b": rng.integers(-128, 128, (1, 40, 6, 5)).astype(np.int8),
                             "a": rng.integers(-128, 128, (1, 40, 1, 1)).astype(np.int8)})
    (layer,) = [entry for entry in report_npu(model, runtime.runs, runtime.machine.platform).layers if entry.tasks]
    (task,) = layer.tasks
    assert layer.target == "NPU" and task.unit_cycles == 3 * 6 * 5 * 16 // 16 and task.npu_cycles == 0
    assert task.ddr_write_bytes == 3 * 6 * 5 * 16 and task.ddr_read_bytes == 3 * 6 * 5 * 16 + 3 * 16 + task.regcmd_bytes  # map, gate atoms, commands
