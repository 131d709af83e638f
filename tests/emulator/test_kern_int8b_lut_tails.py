"""The LUT + EW + OUT_CVT table read past its ends (issue 20, kernels/lut.py ``flat_tails`` and
``_table_block``, NUMERICS.md 31): where both tables' slope SCALEs are 0 on a side, an input past
the table takes that end's entry instead of the per-element evaluation. Checked against the
reference arithmetic in tests/emulator/reference (LUT, EW with a register operand, OUT_CVT), with
inputs spread over the whole int32 range and slopes drawn 0 often; and a deliberately wrong
reading (a flat tail assumed where the slope is not 0) is caught."""

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import lut
from npuemu.emulator.kernels.dpu import EwConfig, OutCvtConfig, _cvt_params, _ew_params
from npuemu.emulator.kernels.lut import LutConfig, LutTableConfig
from tests.emulator.reference import arithmetic as ref

_MODES = {nm.ROUND_HALF_EVEN: "half_even", nm.ROUND_HALF_AWAY: "half_away"}


@st.composite
def _table(draw, start: int, select: int) -> LutTableConfig:
    slope = st.sampled_from([0, 0, 0]) | st.integers(-900, 900)
    end = start + ((nm.LUT_ENTRIES - 1) << select) + draw(st.sampled_from([0, -5, 9]))
    return LutTableConfig(start, end, select, draw(slope), draw(st.integers(0, 12)), draw(slope),
                          draw(st.integers(0, 12)))


@st.composite
def cases(draw):
    select = draw(st.integers(0, 6))
    le_start = draw(st.integers(-(2**16), 0))
    lo_start = le_start + draw(st.integers(-(2**12), 2**15))
    config = LutConfig(draw(_table(le_start, select)), draw(_table(lo_start, select)), draw(st.integers(0, 1)),
                       draw(st.integers(0, 1)), draw(st.integers(0, 1)))
    ew = EwConfig(op_enable=draw(st.booleans()), op_type=draw(st.integers(0, 1)),
                  alu_algo=draw(st.sampled_from([nm.ALU_MAX, nm.ALU_MIN, nm.ALU_ADD, nm.ALU_MINUS])),
                  truncate_positive=draw(st.integers(0, 8)), truncate_negative=draw(st.integers(0, 8)),
                  relu=draw(st.booleans()))
    cvt = OutCvtConfig(draw(st.integers(-32768, 32767)), draw(st.integers(0, 24)), draw(st.integers(-128, 127)),
                       draw(st.sampled_from(sorted(_MODES))))
    return config, ew, cvt, draw(st.integers(-3000, 3000)), draw(st.integers(0, 2**31))


def _expected(x: int, le, lo, config: LutConfig, ew: EwConfig, other: int, cvt: OutCvtConfig) -> int:
    tables = {name: (t.start, t.end, t.index_select, t.uflow_scale, t.uflow_shift, t.oflow_scale, t.oflow_shift)
              for name, t in (("le", config.le), ("lo", config.lo))}
    value = ref.lut(x, le, lo, dict(tables, hybrid_priority=config.hybrid_priority,
                                    uflow_priority=config.uflow_priority, oflow_priority=config.oflow_priority))
    ew_cfg = dict(dataclasses.asdict(ew), cvt_round=_MODES[ew.cvt_round])
    value = ref.ew(value, other, ew_cfg)
    return ref.out_cvt(value, cvt.scale, cvt.shift, cvt.offset, _MODES[cvt.round_mode], ref.INT8)


def _looked_up(config, le, lo, ew, cvt, other, xs, flags=None):
    params, ew_params, cvt_params = config.parameters(), _ew_params(ew), _cvt_params(cvt, np.dtype(np.int8))
    base, table = lut.after_lut_values.get(params, le, lo, other, ew_params, cvt_params, np.dtype(np.int8))
    below, above = lut.flat_tails(params, base, table.shape[0]) if flags is None else flags
    out = np.zeros(xs.shape[0], np.int8)
    lut._table_block(xs.astype(np.int64), out, (le, lo, params, table, base), np.int64(other), ew_params,
                     cvt_params, below, above)
    return out, (below, above), (base, table.shape[0])


def _inputs(rng, config: LutConfig) -> np.ndarray:
    low = min(config.le.start, config.lo.start)
    high = max(config.le.end, config.lo.end)
    width = high - low
    near = rng.integers(low - 3 * width, high + 3 * width, 300)
    far = rng.integers(-(2**31), 2**31, 100)
    return np.clip(np.concatenate([near, far, [-(2**31), 2**31 - 1]]), -(2**31), 2**31 - 1)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_table_read_past_its_ends_equals_the_reference(case):
    config, ew, cvt, other, seed = case
    rng = np.random.default_rng(seed)
    le = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    xs = _inputs(rng, config)
    got, _, _ = _looked_up(config, le, lo, ew, cvt, other, xs)
    assert got.tolist() == [_expected(int(x), le, lo, config, ew, other, cvt) for x in xs]


def test_flat_tails_need_zero_slopes_and_a_table_past_the_ends():
    table = LutTableConfig(-16384, 0, 5)
    flat = LutConfig(table, LutTableConfig(0, 16384, 5))
    params = flat.parameters()
    assert lut.flat_tails(params, -49153, 98307) == (True, True)
    assert lut.flat_tails(params, -16384, 32769) == (False, False)  # the table starts at START
    assert lut.flat_tails(params, -49153, 0) == (False, False)  # no table
    sloped = LutConfig(table, LutTableConfig(0, 16384, 5, oflow_scale=3)).parameters()
    assert lut.flat_tails(sloped, -49153, 98307) == (True, False)


def test_a_flat_tail_assumed_under_a_slope_is_caught():
    """The deliberately broken variant: the over side read flat while LO's overflow slope is not 0
    (the flags forced): past the table the reference's values keep changing, the entry does not."""
    config = LutConfig(LutTableConfig(-16384, 0, 5), LutTableConfig(0, 16384, 5, oflow_scale=700, oflow_shift=4),
                       oflow_priority=1)
    le = np.arange(nm.LUT_ENTRIES, dtype=np.int16) * 8
    lo = np.arange(nm.LUT_ENTRIES, dtype=np.int16) * 8
    ew, cvt, xs = EwConfig(), OutCvtConfig(1, 16, 0, nm.ROUND_HALF_EVEN), np.arange(50_000, 200_000, 5003)
    expected = [_expected(int(x), le, lo, config, ew, 0, cvt) for x in xs]
    right, flags, _ = _looked_up(config, le, lo, ew, cvt, 0, xs)
    assert flags == (True, False) and right.tolist() == expected
    wrong, _, _ = _looked_up(config, le, lo, ew, cvt, 0, xs, flags=(True, True))
    assert wrong.tolist() != expected
