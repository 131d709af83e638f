"""The fp-path LUT with its constants worked out once (kernels/lut_fp.py, issue 20) bit for bit:
against tests/emulator/reference/lut_fp16.py (written from NUMERICS.md 5.1 alone) and against the
per-element kernel it replaces (kernels.lut.lut_stage_fp, NaN payloads included)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import LutConfig, LutTableConfig
from npuemu.emulator.kernels import lut_stage_fp as per_element_lut
from npuemu.emulator.kernels.lut_fp import lut_stage_fp
from npuemu.isa.errors import EmulationError
from tests.emulator.reference.lut_fp16 import lut_float
from tests.emulator.test_kernels_lut import reference_config, tables


def inputs(rng, le: LutTableConfig, lo: LutTableConfig) -> np.ndarray:
    """Both tables' edges and just past them, knots and fractions, far values, infinities, NaN, -0."""
    edges = [t.start + d for t in (le, lo) for d in (-1.0, -0.25, 0.0, 0.5)] + \
        [t.end + d for t in (le, lo) for d in (-0.5, 0.0, 0.25, 1.0)]
    knots = [t.start + (i << t.index_select) + f for t in (le, lo) for i in (0, 1, 255, 511, 512) for f in (0, 0.5)]
    low, high = min(le.start, lo.start) - 2**14, max(le.end, lo.end) + 2**14
    far = [-3e38, 3e38, np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40]
    return np.concatenate([edges, knots, rng.uniform(low, high, 300), far]).astype(np.float32)


@settings(max_examples=80, deadline=None)
@given(tables(), tables(), st.integers(0, 1), st.integers(0, 1), st.integers(0, 1), st.integers(0, 2**32 - 1))
def test_fast_fp_lut_matches_the_model_and_the_per_element_kernel(le, lo, hybrid, uflow, oflow, seed):
    rng = np.random.default_rng(seed)
    le_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    config = LutConfig(le=le, lo=lo, hybrid_priority=hybrid, uflow_priority=uflow, oflow_priority=oflow)
    x = inputs(rng, le, lo).reshape(2, -1)  # any shape
    got = lut_stage_fp(x, config, le_table, lo_table)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.array_equal(got.view(np.uint32), per_element_lut(x, config, le_table, lo_table).view(np.uint32))
    cfg = reference_config(config)
    with np.errstate(over="ignore", invalid="ignore"):  # the slopes of +-3e38
        want = np.array([lut_float(v, le_table.tolist(), lo_table.tolist(), cfg) for v in x.reshape(-1)],
                        np.float32).reshape(x.shape)
    nan = np.isnan(want)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)) and np.isnan(got[nan]).all()


def test_tables_are_checked():
    config = LutConfig()
    with pytest.raises(EmulationError, match="513 entries"):
        lut_stage_fp(np.zeros(3, np.float32), config, np.zeros(512), np.zeros(513))
    with pytest.raises(EmulationError, match="int16"):
        lut_stage_fp(np.zeros(3, np.float32), config, np.full(513, 40000), np.zeros(513))
