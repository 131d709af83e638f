"""The DMA's fixed-row fast paths (``Memory.locate_fixed``: a plan's read-only row-address
arrays located once) behave exactly like the general paths: same bytes, same offsets, same
counters, same refusals and errors, same dropped derived values."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.memory import _READ_STREAMS, DmaTraffic, Memory, TaskDma, Traffic
from npuemu.isa.errors import DmaError, EmulationError

SIZE = 4096


def read_only(starts) -> np.ndarray:
    array = np.array(starts, np.int64)
    array.flags.writeable = False
    return array


@given(st.lists(st.integers(0, 2**31), min_size=12, max_size=12))
@settings(max_examples=30, deadline=None)
def test_read_bytes_is_the_sum_of_every_read_stream(values):
    names = [f.name for f in dataclasses.fields(DmaTraffic)]
    traffic = DmaTraffic(**dict(zip(names, values)))
    assert traffic.read_bytes == sum(getattr(traffic, name) for name in names if name.endswith("_read"))
    assert set(_READ_STREAMS) == {name for name in names if name.endswith("_read")}


rows_strategy = st.tuples(
    st.lists(st.integers(-64, SIZE + 64), min_size=1, max_size=6),  # row starts (some outside, some wrapped)
    st.sampled_from([8, 16, 24, 40]),  # row bytes
    st.sampled_from([np.uint8, np.uint64, np.int32]),  # claimed element type
    st.booleans(),  # caller asserts disjoint rows
)


def outcome(call):
    try:
        return "ok", call()
    except DmaError as error:
        return "error", str(error)


@given(rows_strategy)
@settings(max_examples=60, deadline=None)
def test_claiming_fixed_rows_equals_claiming_fresh_rows(case):
    starts, row_bytes, dtype, disjoint = case
    starts = [s % (1 << 32) if s >= 0 else s for s in starts]
    results = []
    for fixed in (False, True):
        memory = Memory(SIZE)
        memory.derived.put("watch", 256, 512, "value")  # a derived value any overlapping claim drops
        dma = TaskDma(memory, "task")
        addresses = read_only(starts) if fixed else np.array(starts, np.int64)
        kind, value = outcome(lambda: dma.claim_rows(Traffic.DPU_WRITE, addresses, row_bytes, dtype, "WDMA",
                                                     disjoint=disjoint))
        if kind == "ok" and value is not None:
            view, offsets = value
            assert view.dtype == np.dtype(dtype) and np.shares_memory(view, memory.regions[0].data)
            value = offsets.tolist()
        results.append((kind, value, dma.traffic(), memory.derived.get("watch")))
        for _ in range(2):  # a located entry is reused: still the same answer
            if fixed:
                again = outcome(lambda: TaskDma(memory, "task").claim_rows(
                    Traffic.DPU_WRITE, addresses, row_bytes, dtype, "WDMA", disjoint=disjoint))
                assert again[0] == kind
    assert results[0] == results[1]


@given(rows_strategy)
@settings(max_examples=40, deadline=None)
def test_reading_fixed_rows_equals_reading_fresh_rows(case):
    starts, row_bytes, _, _ = case
    results = []
    for fixed in (False, True):
        memory = Memory(SIZE)
        memory.load(0, (np.arange(SIZE) * 7 % 251).astype(np.uint8))
        dma = TaskDma(memory, "task")
        addresses = read_only(starts) if fixed else np.array(starts, np.int64)
        kind, value = outcome(lambda: dma.read_rows(Traffic.EW_READ, addresses, row_bytes, "ERDMA"))
        results.append((kind, value.tolist() if kind == "ok" else value, dma.traffic()))
    assert results[0] == results[1]


def test_locate_fixed_needs_a_read_only_array_and_builds_messages_only_on_error():
    memory = Memory(SIZE)
    with pytest.raises(EmulationError, match="read-only"):
        memory.locate_fixed(np.array([0]), 16, lambda: "never")
    calls = []

    def where():
        calls.append(1)
        return "core 0 task 1: DPU WDMA write"

    starts = read_only([0x10, 0x40])
    first = memory.locate_fixed(starts, 16, where)
    assert memory.locate_fixed(starts, 16, where) is first and not calls
    assert first.bounds == (0x10, 0x50) and first.nbytes == 32 and first.disjoint()
    with pytest.raises(DmaError, match="core 0 task 1: DPU WDMA write"):
        memory.locate_fixed(read_only([SIZE - 8]), 16, where)
    assert calls == [1]
