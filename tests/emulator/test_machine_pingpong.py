"""Register groups (ping-pong), delta tasks, CBUF reuse and the LUT port."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator.machine import Machine
from npuemu.emulator.regfile import RegisterFile
from npuemu.isa.errors import EmulationError
from npuemu.isa.task import RegisterWrite, Task
from tests.emulator.test_machine_support import (
    MASK_CONV, REGMAP, BsParams, ConvSpec, bias_blob, bs_reference, conv_reference, conv_task, load_cube,
    out_cvt_reference, pack_conv_weights, read_cube, run_tasks,
)


# ---------------------------------------------------------------------------------------------
# RegisterFile
# ---------------------------------------------------------------------------------------------
def test_pingpong_writes_alternate_groups_after_each_start():
    regs = RegisterFile(REGMAP)
    regs.write("DPU", "S_POINTER", 0xE, "t")
    for task, value in enumerate((10, 11, 12)):
        regs.write("DPU", "DST_BASE_ADDR", value * 16, "t")
        view = regs.view("DPU")
        assert (view.group, view.raw("DST_BASE_ADDR")) == (task % 2, value * 16)
        regs.started(["DPU"])
    # task 3 writes nothing: it runs group 1 as task 1 left it (two tasks back)
    assert regs.view("DPU").raw("DST_BASE_ADDR") == 11 * 16


def test_pingpong_clear_and_software_pointer():
    regs = RegisterFile(REGMAP)
    regs.write("PPU", "S_POINTER", 0xE, "t")
    regs.started(["PPU"])
    assert regs.view("PPU").group == 1
    regs.write("PPU", "S_POINTER", 0x30, "t")  # POINTER_PP_CLEAR | EXECUTER_PP_CLEAR, ping-pong off (rep10)
    assert regs.view("PPU").group == 0
    regs.started(["PPU"])
    assert regs.view("PPU").group == 0  # no ping-pong: stays
    regs.write("PPU", "S_POINTER", 0x1, "t")  # software selects group 1
    regs.write("PPU", "DST_BASE_ADDR", 0x40, "t")
    assert (regs.view("PPU").group, regs.view("PPU").raw("DST_BASE_ADDR")) == (1, 0x40)


def test_blocks_flip_only_when_started():
    regs = RegisterFile(REGMAP)
    regs.driver_setup(0)  # CNA and CORE get 0xe like the vendor driver sets them
    regs.write("CNA", "PAD_CON1", 1, "t")
    regs.started(["PPU"])  # another block's task
    assert regs.view("CNA").group == 0 and regs.view("CNA").raw("PAD_CON1") == 1


def test_lut_port_stores_only_write_accesses():
    regs = RegisterFile(REGMAP)
    regs.write("DPU", "LUT_ACCESS_CFG", 0, "t")  # read-type access: data writes are not stored
    regs.write("DPU", "LUT_ACCESS_DATA", 7, "t")
    assert not regs.lut.tables.any()
    regs.write("DPU", "LUT_ACCESS_CFG", REGMAP.pack("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1,
                                                      LUT_TABLE_ID=1, LUT_ADDR=511), "t")
    regs.write("DPU", "LUT_ACCESS_DATA", 0xFFFE, "t")
    regs.write("DPU", "LUT_ACCESS_DATA", 5, "t")
    assert list(regs.lut.tables[1, 511:]) == [-2, 5]
    with pytest.raises(EmulationError, match=r"LUT_ACCESS_DATA write to LO table entry 513"):
        regs.write("DPU", "LUT_ACCESS_DATA", 1, "task 9")


# ---------------------------------------------------------------------------------------------
# Delta tasks on the machine
# ---------------------------------------------------------------------------------------------
def delta_against_two_back(full: list[Task]) -> list[Task]:
    """The vendor's compression: from task 2 on, keep only writes that differ from the task
    two before (plus the S_POINTER re-arming), as chain 0 of rep05 does."""
    out = list(full[:2])
    for index in range(2, len(full)):
        previous = {(w.block, w.register): w.value for w in full[index - 2].writes}
        final = {(w.block, w.register): w.value for w in full[index].writes}  # last write wins
        kept = tuple(RegisterWrite(block, register, value) for (block, register), value in final.items()
                     if register == "S_POINTER" or previous.get((block, register)) != value)
        out.append(Task(kept, full[index].enable_mask))
    return out


def split_layer(seed: int):
    """A 3x3 conv of 32 -> 64 channels on a 12-row input run as 4 tasks: kernel group 0 / 1
    alternating with the top / bottom half of the rows (the rep05 pattern)."""
    rng = np.random.default_rng(seed)
    height, width = 12, 10
    x = rng.integers(-128, 128, (32, height, width)).astype(np.int8)
    w = rng.integers(-12, 13, (64, 32, 3, 3)).astype(np.int8)
    alu, cpend, mul = rng.integers(-5000, 5000, 64), np.zeros(64, int), rng.integers(4000, 16385, 64)
    base = ConvSpec(in_c=32, in_h=height, in_w=width, kernels=64, kernel=3, pad_top=1, pad_left=1,
                    out_h=height, out_w=width)
    per_kernel = 9 * 32
    tasks = []
    halves = ((0, 7, 0, 6, 1), (5, 7, 6, 6, 0))  # first/count input rows, first/count output rows, pad
    for first_in, rows_in, first_out, rows_out, pad_top in halves:
        for group in range(2):
            spec = ConvSpec(in_c=32, in_h=rows_in, in_w=width, kernels=32, kernel=3, pad_top=pad_top,
                            pad_left=1, out_h=rows_out, out_w=width, full_in_h=height, full_out_h=height,
                            feature=base.feature + first_in * width * 16,
                            weights=base.weights + group * 32 * per_kernel,
                            bias=base.bias + group * 32 * 8,
                            output=base.output + group * 2 * height * width * 16 + first_out * width * 16,
                            out_scale=21000, out_shift=19, bs_shift=14)
            tasks.append(conv_task(spec).task(MASK_CONV))
    m = Machine.for_platform("rk3588", ddr_size=16 << 20)
    load_cube(m, base.feature, x)
    m.memory.load(base.weights, pack_conv_weights(w).tobytes())
    m.memory.load(base.bias, bias_blob(alu, cpend, mul))
    acc, _ = conv_reference(x, w, base.geometry(), 0)
    expected = out_cvt_reference(bs_reference(acc, BsParams(alu=alu, mul=mul, shift=14)), 21000, 19, 0)
    return m, tasks, expected, base


def test_delta_tasks_complete_the_state_of_the_task_two_before():
    m, full, expected, base = split_layer(5)
    deltas = delta_against_two_back(full)
    assert len(deltas[2].writes) < len(full[2].writes) / 2  # weights, bias, output group omitted
    run_tasks(m, deltas)
    np.testing.assert_array_equal(read_cube(m, base.output, 64, 12, 10), expected)


def test_the_same_deltas_against_the_previous_task_would_be_wrong():
    # Evidence that the model matters: under a single register group task 2 would inherit
    # kernel group 1's weights; here it must run kernel group 0 (two tasks back).
    m, full, expected, base = split_layer(6)
    run = run_tasks(m, delta_against_two_back(full))
    assert [t.conv.weight_address - base.weights for t in run.tasks] == [0, 9216, 0, 9216]
    assert [t.groups["CNA"] for t in run.tasks] == [0, 1, 0, 1]


# ---------------------------------------------------------------------------------------------
# CBUF reuse
# ---------------------------------------------------------------------------------------------
def reuse_tasks(change_weights: bool = False):
    rng = np.random.default_rng(8)
    x = rng.integers(-128, 128, (16, 10, 6)).astype(np.int8)
    w = rng.integers(-10, 11, (32, 16, 1, 1)).astype(np.int8)
    m = Machine.for_platform("rk3588", ddr_size=16 << 20)
    common = dict(in_c=16, in_w=6, kernels=32, kernel=1, full_in_h=10, full_out_h=10, out_shift=8)
    top = ConvSpec(in_h=5, **common)
    bottom = ConvSpec(in_h=5, feature=top.feature + 5 * 6 * 16, output=top.output + 5 * 6 * 16,
                      weight_reuse=True, weights=top.weights + (64 if change_weights else 0), **common)
    load_cube(m, top.feature, x)
    m.memory.load(top.weights, pack_conv_weights(w).tobytes())
    m.memory.load(top.bias, bias_blob(np.zeros(32, int), np.zeros(32, int), np.full(32, 1)))
    return m, [conv_task(top).task(MASK_CONV), conv_task(bottom).task(MASK_CONV)], x, w, top


def test_weight_reuse_uses_the_cbuf_copy():
    m, tasks, x, w, top = reuse_tasks()
    # overwrite the weights in DRAM after the first task could have read them: the second task
    # must not see the change (it reads the CBUF), so run them as two chains
    run_tasks(m, tasks[:1], address=0xE00000)
    m.memory.load(top.weights, np.zeros(512, np.int8).tobytes())
    second = run_tasks(m, tasks[1:], address=0xE80000)
    assert second.tasks[0].traffic.weight_read == 0
    acc = np.einsum("kc,chw->khw", w[:, :, 0, 0].astype(np.int64), x.astype(np.int64))
    expected = out_cvt_reference(acc, 1, 8, 0)
    np.testing.assert_array_equal(read_cube(m, top.output, 32, 10, 6), expected)


def test_weight_reuse_of_other_weights_is_an_error():
    m, tasks, *_ = reuse_tasks(change_weights=True)
    with pytest.raises(EmulationError, match=r"task 1 .*WEIGHT_REUSE=1 but the CBUF holds the weights "
                                             r"loaded by core 0 task 0"):
        run_tasks(m, tasks)


def test_weight_reuse_on_a_fresh_core_is_an_error():
    m, tasks, *_ = reuse_tasks()
    with pytest.raises(EmulationError, match=r"WEIGHT_REUSE=1 but this core's CBUF holds no weights"):
        run_tasks(m, tasks[1:])
