"""DPU stages BS, BN, EW, OUT_CVT against the per-element reference (NUMERICS.md 4)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import (
    EwConfig, OutCvtConfig, XStageConfig, bn_stage, bn_stage_fp, bs_stage, bs_stage_fp,
    ew_stage, ew_stage_fp, out_cvt, out_cvt_fp16,
)
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import arithmetic as ref

MODE_NAMES = {nm.ROUND_HALF_AWAY: "half_away", nm.ROUND_HALF_EVEN: "half_even"}
INT32 = st.integers(-(2**31), 2**31 - 1)
INT16 = st.integers(-(2**15), 2**15 - 1)


@st.composite
def cubes(draw, max_channels=6):
    shape = (draw(st.integers(1, max_channels)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude = draw(st.sampled_from([2**7, 2**15, 2**24, 2**31]))
    values = rng.integers(-magnitude, magnitude, shape)
    return np.clip(values, -(2**31), 2**31 - 1).astype(np.int32), rng


@st.composite
def x_stage_configs(draw):
    return XStageConfig(
        alu_enable=draw(st.booleans()), alu_algo=draw(st.integers(0, 8)),
        mul_enable=draw(st.booleans()), shift_positive=draw(st.integers(0, 40)),
        shift_negative=draw(st.integers(0, 40)), prelu=draw(st.booleans()),
        relu=draw(st.booleans()), relux=draw(st.booleans()), relux_value=draw(INT32),
        cpend_enable=draw(st.booleans()))


def as_dict(config) -> dict:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


@given(cubes(), x_stage_configs(), st.integers(1, 3))
def test_bs_stage_matches_reference(cube, config, groups):
    data, rng = cube
    channels = data.shape[0]
    groups = groups if channels % groups == 0 else 1
    alu = rng.integers(-(2**31), 2**31, channels)
    cpend = rng.integers(-(2**15), 2**15, channels)
    mul = rng.integers(-(2**15), 2**15, channels)
    sums = rng.integers(-(2**20), 2**20, (groups,) + data.shape[1:])
    got = bs_stage(data, config, alu=alu, mul=mul, cpend=cpend, window_sum=sums)
    per_group = channels // groups
    cfg = as_dict(config)
    for (c, y, x), value in np.ndenumerate(data):
        expected = ref.bs(int(value), int(sums[c // per_group, y, x]), int(alu[c]), int(cpend[c]),
                          int(mul[c]), cfg)
        assert got[c, y, x] == expected


@given(cubes(), x_stage_configs())
def test_bn_stage_matches_reference(cube, config):
    data, rng = cube
    alu, mul = int(rng.integers(-(2**31), 2**31)), int(rng.integers(-(2**15), 2**15))
    got = bn_stage(data, config, alu=alu, mul=mul)  # register operands: one value for all
    cfg = as_dict(config)
    for index, value in np.ndenumerate(data):
        assert got[index] == ref.bn(int(value), alu, mul, cfg)


@st.composite
def ew_configs(draw):
    return EwConfig(
        cvt_enable=draw(st.booleans()), cvt_offset=draw(INT32), cvt_scale=draw(INT16),
        cvt_shift=draw(st.integers(0, 40)),
        cvt_round=draw(st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])),
        op_enable=draw(st.booleans()), op_type=draw(st.sampled_from([nm.EW_OP_ALU, nm.EW_OP_MUL])),
        alu_algo=draw(st.integers(0, 8)), truncate_positive=draw(st.integers(0, 40)),
        truncate_negative=draw(st.integers(0, 40)), prelu=draw(st.booleans()),
        relu=draw(st.booleans()), relux=draw(st.booleans()), relux_value=draw(INT32))


@given(cubes(), ew_configs(), st.sampled_from(["pixel", "channel", "tensor"]))
def test_ew_stage_matches_reference(cube, config, source):
    data, rng = cube
    shape = {"pixel": data.shape, "channel": (data.shape[0], 1, 1), "tensor": (1, 1, 1)}[source]
    operand = rng.integers(-(2**31), 2**31, shape).astype(np.int32)
    got = ew_stage(data, config, operand)
    cfg = as_dict(config)
    cfg["cvt_round"] = MODE_NAMES[config.cvt_round]
    wide = np.broadcast_to(operand, data.shape)
    for index, value in np.ndenumerate(data):
        assert got[index] == ref.ew(int(value), int(wide[index]), cfg)


@given(cubes(), INT16, st.integers(0, 70), INT32,
       st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY]),
       st.sampled_from([np.int8, np.int16, np.int32]))
def test_out_cvt_matches_reference(cube, scale, shift, offset, mode, dtype):
    data, _ = cube
    got = out_cvt(data, OutCvtConfig(scale, shift, offset, mode), dtype)
    assert got.dtype == dtype
    bounds = (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    expected = [ref.out_cvt(int(v), scale, shift, offset, MODE_NAMES[mode], bounds)
                for v in data.ravel()]
    assert got.ravel().tolist() == expected


def test_bs_with_cpend_removes_the_weight_zero_point():
    # acc = sum(w_q * x), CPEND = -zp_w, window sum = sum(x): BS gives sum((w_q - zp_w) * x)
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, 27)
    w = rng.integers(-128, 128, 27)
    zp_w = 9
    acc = np.array(int(np.dot(w, x)), np.int32).reshape(1, 1, 1)
    config = XStageConfig(cpend_enable=True)
    got = bs_stage(acc, config, cpend=[-zp_w], window_sum=np.array(x.sum()).reshape(1, 1, 1))
    assert got[0, 0, 0] == int(np.dot(w - zp_w, x))


# ---------------------------------------------------------------------------------------------
# fp32 pipeline
# ---------------------------------------------------------------------------------------------
def reference_alu_float(algo, a, b):
    a, b = np.float32(a), np.float32(b)
    with np.errstate(all="ignore"):
        return np.float32([max(a, b) if a >= b else b, a if a <= b else b, a + b, a / b, a - b,
                           abs(a), -a, np.floor(a), np.ceil(a)][algo])


@given(st.integers(0, 2**32 - 1), x_stage_configs(), st.booleans())
def test_fp_x_stages_follow_the_integer_order_in_fp32(seed, config, is_bn):
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal((3, 2, 4)) * 8).astype(np.float32)
    alu = (rng.standard_normal(3) * 4).astype(np.float32)
    mul = rng.standard_normal(3).astype(np.float32)
    got = (bn_stage_fp if is_bn else bs_stage_fp)(data, config, alu=alu, mul=mul)
    for (c, y, x), value in np.ndenumerate(data):
        v = np.float32(value)
        scaled = config.mul_enable and not (config.prelu and v >= 0)
        if is_bn and scaled:
            v = np.float32(v * mul[c])
        if config.alu_enable:
            v = reference_alu_float(config.alu_algo, v, alu[c])
        if not is_bn and scaled:
            v = np.float32(v * mul[c])
        if config.relu and v < 0:
            v = np.float32(0)
        if config.relux and v > np.float32(config.relux_value):
            v = np.float32(config.relux_value)
        assert np.array_equal(got[c, y, x], v, equal_nan=True)


@given(st.integers(0, 2**32 - 1), ew_configs())
def test_fp_ew_stage(seed, config):
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal((2, 3, 3)) * 8).astype(np.float32)
    operand = (rng.standard_normal((2, 3, 3)) * 8).astype(np.float32)
    got = ew_stage_fp(data, config, operand)
    for index, value in np.ndenumerate(data):
        v, e = np.float32(value), operand[index]
        if config.op_enable:
            if config.op_type == nm.EW_OP_ALU:
                v = reference_alu_float(config.alu_algo, v, e)
            elif not (config.prelu and v >= 0):
                v = np.float32(v * e)
        if config.relu and v < 0:
            v = np.float32(0)
        if config.relux and v > np.float32(config.relux_value):
            v = np.float32(config.relux_value)
        assert np.array_equal(got[index], v, equal_nan=True)


def test_fp16_output_rounds_to_nearest_even():
    values = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 70000.0, -2.0**-25], np.float32)
    assert out_cvt_fp16(values).astype(np.float64).tolist() == [1.0, 1 + 2.0**-9, np.inf, -0.0]


def test_stage_configuration_errors():
    with pytest.raises(EmulationError, match="ALU_ALGO 9"):
        XStageConfig(alu_algo=9)
    with pytest.raises(EmulationError, match="OP_TYPE"):
        EwConfig(op_type=2)
    cube = np.zeros((2, 2, 2), np.int32)
    with pytest.raises(EmulationError, match="window sums"):
        bs_stage(cube, XStageConfig(cpend_enable=True))
    with pytest.raises(EmulationError, match="one value per channel"):
        bs_stage(cube, XStageConfig(), alu=[1, 2, 3])
    with pytest.raises(EmulationError, match="broadcast"):
        ew_stage(cube, EwConfig(), np.zeros((3, 1, 1)))
    with pytest.raises(EmulationError, match="int8, int16 or int32"):
        out_cvt(cube, OutCvtConfig(), np.uint8)
