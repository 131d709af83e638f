"""npuemu's own rk3576 builds of fp16 DPU-only Max / Sub, Adds and Muls over padded channels and standalone LUT
tasks (int8, fp16) in the vendor's layout (compiler/LOWERING.md 55, isa/rknn/rk3576_ew.py): each build is in the
vendor layout and runs bit-identically to the same build at RK3588 positions - but the fp16 LUT, whose factor the
vendor form holds to 15 bits (LOWERING.md 51.1's one numerical change), within one fp16 step.

Reference for the words: the vendor's rk3576 build of the same ONNX (``tests/data/rk3576_vendor/lut1_hsw_fp16.rknn.xz``,
how it was made: tests/emulator/test_rknn_rk3576_ew.py).
"""

from __future__ import annotations

import lzma

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npuemu.compiler.driver import CompileOptions
from npuemu.isa.rknn import load_rknn
from tests.compiler.test_rk3576_vendor_dpu_int8 import _run
from tests.compiler.test_rk3576_vendor_emit import DATA, VENDOR, _values, both_layouts

LUT_FLAG = 0x1001_0000_0010_40CC        # DPU (target 0x1001) 0x40CC = 0x10: the standalone LUT task's word
LUT_EW_WORD = 0x1001_0100_4140_407C     # DPU 0x407C = 0x01004140: the LUT stage


def _model(op: str, shape, inputs=("x", "z")) -> onnx.ModelProto:
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name in inputs]
    graph = helper.make_graph([helper.make_node(op, list(inputs), ["y"])], "g", values,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def _feeds(shape, inputs, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return {name: (rng.normal(size=shape) * scale).astype(np.float32) for name in inputs}


def _regcmd(built) -> np.ndarray:
    return np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")


def _fp16_steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    def ordered(v):
        bits = np.asarray(v, np.float32).astype(np.float16).view(np.int16).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFF), bits)
    return np.abs(ordered(a) - ordered(b))


@pytest.mark.parametrize("op, shape", [("Max", (1, 20, 4, 10)), ("Sub", (1, 20, 4, 10)), ("Max", (1, 16, 6, 8)),
                                       ("Mul", (1, 1, 4, 40)), ("Add", (1, 1, 4, 40)), ("Sub", (1, 3, 5, 9))])
def test_own_fp16_ew_build_is_vendor_layout_and_runs_like_the_old_layout(op, shape):
    """ppocr_rec's forms: Softmax's Max of halves over 3313 channels, LayerNorm's Sub, the 1-channel Adds / Muls of
    its sums and Newton steps - here on small cubes, padded (20 -> 24, 1 -> 8, 3 -> 8) and whole."""
    vendor, old = both_layouts(_model(op, shape), CompileOptions(precision="fp16"))
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    for seed in (5, 6):
        feeds = _feeds(shape, ("x", "z"), seed, 3.0)
        np.testing.assert_array_equal(_run(vendor, feeds), _run(old, feeds))


@pytest.mark.parametrize("op, fp16", [("HardSwish", False), ("Sigmoid", False), ("HardSwish", True),
                                      ("Sigmoid", True), ("Tanh", True)])
def test_own_standalone_lut_build_is_vendor_layout(op, fp16):
    """A LUT of a graph input is npuemu's standalone LUT task (DPU-only, op-enable 0x18): written in the vendor's
    form (0x40CC = 0x10 beside the LUT stage); int8 bit-identical to the RK3588-position build, fp16 within one
    step (the 15-bit factor; the Sigmoid's is 2^-15 exactly: bit-identical)."""
    shape = (1, 16, 4, 10)
    samples = [_feeds(shape, ("x",), seed) for seed in (0, 1)]
    options = CompileOptions(precision="fp16") if fp16 else CompileOptions(dataset=samples)
    vendor, old = both_layouts(_model(op, shape, ("x",)), options)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    words = set(int(w) for w in _regcmd(vendor))
    assert LUT_FLAG in words and LUT_EW_WORD in words
    for seed in (5, 6):
        feeds = _feeds(shape, ("x",), seed, 3.0)
        ours, theirs = _run(vendor, feeds), _run(old, feeds)
        if fp16:   # Sigmoid's factor is 2^-15 (X 8: t = 2^-15 exactly), HardSwish's and Tanh's are rounded
            steps = _fp16_steps(ours, theirs)
            assert steps.max() <= 1 and np.mean(steps == 0) > 0.8
            assert op != "Sigmoid" or steps.max() == 0
        else:
            np.testing.assert_array_equal(ours, theirs)


#: words that differ for reasons of their own (tests/compiler/test_rk3576_vendor_fp16_lut.py's UNRELATED): the
#: addresses (0 in the vendor's stored file), S_POINTER (the vendor's task is its register group's second),
#: OUT_CVT_OFFSET (the vendor writes 1, npuemu 0: the fp path does not read it, emulator/NUMERICS.md 4.6)
UNRELATED = {("DPU", "S_POINTER"), ("DPU_RDMA", "S_POINTER"), ("DPU", "DST_BASE_ADDR"), ("DPU_RDMA", "SRC_BASE_ADDR"),
             ("DPU_RDMA", "ADDR_5030"), ("DPU", "OUT_CVT_OFFSET")}


def test_own_fp16_standalone_hardswish_is_the_vendors_task_word_for_word():
    """npuemu's X, table and t for HardSwish are the vendor's (LOWERING.md 4.1), so its standalone LUT task is the
    vendor's task 1 (89 words) but the unrelated ones; the upload follows in the same task (LOWERING.md 55)."""
    program = load_rknn(lzma.decompress((DATA / "lut1_hsw_fp16.rknn.xz").read_bytes()), "rk3576").program
    record = program.tasks[program.chains[0].tasks[1]]
    start = record.regcmd_addr // 8
    theirs = _values(np.frombuffer(program.regcmd, "<u8")[start:start + record.regcfg_amount], VENDOR)
    vendor, _ = both_layouts(_model("HardSwish", (1, 16, 12, 20), ("x",)), CompileOptions(precision="fp16"))
    regcmd = _regcmd(vendor)   # the build's one task: the standalone LUT
    ours = _values(regcmd[:record.regcfg_amount], VENDOR)
    assert theirs[("DPU", "RSV_40CC")] == 0x10 and theirs[("DPU", "OUT_CVT_SCALE")] == 0x16001
    assert {key for key in set(ours) | set(theirs) if ours.get(key) != theirs.get(key)} <= UNRELATED
    assert len(theirs) > 80
