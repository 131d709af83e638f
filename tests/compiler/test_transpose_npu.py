"""Transpose of the stored H and W on the NPU (compiler/lower/lower_transpose.py, LOWERING.md 35).

Checked against references that do not use the emulator or the lowering:
- the register values of the vendor's own builds of the same Transposes (tests/emulator/
  vendor_dpu_transpose/nwh_*.rknn.xz, how they were made: tests/emulator/test_vendor_dpu_transpose.py),
  every write but the two address registers (the vendor's hold tensor-relative offsets), and the
  step between its tasks' addresses;
- the stored output against numpy's transpose of the stored input, int8 and float16, for random
  shapes (hypothesis), C1 > 1 and more than one run of columns;
- onnxruntime: float16 exactly; int8 exactly against a QuantizeLinear -> Transpose ->
  DequantizeLinear model with the build's one scale;
- the testing kit's reference (tools/testing_reference.reference_model) of a whole int8 build;
- the partition: the perms not lowered stay host steps, naming the perm.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.lower.lower_transpose import TransposeLayer, emit_transpose_task, lower_transpose
from npuemu.compiler.lower.placement import feature_placement
from npuemu.emulator.runtime import Runtime
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.words import WordKind, decode_word
from npuemu.platforms import load_platform
from npuemu.tools.testing_reference import reference_model

F32 = np.float32
VENDOR = Path(__file__).parents[1] / "emulator" / "vendor_dpu_transpose"
ADDRESSES = {("DPU", "DST_BASE_ADDR"), ("DPU_RDMA", "SRC_BASE_ADDR")}


def _model(shape, perm, *, around: bool = False):
    """x -> Transpose -> y; ``around``: a Relu before and a LeakyRelu after (NPU layers either side)."""
    out_shape = [shape[p] for p in perm]
    nodes = [helper.make_node("Transpose", ["a" if around else "x"], ["b" if around else "y"], perm=list(perm))]
    if around:
        nodes = [helper.make_node("Relu", ["x"], ["a"]), *nodes, helper.make_node("LeakyRelu", ["b"], ["y"], alpha=0.5)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _input(shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, shape).astype(np.float16).astype(F32)


def _build(model, precision: str, x: np.ndarray):
    dataset = None if precision == "fp16" else [{"x": x * s} for s in (1.0, -0.7, 0.5)]
    front = prepare(model, "rk3588", CompileOptions(precision=precision, dataset=dataset))
    return front, build_graph(front.graph)


def _run(built, x: np.ndarray) -> Runtime:
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return runtime


def _quantized(x: np.ndarray, record: dict) -> np.ndarray:
    """A real input as int8: round half even, + zp, saturated (the host's quantization, NUMERICS.md)."""
    q = np.rint(x.astype(np.float64) / float(record["scale"])) + int(record["zero_point"])
    return np.clip(q, -128, 127).astype(np.int8)


# --- the vendor's registers -------------------------------------------------------------------------
def _vendor_writes(path: Path, tmp_path: Path, regmap) -> list[list[tuple[str, str, int]]]:
    rknn = tmp_path / path.stem
    rknn.write_bytes(lzma.decompress(path.read_bytes()))
    program = load_rknn(rknn).program
    tasks = [program.tasks[i] for i in program.chains[0].tasks]
    decoded = [[decode_word(int(w), regmap) for w in program.regcmd[t.first_word:t.tail_word]] for t in tasks]
    return [[(d.block, d.register, d.value) for d in task if d.kind == WordKind.WRITE] for task in decoded]


@pytest.mark.parametrize("name, dtype", [("nwh_int8_16x6x10", "int8"), ("nwh_fp16_16x6x10", "float16")])
def test_registers_match_the_vendor_build(name, dtype, tmp_path) -> None:
    platform, regmap = load_platform("rk3588"), load_regmap("rk3588")
    vendor = _vendor_writes(VENDOR / f"{name}.rknn.xz", tmp_path, regmap)
    shape = (16, 6, 10)
    layer = TransposeLayer("t", "x", "y", shape, None, dtype)
    placements = {"x": feature_placement("x", 0x1000, shape, dtype, platform),
                  "y": feature_placement("y", 0x8000, (16, 10, 6), dtype, platform)}
    ours = [[(w.block, w.register, w.value) for w in emit_transpose_task(t, regmap).writes]
            for t in lower_transpose(layer, placements, platform)]
    assert len(ours) == len(vendor) == (1 if dtype == "int8" else 2)
    for mine, theirs in zip(ours, vendor):
        assert [w[:2] for w in mine] == [w[:2] for w in theirs]  # the same 69 registers in the same order
        assert [w for w in mine if w[:2] not in ADDRESSES] == [w for w in theirs if w[:2] not in ADDRESSES]

    def addresses(task):
        return [value for block, register, value in task if (block, register) in ADDRESSES]
    steps = [np.subtract(addresses(t), addresses(ours[0])).tolist() for t in ours]
    assert steps == [np.subtract(addresses(t), addresses(vendor[0])).tolist() for t in vendor]


def test_long_lines_are_cut_into_runs_of_columns() -> None:
    """CHANNEL is 13 bits: 1024 atoms of 8 int16 elements; W 1100 in two runs, per C1 surface."""
    platform = load_platform("rk3588")
    layer = TransposeLayer("t", "x", "y", (20, 3, 1100), None, "float16")
    placements = {"x": feature_placement("x", 0, (20, 3, 1100), "float16", platform),
                  "y": feature_placement("y", 0x40000, (20, 1100, 3), "float16", platform)}
    tasks = lower_transpose(layer, placements, platform)
    assert [t.wdma[1] for t in tasks] == [1024, 76] * 3  # SIZE_C_WDMA + 1: the columns
    assert tasks[1].source_address - tasks[0].source_address == 1024 * 16
    assert tasks[1].dst_address - tasks[0].dst_address == 1024 * 3 * 16


def check_stored_transpose(shape, perm, precision, seed) -> None:
    """Build and run a lone Transpose with no host step; its stored output is numpy's transpose of
    the stored input (int8: the same quantization in and out, a byte move)."""
    x = _input(shape, seed)
    front, built = _build(_model(shape, perm), precision, x)
    assert front.partition.count("CPU") == 0
    runtime = _run(built, x)
    got = runtime.output("y", dequantize=False)
    if precision == "int8":
        record = runtime.tensor_info("x")["quantization"]
        assert record == runtime.tensor_info("y")["quantization"]
        np.testing.assert_array_equal(got, np.transpose(_quantized(x, record), perm))
    else:
        np.testing.assert_array_equal(got.view(np.uint16), np.transpose(x.astype(np.float16), perm).view(np.uint16))


# --- bytes moved, end to end ------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(rank=st.sampled_from([3, 4]), channels=st.integers(1, 40), height=st.integers(2, 17),
       width=st.integers(2, 23), precision=st.sampled_from(["int8", "fp16"]))
