"""What run_cna_core works out once per decoded state (units/cna_core._Plan: CBUF keys, DMA
rows, where they lie in memory) never stands in for the bytes: results follow the memory the
task runs on and every write to it, and the DMA counts the same bytes each time."""

import dataclasses

import numpy as np

from npuemu.emulator import kernels
from npuemu.emulator.memory import Memory, TaskDma, Traffic
from npuemu.emulator.units.cna_core import Cbuf, run_cna_core
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.timing_support import BASE

HEIGHT, WIDTH, CHANNELS, KERNELS = 2, 3, 16, 32
FEATURE, WEIGHTS = 0x100, 0x1000
STATE = dataclasses.replace(
    BASE, in_width=WIDTH, in_height=HEIGHT, line_stride=WIDTH * 16, surface_stride=HEIGHT * WIDTH * 16,
    feature_address=FEATURE, kernels=KERNELS, weight_address=WEIGHTS, weight_bytes=KERNELS * CHANNELS,
    weight_bytes_per_kernel=CHANNELS, out_width=WIDTH, out_height=HEIGHT, out_channels=KERNELS)


def memory_with(x: np.ndarray, w: np.ndarray) -> Memory:
    memory = Memory(1 << 16)
    memory.load(FEATURE, ref_layouts.nchw_to_nc1hwc2(x, 16))
    memory.load(WEIGHTS, kernels.pack_conv_weights(w))
    return memory


def run(memory: Memory) -> tuple[np.ndarray, int]:
    dma = TaskDma(memory, "test")
    result = run_cna_core(STATE, dma, Cbuf(), "test")
    assert result.layout == "hwc"
    return result.data, dma.counts[Traffic.FEATURE_READ]


def expected(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    # a 1x1 convolution, pixel-major [H*W][K]
    return x.reshape(CHANNELS, -1).T.astype(np.int64) @ w[:, :, 0, 0].T.astype(np.int64)


def test_results_follow_the_memory_and_its_writes_with_one_state():
    rng = np.random.default_rng(3)
    x1, x2 = (rng.integers(-128, 128, (CHANNELS, HEIGHT, WIDTH)).astype(np.int8) for _ in range(2))
    w = rng.integers(-128, 128, (KERNELS, CHANNELS, 1, 1)).astype(np.int8)
    first, second = memory_with(x1, w), memory_with(x2, w)
    for memory, x in ((first, x1), (second, x2), (first, x1)):
        data, counted = run(memory)
        assert np.array_equal(data, expected(x, w))
        assert counted == HEIGHT * WIDTH * 16  # the same rows counted every time
    x3 = -x1
    first.load(FEATURE, ref_layouts.nchw_to_nc1hwc2(x3, 16))  # a host write between runs
    assert np.array_equal(run(first)[0], expected(x3, w))
