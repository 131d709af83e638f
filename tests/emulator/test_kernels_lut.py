"""The LUT stage against the reference (NUMERICS.md 5)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import LutConfig, LutTableConfig, lut_stage
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import arithmetic as ref


@st.composite
def tables(draw):
    select = draw(st.integers(0, 12))
    start = draw(st.integers(-(2**20), 2**20))
    span = (nm.LUT_ENTRIES - 1) << select
    end = start + draw(st.sampled_from([span, span // 2, span + 7]))  # END need not match the span
    return LutTableConfig(start=start, end=end, index_select=select,
                          uflow_scale=draw(st.integers(-(2**15), 2**15 - 1)),
                          uflow_shift=draw(st.integers(0, 31)),
                          oflow_scale=draw(st.integers(-(2**15), 2**15 - 1)),
                          oflow_shift=draw(st.integers(0, 31)))


@given(tables(), tables(), st.integers(0, 1), st.integers(0, 1), st.integers(0, 1),
       st.integers(0, 2**32 - 1))
def test_lut_matches_reference(le, lo, hybrid, uflow, oflow, seed):
    rng = np.random.default_rng(seed)
    le_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    config = LutConfig(le=le, lo=lo, hybrid_priority=hybrid, uflow_priority=uflow,
                       oflow_priority=oflow)
    edges = [t.start + d for t in (le, lo) for d in (-1, 0, 1)] + [t.end + d for t in (le, lo)
                                                                   for d in (-1, 0, 1)]
    x = np.concatenate([np.array(edges), rng.integers(min(le.start, lo.start) - 2**14,
                                                      max(le.end, lo.end) + 2**14, 200)])
    x = np.clip(x, -(2**31), 2**31 - 1).astype(np.int32)
    got = lut_stage(x, config, le_table, lo_table)
    expected = [ref.lut(int(v), le_table, lo_table, reference_config(config)) for v in x]
    assert got.tolist() == expected


def reference_config(config: LutConfig) -> dict:
    le, lo = config.le, config.lo
    return {"le": (le.start, le.end, le.index_select, le.uflow_scale, le.uflow_shift,
                   le.oflow_scale, le.oflow_shift),
            "lo": (lo.start, lo.end, lo.index_select, lo.uflow_scale, lo.uflow_shift,
                   lo.oflow_scale, lo.oflow_shift),
            "hybrid_priority": config.hybrid_priority, "uflow_priority": config.uflow_priority,
            "oflow_priority": config.oflow_priority}


@settings(max_examples=30, deadline=None)
@given(tables(), tables(), st.integers(0, 1), st.integers(0, 2**32 - 1), st.integers(1, 600))
def test_dense_inputs_match_reference(le, lo, hybrid, seed, width):
    # more elements than distinct values: the kernel evaluates each value once and looks the
    # elements up (lut.py); the range straddles a table start so all three cases occur
    rng = np.random.default_rng(seed)
    le_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    config = LutConfig(le=le, lo=lo, hybrid_priority=hybrid)
    centre = rng.choice([le.start, lo.start, le.end, lo.end])
    x = rng.integers(centre - width, centre + width + 1, 4 * width + 8).astype(np.int32)
    got = lut_stage(x, config, le_table, lo_table)
    cfg = reference_config(config)
    assert got.tolist() == [ref.lut(int(v), le_table, lo_table, cfg) for v in x]


def test_entries_are_hit_exactly_and_interpolated_between():
    table = (np.arange(nm.LUT_ENTRIES) * 4).astype(np.int16)
    config = LutConfig(le=LutTableConfig(start=100, end=100 + 512 * 8, index_select=3),
                       lo=LutTableConfig(start=10**6, end=10**6 + 1))
    x = np.array([100, 108, 104, 103, 100 + 512 * 8], np.int32)
    assert lut_stage(x, config, table, table).tolist() == [0, 4, 2, 2, 2048]


def test_table_shape_and_range_are_checked():
    config = LutConfig()
    with pytest.raises(EmulationError, match="513 entries"):
        lut_stage(np.zeros(3, np.int32), config, np.zeros(512), np.zeros(513))
    with pytest.raises(EmulationError, match="int16"):
        lut_stage(np.zeros(3, np.int32), config, np.full(513, 40000), np.zeros(513))
    with pytest.raises(EmulationError, match="START <= END"):
        LutConfig(le=LutTableConfig(start=5, end=4)).parameters()


# -- the fp path (NUMERICS.md 5.1) -----------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(tables(), tables(), st.integers(0, 1), st.integers(0, 1), st.integers(0, 1),
       st.integers(0, 2**32 - 1))
def test_fp_lut_matches_reference(le, lo, hybrid, uflow, oflow, seed):
    """fp32 inputs (edges, fractions between entries, infinities, NaN) against the reference
    written from 5.1: bit for bit."""
    from tests.emulator.reference.lut_fp16 import lut_float
    from npuemu.emulator.kernels import lut_stage_fp

    rng = np.random.default_rng(seed)
    le_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    config = LutConfig(le=le, lo=lo, hybrid_priority=hybrid, uflow_priority=uflow, oflow_priority=oflow)
    edges = [t.start + d for t in (le, lo) for d in (-1.0, -0.25, 0.0, 0.5)] + \
        [t.end + d for t in (le, lo) for d in (-0.5, 0.0, 0.25, 1.0)]
    low, high = min(le.start, lo.start) - 2**14, max(le.end, lo.end) + 2**14
    x = np.concatenate([np.array(edges), rng.uniform(low, high, 200), [np.inf, -np.inf, np.nan, 0.0, -0.0]])
    x = x.astype(np.float32)
    got = lut_stage_fp(x, config, le_table, lo_table)
    want = np.array([lut_float(v, le_table.tolist(), lo_table.tolist(), reference_config(config)) for v in x],
                    np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()


def test_fp_lut_interpolates_in_fp32():
    """Entries at the knots, exact fractions between them (no integer rounding of the input)."""
    from npuemu.emulator.kernels import lut_stage_fp

    table = np.arange(nm.LUT_ENTRIES, dtype=np.int16) * 4
    config = LutConfig(lo=LutTableConfig(start=0, end=512 * 32, index_select=5), hybrid_priority=1,
                       oflow_priority=1)
    got = lut_stage_fp(np.array([0.0, 32.0, 16.0, 8.5, 1000.25], np.float32), config, table, table)
    np.testing.assert_array_equal(got, np.array([0.0, 4.0, 2.0, 1.0625, 125.03125], np.float32))
