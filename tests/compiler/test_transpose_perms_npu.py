"""Transposes (0, 2, 3, 1), (0, 3, 1, 2), (0, 2, 1, 3), (0, 3, 2, 1) on the NPU (compiler/lower/transpose_perms.py,
passes/transpose_npu.py, LOWERING.md 36).

Checked against references that do not use the emulator or the lowering:
- the registers of the vendor's own builds of the same Transposes: tests/emulator/vendor_dpu_transpose
  (how they were made: tests/emulator/test_vendor_dpu_transpose.py) and five more made the same way
  for this work (``vendor_transpose_perms/``: rknn-toolkit2 2.5.0, rk3588, one-node ONNX Transpose,
  opset 13, int8 with 2 N(0, 1) calibration samples / fp16 unquantized, ``export_rknn``, ``xz -9``;
  chosen for the forms the first set lacks: int8 rows in two 16-row blocks, fp16 channels not whole
  atoms, NWCH with W not whole atoms or two atoms). Every register we write equals the vendor's
  effective value for that task - the vendor emits delta tasks after the first two, and its tasks
  alternate between two register groups (S_POINTER ping-pong), so a task's effective value is the
  last one written two tasks before, or in it - and the addresses equal as (tensor, offset);
- the stored output against numpy's transpose of the stored input, int8 and float16, rank 3 and 4
  (hypothesis);
- onnxruntime: float16 exactly, with NPU layers either side; int8 exactly against QuantizeLinear ->
  Transpose -> DequantizeLinear with the build's one scale;
- the partition: what stays a host step names its limit.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.compiler.driver import CompileOptions, prepare
from npuemu.compiler.lower.lower_transpose import emit_transpose_task, transpose_geometry
from npuemu.compiler.lower.transpose_perms import plan_moves
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.words import WordKind, decode_word
from npuemu.platforms import load_platform
from tests.compiler.test_transpose_npu import _build, _input, _model, _run, check_stored_transpose, qdq_transpose
from tests.shared_data import RKNN_FIXTURES_OPS

HERE = Path(__file__).parent
VENDOR = {**{name: HERE.parent / "emulator" / "vendor_dpu_transpose" for name in (
    "nhwc_fp16_16x8x8", "nhwc_fp16_24x12x10", "nhwc_int8_24x12x10", "nhwc_int8_40x6x8", "nwch_fp16_20x6x8",
    "nwch_int8_32x20x24", "hcw_fp16_8x30x12", "hcw_int8_8x30x12", "whc_fp16_12x16x40", "whc_int8_12x16x40")},
    **{name: HERE / "vendor_transpose_perms" for name in (
        "nhwc_fp16_20x12x10", "nhwc_int8_24x20x6", "nhwc_int8_32x6x8", "nwch_fp16_16x6x12", "nwch_fp16_20x5x16")},
          # the vendor's shipped fixtures (rknn-fixtures-ops transpose_nhwc_*: 1 x 64 x 20 x 20)
          "nhwc_int8_64x20x20": RKNN_FIXTURES_OPS / "transpose_nhwc_int8",
          "nhwc_fp16_64x20x20": RKNN_FIXTURES_OPS / "transpose_nhwc_fp16"}
FORMS = {"nhwc": ((0, 2, 3, 1), (1, 2, 0)), "nwch": ((0, 3, 1, 2), (2, 0, 1)),  # ONNX perm, cube perm
         "hcw": ((0, 2, 1, 3), (1, 0, 2)), "whc": ((0, 3, 2, 1), (2, 1, 0))}
ADDRESSES = {("DPU", "DST_BASE_ADDR"), ("DPU_RDMA", "SRC_BASE_ADDR")}
TENSORS = {"x": "x", "x_exSecondary": "e", "y": "y"}


def _vendor_states(path: Path, tmp_path: Path, regmap) -> list[dict]:
    """Each task's effective registers: the writes of its register group (tasks alternate two)."""
    rknn = path
    if path.suffix == ".xz":
        rknn = tmp_path / path.name.removesuffix(".xz")
        rknn.write_bytes(lzma.decompress(path.read_bytes()))
    model = load_rknn(rknn)
    program = model.program
    relocated = {word: (TENSORS[r.tensor_name], offset) for r in model.relocations for offset, word in r.pairs}
    groups, states = ({}, {}), []
    for index, task_index in enumerate(program.chains[0].tasks):
        task, state = program.tasks[task_index], groups[index % 2]
        for word in range(task.first_word, task.tail_word):
            decoded = decode_word(int(program.regcmd[word]), regmap)
            if decoded.kind == WordKind.WRITE:
                key = (decoded.block, decoded.register)
                state[key] = relocated[word] if key in ADDRESSES else decoded.value
        states.append(dict(state))
    return states


