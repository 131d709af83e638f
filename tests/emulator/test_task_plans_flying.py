"""Task programs of flying DPU tasks (issue 20, units/dpu_plan.py ``prepare_flying_dpu``): a
replayed chain's DPU-only tasks - the element-wise Add (main cube from the MRDMA, the operand from
the ERDMA, per pixel or per channel), a plain copy, an Add followed by the LUT, a copy of a
convolution's output, the nearest-neighbour unpooling copy - run as compiled steps. They must give
what the full unit path gives: outputs (against the independent references of test_machine_support
and test_dpu_resize), task records with every DMA counter, register state. The last tests break the
step on purpose (main rows read once, when it was built; the LUT's dense values made from swapped
tables) and show these checks catch it."""

import numpy as np
import pytest

from npuemu.emulator.kernels import dpu_flying_lines, lut
from npuemu.emulator.units import dpu_plan
from tests.emulator.test_machine_support import (
    MASK_CONV, MASK_FLYING, BsParams, bs_reference, conv_task, ew_convert_reference, flying_task, load_cube,
    out_cvt_reference, read_cube, sat32,
)
from tests.emulator.test_task_plans import (
    ADDRESS, RUNS, Counting, _machine, _output, _spec, hoist_row_reads, int8_inputs, paired_runs,
)
from tests.emulator.test_task_plans import _expected as _conv_expected
from tests.emulator.test_task_plans_lut import _lut_settings, _with_lut
from tests.emulator.test_dpu_resize import unpool_task
from tests.emulator.test_machine_conv import random_layer
from tests.emulator.test_machine_dpu_ppu import flying_add

IN0, IN1 = 0x10000, 0x80000
OUTS = (0x100000, 0x140000, 0x180000)
CHANNELS, HEIGHT, WIDTH = 40, 9, 11  # 40 channels: the last surface is half padding


def _add(dst: int):
    """test_machine_dpu_ppu's flying Add: BS on the main cube, the ERDMA operand converted, ReLU."""
    return flying_add(WIDTH, HEIGHT, CHANNELS, IN0, IN1, dst)


def _gate(dst: int):
    """The Add with one operand value per channel (ERDMA_DATA_MODE 0: surface s is one atom
    EW_SURF_STRIDE atoms apart, the se_gate form; REGISTER_SEMANTICS 3.4)."""
    t = _add(dst)
    t.set("DPU_RDMA", "ERDMA_CFG", ERDMA_DATA_MODE=0, ERDMA_DATA_SIZE=1)
    t.set("DPU_RDMA", "EW_SURF_STRIDE", EW_SURF_STRIDE=1)
    return t


def _se_gate(dst: int):
    """The SE gate's form (ppocr_cls int8): BS adds one value and multiplies by one without a shift,
    EW multiplies by the converted per-channel operand, OUT_CVT rounds half to even - the form
    kernels/dpu_flying_lines.py runs as one compiled call."""
    t = _gate(dst)
    t.set("DPU", "BS_MUL_CFG", BS_MUL_OPERAND=3).set("DPU", "DATA_FORMAT")
    t.set("DPU", "EW_CFG", EW_CVT_ROUND=1, EW_DATA_MODE=1, EDATA_SIZE=1, EW_OP_TYPE=1, EW_LUT_BYPASS=1, EW_OP_SRC=1)
    t.set("DPU", "EW_CVT_OFFSET_VALUE", 128).set("DPU", "EW_CVT_SCALE_VALUE", EW_OP_CVT_SHIFT=0, EW_OP_CVT_SCALE=1)
    t.set("DPU", "OUT_CVT_SCALE", OUT_CVT_SCALE=26374).set("DPU", "OUT_CVT_SHIFT", CVT_ROUND=0, OUT_CVT_SHIFT=21)
    return t


def _lut_add(dst: int):
    """The Add with the LUT before its EW operation (the ERDMA operand per element: the LUT's
    dense values, not the one-table form)."""
    settings = _lut_settings(np.arange(-300, 300), 8)
    return _with_lut(_add(dst), *settings, "erdma")


def _add_reference(a, b):
    v = bs_reference(a.astype(np.int64), BsParams(alu=-7, mul=9000, shift=2, shift_neg=3))
    v = np.maximum(sat32(v + ew_convert_reference(b, 11, 20000, 3, round_away=True)), 0)
    return out_cvt_reference(v, 20000, 18, 3, round_away=True)


