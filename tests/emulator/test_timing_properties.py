"""Properties of the timing model: NPU cycles never fall when the work grows, DDR bytes are
exactly the DMA traffic, task cycles are max(NPU, DDR) (rk3588: full overlap) plus the launch
(fixed dispatch + the regcmd fetch, timed once)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.emulator.timing_support import BASE
from tests.shared_data import RKNN_FIXTURES
from npuemu.emulator.memory import DmaTraffic
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.emulator.timing import ddr_cycles, time_task
from npuemu.emulator.timing.npu_cycles import conv_npu_cycles
from npuemu.emulator.timing.report import report_rknn
from npuemu.emulator.units.state import FP16, INT8
from npuemu.isa.rknn import load_rknn
from npuemu.platforms import load_platform

FIXTURES = RKNN_FIXTURES
RK3588 = load_platform("rk3588")


convs = st.builds(
    lambda dw, fp16, cin, cout, k, oh, ow: replace(
        BASE, depthwise=dw, precision=FP16 if fp16 else INT8, real_channels=cin, in_channels=-(-cin // 16) * 16,
        kernels=1 if dw else cout, out_channels=cin if dw else cout, kernel_h=k[0], kernel_w=k[1],
        out_height=oh, out_width=ow),
    st.booleans(), st.booleans(), st.integers(1, 1024), st.integers(1, 2048),
    st.tuples(st.integers(1, 7), st.integers(1, 7)), st.integers(1, 200), st.integers(1, 200))


@settings(max_examples=300, deadline=None)
@given(convs, st.integers(1, 300), st.integers(0, 50), st.integers(0, 50))
def test_npu_cycles_never_fall_when_work_grows(conv, more_channels, more_rows, more_columns):
    base = conv_npu_cycles(conv, RK3588)
    assert base > 0
    if conv.depthwise:
        wider = replace(conv, out_channels=conv.out_channels + more_channels,
                        real_channels=conv.real_channels + more_channels)
    else:
        wider = replace(conv, kernels=conv.kernels + more_channels, out_channels=conv.out_channels + more_channels)
    assert conv_npu_cycles(wider, RK3588) >= base
    bigger = replace(conv, out_height=conv.out_height + more_rows, out_width=conv.out_width + more_columns)
    assert conv_npu_cycles(bigger, RK3588) >= base
    deeper = replace(conv, real_channels=conv.real_channels + more_channels) if not conv.depthwise else conv
    assert conv_npu_cycles(deeper, RK3588) >= base
    # fp16 halves K and the floor of passes with it (TIMING.md "fp16 cycle rule"): between half and
    # twice the int8 figure - half for a 1x1 with Cin <= 32, Cout <= 16 (vendor-fp16 MobileNetV2
    # layer 3: 25088 fp16 vs 50176 int8), twice wherever the taps exceed the int8 floor
    fp16 = conv_npu_cycles(replace(conv, precision=FP16), RK3588)
    int8 = conv_npu_cycles(replace(conv, precision=INT8), RK3588)
    assert int8 <= 2 * fp16 and fp16 <= 2 * int8


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1 << 24), st.integers(0, 1 << 24), st.integers(0, 1 << 20))
def test_ddr_cycles_grow_with_bytes(read, write, extra):
    cycles = ddr_cycles(read, write, RK3588)
    assert cycles == math.ceil(read / RK3588.ddr.read_bytes_per_cycle + write / RK3588.ddr.write_bytes_per_cycle)
    assert ddr_cycles(read + extra, write, RK3588) >= cycles
    assert ddr_cycles(read, write + extra, RK3588) >= cycles


def test_ddr_bytes_are_the_dma_traffic_of_a_real_run():
    model = load_rknn(FIXTURES / "rep12_resblock_convadd_3x3_64_56" / "model.rknn")
    runner = RknnRunner(model)
    run = runner.run([np.zeros(t.shape, np.float32) for t in runner.input_tensors])
    assert len(run.chain.tasks) >= 3
    for record in run.chain.tasks:
        timed = time_task(record, RK3588)
        streams = record.traffic.as_dict()
        assert timed.ddr_read_bytes == sum(v for k, v in streams.items() if k.endswith("_read")) > 0
        assert timed.ddr_write_bytes == streams["dpu_write"] + streams["ppu_write"] > 0
        # one count per byte: the regcmd fetch is timed in the launch, the data streams in DDR cycles
        regcmd = streams["regcmd_read"]
        assert timed.regcmd_bytes == regcmd > 0
        assert timed.ddr_cycles == ddr_cycles(timed.ddr_read_bytes - regcmd, timed.ddr_write_bytes, RK3588)
        fetch = math.ceil(regcmd / RK3588.ddr.read_bytes_per_cycle)
        assert timed.overhead_cycles == RK3588.launch.task_overhead_cycles + fetch
        serial = round((1 - RK3588.ddr.compute_overlap) * min(timed.npu_cycles, timed.ddr_cycles)) \
            if record.conv is not None else 0  # the part of the shorter one the overlap does not hide
        assert timed.cycles == max(timed.npu_cycles, timed.ddr_cycles) + serial + timed.overhead_cycles
    report = report_rknn(model, run, RK3588)
    totals = report.totals()
    assert totals["ddr_read_bytes"] == run.chain.read_bytes
    assert totals["ddr_write_bytes"] == run.chain.write_bytes
    assert totals["tasks"] == len(run.chain.tasks)


def test_a_task_without_a_conv_or_unit_state_has_no_compute_and_its_bytes_decide():
    from npuemu.emulator.core import TaskRecord

    traffic = DmaTraffic(regcmd_read=240, ppu_read=802816, ppu_write=200704)
    record = TaskRecord(0, 0, 0, 0, 0x60, ("PPU", "PPU_RDMA"), {}, 26, traffic=traffic)
    timed = time_task(record, RK3588)
    assert timed.npu_cycles == 0
    ddr = RK3588.ddr
    assert timed.ddr_cycles == math.ceil(802816 / ddr.read_bytes_per_cycle + 200704 / ddr.write_bytes_per_cycle)
    fetch = math.ceil(240 / ddr.read_bytes_per_cycle)
    assert timed.cycles == timed.ddr_cycles + RK3588.launch.task_overhead_cycles + fetch
