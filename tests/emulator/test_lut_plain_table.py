"""Plain BS + BN into a LUT table flat past both ends (issue 20, kernels/lut.py
``_plain_table_to_atoms``, NUMERICS.md 32) against the reference arithmetic in tests/emulator/reference
(BS, BN, LUT, EW with a register operand, OUT_CVT on Python integers), laid out as NC1HWC2 atoms:
channel counts either side of ``ROW_RUN`` (a flat run per block, or a run per pixel), atoms holding
fewer lanes than the cube's channels, every window-sum layout, CPEND on or off, shifts alike or not
per sign, ReLU / RELUX, inputs reaching far past the table. The general kernel it stands for
(``_lut_table_general``) is run on each case too; a broken variant (BS's negative products shifted as
its positive ones) is caught."""

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels import lut
from npuemu.emulator.kernels.dpu import (
    _OPERAND_MATRICES, EwConfig, OutCvtConfig, XStageConfig, _cvt_params, _ew_params, _x_params,
)
from npuemu.emulator.kernels.lut import LutConfig, LutTableConfig
from tests.emulator.reference import arithmetic as ref

C2 = 16  # int8 atoms of 16 bytes
_MODES = {nm.ROUND_HALF_EVEN: "half_even", nm.ROUND_HALF_AWAY: "half_away"}
_ON = np.array([1, 1, 1], np.int64)


@st.composite
def _stage(draw, bs: bool) -> XStageConfig:
    shift = draw(st.integers(1, 20))
    return XStageConfig(alu_enable=bs, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=shift,
                        shift_negative=draw(st.sampled_from([shift, shift, draw(st.integers(1, 20))])),
                        relu=draw(st.booleans()), relux=draw(st.booleans()),
                        relux_value=draw(st.integers(-5000, 2**31 - 1)), cpend_enable=bs and draw(st.booleans()))


