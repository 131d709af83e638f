"""Two selects of the fp chain's loops (issue 20, session 21) bit for bit against models written here:
``dpu_fp_fused.bounds`` / ``_bounded`` (a stage's ReLU / ReLUX as two comparisons with no flag) against
NUMERICS.md 4.6's ReLU then ReLUX, and ``lut_fp._table_index`` (the LUT's entry index as llvm.maxnum /
minnum) against 5.1's clamp of the position to [0, 512] and its floor - each over every kind of fp32
value (NaN, infinities, -0.0, subnormals, the ends), element by element and in a loop that LLVM
vectorises (the loops the kernels run)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from npuemu.emulator.kernels.dpu_fp_fused import _bounded, bounds
from npuemu.emulator.kernels.lut_fp import _table_index

F = np.float32
_EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 6.0, 511.0, 511.99997, 512.0, 512.00006,
          -0.5, 0.99999994, 3e38, -3e38]
_FLOATS = st.one_of(st.sampled_from(_EDGES), st.floats(width=32, allow_nan=True, allow_infinity=True))


def _relu_model(value: float, relu: bool, relux: bool, limit: float) -> np.float32:
    """ReLU (a negative value to +0) then ReLUX (above the limit: the limit), in Python floats."""
    if relu and value < 0:
        value = 0.0
    if relux and value > limit:
        value = limit
    return F(value)


def _index_model(position: float) -> int:
    """The entry index of 5.1: the position clamped to [0, 512] (NaN: 0), its floor."""
    if math.isnan(position) or position <= 0:
        return 0
    return 512 if position >= 512 else math.floor(position)


@njit(cache=False)
def _bounded_loop(values, bound, out):
    for i in range(values.size):
        out[i] = _bounded(values[i], bound)


@njit(cache=False)
def _index_loop(positions, out):
    last = np.float32(512)
    for i in range(positions.size):
        out[i] = _table_index(positions[i], last)


def _bits(values) -> np.ndarray:
    return np.asarray(values, np.float32).view(np.uint32)


@settings(max_examples=150, deadline=None)
@given(st.lists(_FLOATS, min_size=1, max_size=70), st.booleans(), st.booleans(), _FLOATS)
def test_bounded_is_relu_then_relux(values, relu, relux, limit):
    data, limit = np.array(values, np.float32), F(limit)
    want = np.array([_relu_model(float(v), relu, relux, float(limit)) for v in data], np.float32)
    bound = bounds(relu, relux, limit)
    one = np.array([_bounded(v, bound) for v in data], np.float32)
    looped = np.empty_like(data)
    _bounded_loop(data, bound, looped)
    assert np.array_equal(_bits(one), _bits(want))
    assert np.array_equal(_bits(looped), _bits(want))


@settings(max_examples=150, deadline=None)
@given(st.lists(_FLOATS, min_size=1, max_size=70))
def test_table_index_is_the_clamped_floor(positions):
    data = np.array(positions, np.float32)
    want = np.array([_index_model(float(p)) for p in data], np.int32)
    looped = np.empty(data.size, np.int32)
    _index_loop(data, looped)
    assert np.array_equal(looped, want)