def _our_writes(shape, cube_perm, dtype, platform, regmap) -> list[dict]:
    bases = {"x": 0x10_0000, "e": 0x20_0000, "y": 0x40_0000}
    moves, _ = plan_moves(cube_perm, transpose_geometry(shape, dtype, cube_perm, platform))
    tasks = []
    for move in moves:
        writes = {}
        for w in emit_transpose_task(move.resolve("t", bases), regmap).writes:
            if (w.block, w.register) in ADDRESSES:
                key = max((k for k in bases if bases[k] <= w.value), key=bases.get)
                writes[(w.block, w.register)] = (key, w.value - bases[key])
            else:
                writes[(w.block, w.register)] = w.value
        tasks.append(writes)
    return tasks


@pytest.mark.parametrize("name", sorted(VENDOR))
def test_registers_match_the_vendor_build(name, tmp_path) -> None:
    platform, regmap = load_platform("rk3588"), load_regmap("rk3588")
    form, dtype, dims = name.split("_")
    shape = tuple(int(v) for v in dims.split("x"))
    folder = VENDOR[name]
    path = folder / "model.rknn" if folder.parent == RKNN_FIXTURES_OPS else folder / f"{name}.rknn.xz"
    vendor = _vendor_states(path, tmp_path, regmap)
    ours = _our_writes(shape, FORMS[form][1], "int8" if dtype == "int8" else "float16", platform, regmap)
    assert len(ours) == len(vendor)
    for index, (mine, theirs) in enumerate(zip(ours, vendor)):
        assert len(mine) == 69
        assert {k: v for k, v in mine.items() if theirs.get(k) != v} == {}, (name, index)


# --- bytes moved, end to end ------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(rank=st.sampled_from([3, 4]), form=st.sampled_from(sorted(FORMS)), channels=st.integers(2, 40),
       height=st.integers(2, 21), width=st.integers(2, 35), precision=st.sampled_from(["int8", "fp16"]))
def test_stored_output_is_numpys_transpose(rank, form, channels, height, width, precision) -> None:
    """(A size-1 axis moved is a Reshape: the clean-up passes make it one, so every axis is 2 or more.)"""
    onnx_perm, cube_perm = FORMS[form]
    shape, perm = ((1, channels, height, width), onnx_perm) if rank == 4 else ((channels, height, width), cube_perm)
    check_stored_transpose(shape, perm, precision, channels * height + width)


@pytest.mark.parametrize("shape, perm", [((1, 40, 7, 13), (0, 2, 3, 1)), ((1, 20, 18, 12), (0, 3, 1, 2)),
                                         ((24, 33, 10), (1, 2, 0)), ((1, 8, 16, 64), (0, 3, 1, 2)),
                                         ((1, 8, 8, 6), (0, 2, 3, 1))])  # one TP_ORG_EN task, no scratch
def test_float16_matches_onnxruntime_exactly(shape, perm) -> None:
    model, x = _model(shape, perm, around=True), _input(shape, 5)
    front, built = _build(model, "fp16", x)
    assert front.partition.count("CPU") == 0
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(_run(built, x).output("y"), want)


@pytest.mark.parametrize("shape, perm", [((1, 40, 7, 13), (0, 2, 3, 1)), ((1, 20, 33, 19), (0, 3, 1, 2)),
                                         ((1, 32, 20, 6), (0, 2, 3, 1))])
