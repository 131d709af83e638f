"""npuemu's own fp16 conv + LUT activation builds for rk3576 in the vendor's layout (compiler/LOWERING.md 51,
isa/rknn/rk3576_lut_fp16.py): the table-unit factor t moves from the EW multiplier to OUT_CVT, rounded to the
15 bits OUT_CVT_SCALE holds.

The reference for the outputs is the RK3588-position build of the same model whose factor is t rounded to 15
significant bits here (``_fifteen_bits``, written from the rule, not from the module): the vendor layout's one
numerical change. ``lut_hsw_fp16.rknn.xz``: see tests/emulator/test_rknn_rk3576_fp16_lut.py.
"""

from __future__ import annotations

import dataclasses
import lzma
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from npuemu.compiler.lower import lut as lut_module
from npuemu.isa.rknn import load_rknn
from tests.compiler.test_rk3576_vendor_emit import DATA, VENDOR, _build, _inputs, _run, _values
from tests.compiler.test_rk3576_vendor_lut import lut_model, se_model

OPS = ["Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Silu"]


def _fifteen_bits(t: float) -> float:
    """t to 15 significant bits, nearest (OUT_CVT_SCALE in [2^14, 2^15) times a power of two)."""
    mantissa, exponent = math.frexp(t)            # t = mantissa 2^exponent, 0.5 <= mantissa < 1
    return round(mantissa * (1 << 15)) * 2.0 ** (exponent - 15)


def _rounded_factor(monkeypatch):
    original = lut_module.lut_fp16_program

    def rounded(*args, **kwargs):
        program = original(*args, **kwargs)
        return dataclasses.replace(program, output_unit=_fifteen_bits(float(np.float32(program.output_unit))))

    monkeypatch.setattr(lut_module, "lut_fp16_program", rounded)


def _onnx_run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _check_fifteen_bits(monkeypatch, model, channels=16):
    samples = _inputs(channels, (12, 20), count=2)
    samples.append({"x": samples[0]["x"] * 4})   # past the tables' ends: the flat and linear tails
    vendor = _build(model, None, True, True)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    _rounded_factor(monkeypatch)
    reference = _build(model, None, True, False, monkeypatch)
    assert "register_layout" not in reference.trailer["platform"]
    for sample in samples:
        ours = np.asarray(_run(vendor, sample["x"]), np.float32)
        np.testing.assert_array_equal(ours, np.asarray(_run(reference, sample["x"]), np.float32))
        expected = _onnx_run(model, sample["x"]).ravel().astype(np.float64)
        got = ours.ravel().astype(np.float64)
        assert got @ expected / np.linalg.norm(got) / np.linalg.norm(expected) > 0.9999


@pytest.mark.parametrize("op", OPS)
def test_own_fp16_lut_conv_is_vendor_layout_and_runs_as_the_fifteen_bit_factor(monkeypatch, op):
    _check_fifteen_bits(monkeypatch, lut_model(op))


@pytest.mark.parametrize("channels, gate", [(8, "Sigmoid"), (16, "HardSigmoid"), (40, "HardSigmoid"),
                                            (24, "Sigmoid")])
def test_own_fp16_se_gate_is_vendor_layout(monkeypatch, channels, gate):
    """The SE gate: GlobalAveragePool (depthwise convs), the gate's LUT conv and the fp16 per-channel Mul
    (REGISTER_SEMANTICS.md 50.4) all in the vendor's words."""
    _check_fifteen_bits(monkeypatch, se_model(channels, gate), channels)


def test_own_fp16_lut_conv_keeps_the_old_layouts_factor_unchanged(monkeypatch):
    """The fallback (RK3588 positions) still multiplies by the fp32 t: the vendor build differs from it, by at
    most one fp16 step, only where the 15-bit rounding moves an output across a rounding boundary."""
    model = lut_model("HardSwish")
    x = _inputs(16, (12, 20), count=1)[0]["x"]
    vendor = np.asarray(_run(_build(model, None, True, True), x), np.float32)
    old = np.asarray(_run(_build(model, None, True, False, monkeypatch), x), np.float32)
    steps = np.abs(vendor.astype(np.float16).view(np.int16).astype(int) - old.astype(np.float16).view(np.int16))
    assert 0 < np.count_nonzero(steps) < vendor.size // 20 and steps[vendor != 0].max() == 1


def _vendor_model(op: str) -> onnx.ModelProto:
    """The ONNX of the stored vendor build (see the module doc): Conv 3x3 16 -> 16 pad 1 on 12 x 12 + ``op``."""
    rng = np.random.RandomState(1)
    weights = (rng.randn(16, 16, 3, 3) * (2.0 / 144) ** 0.5).astype(np.float32)
    bias = (rng.randn(16) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node(op, ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 12, 12])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16, 12, 12])],
                              [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


#: words that differ for reasons of their own: the addresses (the vendor's stored file holds offsets
#: before relocation), S_POINTER (the vendor's second task of a register group), OUT_CVT_OFFSET (the vendor
#: writes 1, npuemu 0: the fp path does not read it, emulator/NUMERICS.md 4.6)
UNRELATED = {("CNA", "S_POINTER"), ("CORE", "S_POINTER"), ("DPU", "S_POINTER"), ("DPU_RDMA", "S_POINTER"),
             ("CNA", "FEATURE_DATA_ADDR"), ("CNA", "DCOMP_ADDR0"), ("DPU", "DST_BASE_ADDR"),
             ("DPU_RDMA", "BS_BASE_ADDR"), ("DPU_RDMA", "ADDR_5030"), ("DPU", "OUT_CVT_OFFSET")}


def test_own_fp16_hardswish_conv_task_is_the_vendors_word_for_word():
    """npuemu's X, tables and t for HardSwish are the vendor's (LOWERING.md 4.1), so its rk3576 task is the
    vendor's task 1: 139 words equal but the unrelated ones - the OUT_CVT factor 24577 x 2^-13 included."""
    program = load_rknn(lzma.decompress((DATA / "lut_hsw_fp16.rknn.xz").read_bytes()), "rk3576").program
    record = program.tasks[1]
    start = record.regcmd_addr // 8
    theirs = _values(np.frombuffer(program.regcmd, "<u8")[start:start + record.regcfg_amount], VENDOR)
    built = _build(_vendor_model("HardSwish"), None, True, True)
    regcmd = np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")
    ours = _values(regcmd[:record.regcfg_amount], VENDOR)
    assert theirs[("DPU", "OUT_CVT_SCALE")] == 0x16001 and theirs[("DPU", "OUT_CVT_SHIFT")] == 0xF00D
    assert {key for key in set(ours) | set(theirs) if ours.get(key) != theirs.get(key)} <= UNRELATED
    assert len(theirs) > 130