@st.composite
def cases(draw):
    channels = draw(st.sampled_from([1, 7, 16, 24, 32, 40, 63, 64, 72, 96, 130]))
    full = -(-channels // C2)
    surfaces = draw(st.sampled_from(sorted({full, max(1, full - 1), 1})))  # (fewer atoms: channels not computed)
    height, width = draw(st.integers(1, 5)), draw(st.integers(1, 9))
    select = draw(st.integers(0, 6))
    config = LutConfig(LutTableConfig(-(512 << select) + draw(st.integers(0, 9)), draw(st.integers(-3, 3)), select),
                       LutTableConfig(draw(st.integers(-3, 3)), (512 << select) - draw(st.integers(0, 9)), select),
                       draw(st.integers(0, 1)), draw(st.integers(0, 1)), draw(st.integers(0, 1)))
    ew = EwConfig(op_enable=draw(st.booleans()), op_type=draw(st.integers(0, 1)),
                  alu_algo=draw(st.sampled_from([nm.ALU_MAX, nm.ALU_ADD, nm.ALU_MINUS])),
                  truncate_positive=draw(st.integers(0, 8)), truncate_negative=draw(st.integers(0, 8)),
                  relu=draw(st.booleans()))
    cvt = OutCvtConfig(draw(st.integers(-32768, 32767)), draw(st.integers(0, 24)), draw(st.integers(-128, 127)),
                       draw(st.sampled_from(sorted(_MODES))))
    groups = draw(st.sampled_from([g for g in (1, 2, channels) if channels % g == 0]))
    sums_form = draw(st.sampled_from(["group-major", "pixel-major"]))
    return (channels, surfaces, height, width, draw(_stage(True)), draw(_stage(False)), config, ew, cvt, groups,
            sums_form, draw(st.integers(1, 64)), draw(st.integers(-3000, 3000)), draw(st.integers(0, 2**31)))


def _expected(data, sums, operands, bn_mul, tables, case) -> np.ndarray:
    """[C][H][W] int8 of the reference arithmetic."""
    channels, _, height, width, bs, bn, config, ew, cvt, groups, _, _, other, _ = case
    bs_cfg, bn_cfg = dataclasses.asdict(bs), dataclasses.asdict(bn)
    cfg = {name: (t.start, t.end, t.index_select, t.uflow_scale, t.uflow_shift, t.oflow_scale, t.oflow_shift)
           for name, t in (("le", config.le), ("lo", config.lo))}
    cfg.update(hybrid_priority=config.hybrid_priority, uflow_priority=config.uflow_priority,
               oflow_priority=config.oflow_priority)
    ew_cfg = dict(dataclasses.asdict(ew), cvt_round=_MODES[ew.cvt_round])
    le, lo = tables[0].tolist(), tables[1].tolist()
    out = np.zeros((channels, height, width), np.int8)
    for c in range(channels):
        g = c * groups // channels
        for y in range(height):
            for x in range(width):
                value = ref.bs(int(data[c, y, x]), int(sums[g, y, x]), int(operands[0][c]), int(operands[1][c]),
                               int(operands[2][c]), bs_cfg)
                value = ref.lut(ref.bn(value, 0, bn_mul, bn_cfg), le, lo, cfg)
                out[c, y, x] = ref.out_cvt(ref.ew(value, other, ew_cfg), cvt.scale, cvt.shift, cvt.offset,
                                           _MODES[cvt.round_mode], ref.INT8)
    return out


def _run(data, sums, operands, bn_mul, tables, case, general: bool = False):
    """``_lut_table_to_atoms`` as units/dpu_plan.py ``_lut_store`` calls it; the atoms as [S*C2][H][W]."""
    channels, surfaces, height, width, bs, bn, config, ew, cvt, groups, _, rows, other, _ = case
    pixels = height * width
    blocks = np.ascontiguousarray(data.reshape(channels, pixels).T).reshape(1, pixels, channels)
    bs_matrix = _OPERAND_MATRICES.get(channels, tuple(zip(operands, ("ALU", "CPEND", "MUL"))), 3)
    bn_matrix = _OPERAND_MATRICES.get(channels, ((0, "ALU"), (bn_mul, "MUL")), 2)
    flat, layout, per_group = dp._NO_SUMS, dp.SUMS_NONE, 1
    if bs.cpend_enable:
        flat, layout, per_group = dp._window_layout(sums, channels, pixels)
    ew_params, cvt_params, params = _ew_params(ew), _cvt_params(cvt, np.dtype(np.int8)), config.parameters()
    base, table = lut.after_lut_values.get(params, tables[0], tables[1], other, ew_params, cvt_params,
                                           np.dtype(np.int8))
    flags = lut.table_flags(_ON, _x_params(bs), _x_params(bn), params, int(base), table.shape[0])
    assert flags == (True, True, True, True)  # (the fast path's case: zero slopes, a table past both ends)
    target = np.zeros(surfaces * pixels * 2, np.uint64)
    lut._lut_table_to_atoms(blocks, flat, layout, per_group, _ON, _x_params(bs), bs_matrix, _x_params(bn), bn_matrix,
                            np.int64(other), ew_params, cvt_params, (tables[0], tables[1], params, table, base),
                            channels, surfaces, width, np.zeros((rows, surfaces * C2), np.int8),
                            np.arange(surfaces * height, dtype=np.int64) * width * 2, target,
                            (*flags[:3], False) if general else flags)
    atoms = target.view(np.int8).reshape(surfaces, height, width, C2)
    return atoms.transpose(0, 3, 1, 2).reshape(surfaces * C2, height, width)


def _inputs(case):
    channels, _, height, width, _, _, _, _, _, groups, sums_form, _, _, seed = case
    rng = np.random.default_rng(seed)
    data = rng.integers(-(2**20), 2**20, (channels, height, width)).astype(np.int32)
    data.reshape(-1)[:2] = (-(2**31), 2**31 - 1)[:data.size]  # (int32's ends)
    sums = rng.integers(-3000, 3000, (groups, height, width))
    if sums_form == "pixel-major" and groups > 1:  # (a [P][G] buffer seen as [G][H][W], as the depthwise CORE's)
        sums = np.ascontiguousarray(sums.reshape(groups, -1).T).T.reshape(groups, height, width)
    operands = (rng.integers(-(2**18), 2**18, channels), rng.integers(-300, 300, channels),
                rng.integers(-(2**15), 2**15, channels))
    tables = rng.integers(-32768, 32768, (2, nm.LUT_ENTRIES)).astype(np.int16)
    return data, sums, operands, int(rng.integers(-(2**15), 2**15)), tables


@settings(max_examples=60, deadline=None)
@given(cases())
def test_plain_table_kernel_equals_the_reference(case):
    data, sums, operands, bn_mul, tables = _inputs(case)
    channels, surfaces = case[0], case[1]
    want = _expected(data, sums, operands, bn_mul, tables, case)
    computed = min(channels, surfaces * C2)
    for general in (False, True):
        got = _run(data, sums, operands, bn_mul, tables, case, general)
        np.testing.assert_array_equal(got[:computed], want[:computed])
        assert not got[computed:].any()  # lanes past the computed channels: 0


def test_both_runs_are_taken():
    """A case of each form (a flat run per block below ROW_RUN channels, with the cube read in place
    and with its lanes copied out; a run per pixel from ROW_RUN on and where the atoms have lanes
    past the channels) against the reference."""
    bs = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=14, shift_negative=14,
                      cpend_enable=True)
    bn = XStageConfig(mul_enable=True, shift_positive=13, shift_negative=12, relu=True)
    config = LutConfig(LutTableConfig(-16384, 0, 5), LutTableConfig(0, 16384, 5))
    for channels, surfaces, groups in ((32, 2, 1), (64, 2, 64), (64, 4, 1), (40, 3, 40), (96, 6, 2)):
        case = (channels, surfaces, 3, 7, bs, bn, config, EwConfig(), OutCvtConfig(1, 0, 0, nm.ROUND_HALF_EVEN),
                groups, "pixel-major", 4, 0, channels)
        data, sums, operands, bn_mul, tables = _inputs(case)
        computed = min(channels, surfaces * C2)
        got = _run(data, sums, operands, bn_mul, tables, case)
        np.testing.assert_array_equal(got[:computed], _expected(data, sums, operands, bn_mul, tables, case)[:computed])


