"""TaskDma.write_planes (the DPU's write without an intermediate NC1HWC2 array) writes the same
bytes, in the same order, with the same counters and cache invalidation as building the atoms
(reference layout) and writing them row by row; the derived cache's sorted index drops exactly
the entries a write overlaps."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from npuemu.emulator.memory import Memory, TaskDma, Traffic
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import layouts as ref_layouts

DTYPES = [np.int8, np.int16, np.int32, np.float16, np.float32]


@st.composite
def write_cases(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    atom = draw(st.sampled_from([8, 16]))
    c2 = atom // dtype.itemsize
    channels, height, width = draw(st.integers(1, 40)), draw(st.integers(1, 6)), draw(st.integers(1, 7))
    surfaces = -(-channels // c2)
    line = width * atom
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # a region base off the element size makes the rows unaligned within the image
    base = draw(st.sampled_from([0, 1, 2, 4096]))
    # surface starts anywhere on atom boundaries, overlapping each other sometimes
    slots = rng.integers(0, 64, surfaces) * atom
    first = -(-base // 16) * 16 + 128
    starts = (first + slots[:, None] + np.arange(height)[None, :] * line).reshape(-1)
    raw = rng.integers(0, 256, channels * height * width * dtype.itemsize, dtype=np.uint8)
    cube = raw.view(dtype).reshape(channels, height, width)
    return dtype, c2, cube, base, starts


def _reference_memory(base, cube, c2, starts, size):
    data = np.full(size, 0xAB, np.uint8)
    atoms = ref_layouts.nchw_to_nc1hwc2(cube, c2)
    rows = atoms.reshape(starts.size, -1).view(np.uint8)
    for start, row in zip(starts, rows):  # in order: a later row wins where two overlap
        data[start - base:start - base + row.size] = row
    return data


@settings(max_examples=80, deadline=None)
@given(write_cases())
def test_write_planes_equals_writing_the_reference_atoms(case):
    dtype, c2, cube, base, starts = case
    size = 64 * 16 + 160 + starts.size * 16 * 7
    memory = Memory(size, base)
    memory.load(base, np.full(size, 0xAB, np.uint8))
    # a cached value over the whole image: any write must drop it
    memory.derived.put("probe", base, base + size, "value")
    dma = TaskDma(memory, "test")
    dma.write_planes(Traffic.DPU_WRITE, starts, cube, c2, "planes")
    expected = _reference_memory(base, cube, c2, starts, size)
    assert np.array_equal(memory.dump(base, size), expected)
    assert dma.traffic().dpu_write == starts.size * cube.shape[2] * c2 * dtype.itemsize
    assert memory.derived.get("probe") is None


def test_write_planes_refuses_a_row_count_that_does_not_match():
    memory = Memory(4096)
    dma = TaskDma(memory, "test")
    with pytest.raises(EmulationError, match="row addresses"):
        dma.write_planes(Traffic.DPU_WRITE, np.arange(3) * 64, np.zeros((17, 2, 1), np.int8), 16, "x")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20)), min_size=1, max_size=12),
       st.lists(st.integers(0, 80), min_size=1, max_size=4), st.integers(1, 10), st.booleans())
@example([(0, 10), (5, 25)], [10], 5, True)  # an entry ending where the write starts survives
@example([(0, 10), (5, 25)], [10], 5, False)
def test_derived_cache_drops_exactly_the_overlapped_entries(entries, rows, row_bytes, ranged):
    # the sorted index with running maximum ends against a brute-force overlap check
    memory = Memory(1024)
    for key, (low, size) in enumerate(entries):
        memory.derived.put(key, low, low + size, key)
    starts = np.array(rows, np.int64)
    if ranged:
        low, high = int(starts.min()), int(starts.max()) + row_bytes
        memory.derived.invalidate(low, high)
        hit = [low < start + size and start < high for start, size in entries]
    else:
        memory.derived.invalidate_rows(starts, row_bytes)
        hit = [bool(np.any((starts < start + size) & (starts + row_bytes > start)))
               for start, size in entries]
    assert [memory.derived.get(key) is None for key in range(len(entries))] == hit
