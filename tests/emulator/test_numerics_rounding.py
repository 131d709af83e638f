"""Every rounding shift of the NPU, at exact .5 ties and at random values (NUMERICS.md 1)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import (
    ConvGeometry, EwConfig, LutConfig, LutTableConfig, OutCvtConfig, PoolConfig, XStageConfig,
    bn_stage, bs_stage, ew_stage, lut_stage, out_cvt, pool_nc1hwc2,
)
from tests.emulator.reference import arithmetic as ref

MODES = {nm.ROUND_HALF_AWAY: "half_away", nm.ROUND_HALF_EVEN: "half_even",
         nm.ROUND_HALF_UP: "half_up", nm.ROUND_FLOOR: "floor"}

# (value, shift) -> expected per mode: half-away, half-even, half-up, floor
TIES = [
    ((5, 1), (3, 2, 3, 2)),
    ((-5, 1), (-3, -2, -2, -3)),
    ((7, 1), (4, 4, 4, 3)),
    ((-7, 1), (-4, -4, -3, -4)),
    ((1, 1), (1, 0, 1, 0)),
    ((-1, 1), (-1, 0, 0, -1)),
    ((3 << 13, 14), (2, 2, 2, 1)),
    ((-(5 << 22), 23), (-3, -2, -2, -3)),
    ((2**40 + 2**39, 40), (2, 2, 2, 1)),
]


@pytest.mark.parametrize("case, expected", TIES)
def test_ties_round_as_documented(case, expected):
    for mode, value in zip((nm.ROUND_HALF_AWAY, nm.ROUND_HALF_EVEN, nm.ROUND_HALF_UP,
                            nm.ROUND_FLOOR), expected):
        assert nm.rshift_round(*case, mode) == value
        assert ref.round_shift(*case, MODES[mode]) == value


@given(st.integers(-(2**61), 2**61), st.integers(0, 80), st.sampled_from(sorted(MODES)))
def test_rshift_round_matches_reference(value, shift, mode):
    assert nm.rshift_round(value, shift, mode) == ref.round_shift(value, shift, MODES[mode])


@given(st.integers(-(2**20), 2**20), st.integers(1, 40), st.sampled_from(sorted(MODES)))
def test_random_ties_match_reference(k, shift, mode):
    tie = (2 * k + 1) << (shift - 1)
    assert nm.rshift_round(tie, shift, mode) == ref.round_shift(tie, shift, MODES[mode])


def test_register_bits_select_the_documented_modes():
    assert nm.out_cvt_round_mode(0) == nm.ROUND_HALF_EVEN
    assert nm.out_cvt_round_mode(1) == nm.ROUND_HALF_AWAY
    assert nm.core_round_mode(0) == nm.ROUND_HALF_AWAY
    assert nm.core_round_mode(1) == nm.ROUND_HALF_EVEN


def cube(*values):
    return np.array(values, np.int32).reshape(1, 1, -1)


def test_core_truncate_ties():
    def core(values, truncate, mode):  # the CORE stage the int8 kernels apply per sum
        return [int(nm.core_output(v, truncate, mode)) for v in values]
    assert core([5, -5, 7, -7], 1, nm.core_round_mode(0)) == [3, -3, 4, -4]
    assert core([5, -5, 7, -7], 1, nm.core_round_mode(1)) == [2, -2, 4, -4]
    assert core([3 << 9], 10, nm.core_round_mode(0)) == [2]


def test_bs_and_bn_multiplier_shift_ties_round_half_away():
    config = XStageConfig(mul_enable=True, shift_positive=1, shift_negative=2)
    # positive products use the positive shift, negative ones the negative shift
    assert bs_stage(cube(5, -5, -6, 3), config, mul=1).ravel().tolist() == [3, -1, -2, 2]
    bn_config = XStageConfig(mul_enable=True, alu_enable=True, alu_algo=nm.ALU_ADD,
                             shift_positive=2, shift_negative=2)
    # (x * 3 + 3) >> 2: x = 1 -> 6/4 = 1.5 -> 2; x = -3 -> -6/4 = -1.5 -> -2
    assert bn_stage(cube(1, -3), bn_config, alu=3, mul=3).ravel().tolist() == [2, -2]


@pytest.mark.parametrize("round_bit, expected", [(0, [2, -2, 4]), (1, [3, -3, 4])])
def test_ew_operand_converter_ties_follow_cvt_round(round_bit, expected):
    config = EwConfig(cvt_enable=True, cvt_offset=1, cvt_scale=1, cvt_shift=1,
                      cvt_round=nm.out_cvt_round_mode(round_bit), op_enable=True,
                      alu_algo=nm.ALU_ADD)
    got = ew_stage(cube(0, 0, 0), config, cube(4, -6, 6))  # (4+1)/2, (-6+1)/2, (6+1)/2
    assert got.ravel().tolist() == expected


def test_ew_multiplier_truncate_ties_round_half_away():
    config = EwConfig(op_enable=True, op_type=nm.EW_OP_MUL, truncate_positive=1,
                      truncate_negative=1)
    assert ew_stage(cube(5, -5, 3), config, cube(1, 1, 3)).ravel().tolist() == [3, -3, 5]


@pytest.mark.parametrize("round_bit, expected", [(0, [2, -2, 4, 0]), (1, [3, -3, 4, 1])])
def test_out_cvt_ties_follow_cvt_round(round_bit, expected):
    config = OutCvtConfig(scale=1, shift=1, offset=0, round_mode=nm.out_cvt_round_mode(round_bit))
    assert out_cvt(cube(5, -5, 7, 1), config, np.int32).ravel().tolist() == expected


def test_lut_interpolation_and_slope_ties_round_half_away():
    table = np.zeros(nm.LUT_ENTRIES, np.int16)
    table[1], table[3] = 1, -1
    table[-1] = 100
    config = LutConfig(le=LutTableConfig(start=0, end=512 * 2, index_select=1, uflow_scale=1,
                                         uflow_shift=1, oflow_scale=3, oflow_shift=1),
                       lo=LutTableConfig(start=5000, end=6000))
    # x=1: halfway 0 -> 1 gives 0.5 -> 1; x=5: halfway 0 -> -1 gives -0.5 -> -1
    # x=-1: T[0] + (-1 * 1) / 2 = -0.5 -> -1; x=1025: T[512] + 3/2 = 101.5 -> 102
    got = lut_stage(cube(1, 5, -1, 1025), config, table, table)
    assert got.ravel().tolist() == [1, -1, -1, 102]


def test_pool_average_ties_round_half_away():
    feature = np.array([1, 1, 0, 0, -1, -1, 0, 0], np.int8).reshape(2, 2, 2, 1)
    config = PoolConfig(method=nm.POOL_AVERAGE, kernel_h=2, kernel_w=2, out_h=1, out_w=1,
                        recip_kernel_w=32768, recip_kernel_h=32768)
    assert pool_nc1hwc2(feature, config).ravel().tolist() == [1, -1]  # +-2/4 -> +-1


def test_geometry_rejects_nonsense():
    from npuemu.isa.errors import EmulationError
    with pytest.raises(EmulationError):
        ConvGeometry(kernel_h=0, kernel_w=1, out_h=1, out_w=1)