def test_a_wrong_shift_select_is_caught(monkeypatch):
    """The broken variant: BS's negative products shifted as its positive ones (the one-shift loop
    taken where the shifts differ) - the reference comparison fails."""
    bs = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=14, shift_negative=3)
    bn = XStageConfig(mul_enable=True, shift_positive=13, shift_negative=13)
    config = LutConfig(LutTableConfig(-16384, 0, 5), LutTableConfig(0, 16384, 5))
    case = (16, 1, 2, 4, bs, bn, config, EwConfig(), OutCvtConfig(1, 0, 0, nm.ROUND_HALF_EVEN), 1, "group-major", 8,
            0, 3)
    data, sums, operands, bn_mul, tables = _inputs(case)
    want = _expected(data, sums, operands, bn_mul, tables, case)
    assert np.array_equal(_run(data, sums, operands, bn_mul, tables, case)[:16], want)
    original = lut._plain_table_to_atoms.py_func

    def one_shift(data, sums, layout, per_group, bs, *rest):
        bs = bs.copy()
        bs[lut.kd.XP_SHIFT_NEG] = bs[lut.kd.XP_SHIFT_POS]
        original(data, sums, layout, per_group, bs, *rest)

    monkeypatch.setattr(lut, "_plain_table_to_atoms", one_shift)
    assert not np.array_equal(_run(data, sums, operands, bn_mul, tables, case)[:16], want)
