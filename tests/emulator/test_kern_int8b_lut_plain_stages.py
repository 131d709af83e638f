"""BS then BN in one loop for their common settings (issue 20, kernels/lut.py ``_bs_bn_plain`` and
``plain_bs_bn``, NUMERICS.md 31) against the reference arithmetic in tests/emulator/reference:
BS ALU add with CPEND on or off, MUL on, BN MUL on, ReLU / RELUX either, shifts over 1..62 with
operands up to int32's ends; the settings it does not stand for are refused; a broken variant
(the shifts of BN's negative products used for BS's) is caught."""

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import lut
from npuemu.emulator.kernels.dpu import XStageConfig, _x_params
from tests.emulator.reference import arithmetic as ref

_ON = np.array([1, 1, 0], np.int64)


@st.composite
def _stage(draw, bs: bool) -> XStageConfig:
    return XStageConfig(alu_enable=bs, alu_algo=nm.ALU_ADD, mul_enable=True,
                        shift_positive=draw(st.integers(1, 62)), shift_negative=draw(st.integers(1, 62)),
                        relu=draw(st.booleans()), relux=draw(st.booleans()),
                        relux_value=draw(st.integers(-5000, 2**31 - 1)), cpend_enable=bs and draw(st.booleans()))


def _run(bs, bn, data, window, alu, cpend, mul, bn_mul, kernel=None):
    block = data.astype(np.int64)
    (kernel or lut._bs_bn_plain)(block, window.astype(np.int64), alu.astype(np.int64), cpend.astype(np.int64),
                                 mul.astype(np.int64), _x_params(bs), bn_mul.astype(np.int64), _x_params(bn))
    return block


def _expected(bs, bn, data, window, alu, cpend, mul, bn_mul):
    bs_cfg, bn_cfg = dataclasses.asdict(bs), dataclasses.asdict(bn)
    return [ref.bn(ref.bs(int(d), int(w), int(a), int(c), int(m), bs_cfg), 0, int(b), bn_cfg)
            for d, w, a, c, m, b in zip(data, window, alu, cpend, mul, bn_mul)]


@settings(max_examples=80, deadline=None)
@given(_stage(True), _stage(False), st.integers(0, 2**32 - 1), st.sampled_from([2**8, 2**20, 2**31]))
def test_plain_stages_equal_the_reference(bs, bn, seed, reach):
    rng = np.random.default_rng(seed)
    n = 300
    data = rng.integers(-reach, reach, n)
    window = rng.integers(-(2**15), 2**15, n)
    alu, cpend = rng.integers(-(2**31), 2**31, n), rng.integers(-(2**15), 2**15, n)
    mul, bn_mul = rng.integers(-(2**15), 2**15, n), rng.integers(-(2**15), 2**15, n)
    assert lut.plain_bs_bn(_ON, _x_params(bs), _x_params(bn))
    got = _run(bs, bn, data, window, alu, cpend, mul, bn_mul)
    assert got.tolist() == _expected(bs, bn, data, window, alu, cpend, mul, bn_mul)


def test_other_settings_are_refused():
    bs, bn = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=14,
                          shift_negative=14), XStageConfig(mul_enable=True, shift_positive=13, shift_negative=13)
    assert lut.plain_bs_bn(_ON, _x_params(bs), _x_params(bn))
    for changed in (dict(alu_algo=nm.ALU_MAX), dict(prelu=True), dict(mul_enable=False), dict(shift_positive=0),
                    dict(shift_negative=63), dict(alu_enable=False)):
        assert not lut.plain_bs_bn(_ON, _x_params(dataclasses.replace(bs, **changed)), _x_params(bn))
    for changed in (dict(alu_enable=True), dict(prelu=True), dict(mul_enable=False), dict(shift_positive=0)):
        assert not lut.plain_bs_bn(_ON, _x_params(bs), _x_params(dataclasses.replace(bn, **changed)))
    assert not lut.plain_bs_bn(np.array([1, 0, 0], np.int64), _x_params(bs), _x_params(bn))


def test_a_broken_variant_is_caught():
    bs = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=14, shift_negative=3)
    bn = XStageConfig(mul_enable=True, shift_positive=13, shift_negative=13)
    rng = np.random.default_rng(5)
    args = [rng.integers(-(2**20), 2**20, 200), np.zeros(200, np.int64), rng.integers(-999, 999, 200),
            np.zeros(200, np.int64), rng.integers(1, 2**15, 200), rng.integers(1, 2**15, 200)]
    assert _run(bs, bn, *args).tolist() == _expected(bs, bn, *args)
    swapped = dataclasses.replace(bs, shift_negative=bs.shift_positive)  # the negative products' shift lost
    assert _run(swapped, bn, *args).tolist() != _expected(bs, bn, *args)
