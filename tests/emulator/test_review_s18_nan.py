"""Review of session 18's canonical NaN (NUMERICS.md 3.3, the section on canonical NaN sums): fp16
programs compiled end to end (``npuemu compile --fp16``) for each chip, fed inputs with NaNs of
both signs and several payloads, infinities (inf x a zero weight is a NaN product) and finite
values. Every NaN the CORE hands the DPU (the fp32 sums, ``run_dpu``'s source) is 0x7FC00000,
and, the DPU adding only finite operands to it here (no bias, no element-wise input), every NaN
output is too. The forms: 3x3, strided, dilated and wide convs, a 1x1 conv, depthwise 3x3 (stride
1 and 2), two transposed convs (the CNA's deconvolution mode) and a fully connected layer; then
vendor fp16 builds (tests/data) through the .rknn runner, NaN inputs placed as given."""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.emulator import core
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile

C, S = 16, 8
#: fp16 NaNs of both signs, quiet and signalling, several payloads
NANS16 = np.array([0x7E01, 0xFE2A, 0x7D55, 0xFC01, 0x7FFF, 0xFFFF], np.uint16)
CANONICAL32 = 0x7FC00000


def _graph(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], [], []

    def layer(op, name, wshape, oshape, **attrs):
        weights = rng.integers(-2, 3, wshape).astype(np.float32) * 0.5  # (zeros among them: inf x 0)
        inits.append(numpy_helper.from_array(weights, name + "_w"))
        nodes.append(helper.make_node(op, ["x", name + "_w"], [name], name=name, **attrs))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, oshape))

    same = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    layer("Conv", "c3", (C, C, 3, 3), [1, C, S, S], **same)
    layer("Conv", "c1", (32, C, 1, 1), [1, 32, S, S], kernel_shape=[1, 1])
    layer("Conv", "dw", (C, 1, 3, 3), [1, C, S, S], group=C, **same)
    layer("Conv", "dws2", (C, 1, 3, 3), [1, C, S // 2, S // 2], group=C, strides=[2, 2], **same)
    layer("Conv", "c3s2", (C, C, 3, 3), [1, C, S // 2, S // 2], strides=[2, 2], **same)
    layer("Conv", "c3w", (64, C, 3, 3), [1, 64, S, S], **same)
    layer("Conv", "c3d2", (C, C, 3, 3), [1, C, S - 4, S - 4], kernel_shape=[3, 3], dilations=[2, 2])
    layer("ConvTranspose", "dc2", (C, C, 2, 2), [1, C, 2 * S, 2 * S], kernel_shape=[2, 2], strides=[2, 2])
    layer("ConvTranspose", "dc4", (C, C, 4, 4), [1, C, 2 * S, 2 * S], kernel_shape=[4, 4], strides=[2, 2],
          pads=[1, 1, 1, 1])
    nodes.append(helper.make_node("Flatten", ["x"], ["flat"], name="flat"))
    inits.append(numpy_helper.from_array(rng.integers(-2, 3, (C * S * S, 24)).astype(np.float32), "fc_w"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w"], ["fc"], name="fc"))
    outs.append(helper.make_tensor_value_info("fc", TensorProto.FLOAT, [1, 24]))
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, S, S])],
                              outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _input(seed: int) -> np.ndarray:
    """fp16 values (as float32): ~5% NaNs of NANS16, ~3% infinities of both signs, the rest normal."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1, C, S, S)).astype(np.float16)
    bits, pick = x.view(np.uint16), rng.random(x.shape)
    bits[pick < 0.05] = rng.choice(NANS16, int((pick < 0.05).sum()))
    infinite = (pick >= 0.05) & (pick < 0.08)
    bits[infinite] = rng.choice(np.array([0x7C00, 0xFC00], np.uint16), int(infinite.sum()))
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from npuemu.tools.cli import main

    folder = tmp_path_factory.mktemp("nan_models")
    onnx.save(_graph(), folder / "m.onnx")
    paths = {}
    for chip in ("rk3588", "rk3568", "rk3576", "rk3562"):
        paths[chip] = folder / f"{chip}.npu"
        assert main(["compile", str(folder / "m.onnx"), "--fp16", "-t", chip, "-o", str(paths[chip])]) == 0
    return paths


@pytest.mark.parametrize("chip", ["rk3588", "rk3568", "rk3576", "rk3562"])
@pytest.mark.parametrize("seed", [1, 2])
def test_every_nan_the_core_sums_and_the_outputs_hold_is_canonical(built, monkeypatch, chip, seed):
    sums = []
    real = core.run_dpu

    def watched(state, rdma, source, *args, **kwargs):
        if source is not None and source.data.dtype == np.float32:
            sums.append(np.array(source.data))
        return real(state, rdma, source, *args, **kwargs)

    monkeypatch.setattr(core, "run_dpu", watched)
    runtime = Runtime(ModelFile.read(built[chip]))
    runtime.set_input("x", _input(seed))
    runtime.run()  # (a first run: every task through the units, run_dpu included)
    assert len(sums) >= 10
    nans = [np.isnan(data) for data in sums]
    assert sum(int(nan.sum()) for nan in nans) and sum(int((~nan).sum()) for nan in nans)  # (both kinds)
    for data, nan in zip(sums, nans):
        assert set(np.unique(data.view(np.uint32)[nan]).tolist()) <= {CANONICAL32}
    for name in runtime.outputs:
        out = np.asarray(runtime.output(name), np.float32)
        nan = np.isnan(out)
        assert nan.any(), name
        assert set(np.unique(out.view(np.uint32)[nan]).tolist()) == {CANONICAL32}, name


DATA = Path(__file__).resolve().parents[1] / "data"
#: vendor fp16 builds (rknn-toolkit2's own register streams), their chip
VENDOR = {"vendor_deconv/fp16_k4s2p1": "rk3588", "vendor_deconv/fp16_k2s2p0_rk3576": "rk3576",
          "rk3576_vendor/se8_fp16": "rk3576", "rk3576_vendor/dw80_f16": "rk3576",
          "rk3576_vendor/pool3s2_fp16_dw_rk3588": "rk3588", "rk3576_vendor/bilinear_fp16_rk3588": "rk3588"}
VENDOR.update({str(path.relative_to(DATA)).removesuffix(".rknn.xz"): "rk3588"
               for name in ("fp16_56to17", "dw_fp16_24", "ln_1x6x20_fp16", "fp16_16x6x9_s12")
               for path in sorted(DATA.glob(f"*/{name}.rknn.xz"))})


@pytest.mark.parametrize("name", sorted(VENDOR))
def test_vendor_fp16_programs_hand_the_dpu_canonical_nans_only(name, monkeypatch, tmp_path):
    """The vendor runner refuses NaN inputs (rknn_runner.quantize_input); an fp16 input is placed
    as given here, so the vendor's own conv, depthwise, deconv and matmul tasks see NaNs."""
    from npuemu.emulator.rknn_runner import RknnRunner
    from npuemu.isa.rknn import load_rknn

    sums = []
    real_dpu, real_input = core.run_dpu, RknnRunner.quantize_input

    def watched(state, rdma, source, *args, **kwargs):
        if source is not None and source.data.dtype == np.float32:
            sums.append(np.array(source.data))
        return real_dpu(state, rdma, source, *args, **kwargs)

    def placed(self, index, array):
        checked = real_input(self, index, np.nan_to_num(array, nan=0.0, posinf=0.0, neginf=0.0))
        assert checked.dtype == np.float16
        return np.asarray(array, np.float16).reshape(checked.shape)

    monkeypatch.setattr(core, "run_dpu", watched)
    monkeypatch.setattr(RknnRunner, "quantize_input", placed)
    path = tmp_path / "m.rknn"
    path.write_bytes(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()))
    runner = RknnRunner(load_rknn(path), platform=VENDOR[name])
    rng = np.random.default_rng(3)
    inputs = []
    for tensor in runner.input_tensors:
        x = rng.normal(size=tensor.shape).astype(np.float16)
        bits, pick = x.view(np.uint16), rng.random(x.shape)
        bits[pick < 0.05] = rng.choice(NANS16, int((pick < 0.05).sum()))
        bits[(pick >= 0.05) & (pick < 0.08)] = 0xFC00
        inputs.append(x.astype(np.float32))
    runner.run(inputs)
    assert sums
    assert any(np.isnan(data).any() for data in sums)
    for data in sums:
        assert set(np.unique(data.view(np.uint32)[np.isnan(data)]).tolist()) <= {CANONICAL32}


def _matmul_model(folder: Path) -> Path:
    from npuemu.tools.cli import main

    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8, 40]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 40, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, folder / "mm.onnx")
    assert main(["compile", str(folder / "mm.onnx"), "--fp16", "-o", str(folder / "mm.npu")]) == 0
    return folder / "mm.npu"


