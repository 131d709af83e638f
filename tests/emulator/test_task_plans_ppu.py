"""Task programs of PPU tasks (issue 20, units/ppu.py ``prepare_ppu``): a replayed chain's pooling
tasks run as compiled steps. They must give what the full unit path gives - outputs (against the
independent pooling reference of test_machine_support), task records with every DMA counter,
register state - also when the pool reads what a convolution's step wrote in the same run. The
last test breaks the step on purpose (its source rows read once, when it was built) and shows
these checks catch it."""

import numpy as np
import pytest

from npuemu.emulator.units import ppu
from tests.emulator.test_machine_conv import random_layer
from tests.emulator.test_machine_support import MASK_CONV, MASK_POOL, conv_task, load_cube, pool_reference, \
    pool_task, read_cube
from tests.emulator.test_task_plans import Counting, _machine, _output, _spec, hoist_row_reads, int8_inputs, paired_runs
from tests.emulator.test_task_plans import _expected as _conv_expected

IN0 = 0x10000
OUTS = (0x100000, 0x140000, 0x180000)
CHANNELS, HEIGHT, WIDTH = 20, 13, 15
POOLS = {  # method, kernel, stride, pads (top, bottom, left, right), pad value
    "max": (1, 3, 2, (1, 1, 1, 1), 0),
    "min": (2, 2, 1, (0, 1, 0, 1), 0),
    "avg": (0, 3, 1, (1, 1, 1, 1), -5),
}


def _pool(name: str, src: int, dst: int, channels: int = CHANNELS, height: int = HEIGHT, width: int = WIDTH):
    method, kernel, stride, pads, pad_value = POOLS[name]
    out_h = (height + pads[0] + pads[1] - kernel) // stride + 1
    out_w = (width + pads[2] + pads[3] - kernel) // stride + 1
    task = pool_task(width, height, channels, method=method, kernel=kernel, stride=stride, out_w=out_w, out_h=out_h,
                     src=src, dst=dst, pads=pads, pad_value=pad_value)
    return task, (out_h, out_w)


def _reference(name: str, x: np.ndarray, out: tuple[int, int]) -> np.ndarray:
    _, kernel, stride, pads, pad_value = POOLS[name]
    if name == "min":
        return -pool_reference(-x.astype(np.int64), "max", kernel, stride, *out, pads[0], pads[2])
    return pool_reference(x, name, kernel, stride, *out, pads[0], pads[2], pad_value)


@pytest.mark.parametrize("order", [("max", "avg"), ("min", "max", "avg")])
def test_pool_steps_equal_full_runs(monkeypatch, order):
    tasks = [_pool(name, IN0, out) for name, out in zip(order, OUTS)]
    counting = Counting(monkeypatch)
    fast, amount = _machine([(task, MASK_POOL) for task, _ in tasks], False)
    slow, _ = _machine([(task, MASK_POOL) for task, _ in tasks], True)
    runs = paired_runs(fast, slow, amount, int8_inputs(6, (CHANNELS, HEIGHT, WIDTH)),
                       lambda machine, x: load_cube(machine, IN0, x),
                       lambda machine: [read_cube(machine, out, CHANNELS, *shape) for out, (_, shape) in zip(OUTS, tasks)])
    for fast_reads, slow_reads, x in runs:
        for name, got, want, (_, shape) in zip(order, fast_reads, slow_reads, tasks):
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got, _reference(name, x, shape))
    assert counting.built >= 1 and counting.steps >= len(order)


def test_a_pool_of_a_convolutions_output_reads_it_as_written(monkeypatch):
    spec = _spec("pointwise_70_kernels")
    layer = random_layer(spec, 0)
    pool, shape = _pool("max", spec.output, 0x380000, spec.kernels, spec.out_h, spec.out_w)
    chain = [(conv_task(spec), MASK_CONV), (pool, MASK_POOL)]
    counting = Counting(monkeypatch)
    fast, amount = _machine(chain, False, layer, spec)
    slow, _ = _machine(chain, True, layer, spec)
    runs = paired_runs(fast, slow, amount, int8_inputs(7, (spec.in_c, spec.in_h, spec.in_w)),
                       lambda machine, x: load_cube(machine, spec.feature, x),
                       lambda machine: (_output(machine, spec), read_cube(machine, 0x380000, spec.kernels, *shape)))
    for (conv, pooled), (slow_conv, slow_pooled), x in runs:
        expected = _conv_expected(spec, x, layer[1], layer[3])
        np.testing.assert_array_equal(conv, expected)
        np.testing.assert_array_equal(slow_conv, expected)
        np.testing.assert_array_equal(pooled, slow_pooled)
        np.testing.assert_array_equal(pooled, _reference("max", expected, shape))
    assert counting.steps >= 2


def test_the_checks_catch_source_rows_read_when_the_step_was_built(monkeypatch):
    hoist_row_reads(monkeypatch, ppu)
    task, shape = _pool("avg", IN0, OUTS[0])
    counting = Counting(monkeypatch)
    fast, amount = _machine([(task, MASK_POOL)], False)
    slow, _ = _machine([(task, MASK_POOL)], True)
    runs = paired_runs(fast, slow, amount, int8_inputs(8, (CHANNELS, HEIGHT, WIDTH)),
                       lambda machine, x: load_cube(machine, IN0, x),
                       lambda machine: read_cube(machine, OUTS[0], CHANNELS, *shape))
    assert counting.steps >= 1 and sum(int(not np.array_equal(got, want)) for got, want, _ in runs) > 0
