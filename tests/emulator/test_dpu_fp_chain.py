"""The fp path's BS -> BN -> EW in one pass (kernels/dpu_fp_chain.py, issue 20) bit for bit:
against a scalar numpy model of NUMERICS.md 4.6 written here, and against the per-stage kernels
it replaces (kernels.dpu bs_stage_fp / bn_stage_fp / ew_stage_fp; every NaN of the result the canonical
0x7FC00000, NUMERICS.md 37)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import EwConfig, XStageConfig, bn_stage_fp, bs_stage_fp, ew_stage_fp
from npuemu.emulator.kernels.dpu_fp_chain import FloatChain
from npuemu.isa.errors import EmulationError

F = np.float32


def alu(algo: int, a, b):
    """The fp32 ALU: max, min, add, div, minus, abs, neg, floor, ceil (NUMERICS.md 4.3 / 4.6)."""
    a, b = F(a), F(b)
    with np.errstate(all="ignore"):
        return [a if a >= b else b, a if a <= b else b, F(a + b), F(a / b), F(a - b), F(abs(a)), F(-a),
                F(np.floor(a)), F(np.ceil(a))][algo]


def relu(v, config):
    if config.relu and v < 0:
        v = F(0)
    if config.relux and v > F(config.relux_value):
        v = F(config.relux_value)
    return v


def x_stage(v, config: XStageConfig, alu_value, mul_value, mul_first: bool):
    scaled = config.mul_enable and not (config.prelu and v >= 0)
    with np.errstate(all="ignore"):
        if mul_first and scaled:
            v = F(v * mul_value)
        if config.alu_enable:
            v = alu(config.alu_algo, v, alu_value)
        if not mul_first and scaled:
            v = F(v * mul_value)
    return relu(v, config)


def ew_stage(v, config: EwConfig, other):
    if config.op_enable:
        if config.op_type == 0:
            v = alu(config.alu_algo, v, other)
        elif not (config.prelu and v >= 0):
            with np.errstate(all="ignore"):
                v = F(v * other)
    return relu(v, config)


def reference(data, stages, ew):
    out = np.empty_like(data)
    for (c, y, x), value in np.ndenumerate(data):
        v = F(value)
        for config, alu_values, mul_values, mul_first in stages:
            v = x_stage(v, config, alu_values[c], mul_values[c], mul_first)
        if ew is not None:
            config, operand = ew
            v = ew_stage(v, config, operand[tuple(i if n > 1 else 0 for i, n in zip((c, y, x), operand.shape))])
        out[c, y, x] = v
    return out


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 65504.0, -2.5, 0.5], np.float32)


def values(rng, shape, special: bool):
    out = (rng.standard_normal(shape) * 8).astype(np.float32)
    if special:
        where = rng.random(shape) < 0.15
        out[where] = rng.choice(SPECIALS, int(where.sum()))
    return out


@st.composite
def x_configs(draw):
    return XStageConfig(alu_enable=draw(st.booleans()), alu_algo=draw(st.integers(0, 8)),
                        mul_enable=draw(st.booleans()), prelu=draw(st.booleans()), relu=draw(st.booleans()),
                        relux=draw(st.booleans()), relux_value=draw(st.floats(-4, 8, width=32)))


@st.composite
def ew_configs(draw):
    return EwConfig(op_enable=draw(st.booleans()), op_type=draw(st.integers(0, 1)), alu_algo=draw(st.integers(0, 8)),
                    prelu=draw(st.booleans()), relu=draw(st.booleans()), relux=draw(st.booleans()),
                    relux_value=draw(st.floats(-4, 8, width=32)))


@settings(max_examples=150, deadline=None)
@given(st.tuples(st.integers(1, 5), st.integers(1, 4), st.integers(1, 6)), st.booleans(),
       st.one_of(st.none(), x_configs()), st.one_of(st.none(), x_configs()), st.one_of(st.none(), ew_configs()),
       st.sampled_from(["scalar", "channel", "pixel", "row"]), st.booleans(), st.integers(0, 2**31))
def test_chain_matches_the_model_and_the_stage_kernels(shape, special, bs, bn, ew, operand_kind, scalar_mul, seed):
    rng = np.random.default_rng(seed)
    channels = shape[0]
    data = values(rng, shape, special)
    operand_shape = {"scalar": (1, 1, 1), "channel": (channels, 1, 1), "pixel": shape,
                     "row": (1, shape[1], 1)}[operand_kind]
    operand = values(rng, operand_shape, special)
    chain, stages, staged = FloatChain(data), [], data
    for config, mul_first in ((bs, False), (bn, True)):
        if config is None:
            continue
        alu_values, mul_values = values(rng, channels, special), values(rng, channels, special)
        mul = mul_values[0] if scalar_mul else mul_values  # a register operand is one value
        chain.x_stage(config, alu=alu_values, mul=mul, mul_first=mul_first)
        stages.append((config, alu_values, np.broadcast_to(np.float32(mul), channels), mul_first))
        staged = (bn_stage_fp if mul_first else bs_stage_fp)(staged, config, alu=alu_values, mul=mul)
    if ew is not None:
        chain.ew(ew, operand)
        staged = ew_stage_fp(staged, ew, operand)
    got = chain.result()
    # the per-stage kernels, every bit - their NaNs made canonical, as the result's (NUMERICS.md 37)
    assert np.array_equal(got.view(np.uint32), canonical_bits(staged))
    expected = reference(data, stages, None if ew is None else (ew, operand))
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))


def canonical_bits(data: np.ndarray) -> np.ndarray:
    """uint32 bits of float32 ``data`` with every NaN the canonical 0x7FC00000."""
    bits = np.array(data, np.float32).view(np.uint32)
    bits[np.isnan(data)] = 0x7FC00000
    return bits


def test_no_stage_hands_back_the_input_and_bad_operands_are_refused():
    data = np.ones((2, 3, 4), np.float32)
    assert FloatChain(data).result() is data
    data[0, 1, 2] = np.array([0xFF812345], np.uint32).view(np.float32)[0]  # (a NaN: a canonical copy instead)
    got = FloatChain(data).result()
    assert got is not data and np.array_equal(got.view(np.uint32), canonical_bits(data))
    chain = FloatChain(data)
    with pytest.raises(EmulationError, match="one value per channel"):
        chain.x_stage(XStageConfig(alu_enable=True), alu=np.zeros(3, np.float32))
    with pytest.raises(EmulationError, match="does not broadcast"):
        chain.ew(EwConfig(op_enable=True), np.zeros((2, 2, 4), np.float32))
    chain.ew(EwConfig(op_enable=True), np.zeros((2, 1, 1), np.float32))
    with pytest.raises(EmulationError, match="before EW"):
        chain.x_stage(XStageConfig())
    with pytest.raises(EmulationError, match=r"\[C\]\[H\]\[W\]"):
        FloatChain(np.zeros((2, 3), np.float32))


def test_relux_values_equal_as_floats_keep_their_bits():
    # ReLUX at -0.0 and at 0.0 clamp a positive value to different bits: settings looked up by value
    # must not hand one the other's (a float key would: -0.0 == 0.0)
    data = np.full((1, 1, 2), 3.0, np.float32)
    for relux in (0.0, -0.0, 0.0):
        chain = FloatChain(data)
        chain.x_stage(XStageConfig(relux=True, relux_value=relux))
        chain.ew(EwConfig(relux=True, relux_value=relux), np.zeros((1, 1, 1), np.float32))
        assert np.signbit(chain.result()).tolist() == [[[np.signbit(relux)] * 2]]