def test_stored_output_is_numpys_transpose(rank, channels, height, width, precision) -> None:
    shape = (1, channels, height, width) if rank == 4 else (channels, height, width)
    perm = (0, 1, 3, 2) if rank == 4 else (0, 2, 1)
    check_stored_transpose(shape, perm, precision, channels + height + width)


@pytest.mark.parametrize("shape, perm", [((1, 40, 7, 13), (0, 1, 3, 2)), ((1, 50, 64), (0, 2, 1)),
                                         ((1, 3, 1100), (0, 2, 1)), ((30, 20), (1, 0))])
def test_float16_matches_onnxruntime_exactly(shape, perm) -> None:
    model, x = _model(shape, perm, around=True), _input(shape, 5)
    front, built = _build(model, "fp16", x)
    assert front.partition.count("CPU") == 0
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(_run(built, x).output("y"), want)


def qdq_transpose(runtime, x, shape, perm) -> np.ndarray:
    """onnxruntime's QuantizeLinear -> Transpose -> DequantizeLinear of ``x`` with the scale and zero
    point the build gave the input (the int8 reference of a Transpose: a byte move)."""
    record = runtime.tensor_info("x")["quantization"]
    inits = [numpy_helper.from_array(np.array(record["scale"], F32), "s"),
             numpy_helper.from_array(np.array(record["zero_point"], np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("Transpose", ["q"], ["t"], perm=list(perm)),
             helper.make_node("DequantizeLinear", ["t", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [shape[p] for p in perm])], inits)
    qdq = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("shape, perm", [((1, 40, 7, 13), (0, 1, 3, 2)), ((1, 50, 64), (0, 2, 1))])
def test_int8_matches_onnxruntime_with_one_scale(shape, perm) -> None:
    """onnxruntime's QuantizeLinear -> Transpose -> DequantizeLinear with the build's scale and zero point."""
    x = _input(shape, 6)
    front, built = _build(_model(shape, perm), "int8", x)
    runtime = _run(built, x)
    np.testing.assert_array_equal(runtime.output("y"), qdq_transpose(runtime, x, shape, perm))


def test_int8_build_matches_the_testing_kit() -> None:
    shape, perm = (1, 24, 9, 5), (0, 1, 3, 2)
    x = _input(shape, 7)
    front, built = _build(_model(shape, perm, around=True), "int8", x)
    assert front.partition.count("CPU") == 0
    runtime = _run(built, x)
    want = reference_model(front.graph, built, {"x": x})
    for name in ("b", "y"):
        np.testing.assert_array_equal(runtime.output(name, dequantize=False), want[name])


# --- what stays on the host -------------------------------------------------------------------------
@pytest.mark.parametrize("shape, perm, reason", [
    ((1, 8, 6, 10), (2, 1, 0, 3), "perm [2, 1, 0, 3] of a rank-4 tensor is not lowered"),  # moves N (LOWERING.md 36)
    ((2, 8, 6, 10), (0, 1, 3, 2), "'x' of shape [2, 8, 6, 10] is not stored with those axes as C, H and W"),
    ((20, 100, 90), (1, 0, 2), "exceeds DPU DATA_CUBE_NOTCH_ADDR.NOTCH_ADDR_1 (13 bits, max 8191)"),  # LOWERING.md 36
])
def test_other_transposes_stay_host_steps_naming_the_limit(shape, perm, reason) -> None:
    front = prepare(_model(shape, perm), "rk3588", CompileOptions(precision="fp16"))
    (decision,) = [d for d in front.partition.decisions if d.op == "Transpose"]
    assert decision.target == "CPU" and decision.reason.endswith(reason)