def _copy(dst: int):
    """A flying copy, OUT_CVT the identity (an Add before it may have left its settings in the group)."""
    t = flying_task(WIDTH, HEIGHT, CHANNELS, src=IN0, dst=dst)
    t.set("DPU", "OUT_CVT_OFFSET", 0).set("DPU", "OUT_CVT_SHIFT", OUT_CVT_SHIFT=0)
    return t


def _lut_copy(dst: int):
    """A flying copy through the LUT (its own tables uploaded), EW's operation bypassed."""
    settings = _lut_settings(np.arange(-300, 300), 7)
    return _with_lut(_copy(dst), *settings, "identity")


def _run_both(monkeypatch, chain):
    """RUNS inputs through a replaying machine and a full-path one: per run the outputs of both
    and the inputs, checked equal in records and state on the way; the counting."""
    counting = Counting(monkeypatch)
    fast, amount = _machine(chain, False)
    slow, _ = _machine(chain, True)
    inputs = int8_inputs(4, (2, CHANNELS, HEIGHT, WIDTH))

    def load(machine, ab):
        load_cube(machine, IN0, ab[0])
        load_cube(machine, IN1, ab[1])

    runs = paired_runs(fast, slow, amount, inputs, load,
                       lambda machine: [read_cube(machine, out, 48, HEIGHT, WIDTH) for out in OUTS[:len(chain)]])
    return [(got, want, ab[0], ab[1]) for got, want, ab in runs], counting


@pytest.mark.parametrize("order", [("add", "copy", "lut"), ("copy", "add"), ("lut", "gate", "copy"),
                                   ("lut_add", "add"), ("se_gate", "copy")])
def test_flying_steps_equal_full_runs(monkeypatch, order):
    makers = {"add": _add, "copy": _copy, "lut": _lut_copy, "gate": _gate, "lut_add": _lut_add,
              "se_gate": _se_gate}
    calls = []
    inner = dpu_flying_lines.flying_lines
    monkeypatch.setattr(dpu_flying_lines, "flying_lines", lambda *args: calls.append(1) or inner(*args))
    chain = [(makers[name](out), MASK_FLYING) for name, out in zip(order, OUTS)]
    runs, counting = _run_both(monkeypatch, chain)
    for got, want, a, b in runs:
        for index, name in enumerate(order):
            np.testing.assert_array_equal(got[index], want[index])
            assert not got[index][CHANNELS:].any()  # the padding lanes of the last surface written 0
            if name == "add":
                np.testing.assert_array_equal(got[index][:CHANNELS], _add_reference(a, b))
            elif name == "copy":
                np.testing.assert_array_equal(got[index][:CHANNELS], a)
    assert counting.built >= 1 and counting.steps >= len(order)  # every task ran as a step
    if "se_gate" in order:  # (its steps: one compiled call each)
        assert len(calls) >= RUNS - 3


def test_a_copy_of_a_convolutions_output_reads_it_as_written(monkeypatch):
    """conv -> flying copy of its output -> conv: all three steps, the copy reading what the
    conv's step wrote in that run."""
    spec = _spec("pointwise_70_kernels")
    layer = random_layer(spec, 0)
    copy = flying_task(spec.out_w, spec.out_h, 80, src=spec.output, dst=0x380000)
    copy.set("DPU", "OUT_CVT_OFFSET", 0).set("DPU", "OUT_CVT_SHIFT", OUT_CVT_SHIFT=0)  # (the conv's group)
    chain = [(conv_task(spec), MASK_CONV), (copy, MASK_FLYING), (conv_task(spec), MASK_CONV)]
    counting = Counting(monkeypatch)
    fast, amount = _machine(chain, False, layer, spec)
    slow, _ = _machine(chain, True, layer, spec)
    runs = paired_runs(fast, slow, amount, int8_inputs(5, (spec.in_c, spec.in_h, spec.in_w)),
                       lambda machine, x: load_cube(machine, spec.feature, x),
                       lambda machine: (_output(machine, spec),
                                        read_cube(machine, 0x380000, spec.kernels, spec.out_h, spec.out_w)))
    for (conv, copied), (slow_conv, slow_copied), x in runs:
        expected = _conv_expected(spec, x, layer[1], layer[3])
        for array in (conv, slow_conv, copied, slow_copied):
            np.testing.assert_array_equal(array, expected)
    program = fast.cores[0]._replays.get(fast.cores[0]._fetch(ADDRESS, amount))[0].program[0]
    assert [step is None for step in program.steps] == [False, False, False]
    assert counting.steps >= 3


