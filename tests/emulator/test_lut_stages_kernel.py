"""The fused LUT kernels of the task programs (issue 20, kernels/lut.py ``_lut_stages_to_atoms`` and
``_lut_table_to_atoms``, called as units/dpu_plan.py ``_lut_store`` calls them) against the full
path they stand for (units/dpu.py ``_run_integer`` with the LUT on): ``int_stages`` (BS, BN) on the
[C][H][W] cube, ``lut_stage``, ``int_stages`` (EW, OUT_CVT), the result laid out as NC1HWC2 atoms.
Random stage settings (every ALU algorithm, PReLU, ReLU / RELUX, CPEND with shared or per-group
window sums, EW ALU or MUL with a per-pixel or register operand), random LUT tables and settings."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels import lut
from npuemu.emulator.kernels.dpu import (
    _OPERAND_MATRICES, EwConfig, OutCvtConfig, XStageConfig, _cvt_params, _ew_params, _x_params, int_stages,
)
from npuemu.emulator.kernels.dpu_pixel_plan import _operand as pixel_operand
from npuemu.emulator.kernels.lut import LutConfig, LutTableConfig, lut_stage

C2 = 16  # int8 atoms of 16 bytes


@st.composite
def x_stages(draw, cpend: bool) -> XStageConfig:
    shift = draw(st.integers(0, 20))
    return XStageConfig(alu_enable=draw(st.booleans()), alu_algo=draw(st.integers(0, 8)),
                        mul_enable=draw(st.booleans()), shift_positive=shift,
                        shift_negative=draw(st.sampled_from([shift, draw(st.integers(0, 20))])),
                        prelu=draw(st.booleans()), relu=draw(st.booleans()), relux=draw(st.booleans()),
                        relux_value=draw(st.integers(-5000, 20000)), cpend_enable=cpend)


@st.composite
def cases(draw):
    channels, height, width = draw(st.integers(1, 40)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31))
    bs = draw(st.none() | x_stages(cpend=draw(st.booleans())))
    bn = draw(st.none() | x_stages(cpend=False))
    ew = EwConfig(cvt_enable=draw(st.booleans()), cvt_offset=draw(st.integers(-100, 100)),
                  cvt_scale=draw(st.integers(-3000, 3000)), cvt_shift=draw(st.integers(0, 12)),
                  cvt_round=draw(st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])),
                  op_enable=draw(st.booleans()), op_type=draw(st.integers(0, 1)), alu_algo=draw(st.integers(0, 8)),
                  truncate_positive=draw(st.integers(0, 8)), truncate_negative=draw(st.integers(0, 8)),
                  prelu=draw(st.booleans()), relu=draw(st.booleans()), relux=draw(st.booleans()),
                  relux_value=draw(st.integers(-200, 3000)))
    cvt = OutCvtConfig(draw(st.integers(-32768, 32767)), draw(st.integers(0, 24)), draw(st.integers(-128, 127)),
                       draw(st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])))
    select = draw(st.integers(0, 7))
    lut_config = LutConfig(
        le=LutTableConfig(-(512 << select), draw(st.integers(-3, 3)), select, draw(st.integers(-900, 900)),
                          draw(st.integers(0, 10)), draw(st.integers(-900, 900)), draw(st.integers(0, 10))),
        lo=LutTableConfig(draw(st.integers(-3, 3)), 512 << select, select, draw(st.integers(-900, 900)),
                          draw(st.integers(0, 10)), draw(st.integers(-900, 900)), draw(st.integers(0, 10))),
        hybrid_priority=draw(st.integers(0, 1)), uflow_priority=draw(st.integers(0, 1)),
        oflow_priority=draw(st.integers(0, 1)))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, channels) if channels % g == 0]))
    return channels, height, width, seed, bs, bn, ew, cvt, lut_config, groups, draw(st.booleans())


def _full_path(data, sums, operands, bn_operands, operand, bs, bn, ew, cvt, lut_config, tables):
    """_run_integer's LUT branch on the [C][H][W] cube."""
    pre = {}
    if bs is not None:
        pre = dict(bs=bs, bs_alu=operands[0], bs_cpend=operands[1], bs_mul=operands[2], window_sum=sums)
    if bn is not None:
        pre.update(bn=bn, bn_alu=bn_operands[0], bn_mul=bn_operands[1])
    looked = lut_stage(int_stages(data, **pre), lut_config, tables[0], tables[1])
    return int_stages(looked, ew=ew, ew_operand=operand, cvt=cvt, out_dtype=np.int8)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_fused_lut_kernels_equal_the_full_path(case):
    channels, height, width, seed, bs, bn, ew, cvt, lut_config, groups, per_pixel = case
    rng = np.random.default_rng(seed)
    pixels, surfaces = height * width, -(-channels // C2)
    data = rng.integers(-(2**20), 2**20, (channels, height, width)).astype(np.int32)
    sums = rng.integers(-3000, 3000, (groups, height, width)).astype(np.int64)
    operands = (rng.integers(-(2**18), 2**18, channels).astype(np.int32), rng.integers(-300, 300, channels).astype(
        np.int32), rng.integers(-(2**15), 2**15, channels).astype(np.int32))
    bn_operands = (int(rng.integers(-(2**20), 2**20)), int(rng.integers(-(2**15), 2**15)))
    tables = rng.integers(-32768, 32768, (2, 513)).astype(np.int16)
    operand = rng.integers(-128, 128, (channels, height, width)).astype(np.int32) if per_pixel \
        else np.array(int(rng.integers(-3000, 3000)), np.int32).reshape(1, 1, 1)
    want = _full_path(data, sums, operands, bn_operands, operand, bs, bn, ew, cvt, lut_config, tables)

    blocks = np.ascontiguousarray(data.reshape(channels, pixels).T).reshape(1, pixels, channels)
    bs_matrix = _OPERAND_MATRICES.get(channels, () if bs is None else tuple(
        (value, name) for value, name in zip(operands, ("ALU", "CPEND", "MUL"))), 3)
    bn_matrix = _OPERAND_MATRICES.get(channels, () if bn is None else tuple(
        (value, name) for value, name in zip(bn_operands, ("ALU", "MUL"))), 2)
    flat, layout, per_group = dp._NO_SUMS, dp.SUMS_NONE, 1
    if bs is not None and bs.cpend_enable:
        flat, layout, per_group = dp._window_layout(sums, channels, pixels)
    stage = (dp._stage_flags(bs is not None, bn is not None, True), _x_params(bs or dp._BYPASSED), bs_matrix,
             _x_params(bn or dp._BYPASSED), bn_matrix)
    ew_params, cvt_params = _ew_params(ew), _cvt_params(cvt, np.dtype(np.int8))
    params = lut_config.parameters()
    offsets = (np.arange(surfaces * height, dtype=np.int64) * width * 2)
    per_block = max(1, dp.BLOCK_ELEMENTS // channels)
    rows = max(per_block, dp.GATHER_PIXELS) if layout == dp.SUMS_GROUP_MAJOR else per_block
    runs = []
    if not per_pixel:  # the one-table form
        base, table = lut.after_lut_values.get(params, tables[0], tables[1], int(operand[0, 0, 0]), ew_params,
                                               cvt_params, np.dtype(np.int8))
        target = np.zeros(surfaces * pixels * 2, np.uint64)
        lut._lut_table_to_atoms(blocks, flat, layout, per_group, *stage, np.int64(operand[0, 0, 0]), ew_params,
                                cvt_params, (tables[0], tables[1], params, table, base), channels, surfaces, width,
                                np.zeros((rows, surfaces * C2), np.int8), offsets, target)
        runs.append(target)
    base, dense = lut.dense_values.get(params, tables[0], tables[1], build=True)
    ew_blocks = operand if not per_pixel else np.ascontiguousarray(
        operand.reshape(channels, pixels).T).reshape(1, pixels, channels)
    target = np.zeros(surfaces * pixels * 2, np.uint64)
    lut._lut_stages_to_atoms(blocks, flat, layout, per_group, *stage, pixel_operand(ew_blocks, channels, pixels),
                             ew_params, cvt_params, (tables[0], tables[1], params, dense, base), channels, surfaces,
                             width, np.zeros((rows, surfaces * C2), np.int8), offsets, target)
    runs.append(target)
    for target in runs:
        atoms = target.view(np.int8).reshape(surfaces, height, width, C2)
        cube = atoms.transpose(0, 3, 1, 2).reshape(surfaces * C2, height, width)
        np.testing.assert_array_equal(cube[:channels], want)
        assert not cube[channels:].any()  # lanes past the channels: 0
