"""Every kernel shape (issue 24 item 1): the NPU cycle rule (model H1, emulator/TIMING.md) for
kernels with kh != kw, strides and dilations, checked three ways:

1. generated convs (any kh, kw in 1..7, strides 1..3, dilations 1..3, pads, int8 and fp16)
   compiled by npuemu: each task's registers carry the ONNX geometry (kernel not transposed,
   strides, dilations, output width, rows covering the output once), and the cycles the
   emulator derives from those registers equal this file's own formula on that geometry;
2. first principles: the CNA walks the output in 16-pixel groups of the flattened OH*OW plane
   and, per group, every kernel tap of every 32-channel input group for K kernels at a time;
   the stride and the dilation only change which input pixels a tap fetches. So the cycles of
   one task depend on OH*OW, kh*kw, Cin and Cout alone: the same output from another stride or
   dilation costs the same, and the transposed conv (kh<->kw, H<->W) costs the same;
3. the vendor corpus's 32 non-square conv cases (1x3 and 3x1, stride 1 and 2, dilation 1 and
   2) compiled by npuemu for rk3588 int8: equal to the vendor's static figure where the layer is
   one task; a layer split along its output rows pays the 16-pixel rounding once per task
   (TIMING.md "Every kernel shape"), the vendor's static estimate once per layer, and
   `perf --ddr-model vendor` (which merges the row bands) gives the vendor's figure on all 32.

The formula here is written from ../shared/docs/vendor-corpus/README.md section 4.1, not
imported from the emulator.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.shared_data import VENDOR_CORPUS
from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.timing.npu_cycles import task_npu_cycles
from npuemu.emulator.timing.vendor_estimate import vendor_layer_npu_cycles
from npuemu.emulator.units.state import FP16
from npuemu.platforms import load_platform

RK3588 = load_platform("rk3588")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def h1_cycles(rows: int, width: int, cin: int, cout: int, kh: int, kw: int, fp16: bool) -> int:
    """README 4.1 for a normal (not depthwise) conv task on rk3588: 16-pixel groups x kernel
    groups of K (32 int8, 16 fp16) x max(taps x 32-channel groups, floor 4 int8 / 2 fp16)."""
    pixels = _ceil(rows * width, 16) * 16
    if cin == 1:
        return pixels * kh * kw
    k, floor = (16, 2) if fp16 else (32, 4)
    return pixels * _ceil(cout, k) * max(kh * kw * _ceil(cin, 32), floor)


def out_size(size: int, kernel: int, stride: int, dilation: int, pad_a: int, pad_b: int) -> int:
    return (size + pad_a + pad_b - dilation * (kernel - 1) - 1) // stride + 1


def conv_model(cin, cout, h, w, kernel, strides, dilations, pads, seed=0) -> onnx.ModelProto:
    rng = np.random.RandomState(seed)
    weights = (rng.randn(cout, cin, *kernel) * 0.2).astype(np.float32)
    bias = (rng.randn(cout) * 0.1).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=list(kernel), strides=list(strides),
                            dilations=list(dilations), pads=list(pads))
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def conv_tasks(model: onnx.ModelProto, fp16: bool, shape: tuple[int, ...]):
    """The conv task records of one run of ``model`` compiled for rk3588."""
    rng = np.random.RandomState(1)
    if fp16:
        options = CompileOptions(precision="fp16")
    else:
        options = CompileOptions(dataset=[{"x": rng.randn(*shape).astype(np.float32)}])
    runtime = Runtime(compile_model(model, "rk3588", options))
    runtime.set_input("x", rng.randn(*shape).astype(np.float32))
    runtime.run()
    return [task for run in runtime.runs for task in run.tasks if task.conv is not None]


shapes = st.fixed_dictionaries({
    "cin": st.integers(1, 48), "cout": st.integers(1, 48), "h": st.integers(1, 24), "w": st.integers(1, 24),
    "kernel": st.tuples(st.integers(1, 7), st.integers(1, 7)), "strides": st.tuples(st.integers(1, 3), st.integers(1, 3)),
    "dilations": st.tuples(st.integers(1, 3), st.integers(1, 3)), "pads": st.tuples(*[st.integers(0, 3)] * 4),
    "fp16": st.booleans()})


def _geometry(case: dict) -> tuple[int, int] | None:
    (kh, kw), (sh, sw), (dh, dw) = case["kernel"], case["strides"], case["dilations"]
    top, left, bottom, right = case["pads"]
    if max(top, bottom) >= kh or max(left, right) >= kw:  # ONNX allows it; keep pads inside a kernel
        return None
    oh = out_size(case["h"], kh, sh, dh, top, bottom)
    ow = out_size(case["w"], kw, sw, dw, left, right)
    return (oh, ow) if oh >= 1 and ow >= 1 else None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(shapes)
def test_registers_carry_the_onnx_geometry_and_cycles_follow_the_formula(case):
    geometry = _geometry(case)
    if geometry is None:
        return
    oh, ow = geometry
    (kh, kw), (sh, sw), (dh, dw) = case["kernel"], case["strides"], case["dilations"]
    model = conv_model(case["cin"], case["cout"], case["h"], case["w"], case["kernel"], case["strides"],
                       case["dilations"], case["pads"])
    tasks = conv_tasks(model, case["fp16"], (1, case["cin"], case["h"], case["w"]))
    assert tasks, "the conv ran no CNA task"
    covered = 0
    for task in tasks:
        conv = task.conv
        assert (conv.kernel_h, conv.kernel_w) == (kh, kw)  # not transposed
        assert (conv.stride_y, conv.stride_x) == (sh, sw)
        assert (conv.dilation_y, conv.dilation_x) == (dh, dw)
        assert conv.out_width == ow
        assert (conv.precision == FP16) == case["fp16"]
        covered += conv.out_height * conv.kernels
        expected = h1_cycles(conv.out_height, ow, case["cin"], conv.kernels, kh, kw, case["fp16"])
        assert task_npu_cycles(task, RK3588) == expected
    # every output row of every kernel exactly once; int8 kernels are stored in pairs (LOWERING.md 4:
    # WEIGHT_SIZE2 KERNELS, OC 1 -> 2 as the vendor's tasks.csv), fp16 kernel tails are not padded
    # (the vendor's fp16 builds, LOWERING.md 34)
    assert covered == oh * (case["cout"] + (0 if case["fp16"] else case["cout"] % 2))
    if len(tasks) == 1:
        assert task_npu_cycles(tasks[0], RK3588) == h1_cycles(oh, ow, case["cin"], case["cout"], kh, kw, case["fp16"])


def _total(tasks) -> int:
    return sum(task_npu_cycles(task, RK3588) for task in tasks)


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("kernel", [(1, 3), (3, 1), (1, 5), (5, 1), (1, 7), (7, 1), (3, 5), (2, 7)])
def test_stride_and_dilation_cost_nothing_beyond_the_output_size(kernel, fp16):
    kh, kw = kernel
    oh, ow = 9, 11
    costs = set()
    for stride, dilation in [(1, 1), (2, 1), (1, 2), (3, 2), (2, 3)]:
        # the input size that gives the same oh x ow output without padding
        h = (oh - 1) * stride + dilation * (kh - 1) + 1
        w = (ow - 1) * stride + dilation * (kw - 1) + 1
        tasks = conv_tasks(conv_model(24, 40, h, w, kernel, (stride, stride), (dilation, dilation), (0, 0, 0, 0)),
                           fp16, (1, 24, h, w))
        assert len(tasks) == 1
        costs.add(_total(tasks))
    assert costs == {h1_cycles(oh, ow, 24, 40, kh, kw, fp16)}


@pytest.mark.parametrize("kernel,strides,dilations", [((1, 3), (1, 2), (1, 1)), ((5, 1), (2, 1), (2, 1)),
                                                      ((1, 7), (1, 1), (1, 2)), ((3, 5), (2, 3), (1, 1))])
def test_the_transposed_conv_costs_the_same(kernel, strides, dilations):
    h, w = 17, 29
    one = conv_tasks(conv_model(40, 20, h, w, kernel, strides, dilations, (0, 0, 0, 0)), False, (1, 40, h, w))
    other = conv_tasks(conv_model(40, 20, w, h, kernel[::-1], strides[::-1], dilations[::-1], (0, 0, 0, 0)),
                       False, (1, 40, w, h))
    assert len(one) == len(other) == 1
    assert _total(one) == _total(other) > 0


def _corpus_cases() -> list[dict]:
    if not (VENDOR_CORPUS / "cases.csv").is_file():  # a plain clone: the tests using it skip (conftest)
        return []
    with open(VENDOR_CORPUS / "cases.csv", newline="") as handle:
        cases = [row for row in csv.DictReader(handle)
                 if row["kind"] == "conv" and row["kh"] != row["kw"] and row["groups"] == "1"]
    with open(VENDOR_CORPUS / "layers.csv", newline="") as handle:
        vendor = {}
        for row in csv.DictReader(handle):
            if row["target"] == "rk3588" and row["dtype"] == "INT8" and row["op_type"].startswith("Conv"):
                vendor.setdefault(row["case"], []).append(int(row["npu_cycles"]))
    return [dict(case, vendor=vendor[case["case"]]) for case in cases]


CORPUS_CASES = _corpus_cases()


def test_the_corpus_holds_the_non_square_cases():
    assert len(CORPUS_CASES) == 32
    assert {(c["kh"], c["kw"]) for c in CORPUS_CASES} == {("1", "3"), ("3", "1")}
    assert {c["stride"] for c in CORPUS_CASES} == {"1", "2"} and {c["dilation"] for c in CORPUS_CASES} == {"1", "2"}


@pytest.mark.parametrize("case", CORPUS_CASES, ids=[c["case"] for c in CORPUS_CASES])
def test_non_square_corpus_cases_against_the_vendor(case):
    cin, h, w, cout, kh, kw, stride, dilation = (int(case[k]) for k in ("C", "H", "W", "cout", "kh", "kw", "stride",
                                                                           "dilation"))
    pads = tuple(int(case[k]) for k in ("pad_t", "pad_l", "pad_b", "pad_r"))
    oh = out_size(h, kh, stride, dilation, pads[0], pads[2])
    ow = out_size(w, kw, stride, dilation, pads[1], pads[3])
    assert (oh, ow) == (int(case["OH"]), int(case["OW"]))
    vendor = sum(case["vendor"])
    assert len(case["vendor"]) == 1 and vendor == h1_cycles(oh, ow, cin, cout, kh, kw, False)  # one vendor layer
    tasks = conv_tasks(conv_model(cin, cout, h, w, (kh, kw), (stride, stride), (dilation, dilation), pads,
                                  int(case["seed"])), False, (1, cin, h, w))
    ours = _total(tasks)
    if len(tasks) == 1:
        assert ours == vendor
    else:  # the 16-pixel rounding once per row band: at most 16 pixels more per extra task
        groups, passes = _ceil(cout, 32), max(kh * kw * _ceil(cin, 32), 4)
        assert vendor <= ours <= vendor + 16 * (len(tasks) - 1) * groups * passes
    assert math.isclose(ours, vendor, rel_tol=0.05)
    # `perf --ddr-model vendor` merges the row bands into one plane, as librknnc's estimate does
    assert vendor_layer_npu_cycles(tasks, RK3588) == vendor
