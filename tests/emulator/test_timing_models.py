"""The timing model's remaining pieces (emulator/TIMING.md): the vendor's static DDR estimate
(``perf --ddr-model vendor``) against the corpus DDR column of the 15 .rknn fixtures, the
DPU/PPU compute cycles of tasks without MAC work, the compute/DMA overlap, the CPU-step host
model and ``perf --profile-layers``."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shared_data import RKNN_FIXTURES
from npuemu.emulator.memory import DmaTraffic
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.emulator.timing.host_model import cpu_step_us
from npuemu.emulator.timing.report import report_rknn
from npuemu.emulator.timing.task_time import time_task
from npuemu.isa.rknn import load_rknn
from npuemu.platforms import load_platform
from npuemu.tools.cli import main

RK3588 = load_platform("rk3588")
FIXTURES = sorted(p.parent for p in RKNN_FIXTURES.glob("*/model.rknn"))


def _run(case):
    model = load_rknn(case / "model.rknn")
    runner = RknnRunner(model)
    return model, runner.run([np.zeros(t.shape, np.float32) for t in runner.input_tensors])


@pytest.fixture(scope="module")
def fixture_runs():
    return {case.name: _run(case) for case in FIXTURES}


def _vendor_bytes_reference(model, layer) -> int:
    """README §4.2 accounting, written here from the tensor table: native feature bytes
    (prod of the 5-D NC1HWC2 shape, int8) + stored constant bytes, except direct-conv weights
    [Cout, Cin > 1, kh, kw]: Cout*kh*kw rows of Cin rounded up to 8, at least 16 bytes (the
    session 11 rule, emulator/TIMING.md; it turns README §4.2's known exception, mobilenet_v2
    rows 7 and 10, into matches)."""
    total = 0
    for index in (*layer.inputs, *layer.outputs):
        tensor = model.tensors[index]
        native, shape = tuple(tensor.native_shape or ()), tuple(tensor.shape or ())
        if tensor.kind_name == "const" and len(shape) == 4 and shape[1] > 1 and tensor.dtype_name == "int8":
            cout, cin, kh, kw = shape
            total += cout * kh * kw * max(16, 8 * math.ceil(cin / 8))
        else:
            total += math.prod(native) if tensor.kind_name != "const" and len(native) == 5 else int(tensor.size)
    return total


def test_vendor_ddr_mode_reproduces_the_corpus_ddr_column(fixture_runs):
    rate = RK3588.vendor_estimate.ddr_bytes_per_cycle
    assert rate == 23.654
    matched, other = 0, []
    for case in FIXTURES:
        model, run = fixture_runs[case.name]
        vendor = json.loads((case / "meta.json").read_text())["librknnc"]["layers"]
        report = report_rknn(model, run, RK3588, "vendor")
        assert report.ddr_model == "vendor"
        for layer, row in zip(report.layers, vendor, strict=True):
            nbytes = _vendor_bytes_reference(model, model.layers[layer.id])
            expected = math.ceil(nbytes / rate) if layer.npu_cycles else 0
            assert layer.ddr_cycles == expected
            assert layer.cycles == layer.max_cycles == max(layer.ddr_cycles, layer.npu_cycles)
            if (layer.ddr_cycles, layer.max_cycles) == (row["ddr_cycles"], row["total_cycles"]):
                matched += 1
            else:
                other.append((case.name, layer.id, layer.ddr_cycles, row["ddr_cycles"]))
    # every row, README §4.2's old exception too (a 24 -> 144 1x1 conv: 144*24 weight bytes
    # counted, 4608 stored)
    assert matched == 134 and other == []


def test_board_mode_is_unchanged_by_the_vendor_mode(fixture_runs):
    model, run = fixture_runs["rep12_resblock_convadd_3x3_64_56"]
    board = report_rknn(model, run, RK3588)
    assert board.ddr_model == "board"
    for layer in board.layers:
        assert layer.ddr_cycles == sum(t.ddr_cycles for t in layer.tasks)
        assert layer.cycles == sum(t.cycles for t in layer.tasks)
    with pytest.raises(Exception, match="unknown DDR model"):
        report_rknn(model, run, RK3588, "guess")


def test_dpu_and_ppu_only_tasks_get_unit_cycles_from_their_cubes(fixture_runs):
    # rep09: Add of two 64x56x56 int8 inputs (one DPU-only task); rep07: maxpool k3s2p1 64 @112
    for case, elements in (("rep09_add_64_56", 64 * 56 * 56), ("rep07_maxpool_k3s2p1_64_112", 64 * 112 * 112)):
        model, run = fixture_runs[case]
        unit = [time_task(r, RK3588) for r in run.chain.tasks if r.conv is None and (r.dpu or r.ppu)]
        assert unit, case
        assert sum(t.npu_cycles for t in unit) == 0  # the NPUCycles column stays the vendor's 0
        assert max(t.unit_cycles for t in unit) == math.ceil(elements / 16)
        for t in unit:
            assert t.max_cycles == max(t.unit_cycles, t.ddr_cycles)
    conv_tasks = [time_task(r, RK3588) for r in fixture_runs["rep01_conv3x3s1_32to32_56_relu"][1].chain.tasks
                  if r.conv is not None]
    assert conv_tasks and all(t.unit_cycles == 0 for t in conv_tasks)


def test_tasks_without_a_conv_overlap_fully_whatever_the_platform_overlap(fixture_runs):
    """DPU/PPU-only tasks stream (no CBUF staging): max(unit, DDR) even where conv tasks add
    compute and DMA up (compute_overlap 0, rk3562's fit; emulator/TIMING.md Per task)."""
    serial = replace(RK3588, ddr=replace(RK3588.ddr, compute_overlap=0.0))
    for case in ("rep09_add_64_56", "rep07_maxpool_k3s2p1_64_112"):
        tasks = [time_task(r, serial) for r in fixture_runs[case][1].chain.tasks if r.conv is None and (r.dpu or r.ppu)]
        assert tasks and all(t.unit_cycles > 0 and t.ddr_cycles > 0 for t in tasks), case
        assert all(t.serial_cycles == 0 and t.max_cycles == max(t.unit_cycles, t.ddr_cycles) for t in tasks), case
    conv = [time_task(r, serial) for r in fixture_runs["rep01_conv3x3s1_32to32_56_relu"][1].chain.tasks
            if r.conv is not None]
    assert conv and all(t.max_cycles == t.npu_cycles + t.ddr_cycles for t in conv)


@settings(max_examples=60, deadline=None)
@given(overlap=st.floats(0, 1), npu=st.integers(0, 10**6), read=st.integers(0, 10**7), write=st.integers(0, 10**7))
def test_overlap_puts_task_cycles_between_max_and_sum(overlap, npu, read, write):
    from npuemu.emulator.core import TaskRecord
    from tests.emulator.timing_support import BASE

    platform = replace(RK3588, ddr=replace(RK3588.ddr, compute_overlap=overlap))
    side = 4 * max(1, int(math.isqrt(npu // 16 + 1)))  # a 1x1 conv with ~npu cycles
    conv = replace(BASE, out_width=side, out_height=side, in_width=side, in_height=side)
    record = TaskRecord(0, 0, 0, 0, 0x0d, ("CNA", "CORE", "DPU"), {}, 100, conv=conv,
                        traffic=DmaTraffic(regcmd_read=1000, feature_read=read, dpu_write=write))
    timed = time_task(record, platform)
    low, high = max(timed.npu_cycles, timed.ddr_cycles), timed.npu_cycles + timed.ddr_cycles
    assert low <= timed.max_cycles <= high
    assert timed.max_cycles == low + round((1 - overlap) * min(timed.npu_cycles, timed.ddr_cycles))
    full = time_task(record, replace(platform, ddr=replace(platform.ddr, compute_overlap=1.0)))
    none = time_task(record, replace(platform, ddr=replace(platform.ddr, compute_overlap=0.0)))
    assert full.max_cycles == low and none.max_cycles == high


def test_cpu_host_model_and_its_figures():
    rk3562 = load_platform("rk3562")
    # calibration.md Table B CPU rows: ReduceMax over (1,83,60,80) took 7441 us on the board
    assert cpu_step_us([(1, 83, 60, 80)], rk3562) == pytest.approx(7441, abs=1)
    assert cpu_step_us([], rk3562) == rk3562.launch.cpu_op_overhead_us == 13.0
    assert cpu_step_us([(1, 4), (1, 4)], rk3562) > cpu_step_us([(1, 4)], rk3562)


def test_perf_profile_layers_vendor_mode_and_cpu_steps_on_a_model(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    npu = str(tmp_path / "demo_cnn.npu")
    assert main(["perf", npu, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["perf", npu, "--json", "--profile-layers"]) == 0
    profiled = json.loads(capsys.readouterr().out)
    npu_layers = [layer for layer in plain["layers"] if layer["tasks"]]
    overhead = RK3588.launch.host_submit_overhead_us
    assert profiled["totals"]["time_us"] == pytest.approx(plain["totals"]["time_us"] + overhead * len(npu_layers))
    for a, b in zip(plain["layers"], profiled["layers"]):
        assert b["time_us"] == pytest.approx(a["time_us"] + (overhead if a["tasks"] else 0))
        assert (a["cycles"], a["ddr_cycles"]) == (b["cycles"], b["ddr_cycles"])
    assert main(["perf", npu, "--ddr-model", "vendor"]) == 0
    out = capsys.readouterr().out
    assert "the vendor's static estimate" in out
    assert main(["perf", npu, "--ddr-model", "vendor", "--profile-layers"]) == 2
    assert "use one of them" in capsys.readouterr().err


def test_a_cpu_step_gets_its_host_time_in_the_report(tmp_path, capsys):
    from onnx import TensorProto, helper, numpy_helper

    from npuemu.compiler.build import build_model
    from npuemu.compiler.onnx_import import import_onnx
    from npuemu.compiler.passes import optimize
    from npuemu.compiler.passes.context import PassContext
    from npuemu.compiler.quant import calibrate, quantize_graph

    rng = np.random.default_rng(3)
    weights = numpy_helper.from_array(rng.normal(0, 0.3, (16, 8, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Floor", ["c"], ["y"])]  # no NPU lowering: a host step
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weights])
    ir = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), None)
    optimize(ir, PassContext.for_chip("rk3588", 3))
    quantize_graph(ir, calibrate(ir, [{"x": rng.normal(size=(1, 8, 6, 6)).astype(np.float32)}], progress=False).ranges)
    build_model(ir).write(tmp_path / "m.npu")
    assert main(["perf", str(tmp_path / "m.npu"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cpu = [layer for layer in report["layers"] if layer["target"] == "CPU"]
    assert [layer["op_type"] for layer in cpu] == ["Floor"]
    assert cpu[0]["host_us"] == pytest.approx(cpu_step_us([(1, 16, 6, 6)], RK3588)) == cpu[0]["time_us"]
    assert report["totals"]["cpu_time_us"] == pytest.approx(cpu[0]["host_us"])
    npu_time = sum(layer["time_us"] for layer in report["layers"] if layer["target"] != "CPU")
    assert report["totals"]["time_us"] == pytest.approx(npu_time + cpu[0]["host_us"])


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(0.1, 64), npu=st.integers(0, 10**6), write=st.integers(0, 10**7))
def test_a_conv_output_bound_makes_compute_at_least_the_written_bytes_at_its_rate(rate, npu, write):
    """cycle_model.conv_write_bytes_per_cycle (rk3562's fit): a conv task computes for
    max(MAC cycles, written bytes / rate); the NPUCycles column keeps the MAC cycles; none: no bound."""
    from npuemu.emulator.core import TaskRecord
    from tests.emulator.timing_support import BASE

    side = 4 * max(1, int(math.isqrt(npu // 16 + 1)))
    conv = replace(BASE, out_width=side, out_height=side, in_width=side, in_height=side)
    record = TaskRecord(0, 0, 0, 0, 0x0d, ("CNA", "CORE", "DPU"), {}, 100, conv=conv,
                        traffic=DmaTraffic(regcmd_read=1000, feature_read=1000, dpu_write=write))
    unbounded = time_task(record, RK3588)
    bounded = time_task(record, replace(RK3588, cycle_model=replace(RK3588.cycle_model, conv_write_bytes_per_cycle=rate)))
    assert RK3588.cycle_model.conv_write_bytes_per_cycle is None and unbounded.unit_cycles == 0
    assert bounded.npu_cycles == unbounded.npu_cycles
    assert bounded.unit_cycles == math.ceil(write / rate)
    assert bounded.compute_cycles == max(unbounded.npu_cycles, math.ceil(write / rate)) >= unbounded.compute_cycles


def test_bf16_cubes_count_two_bytes_per_element():
    """A DPU-only task reading bf16 (the vendor's exNorm, REGISTER_SEMANTICS.md 37) moves 2 bytes
    per element like fp16; numpy has no bf16 type, and the lookup used to fall back to 1."""
    from npuemu.emulator.timing.unit_cycles import _itemsize
    from npuemu.emulator.units.state import BF16, FP16, INT8, INT32

    assert (_itemsize(BF16), _itemsize(FP16), _itemsize(INT8), _itemsize(INT32)) == (2, 2, 1, 4)