def test_int8_matches_onnxruntime_with_one_scale(shape, perm) -> None:
    """onnxruntime's QuantizeLinear -> Transpose -> DequantizeLinear with the build's scale and zero point."""
    x = _input(shape, 6)
    front, built = _build(_model(shape, perm), "int8", x)
    assert front.partition.count("CPU") == 0
    runtime = _run(built, x)
    np.testing.assert_array_equal(runtime.output("y"), qdq_transpose(runtime, x, shape, perm))


@pytest.mark.parametrize("shape, perm", [((1, 8, 160, 64), (0, 3, 2, 1)),   # fp16: 1280 tiles > SIZE_C_WDMA's 1024
                                         ((1, 8, 100, 6), (0, 2, 1, 3))])   # Hp / 8 = 13 atoms a TP_EN line
def test_pairs_where_no_plan_fits_are_two_npu_transposes(shape, perm) -> None:
    """(0, 3, 2, 1) too large for its plan = NWCH then H <-> W; (0, 2, 1, 3) too tall for its plan =
    NHWC then H <-> W (passes/transpose_npu.transposes_as_lowered_pairs)."""
    model, x = _model(shape, perm, around=True), _input(shape, 8)
    front, built = _build(model, "fp16", x)
    transposes = [d for d in front.partition.decisions if d.op == "Transpose"]
    assert len(transposes) == 2 and front.partition.count("CPU") == 0
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(_run(built, x).output("y"), want)


def test_the_scratch_lives_between_two_layers_and_perf_counts_their_tasks() -> None:
    """NHWC int8 of 1 x 24 x 12 x 10: the vendor's 4 tasks split over two NPU layers around the scratch
    tensor - the copy that reads x | TP_EN, TP_ORG_EN, the compacting copy; `npuemu perf` gives every
    task cycles."""
    from npuemu.emulator.timing.report import report_npu

    shape = (1, 24, 12, 10)
    x = _input(shape, 9)
    front, built = _build(_model(shape, (0, 2, 3, 1)), "int8", x)
    runtime = _run(built, x)
    layers = [entry for entry in report_npu(built, runtime.runs, runtime.machine.platform).layers if entry.tasks]
    assert [len(entry.tasks) for entry in layers] == [1, 3] and all(entry.target == "NPU" for entry in layers)
    assert all(task.unit_cycles > 0 and task.ddr_cycles > 0 for entry in layers for task in entry.tasks)


# --- what stays on the host -------------------------------------------------------------------------
@pytest.mark.parametrize("shape, perm, chip, reason", [
    # neither its own plan (TP_EN's notch: 13 x 1440 lines) nor a pair (NHWC's Hp x W = 9000 > 8192) fits
    ((1, 20, 100, 90), (0, 2, 1, 3), "rk3588", "exceeds DPU DATA_CUBE_NOTCH_ADDR.NOTCH_ADDR_1"),
    ((1, 20, 100, 90), (0, 3, 2, 1), "rk3588", "exceeds DPU DATA_CUBE_CHANNEL.ORIG_CHANNEL"),  # nor a pair
    ((2, 8, 6, 10), (0, 2, 3, 1), "rk3588", "'x' of shape [2, 8, 6, 10] is not stored with those axes as C, H and W"),
    ((1, 8, 6, 10), (2, 1, 0, 3), "rk3588", "perm [2, 1, 0, 3] of a rank-4 tensor is not lowered"),  # moves N
    ((1, 8, 6, 10), (0, 2, 3, 1), "rk3568", "rk3568 pixels are not 16-byte atoms"),
    ((1, 20, 100, 90), (0, 2, 3, 1), "rk3588", "CHANNEL"),   # TP_EN: Hp x W = 9000 > 8192 elements
    ((1, 8, 4, 200), (0, 3, 1, 2), "rk3588", "SIZE_E"),   # W 200: TP_EN lines of 13 atoms, SIZE_E is 3 bits
])
def test_other_transposes_stay_host_steps_naming_the_limit(shape, perm, chip, reason) -> None:
    front = prepare(_model(shape, perm), chip, CompileOptions(precision="fp16"))
    (decision,) = [d for d in front.partition.decisions if d.op == "Transpose"]
    assert decision.target == "CPU" and reason in decision.reason, decision.reason
