"""The fp LUT's table reads on int32 indices (``lut_fp._word_at``, NUMERICS.md 33, 48) at the positions
where an index could go wrong: every entry of both tables hit exactly and just past it, the last
entries (511, 512) and past END where END is not START + 512 steps, far out of range, +-inf, NaN and -0,
in arrays long enough for the 16-lane vector loop and its remainders, against reference/lut_fp16.py
(NUMERICS.md 5.1 in plain Python)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import LutConfig
from npuemu.emulator.kernels.lut_fp import lut_float, prepared
from tests.emulator.reference.lut_fp16 import lut_float as reference_lut
from tests.emulator.test_kernels_lut import reference_config, tables


def positions(table) -> np.ndarray:
    """Each entry's input, a quarter step either side, the ends and past them."""
    step = 2.0 ** table.index_select
    entries = table.start + np.arange(nm.LUT_ENTRIES + 2) * step
    return np.concatenate([entries, entries + step / 4, entries - step / 4,
                           [table.end, table.end + 1, table.start - 1, 2.0**30, -(2.0**30)]])


@settings(max_examples=25, deadline=None)
@given(tables(), tables(), st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1)), st.integers(0, 2**32 - 1))
def test_every_entry_and_edge_reads_the_model_value(le, lo, priorities, seed):
    rng = np.random.default_rng(seed)
    le_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    config = LutConfig(le=le, lo=lo, hybrid_priority=priorities[0], uflow_priority=priorities[1],
                       oflow_priority=priorities[2])
    data = np.concatenate([positions(le), positions(lo), [np.inf, -np.inf, np.nan, -0.0]]).astype(np.float32)
    data = data[rng.permutation(data.size)]
    packed, params = prepared(config, le_table, lo_table)
    out = np.empty_like(data)
    with np.errstate(over="ignore", invalid="ignore"):
        lut_float(data, packed, params, out)
        want = np.array([reference_lut(v, le_table.tolist(), lo_table.tolist(), reference_config(config))
                         for v in data], np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan)
    assert np.array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))