def test_the_checks_catch_main_rows_read_when_the_step_was_built(monkeypatch):
    """A step whose MRDMA rows are the bytes of its first run (a read hoisted out of the run)."""
    hoist_row_reads(monkeypatch, dpu_plan)
    chain = [(_add(OUTS[0]), MASK_FLYING)]
    runs, counting = _run_both(monkeypatch, chain)
    assert counting.steps >= 1
    assert sum(int(not np.array_equal(got[0], want[0])) for got, want, _, _ in runs) > 0


def test_the_checks_catch_dense_values_of_swapped_tables(monkeypatch):
    """The LUT's dense values the steps ask for (``build``) made from LO and LE swapped: the Add
    with the LUT (its ERDMA operand keeps it off the one-table form) differs from the full path."""
    inner = lut.dense_values.get

    def swapped(params, le, lo, build=False):
        return inner(params, lo, le, build) if build else inner(params, le, lo, build)

    monkeypatch.setattr(lut.dense_values, "get", swapped)
    runs, counting = _run_both(monkeypatch, [(_lut_add(OUTS[0]), MASK_FLYING)])
    assert counting.steps >= 1
    assert sum(int(not np.array_equal(got[0], want[0])) for got, want, _, _ in runs) > 0


def _unpool_runs(monkeypatch):
    """test_dpu_resize's 2 x 2 nearest unpooling of one int8 atom a pixel, then a copy of its
    output: per run (replaying output, full-path output, input), checked equal in records and state."""
    height, width = 3, 5
    unpool = unpool_task(width, height, 2, 2, src=IN0, dst=OUTS[0])
    copy = flying_task(2 * width, 2 * height, 16, src=OUTS[0], dst=OUTS[1])
    copy.set("DPU", "DATA_FORMAT").set("DPU_RDMA", "FEATURE_MODE_CFG", BURST_LEN=15, FLYING_MODE=1)
    counting = Counting(monkeypatch)
    fast, amount = _machine([(unpool, MASK_FLYING), (copy, MASK_FLYING)], False)
    slow, _ = _machine([(unpool, MASK_FLYING), (copy, MASK_FLYING)], True)
    runs = paired_runs(fast, slow, amount, int8_inputs(9, (16, height, width)),
                       lambda machine, x: load_cube(machine, IN0, x),
                       lambda machine: [read_cube(machine, out, 16, 2 * height, 2 * width) for out in OUTS[:2]])
    return runs, counting


def test_unpooling_steps_equal_full_runs(monkeypatch):
    runs, counting = _unpool_runs(monkeypatch)
    for got, want, x in runs:
        expected = np.repeat(np.repeat(x, 2, axis=1), 2, axis=2)  # ONNX nearest x2 (test_dpu_resize's reference)
        for mine, theirs in zip(got, want):
            np.testing.assert_array_equal(mine, theirs)
            np.testing.assert_array_equal(mine, expected)
    assert counting.steps >= 2 * (RUNS - 3)  # both tasks ran as steps in the replays


def test_the_checks_catch_unpooling_rows_read_when_the_step_was_built(monkeypatch):
    hoist_row_reads(monkeypatch, dpu_plan)
    runs, counting = _unpool_runs(monkeypatch)
    assert counting.steps >= 1
    assert sum(int(not np.array_equal(got[0], want[0])) for got, want, _ in runs) > 0


def test_the_checks_catch_a_gate_call_reading_the_main_cube_of_its_first_run(monkeypatch):
    """The SE gate's compiled call (kernels/dpu_flying_lines.py) given the memory as its first run
    left it, not as it is: the later runs' outputs differ from the full path's."""
    inner, first = dpu_flying_lines.flying_lines, []

    def stale(main, *args):
        first.append(main.copy()) if not first else None
        inner(first[0], *args)

    monkeypatch.setattr(dpu_flying_lines, "flying_lines", stale)
    runs, counting = _run_both(monkeypatch, [(_se_gate(OUTS[0]), MASK_FLYING)])
    assert first and counting.steps >= 1
    assert sum(int(not np.array_equal(got[0], want[0])) for got, want, _, _ in runs) > 0
