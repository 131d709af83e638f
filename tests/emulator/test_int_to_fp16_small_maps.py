"""``int_atoms_to_planes`` on maps of under 16 pixels (session 22: pixel by pixel across the channels, the
stages' operands one a channel) against the unit path: ``kernels.dpu.int_stages`` on the cube moved out of
its atoms here, then ``dpu_convert.int_to_fp16``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu
from npuemu.emulator.kernels.dpu_convert import int_to_fp16
from npuemu.emulator.kernels.dpu_int_to_fp16_step import int_atoms_to_planes
from npuemu.emulator.kernels.fp16 import fp32_to_fp16
from npuemu.emulator.numerics import ROUND_HALF_AWAY, out_cvt_round_mode


@st.composite
def _stage(draw):
    return dpu.XStageConfig(alu_enable=draw(st.booleans()), alu_algo=draw(st.sampled_from([nm.ALU_ADD, nm.ALU_MAX])),
                            mul_enable=draw(st.booleans()), shift_positive=draw(st.integers(0, 12)),
                            relu=draw(st.booleans()))


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 40), st.integers(1, 3), st.integers(1, 5), st.sampled_from([8, 16]), _stage(), _stage(),
       st.booleans(), st.sampled_from(["tensor", "channel", "pixel"]), st.integers(1, 2**15 - 1),
       st.integers(0, 8), st.integers(0, 1), st.integers(0, 20), st.integers(0, 2**32 - 1))
def test_small_maps_match_the_unit_stages(channels, height, width, lanes, bs, bn, ew_on, operand_kind, scale, shift,
                                          round_bit, minus_exp, seed):
    rng = np.random.default_rng(seed)
    surfaces, pixels = -(-channels // lanes), height * width
    # the atoms: row r (surface r // H, line r % H) at a random gap after the one before
    offsets = np.cumsum(width * lanes + lanes * rng.integers(0, 2, surfaces * height)) - width * lanes
    region = rng.integers(-128, 128, int(offsets[-1]) + width * lanes, dtype=np.int8)
    cube = np.empty((channels, height, width), np.int32)
    for c in range(channels):
        for y in range(height):
            row = offsets[(c // lanes) * height + y]
            cube[c, y] = region[row + np.arange(width) * lanes + c % lanes]
    bs_alu, bs_mul = rng.integers(-300, 300, channels), rng.integers(-300, 300, channels)
    bn_alu, bn_mul = rng.integers(-300, 300, channels), rng.integers(-300, 300, channels)
    ew = dpu.EwConfig(op_enable=True, op_type=nm.EW_OP_ALU, alu_algo=nm.ALU_ADD, relu=True) if ew_on else None
    operand_shape = {"tensor": (1, 1, 1), "channel": (channels, 1, 1), "pixel": (channels, height, width)}
    ew_operand = rng.integers(-1000, 1000, operand_shape[operand_kind]).astype(np.int32)
    stages = dpu.int_stages(cube, bs=bs, bs_alu=bs_alu, bs_mul=bs_mul, bn=bn, bn_alu=bn_alu, bn_mul=bn_mul,
                            ew=ew, ew_operand=ew_operand if ew_on else None)
    want = int_to_fp16(stages, scale, shift, round_bit, minus_exp)
    out = np.empty((channels, pixels), np.float32)
    bs_operands = np.stack([bs_alu, np.zeros(channels, np.int64), bs_mul]).astype(np.int64)
    bn_operands = np.stack([bn_alu, bn_mul]).astype(np.int64)
    operand = dpu._operand_planes(ew_operand, cube.shape) if ew_on else dpu._zero_row(pixels, np.int32)
    int_atoms_to_planes(region, offsets.astype(np.int64), height, lanes, dpu._x_params(bs), bs_operands,
                        dpu._x_params(bn), bn_operands, operand, dpu._ew_params(ew) if ew_on else None, np.int64(scale),
                        shift, out_cvt_round_mode(round_bit) == ROUND_HALF_AWAY, np.float32(2.0 ** -minus_exp),
                        bool(minus_exp), out)
    assert np.array_equal(fp32_to_fp16(out).view(np.uint16), want.reshape(channels, pixels).view(np.uint16))
