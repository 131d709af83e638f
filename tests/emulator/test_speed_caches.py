"""The emulator's speed caches never serve stale values: unpacked weights and decoded regcmd
chains are rebuilt after any host or DMA write touching their bytes, and decoded register
state follows the register values."""

from dataclasses import replace

import numpy as np
import pytest

from npuemu.emulator.machine import Machine
from npuemu.emulator.memory import Memory, TaskDma, Traffic
from npuemu.emulator.regfile import RegisterFile
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import EmulationError
from npuemu.isa.task import Chain, RegisterWrite
from tests.emulator.test_machine_conv import CASES, random_layer, reference_accumulators
from tests.emulator.test_machine_support import (
    MASK_CONV, REGMAP, bias_blob, conv_task, load_cube, out_cvt_reference, read_cube,
)


def derive(dma: TaskDma, builds: list, address: int = 0x100, nbytes: int = 16):
    def build(raw):
        builds.append(raw.copy())
        return int(raw.astype(np.int64).sum())
    return dma.derived_from_block(Traffic.WEIGHT_READ, address, nbytes, "test block", "sum", build)


def test_derived_values_are_rebuilt_only_after_an_overlapping_write():
    memory = Memory(4096)
    memory.load(0x100, np.arange(16, dtype=np.uint8))
    dma, builds = TaskDma(memory, "test"), []
    assert derive(dma, builds) == sum(range(16)) and len(builds) == 1
    assert derive(dma, builds) == sum(range(16)) and len(builds) == 1  # cached
    dma.write_rows(Traffic.DPU_WRITE, np.array([0xF0, 0x110]), np.zeros((2, 16), np.uint8), "apart")
    assert derive(dma, builds) == sum(range(16)) and len(builds) == 1  # [0xF0, 0x100) and [0x110, 0x120): no overlap
    dma.write_rows(Traffic.DPU_WRITE, np.array([0x10F]), np.full((1, 1), 100, np.uint8), "last byte")
    assert derive(dma, builds) == sum(range(15)) + 100 and len(builds) == 2
    memory.load(0xFF, np.array([1, 1], np.uint8))  # host write over the first byte
    assert derive(dma, builds) == 1 + sum(range(1, 15)) + 100 and len(builds) == 3
    assert dma.traffic().weight_read == 5 * 16  # every call counts its DMA bytes


def run_conv(machine: Machine, spec, seed: int, write_regcmd: bool, address: int = 0xF0_0000):
    """Load layer ``seed`` of ``spec`` (and its regcmd if asked), run it, return (got, expected)."""
    x, w, blob, bs = random_layer(spec, seed)
    v = reference_accumulators(spec, x, w, bs)
    load_cube(machine, spec.feature, x)
    machine.memory.load(spec.weights, blob.tobytes())
    machine.memory.load(spec.bias, bias_blob(bs.alu, bs.cpend, bs.mul))
    encoded = encode_chain(Chain((conv_task(spec).task(MASK_CONV),)), REGMAP, base_addr=address)
    if write_regcmd:
        machine.memory.load(address, encoded.data)
    machine.run_chain(address, encoded.first_amount)
    channels = spec.in_c if spec.depthwise else spec.kernels
    expected = out_cvt_reference(v, spec.out_scale, spec.out_shift, spec.out_offset)
    return read_cube(machine, spec.output, channels, spec.out_h, spec.out_w), expected


def test_new_weights_and_new_registers_at_the_same_addresses_take_effect():
    for name in ("direct_3x3_pad1", "depthwise_3x3_24ch"):
        spec = replace(CASES[name], bs_shift=14, out_scale=23000, out_offset=-5, out_shift=17)
        machine = Machine.for_platform("rk3588", ddr_size=16 << 20)
        outputs = []
        for seed in (0, 1, 1):  # new weights (seed 1), then the same again from the caches
            got, expected = run_conv(machine, spec, seed, write_regcmd=seed == 0)
            np.testing.assert_array_equal(got, expected)
            outputs.append(got)
        assert not np.array_equal(outputs[0], outputs[1])
        spec = replace(spec, out_shift=16, out_offset=3)  # same chain address, new registers
        got, expected = run_conv(machine, spec, 1, write_regcmd=True)
        np.testing.assert_array_equal(got, expected)
        assert not np.array_equal(got, outputs[1])


def lut_writes(rng, count: int) -> list:
    """A register-write sequence with LUT uploads (some read-type, some past the table end),
    S_POINTER flips, PC and ordinary writes mixed in."""
    writes = []
    for _ in range(count):
        kind = rng.integers(0, 6)
        if kind == 0:
            address = int(rng.choice([0, rng.integers(0, 513), 400]))  # 400 + a long run overflows
            cfg = REGMAP.pack("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=int(rng.random() < 0.8),
                              LUT_TABLE_ID=int(rng.integers(0, 2)), LUT_ADDR=address)
            writes.append(RegisterWrite("DPU", "LUT_ACCESS_CFG", cfg))
        elif kind == 1:
            writes += [RegisterWrite("DPU", "LUT_ACCESS_DATA", int(v))
                       for v in rng.integers(0, 2**32, int(rng.integers(1, 300)))]
        elif kind == 2:
            writes.append(RegisterWrite("DPU", "S_POINTER", int(rng.choice([0, 1, 0xE]))))
        elif kind == 3:
            writes.append(RegisterWrite("PC", "BASE_ADDRESS", int(rng.integers(0, 2**28)) * 16))
        elif kind == 4:
            writes.append(RegisterWrite("DPU", "OUT_CVT_SCALE", int(rng.integers(0, 2**16))))
        else:  # runs of plain writes to several blocks and registers (merged into one step)
            for _ in range(int(rng.integers(1, 6))):
                block, register = PLAIN[int(rng.integers(0, len(PLAIN)))]
                writes.append(RegisterWrite(block, register, int(rng.integers(0, 2**16))))
    return writes


PLAIN = (("DPU", "OUT_CVT_SCALE"), ("DPU", "OUT_CVT_SHIFT"), ("CNA", "CONV_CON1"), ("CNA", "S_POINTER"),
         ("CORE", "MISC_CFG"), ("CNA", "CONV_CON1"))


def state_of(regs: RegisterFile):
    blocks = [(name, b.pointer, b.executer, [dict(g) for g in b.groups]) for name, b in regs.blocks.items()]
    return (regs.lut.tables.copy(), regs.lut.address, dict(regs.pc), blocks)


@pytest.mark.parametrize("seed", range(16))
def test_resolved_writes_act_like_one_write_at_a_time(seed):
    writes = lut_writes(np.random.default_rng(seed), 12)
    slow, fast = RegisterFile(REGMAP), RegisterFile(REGMAP)
    slow_error = fast_error = None
    try:
        for write in writes:
            slow.write(write.block, write.register, write.value, "t")
    except EmulationError as error:
        slow_error = str(error)
    try:
        fast.apply(fast.resolve(writes), "t")
    except EmulationError as error:
        fast_error = str(error)
    assert slow_error == fast_error
    got, expected = state_of(fast), state_of(slow)
    assert np.array_equal(got[0], expected[0]) and got[1:] == expected[1:]
