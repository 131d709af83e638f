"""RK3576 sparse inference (guide 5.11, `npuemu compile --sparse`, compiler/LOWERING.md 23):
which convs go sparse and why the others stay dense, outputs bit-identical to the dense build
of the same int8 weights, the registers and timing against the vendor's build of the same conv
(../shared/rknn-fixtures-ops/sparse_rk3576_int8, its option-off twin), and the refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.compiler.sparse_weights import decide
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.timing.report import report_npu
from npuemu.isa.errors import ConfigError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "rknn-fixtures-ops"
RK3576 = load_platform("rk3576")
SPARSE = dataclasses.replace(RK3576, sparse=dataclasses.replace(RK3576.sparse, enabled=True))


def prune(weights: np.ndarray, axis, rng: np.random.Generator) -> np.ndarray:
    """Zero 2 of every 4 consecutive values along ``axis`` (0: output, 1: input channels), or
    (``axis`` "both") keep 2 kernels x 2 channels of every 4 x 4 tile: the vendor's 16:4."""
    if axis == "both":
        oc, ic = weights.shape[:2]
        keep = np.zeros((oc // 4, 4, ic // 4, 4) + weights.shape[2:], bool)
        for a, b in np.ndindex(oc // 4, ic // 4):
            keep[a, :, b][np.ix_(rng.permutation(4)[:2], rng.permutation(4)[:2])] = True
        return np.where(keep.reshape(weights.shape), weights, 0)
    moved = np.moveaxis(weights, axis, -1)
    groups = moved.reshape(moved.shape[:-1] + (-1, 4))
    keep = np.zeros(groups.shape, bool)
    np.put_along_axis(keep, np.argsort(rng.random(groups.shape), axis=-1)[..., :2], True, axis=-1)
    return np.moveaxis(np.where(keep, groups, 0).reshape(moved.shape), -1, axis)


def conv_model(weights: np.ndarray, size: int, group: int = 1) -> onnx.ModelProto:
    out, inp = weights.shape[0], weights.shape[1] * group
    bias = np.random.default_rng(1).normal(0, 0.1, out).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[weights.shape[2] // 2] * 4, group=group)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, inp, size, size])
    graph = helper.make_graph([node], "sparse", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights.astype(np.float32), "w"),
                               numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def samples(channels: int, size: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [{"x": rng.normal(size=(1, channels, size, size)).astype(np.float32)} for _ in range(2)]


def dense_twin(front):
    """The same quantized graph with the option off (the switch is the platform's sparse.enabled)."""
    front.options = dataclasses.replace(front.options, sparse=False)
    front.platform = RK3576
    return front


def run(model, x: np.ndarray):
    runtime = Runtime(model)
    runtime.set_input("x", x)
    runtime.run()
    return runtime


# -- which layers go sparse ---------------------------------------------------------------------
@pytest.mark.parametrize("axis, mode", [(1, "in_4_2"), (0, "out_4_2")])
def test_4_2_weights_are_detected_along_their_axis(axis, mode):
    rng = np.random.default_rng(0)
    weights = prune(rng.integers(1, 100, (64, 32, 3, 3)), axis, rng)
    decision = decide("c", weights, 1, "int8", 0, SPARSE)
    assert decision.mode == mode and decision.ratio == {"in_4_2": "50%(IC)", "out_4_2": "50%(OC)"}[mode]


def sixteen_four(rng: np.random.Generator, first: int) -> np.ndarray:
    """32 x 32 x 3 x 3 weights pruned 16:4 as guide table 5-10 says: first 4:2 along axis ``first``
    (1: input, 0: output channels), then 4:2 along the other axis of the kept pairs - 4 of every
    4 x 4 tile, at most 2 per group along ``first``, up to 4 along the other axis."""
    keep = np.zeros((8, 4, 8, 4, 9), bool)  # [OC/4][4][IC/4][4][taps]
    pairs = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    for a, b, t in np.ndindex(8, 8, 9):
        chosen = [pairs[i] for i in rng.integers(0, 6, 4)]  # per row (first=1) or column (first=0)
        for slot in range(2):
            for line in rng.permutation(4)[:2]:  # 2 of the 4 rows/columns keep this slot
                row, col = (line, chosen[line][slot]) if first == 1 else (chosen[line][slot], line)
                keep[a, row, b, col, t] = True
    return np.where(keep.reshape(32, 32, 3, 3), rng.integers(1, 100, (32, 32, 3, 3)), 0)


@pytest.mark.parametrize("first, mode", [(1, "in_4_2"), (0, "out_4_2")])
def test_guide_ordered_16_4_weights_are_stored_4_2_along_their_first_axis(first, mode):
    """The vendor picks method 2 (50%(IC)) for weights pruned 16:4 in->out as the guide describes
    and method 1 (50%(OC)) for out->in ones: their tiles are not 2 kernels x 2 channels
    [V: librknnc 2.5.0 build log, LOWERING.md 43]."""
    weights = sixteen_four(np.random.default_rng(1), first)
    assert (weights != 0).sum() == weights.size // 4
    decision = decide("c", weights, 1, "int8", 0, SPARSE)
    assert decision.mode == mode and decision.ratio == {1: "50%(IC)", 0: "50%(OC)"}[first]


def test_2_by_2_tiles_are_the_vendor_16_4():
    """4 x 4 tiles keeping 2 kernels x 2 channels: the vendor's method 3, "75%", even though such
    weights are 4:2 along both axes too; a platform without the mode stores them 4:2."""
    weights = prune(np.random.default_rng(4).integers(1, 100, (64, 32, 3, 3)), "both", np.random.default_rng(5))
    decision = decide("c", weights, 1, "int8", 0, SPARSE)
    assert decision.mode == "in_out_16_4" and decision.ratio == "75%"
    no_16_4 = dataclasses.replace(SPARSE, sparse=dataclasses.replace(SPARSE.sparse, modes=["in_4_2", "out_4_2"]))
    decision = decide("c", weights, 1, "int8", 0, no_16_4)
    assert decision.mode == "in_4_2" and "16:4 weights: stored 4:2" in decision.reason


@pytest.mark.parametrize("shape, group, dtype, zero_point, reason", [
    ((64, 64, 3, 3), 1, "int8", 0, "not 4:2 sparse: 9216 of 9216 groups of 4 input channels"),
    ((64, 16, 3, 3), 4, "int8", 0, "group 4"),
    ((48, 64, 1, 1), 1, "int8", 0, "48 output / 64 input channels: both must be multiples of 32"),
    ((64, 64, 1, 1), 1, "float16", 0, "float16 weights: rk3576 sparse inference takes int8 only"),
    ((64, 64, 1, 1), 1, "int8", np.arange(64), "asymmetric weights"),
])
def test_layers_that_stay_dense_say_why(shape, group, dtype, zero_point, reason):
    weights = np.ones(shape, np.int8)
    if "not 4:2" not in reason:
        weights = prune(weights, 1, np.random.default_rng(2)) if shape[1] % 4 == 0 else weights
    decision = decide("c", weights, group, dtype, zero_point, SPARSE)
    assert decision.mode is None and reason in decision.reason


@pytest.mark.parametrize("axis", [1, 0])
def test_wide_layers_go_sparse_along_either_axis(axis):
    """The vendor's format has two streams whatever the kernel count (LOWERING.md 27, 43): no
    512-kernel limit along output channels any more."""
    weights = prune(np.ones((544, 32, 1, 1), np.int8), axis, np.random.default_rng(2))
    assert decide("c", weights, 1, "int8", 0, SPARSE).mode == {1: "in_4_2", 0: "out_4_2"}[axis]


# -- outputs and timing ----------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [1, 0, "both"])
def test_sparse_build_is_bit_identical_to_the_dense_build_of_the_same_weights(axis):
    """The same quantized graph built twice: --sparse (streams, DCOMP registers) and dense. The
    int8 outputs are identical; the weight DMA reads the streams (5/8 of the dense blob); the MAC
    cycles do not change (the vendor's NPU column is the same with and without the option)."""
    rng = np.random.default_rng(3)
    model = conv_model(prune(rng.normal(0, 0.1, (64, 64, 3, 3)), axis, rng), 8)
    data = samples(64, 8)
    front = prepare(model, "rk3576", CompileOptions(dataset=data, sparse=True))
    sparse = build(front)
    dense = build(dense_twin(front))
    x = data[0]["x"]
    ours, theirs = run(sparse, x), run(dense, x)
    np.testing.assert_array_equal(ours.read_native("y"), theirs.read_native("y"))
    (task,), (dense_task,) = ([r for run_ in rt.runs for r in run_.tasks] for rt in (ours, theirs))
    assert task.conv.decompress is not None and dense_task.conv.decompress is None
    # both axes: the vendor's entropy-coded pair of streams (LOWERING.md 27, 43), which the DMA
    # reads to the end of stream 1
    streams = task.conv.decompress.span
    assert task.traffic.weight_read == streams < (0.65 if axis != "both" else 0.4) * 36864
    assert dense_task.traffic.weight_read == 36864
    ours_perf = report_npu(sparse, ours.runs, RK3576).totals()
    dense_perf = report_npu(dense, theirs.runs, RK3576).totals()
    assert ours_perf["npu_cycles"] == dense_perf["npu_cycles"]
    assert ours_perf["ddr_cycles"] < dense_perf["ddr_cycles"]


@pytest.mark.skipif(not (FIXTURES / "sparse_rk3576_int8").exists(), reason="rknn op fixtures not present")
def test_the_vendor_conv_against_its_sparse_build(tmp_path):
    """The fixture's own model (Conv 3x3 64->64 on 56x56, 4:2 along Cin): npuemu's --sparse build
    writes DECOMP_CONTROL 5 and the vendor's two streams (its AMOUNT0/1), halves the weight sizes of
    the option-off build, reports 50%(IC) as the vendor's table, and keeps the vendor's NPU cycles;
    the vendor-estimate DDR cycles are the vendor's (weights counted as -1/8 of the stored half,
    LOWERING.md 43), the board model's fall by the weight bytes not read."""
    vendor = json.loads((FIXTURES / "sparse_rk3576_int8" / "meta.json").read_text())["librknnc"]["layers"][1]
    off = json.loads((FIXTURES / "sparse_rk3576_off_int8" / "meta.json").read_text())["librknnc"]["layers"][1]
    model = onnx.load(FIXTURES / "sparse_rk3576_int8" / "model.onnx")
    front = prepare(model, "rk3576", CompileOptions(dataset=samples(64, 56), sparse=True))
    from npuemu.compiler.sparse_weights import graph_decisions

    (decision,) = graph_decisions(front.graph, front.platform)
    assert decision.ratio == vendor["sparse_ratio"] == "50%(IC)"
    sparse = build(front)
    dense = build(dense_twin(front))
    x = np.zeros((1, 64, 56, 56), np.float32)
    rows, runtimes = {}, {}
    for name, model_file in (("sparse", sparse), ("dense", dense)):
        runtime = runtimes[name] = run(model_file, x)
        (record,) = [r for run_ in runtime.runs for r in run_.tasks]
        rows[name] = (record, report_npu(model_file, runtime.runs, RK3576, ddr_model="vendor").layers[0])
    cna, dense_cna = rows["sparse"][0].registers["CNA"], rows["dense"][0].registers["CNA"]
    assert cna.field("DCOMP_CTRL", "DECOMP_CONTROL") == 5  # the vendor's value (regcmd_diff_vs_off.txt)
    # the vendor's streams of the same int8 weights: its AMOUNT0/1 and REGNUM (LOWERING.md 27)
    assert [cna.raw(f"DCOMP_AMOUNT{i}") for i in range(3)] == [712, 716, 0]
    assert cna.field("DCOMP_REGNUM", "DCOMP_REGNUM") == 5
    from npuemu.isa.rknn import load_rknn

    vendor_file = load_rknn(FIXTURES / "sparse_rk3576_int8" / "model.rknn")
    vendor_tensor = next(t for t in vendor_file.tensors if t.name == "w1")
    stored = runtimes["sparse"].machine.memory.dump(cna.raw("DCOMP_ADDR0"), 11456 + 717 * 16)
    assert stored.tobytes() == bytes(vendor_file.blobs[vendor_tensor.blob_index])[:11456 + 717 * 16]
    assert 2 * cna.field("WEIGHT_SIZE0", "WEIGHT_BYTES") == dense_cna.field("WEIGHT_SIZE0", "WEIGHT_BYTES") == 36864
    sparse_row, dense_row = rows["sparse"][1], rows["dense"][1]
    assert sparse_row.npu_cycles == dense_row.npu_cycles == vendor["npu_cycles"] == off["npu_cycles"]
    assert dense_row.ddr_cycles == off["ddr_cycles"] == 58779
    assert sparse_row.ddr_cycles == vendor["ddr_cycles"] == 53532  # 36864 + 18432 / 8 bytes fewer
    assert dense_row.ddr_cycles - sparse_row.ddr_cycles == pytest.approx((36864 + 18432 / 8) / 7.465, abs=1)
    board = [report_npu(f, runtimes[name].runs, RK3576).layers[0].ddr_cycles for name, f in
             (("sparse", sparse), ("dense", dense))]
    assert board[0] < board[1]  # the board model: the DMA reads 22928 stream bytes, not 36864


@pytest.mark.parametrize("axis", [1, 0, "both"])
def test_sparse_build_against_onnxruntime(axis):
    """End to end: a 4:2-pruned conv + Relu (64 -> 96, 3x3, 12x12) built with --sparse along either
    axis, dequantized output against onnxruntime's float output."""
    import onnxruntime as ort

    rng = np.random.default_rng(11 + len(str(axis)))
    weights = prune(rng.normal(0, 0.1, (96, 64, 3, 3)), axis, rng)
    model = conv_model(weights, 12)
    node = helper.make_node("Relu", ["y"], ["z"])
    model.graph.node.append(node)
    model.graph.output[0].name = "z"
    data = samples(64, 12)
    front = prepare(model, "rk3576", CompileOptions(dataset=data, sparse=True))
    compiled = build(front)
    runtime = run(compiled, data[1]["x"])
    (task,) = [r for run_ in runtime.runs for r in run_.tasks]
    assert task.conv.decompress.mode == {1: "in_4_2", 0: "out_4_2", "both": "in_out_16_4"}[axis]
    ours = runtime.output("z")
    expected = ort.InferenceSession(model.SerializeToString()).run(None, data[1])[0]
    cosine = float(np.dot(ours.ravel(), expected.ravel()) / np.linalg.norm(ours) / np.linalg.norm(expected))
    assert cosine > 0.999 and np.abs(ours - expected).max() < 0.1 * np.abs(expected).max()


@pytest.mark.parametrize("axis, control, mode", [(1, 5, 1), (0, 6, 2), ("both", 7, 3)])
def test_register_form_of_each_mode(axis, control, mode):
    """DECOMP_CONTROL 5 along input channels, 6 along output channels, 7 for 16:4 in the RK3588 form
    the emulator reads (npuemu's stand-ins for the last two); every mode packed in the vendor's rk3576
    layout, which stores DECOMP_CONTROL 5 and the mode in CORE 0x3018 bits 13:12 (LOWERING.md 43.2, 44)."""
    rng = np.random.default_rng(8)
    model = conv_model(prune(rng.normal(0, 0.1, (64, 64, 3, 3)), axis, rng), 8)
    built = build(prepare(model, "rk3576", CompileOptions(dataset=samples(64, 8), sparse=True)))
    (task,) = [r for run_ in run(built, samples(64, 8)[0]["x"]).runs for r in run_.tasks]
    cna = task.registers["CNA"]
    assert cna.field("DCOMP_CTRL", "DECOMP_CONTROL") == control and cna.field("DCOMP_REGNUM", "DCOMP_REGNUM") == 5
    platform = built.trailer["platform"]
    assert platform.get("register_layout") == "rk3576_vendor" and "register_layout_notice" not in platform
    regcmd = next(s for s in built.sections if s.name == "regcmd").data
    stored = {(word >> 48, word & 0xFFFF): (word >> 16) & 0xFFFFFFFF
              for word in (int.from_bytes(regcmd[i:i + 8], "little") for i in range(0, len(regcmd), 8))}
    vendor = load_regmap("rk3576_vendor")
    assert stored[(vendor.block("CNA").target, 0x1100)] & 0x7 == 5       # DCOMP_CTRL as the vendor writes it
    assert (stored[(vendor.block("CORE").target, 0x3018)] >> 12) & 3 == mode


# -- the option on other builds and chips --------------------------------------------------------
def test_other_chips_refuse_sparse_naming_the_chips_that_have_it():
    model = conv_model(np.ones((32, 32, 1, 1), np.float32), 4)
    with pytest.raises(ConfigError, match=r"^--sparse: rk3588 has no sparse inference; it is on rk3576 "):
        prepare(model, "rk3588", CompileOptions(dataset=samples(32, 4), sparse=True))


def test_cli_sparse_summary_and_refusal(tmp_path, capsys, monkeypatch):
    from npuemu.tools.cli import main

    rng = np.random.default_rng(4)
    onnx.save(conv_model(prune(rng.normal(0, 0.1, (32, 32, 3, 3)), 1, rng), 4), tmp_path / "conv.onnx")
    np.save(tmp_path / "x.npy", samples(32, 4)[0]["x"])
    (tmp_path / "ds.txt").write_text("x.npy\n")
    monkeypatch.chdir(tmp_path)

    def compile_(*flags):
        code = main(["compile", "conv.onnx", "--no-progress", *flags])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = compile_("-t", "rk3576", "--dataset", "ds.txt", "--sparse", "-o", "s.npu")
    assert code == 0 and ": 50%(IC) - 4:2 along input channels" in out, out
    code, _, err = compile_("-t", "rv1106", "--dataset", "ds.txt", "--sparse")
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert "rv1106 has no sparse inference; it is on rk3576" in err
    code, out, _ = compile_("-t", "rk3576", "--fp16", "--sparse", "-o", "f1.npu")
    assert code == 0 and "--sparse ignored: an fp16 build" in out
    assert compile_("-t", "rk3576", "--fp16", "-o", "f2.npu")[0] == 0
    assert (tmp_path / "f1.npu").read_bytes() == (tmp_path / "f2.npu").read_bytes()


def test_sparse_leaves_a_dense_model_byte_identical():
    """--sparse on a model without pruned weights changes nothing: same quantization, same file."""
    model = conv_model(np.random.default_rng(5).normal(0, 0.1, (32, 32, 3, 3)), 4)
    files = [build(prepare(model, "rk3576", CompileOptions(dataset=samples(32, 4), sparse=flag))).to_bytes()
             for flag in (True, False)]
    assert files[0] == files[1]


def test_api_sparse_infer_builds_sparse_weights_on_rk3576_only(tmp_path, capsys):
    """The vendor's config(sparse_infer=True) is the driver's --sparse (guide 5.11.3)."""
    from npuemu.api import RKNN

    rng = np.random.default_rng(6)
    onnx.save(conv_model(prune(rng.normal(0, 0.1, (32, 32, 3, 3)), 0, rng), 4), tmp_path / "conv.onnx")
    np.save(tmp_path / "x.npy", samples(32, 4)[0]["x"].transpose(0, 2, 3, 1))  # the vendor's NHWC samples
    (tmp_path / "ds.txt").write_text("x.npy\n")
    results = {}
    for chip in ("rk3576", "rk3588"):
        rknn = RKNN()
        assert rknn.config(target_platform=chip, sparse_infer=True) == 0
        assert rknn.load_onnx(str(tmp_path / "conv.onnx")) == 0
        results[chip] = (rknn.build(dataset=str(tmp_path / "ds.txt")), rknn._model, capsys.readouterr().err)
    code, model, _ = results["rk3576"]
    assert code == 0
    (task,) = [r for run_ in run(model, samples(32, 4)[0]["x"]).runs for r in run_.tasks]
    assert task.conv.decompress.mode == "out_4_2"
    code, _, err = results["rk3588"]
    assert code == -1 and "rk3588 has no sparse inference; it is on rk3576" in err
