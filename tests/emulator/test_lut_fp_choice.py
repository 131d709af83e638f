"""The fp LUT's table choice by thresholds and its entry pairs (kernels/lut_fp.py, NUMERICS.md 48)
against reference/lut_fp16.py (NUMERICS.md 5.1 in plain Python), where they could go wrong: the
compiler's adjacent tables (one threshold), overlapping, nested, equal and disjoint ranges (up to
eight changes of table), START == END, ends that fp32 rounds (> 2**24), every end and the floats
either side of it, +-inf, NaN and -0, in arrays long enough for the 16-lane vector loops."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import LutConfig, LutTableConfig
from npuemu.emulator.kernels.lut_fp import lut_float, prepared
from tests.emulator.reference.arithmetic import pick_lo
from tests.emulator.reference.lut_fp16 import lut_float as reference_lut
from tests.emulator.test_kernels_lut import reference_config

F32 = np.float32
_POOL = [-(2**31) + 1, -(2**24) - 3, -16384, -100, -1, 0, 1, 5, 8192, 16384, 2**24 + 1, 2**24 + 3, 2**31 - 1]


@st.composite
def table_pair(draw):
    """LE and LO ranges from a small pool of ends (so that ends coincide), or the compiler's
    adjacent layout (LE [-16384, 0], LO [0, 16384] and the like)."""
    if draw(st.booleans()):
        low, mid, high = sorted(draw(st.lists(st.sampled_from(_POOL), min_size=3, max_size=3)))
        ranges = [(low, mid), (mid, high)]
    else:
        ranges = [tuple(sorted(draw(st.lists(st.sampled_from(_POOL), min_size=2, max_size=2)))) for _ in range(2)]
    made = []
    for start, end in ranges:
        made.append(LutTableConfig(start=start, end=end, index_select=draw(st.integers(0, 14)),
                                   uflow_scale=draw(st.sampled_from([0, 1, -7, 16384])),
                                   uflow_shift=draw(st.integers(0, 20)),
                                   oflow_scale=draw(st.sampled_from([0, 3, -16384, 16434])),
                                   oflow_shift=draw(st.integers(0, 20))))
    return made


def edge_inputs(config: LutConfig, rng: np.random.Generator) -> np.ndarray:
    """Every end as fp32 and the floats either side, specials, random values across the ends."""
    ends = np.array([F32(t.start) for t in (config.le, config.lo)] + [F32(t.end) for t in (config.le, config.lo)],
                    np.float32)
    near = np.concatenate([ends, np.nextafter(ends, F32(np.inf)), np.nextafter(ends, F32(-np.inf))])
    spread = rng.uniform(float(ends.min()) - 100, float(ends.max()) + 100, 64).astype(np.float32)
    data = np.concatenate([near, near, spread, [np.inf, -np.inf, np.nan, -0.0, 0.0]]).astype(np.float32)
    return data[rng.permutation(data.size)]


def reference_choice(x: np.float32, config: LutConfig) -> bool:
    def status(table):
        return "under" if x < F32(table.start) else "over" if x > F32(table.end) else "hit"
    return pick_lo(status(config.le), status(config.lo), reference_config(config))


@settings(max_examples=60, deadline=None)
@given(table_pair(), st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1)), st.integers(0, 2**32 - 1))
def test_lut_values_at_every_end_equal_the_reference(pair, priorities, seed):
    rng = np.random.default_rng(seed)
    le_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    config = LutConfig(le=pair[0], lo=pair[1], hybrid_priority=priorities[0], uflow_priority=priorities[1],
                       oflow_priority=priorities[2])
    data = edge_inputs(config, rng)
    packed, params = prepared(config, le_table, lo_table)
    out = np.empty_like(data)
    lut_float(data, packed, params, out)
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.array([reference_lut(v, le_table.tolist(), lo_table.tolist(), reference_config(config))
                         for v in data], np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan)
    assert np.array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(table_pair(), st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1)), st.integers(0, 2**32 - 1))
def test_table_choice_is_the_reference_choice(pair, priorities, seed):
    """Tables that tell LE from LO apart (LE all 1000, LO all -1000, no slopes): the output names
    the table the kernel chose."""
    le = LutTableConfig(pair[0].start, pair[0].end, pair[0].index_select)
    lo = LutTableConfig(pair[1].start, pair[1].end, pair[1].index_select)
    config = LutConfig(le=le, lo=lo, hybrid_priority=priorities[0], uflow_priority=priorities[1],
                       oflow_priority=priorities[2])
    data = edge_inputs(config, np.random.default_rng(seed))
    data = data[~np.isnan(data)]
    packed, params = prepared(config, np.full(nm.LUT_ENTRIES, 1000, np.int16), np.full(nm.LUT_ENTRIES, -1000, np.int16))
    out = np.empty_like(data)
    lut_float(data, packed, params, out)
    assert [bool(v == -1000) for v in out] == [reference_choice(v, config) for v in data]


def test_adjacent_tables_read_every_entry_pair():
    """The compiler's layout (one threshold): each entry, between entries, the last ones, past END."""
    rng = np.random.default_rng(3)
    le_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo = LutTableConfig(0, 16384, 5, oflow_scale=16384, oflow_shift=13)
    config = LutConfig(le=LutTableConfig(-16384, 0, 5), lo=lo, hybrid_priority=1, uflow_priority=0, oflow_priority=1)
    steps = np.arange(-16384 - 64, 16384 + 64, 8, dtype=np.float32)
    data = np.concatenate([steps, steps + F32(0.25), [np.inf, -np.inf, -0.0]]).astype(np.float32)
    packed, params = prepared(config, le_table, lo_table)
    out = np.empty_like(data)
    lut_float(data, packed, params, out)
    want = np.array([reference_lut(v, le_table.tolist(), lo_table.tolist(), reference_config(config)) for v in data],
                    np.float32)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