def test_a_k_split_matmul_whose_partial_sums_are_opposite_infinities_gives_the_canonical_nan(monkeypatch, tmp_path):
    """The DPU's own NaN (NUMERICS.md 37, default-NaN mode): an fp16 MatMul whose K is split over tasks
    adds the partial sums in the DPU; +inf + -inf there is the host's default NaN (x86: 0xFFC00000,
    fp16 0xFE00) inside the chain, stored as the canonical NaN (fp16 0x7E00, read back 0x7FC00000)."""
    sums = []
    real = core.run_dpu

    def watched(state, rdma, source, *args, **kwargs):
        if source is not None and source.data.dtype == np.float32:
            sums.append(np.array(source.data))
        return real(state, rdma, source, *args, **kwargs)

    monkeypatch.setattr(core, "run_dpu", watched)
    runtime = Runtime(ModelFile.read(_matmul_model(tmp_path)))
    a, b = np.ones((1, 8, 40), np.float32), np.ones((1, 40, 32), np.float32)
    a[0, 0, 0], a[0, 0, 39] = np.inf, -np.inf  # (row 0: +inf in the first K part, -inf in the last)
    runtime.set_input("a", a)
    runtime.set_input("b", b)
    runtime.run()
    assert len(sums) > 1 and not any(np.isnan(data).any() for data in sums)  # (no NaN from the CORE)
    y = np.asarray(runtime.output("y"), np.float32)
    assert np.isnan(y[0, 0]).all() and not np.isnan(y[0, 1:]).any()
    assert set(np.unique(y.view(np.uint32)[np.isnan(y)]).tolist()) == {CANONICAL32}
