"""Configurations a real NPU would fault or hang on: each is an error naming the task, the
registers and what was expected (rknpu-isa.md 7.1, 7.2), never a silently wrong result."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator.machine import Machine
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import DmaError, EmulationError
from npuemu.isa.task import Chain
from npuemu.isa.words import WORD_BYTES
from tests.emulator.test_machine_support import (
    MASK_CONV, MASK_CONV_NO_RDMA, MASK_FLYING, REGMAP, ConvSpec, bias_blob, conv_task, flying_task,
    load_cube, pack_conv_weights, run_tasks,
)

DDR = 16 << 20


def machine() -> Machine:
    return Machine.for_platform("rk3588", ddr_size=DDR)


def conv_machine(spec: ConvSpec) -> Machine:
    m = machine()
    m.memory.load(spec.weights, pack_conv_weights(np.ones((spec.kernels, spec.in_c, spec.kernel, spec.kernel),
                                                          np.int8)).tobytes())
    m.memory.load(spec.bias, bias_blob(np.zeros(64, int), np.zeros(64, int), np.ones(64, int)))
    return m


def small_conv(**changes) -> ConvSpec:
    return ConvSpec(**{"in_c": 16, "in_h": 4, "in_w": 4, "kernels": 32, **changes})


def test_feature_read_outside_ddr_is_a_dma_error():
    spec = small_conv(feature=DDR - 64)
    with pytest.raises(DmaError, match=r"core 0 task 0 \(regcmd at 0x[0-9a-f]+\): CNA feature "
                                       r"\(FEATURE_DATA_ADDR=0xffffc0, .*\) read: touches \[0xffffc0, 0x10000c0\), "
                                       r"first bad row \[0x1000000, 0x1000040\), outside the memory "
                                       r"\(ddr \[0x0, 0x1000000\)\).*bits 12/13"):
        run_tasks(conv_machine(spec), [conv_task(spec).task(MASK_CONV)])


def test_output_write_outside_ddr_is_a_dma_error():
    spec = small_conv(output=DDR - 16)
    with pytest.raises(DmaError, match=r"task 0 .*DPU WDMA \(DST_BASE_ADDR=0xfffff0.*write: touches"):
        run_tasks(conv_machine(spec), [conv_task(spec).task(MASK_CONV)])


def test_pc_fetch_outside_memory_is_a_dma_error():
    with pytest.raises(DmaError, match=r"core 0: PC fetch at 0x2000000: PC_DATA_AMOUNT 10 fetches"):
        machine().run_chain(0x2000000, 10)


def test_missing_tail_hangs_the_pc():
    spec = small_conv()
    m = conv_machine(spec)
    encoded = encode_chain(Chain((conv_task(spec).task(MASK_CONV),)), REGMAP, base_addr=0x800000)
    words = bytearray(encoded.data)
    op_enable_at = (len(conv_task(spec).writes) + 3) * WORD_BYTES
    words[op_enable_at:op_enable_at + WORD_BYTES] = bytes(WORD_BYTES)  # no op-enable word
    m.memory.load(0x800000, bytes(words))
    with pytest.raises(EmulationError, match=r"core 0: the PC cannot run the chain at 0x800000: task 0 .*"
                                             r"expected the op-enable word.*A real NPU hangs"):
        m.run_chain(0x800000, encoded.first_amount)


def test_short_fetch_amount_misses_the_tail():
    spec = small_conv()
    m = conv_machine(spec)
    encoded = encode_chain(Chain((conv_task(spec).task(MASK_CONV),)), REGMAP, base_addr=0x800000)
    m.memory.load(0x800000, encoded.data)
    with pytest.raises(EmulationError, match=r"the PC cannot run the chain .*op-enable"):
        m.run_chain(0x800000, encoded.first_amount - 3)


def test_bank_sum_above_the_cbuf_is_an_error():
    spec = small_conv(banks=(8, 6))
    with pytest.raises(EmulationError, match=r"task 0 .*CNA\.CBUF_CON0=0x68 asks for DATA_BANK 8 \+ "
                                             r"WEIGHT_BANK 6 banks; the CBUF has 12"):
        run_tasks(conv_machine(spec), [conv_task(spec).task(MASK_CONV)])


def test_flying_mode_without_the_dpu_rdma_has_no_source():
    task = flying_task(4, 4, 16, src=0x10000, dst=0x20000).task(0x08)  # DPU only
    with pytest.raises(EmulationError,
                       match=r"flying mode .*but DPU_RDMA is not started: no source feeds it"):
        run_tasks(machine(), [task])


def test_flying_mode_with_the_mrdma_disabled_has_no_source():
    t = flying_task(4, 4, 16, src=0x10000, dst=0x20000)
    t.set("DPU_RDMA", "FEATURE_MODE_CFG", BURST_LEN=15, MRDMA_DISABLE=1, FLYING_MODE=1)
    with pytest.raises(EmulationError, match=r"but DPU_RDMA\.FEATURE_MODE_CFG\.MRDMA_DISABLE=1: no source"):
        run_tasks(machine(), [t.task(MASK_FLYING)])


def test_mrdma_enabled_but_unfed_hangs():
    spec = small_conv()
    t = conv_task(spec)
    t.set("DPU_RDMA", "FEATURE_MODE_CFG", BURST_LEN=15)  # MRDMA on, not flying, COMB_USE 0
    with pytest.raises(EmulationError, match=r"MRDMA is enabled .*MRDMA_DISABLE=0\) but nothing consumes "
                                             r"it .*unfed hangs"):
        run_tasks(conv_machine(spec), [t.task(MASK_CONV)])


def test_partial_kernel_group_hangs():
    spec = small_conv(kernels=40)
    t = conv_task(spec)
    t.set("CORE", "DATAOUT_SIZE_1", DATAOUT_CHANNEL=39)
    with pytest.raises(EmulationError, match=r"CORE\.DATAOUT_SIZE_1\.DATAOUT_CHANNEL=39 \(40 channels\) ends "
                                             r"part-way through a 32-kernel group"):
        run_tasks(conv_machine(spec), [t.task(MASK_CONV)])


def test_core_and_dpu_sizes_must_agree():
    spec = small_conv()
    t = conv_task(spec)
    for block in ("DPU", "DPU_RDMA"):
        t.set(block, "DATA_CUBE_WIDTH", WIDTH=2)
    t.set("DPU", "WDMA_SIZE_1", HEIGHT_WDMA=3, WIDTH_WDMA=2)
    with pytest.raises(EmulationError, match=r"CORE and DPU sizes disagree: CORE DATAOUT_SIZE_0/1 give "
                                             r"4x4x32, DPU DATA_CUBE_WIDTH/HEIGHT/CHANNEL give 3x4x32"):
        run_tasks(conv_machine(spec), [t.task(MASK_CONV)])


def test_cna_output_size_must_agree_with_the_core():
    spec = small_conv()
    t = conv_task(spec)
    t.set("CNA", "DATA_SIZE3", DATAOUT_ATOMICS=15)
    with pytest.raises(EmulationError, match=r"CNA\.DATA_SIZE3\.DATAOUT_ATOMICS=15 is not the CORE's output"):
        run_tasks(conv_machine(spec), [t.task(MASK_CONV)])


def test_weight_sizes_must_match_the_geometry():
    spec = small_conv()
    t = conv_task(spec)
    t.set("CNA", "WEIGHT_SIZE0", WEIGHT_BYTES=100)
    with pytest.raises(EmulationError, match=r"weight sizes disagree with the geometry: .*WEIGHT_SIZE0=0x64"):
        run_tasks(conv_machine(spec), [t.task(MASK_CONV)])


def test_bias_from_brdma_needs_the_dpu_rdma():
    spec = small_conv()
    with pytest.raises(EmulationError,
                       match=r"BS stage takes operands from the BRDMA but DPU_RDMA is not enabled"):
        run_tasks(conv_machine(spec), [conv_task(spec).task(MASK_CONV_NO_RDMA)])


def test_ew_operand_from_a_disabled_erdma_hangs():
    t = flying_task(4, 4, 16, src=0x10000, dst=0x20000)
    t.set("DPU", "EW_CFG", EW_ALU_ALGO=2, EW_OP_SRC=1, EW_LUT_BYPASS=1, EW_OP_CVT_BYPASS=1, EW_RELU_BYPASS=1)
    with pytest.raises(EmulationError, match=r"EW_OP_SRC=1 .*ERDMA_DISABLE=1: the DPU would wait forever"):
        run_tasks(machine(), [t.task(MASK_FLYING)])


def test_op_enable_without_blocks_never_completes():
    from npuemu.isa.task import Task

    with pytest.raises(EmulationError, match=r"task 0 .*mask 0 and starts no block"):
        run_tasks(machine(), [Task((), 0)])


def test_cna_without_core_never_completes():
    spec = small_conv()
    with pytest.raises(EmulationError, match=r"starts CNA but not CORE"):
        run_tasks(conv_machine(spec), [conv_task(spec).task(0x19)])


def test_dpu_waiting_for_a_core_that_does_not_run():
    spec = small_conv()
    with pytest.raises(EmulationError, match=r"FLYING_MODE=0 makes the DPU wait for the CORE"):
        run_tasks(conv_machine(spec), [conv_task(spec).task(MASK_FLYING)])


def test_unmodelled_features_are_refused_not_ignored():
    spec = small_conv()
    t = conv_task(spec)
    t.set("CNA", "CVT_CON0", DATA_SIGN=1, CVT_TYPE=1, CVT_BYPASS=0)
    with pytest.raises(EmulationError,
                       match=r"CVT_CON0=0xa enables the CNA input converter, which is not modelled"):
        run_tasks(conv_machine(spec), [t.task(MASK_CONV)])


@pytest.mark.parametrize("register, field", [("BS_CFG", "BS_ALU_SRC"), ("BS_MUL_CFG", "BS_MUL_SRC")])
def test_a_bypassed_bs_operand_with_its_source_bit_set_fetches_nothing(register, field):
    """A BS sub-unit that is bypassed never uses its operand, so its source bit (BRDMA) alone
    starts no fetch: the task runs as with the bit clear (it raised KeyError before session 16)."""
    x = np.random.default_rng(11).integers(-128, 128, (16, 4, 4)).astype(np.int8)
    outputs = []
    for source in (0, 1):
        t = flying_task(4, 4, 16, src=0x10000, dst=0x20000)
        t.set("DPU", "BS_CFG", BS_RELU_BYPASS=1, BS_MUL_BYPASS=1, BS_ALU_BYPASS=1)  # BS on, its parts off
        if source:
            t.set("DPU", register, **{field: 1}) if register != "BS_CFG" else t.set(
                "DPU", "BS_CFG", BS_RELU_BYPASS=1, BS_MUL_BYPASS=1, BS_ALU_BYPASS=1, BS_ALU_SRC=1)
        m = machine()
        load_cube(m, 0x10000, x)
        run_tasks(m, [t.task(MASK_FLYING)])
        outputs.append(m.memory.dump(0x20000, 16 * 16))
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0].view(np.int8).reshape(4, 4, 16).transpose(2, 0, 1), x)
