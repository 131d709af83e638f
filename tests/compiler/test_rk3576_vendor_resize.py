"""npuemu's own rk3576 Resize (nearest) in the vendor's layout (compiler/LOWERING.md 50): each unpooling copy is
written as the vendor's copy frame (isa/rknn/rk3576_resize.py), the build keeps the vendor layout, and its outputs
equal the RK3588-position build's and numpy's nearest repeat of the quantized input bit for bit. The vendor's
rk3576 file of the same ONNX (tests/emulator/test_rknn_rk3576_resize.py) holds the same copy words but addresses."""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions
from npuemu.emulator.runtime import Runtime
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.words import TARGET_OP_ENABLE
from tests.compiler.test_rk3576_vendor_emit import both_layouts

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
VENDOR = load_regmap("rk3576_vendor")


def resize_model(shape, factor: int, conv_after: bool = False) -> onnx.ModelProto:
    """y = Resize(x, nearest, scales [1, 1, f, f]) (then a 1x1 conv when ``conv_after``), opset 13."""
    out = [shape[0], shape[1], shape[2] * factor, shape[3] * factor]
    scales = numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "sc")
    nodes = [helper.make_node("Resize", ["x", "", "sc"], ["r" if conv_after else "y"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    inits = [scales]
    if conv_after:
        weight = np.random.RandomState(3).randn(shape[1], shape[1], 1, 1).astype(np.float32) * 0.3
        inits.append(numpy_helper.from_array(weight, "w"))
        nodes.append(helper.make_node("Conv", ["r", "w"], ["y"]))
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model


def _samples(shape, seeds=(10, 11, 12)):
    return [{"x": np.random.RandomState(seed).randn(*shape).astype(np.float32)} for seed in seeds]


def _run(built, x):
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return np.asarray(runtime.output("y", dequantize=False))


def _options(shape, fp16: bool) -> CompileOptions:
    return CompileOptions(precision="fp16") if fp16 else CompileOptions(dataset=_samples(shape))


def _check(shape, factor, fp16, conv_after=False):
    vendor, old = both_layouts(resize_model(shape, factor, conv_after), _options(shape, fp16))
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert "register_layout" not in old.trailer["platform"]
    for seed in (5, 6):
        x = np.random.RandomState(seed).randn(*shape).astype(np.float32) * 1.5
        ours = _run(vendor, x)
        np.testing.assert_array_equal(ours, _run(old, x))
    return vendor, old, x, ours


@pytest.mark.parametrize("fp16", [False, True])
def test_own_resize_is_the_nearest_repeat_in_the_vendor_layout(fp16):
    shape, factor = (1, 24, 6, 10), 2
    vendor, _, x, ours = _check(shape, factor, fp16)
    if fp16:
        reference = x.astype(np.float16)
    else:   # the input codes the build's own input quantization gives (its graph input tensor)
        quant = vendor.tensor("x").quantization
        scale, zero = quant.scale[0], quant.zero_point[0]
        reference = np.clip(np.rint(x / scale) + zero, -128, 127).astype(np.int64)
    np.testing.assert_array_equal(ours.astype(reference.dtype),
                                  reference.repeat(factor, axis=2).repeat(factor, axis=3))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(channels=st.sampled_from([8, 16, 40, 64]), height=st.integers(1, 7), width=st.integers(1, 9),
       factor=st.sampled_from([2, 4, 8]), fp16=st.booleans(), conv_after=st.booleans())
def test_own_resizes_run_bit_identically_in_both_layouts(channels, height, width, factor, fp16, conv_after):
    _check((1, channels, height, width), factor, fp16, conv_after)


def _copy_frames(words, regmap):
    """(op-enable, values) of each task of a regcmd stream (tasks split at their op-enable words)."""
    tasks, current = [], []
    for word in (int(w) for w in words):
        if word >> 48 == TARGET_OP_ENABLE:
            tasks.append(((word >> 16) & 0xFFFFFFFF, current))
            current = []
        elif word:
            current.append(word)
    return [(enable, read_task(body, regmap, "own", enable)) for enable, body in tasks]


def test_own_copy_words_are_the_vendors_but_addresses():
    """npuemu's build of the committed vendor file's ONNX (int8 [1, 16, 12, 20], x2) against the vendor's copy in
    effect (its 30-word delta on the clear conv's group)."""
    shape = (1, 16, 12, 20)
    vendor_built, _ = both_layouts(resize_model(shape, 2), _options(shape, False))
    regcmd = np.frombuffer(next(s for s in vendor_built.sections if s.name == "regcmd").data, "<u8")
    ours = [task for enable, task in _copy_frames(regcmd, VENDOR) if enable == 0x18]
    assert len(ours) == 1
    model = load_rknn(lzma.decompress((DATA / "resize2_int8.rknn.xz").read_bytes()), "resize2_int8")
    program, values = model.program, {}
    for position in (0, 2):   # the clear conv, then the copy on its register group
        record = program.tasks[program.chains[0].tasks[position]]
        values = dict(read_task(program.regcmd[record.first_word:record.tail_word], VENDOR, "v",
                                record.enable_mask, values).values)
    frame = {key: value for key, value in ours[0].values.items() if key[0] in ("DPU", "DPU_RDMA")}
    assert len(frame) == 89 - 8   # the frame's 89 words less the eight reserved ones read_task skips (0x5078 is
    # LINE_NOTCH since REGISTER_SEMANTICS.md 56.2)
    differ = {key: (hex(value), hex(values[key])) for key, value in frame.items() if values[key] != value}
    assert set(differ) <= {("DPU", "DST_BASE_ADDR"), ("DPU_RDMA", "SRC_BASE_ADDR")}, differ
