"""A task's decoded state is reused across runs only while its blocks' executing groups hold
the same register values: a register the task does not write (left by earlier writes) still
takes effect on every run, and the per-state BRDMA plan follows new blob bytes."""

from dataclasses import replace

import numpy as np
import pytest

from npuemu.emulator.machine import Machine
from npuemu.emulator.regfile import RegisterFile
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import EmulationError
from npuemu.isa.task import Chain, Task
from tests.emulator.test_machine_conv import CASES, random_layer, reference_accumulators
from tests.emulator.test_machine_support import (
    MASK_CONV, REGMAP, bias_blob, conv_task, load_cube, out_cvt_reference, read_cube,
)

ADDRESS = 0xF0_0000


def prepared(seed: int = 0):
    spec = replace(CASES["direct_3x3_pad1"], bs_shift=14, out_scale=23000, out_offset=-5, out_shift=17)
    machine = Machine.for_platform("rk3588", ddr_size=16 << 20)
    x, w, blob, bs = random_layer(spec, seed)
    load_cube(machine, spec.feature, x)
    machine.memory.load(spec.weights, blob.tobytes())
    machine.memory.load(spec.bias, bias_blob(bs.alu, bs.cpend, bs.mul))
    return spec, machine, reference_accumulators(spec, x, w, bs), bs


def load_chain(machine: Machine, task: Task) -> int:
    encoded = encode_chain(Chain((task,)), REGMAP, base_addr=ADDRESS)
    machine.memory.load(ADDRESS, encoded.data)
    return encoded.first_amount


def test_a_register_the_task_does_not_write_takes_effect_on_every_run():
    spec, machine, accumulators, _ = prepared()
    writes = tuple(w for w in conv_task(spec).writes if w.register != "OUT_CVT_SHIFT")
    amount = load_chain(machine, Task(writes, MASK_CONV))
    dpu = machine.cores[0].regfile.blocks["DPU"]
    offset = REGMAP.register("DPU", "OUT_CVT_SHIFT").offset
    records = []
    for shift in (17, 16, 16, 17):
        for group in dpu.groups:  # whichever group executes holds this shift
            group[offset] = REGMAP.pack("DPU", "OUT_CVT_SHIFT", OUT_CVT_SHIFT=shift)
        (record,) = machine.run_chain(ADDRESS, amount).tasks
        got = read_cube(machine, spec.output, spec.kernels, spec.out_h, spec.out_w)
        np.testing.assert_array_equal(got, out_cvt_reference(accumulators, spec.out_scale, shift, spec.out_offset))
        assert record.dpu.out_cvt.shift == shift
        records.append(record)
    # equal values: the decoded states are the same objects (no re-decoding); counters are per run
    assert records[2].dpu is records[1].dpu and records[2].conv is records[1].conv
    assert records[2].traffic == records[1].traffic and records[2].traffic.bias_read > 0


def test_new_bias_blob_bytes_at_the_same_address_take_effect():
    spec, machine, accumulators, bs = prepared()
    amount = load_chain(machine, conv_task(spec).task(MASK_CONV))
    for alu in (bs.alu, bs.alu + 1000, bs.alu + 1000):
        machine.memory.load(spec.bias, bias_blob(alu, bs.cpend, bs.mul))
        machine.run_chain(ADDRESS, amount)
        got = read_cube(machine, spec.output, spec.kernels, spec.out_h, spec.out_w)
        expected = prepared_reference(spec, replace(bs, alu=alu))
        np.testing.assert_array_equal(got, expected)


def prepared_reference(spec, bs):
    x, w, _, _ = random_layer(spec, 0)
    return out_cvt_reference(reference_accumulators(spec, x, w, bs), spec.out_scale, spec.out_shift,
                             spec.out_offset)


def test_unchanged_compares_group_and_values():
    regs = RegisterFile(REGMAP)
    regs.write("DPU", "OUT_CVT_SCALE", 5, "t")
    views = {"DPU": regs.view("DPU")}
    assert regs.unchanged(views)
    regs.write("DPU", "OUT_CVT_SCALE", 5, "t")  # the same value again
    assert regs.unchanged(views)
    regs.write("DPU", "OUT_CVT_SCALE", 6, "t")
    assert not regs.unchanged(views)
    regs.write("DPU", "OUT_CVT_SCALE", 5, "t")
    regs.write("DPU", "S_POINTER", 0xE, "t")
    regs.started(["DPU"])  # the executer moves to the other group
    assert not regs.unchanged(views)


def test_a_refused_brdma_configuration_is_refused_on_every_run():
    spec, machine, _, _ = prepared()
    writes = tuple(w if w.register != "BRDMA_CFG" else replace(w, value=0) for w in conv_task(spec).writes)
    amount = load_chain(machine, Task(writes, MASK_CONV))
    for _ in range(2):
        with pytest.raises(EmulationError, match="BRDMA_DATA_USE=0 does not fetch"):
            machine.run_chain(ADDRESS, amount)
