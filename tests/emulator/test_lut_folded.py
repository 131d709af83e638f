"""BN folded into the LUT + EW + OUT_CVT table (issue 20, kernels/lut_folded.py, NUMERICS.md 41)
against the reference arithmetic in tests/emulator/reference (BS, BN, LUT, EW with a register
operand, OUT_CVT on Python integers):

- the folded table itself: every BS result in and well past its span (clamped into it) reads the
  reference's BN -> LUT -> EW -> OUT_CVT value, for BN MUL of either sign, shifts alike or not per
  sign, ReLU / RELUX on BN and on BS (the BS range the span lies in);
- ``folded_to_atoms`` on whole cubes (the cases of tests/emulator/test_lut_plain_table.py: channel
  counts either side of 16 and ROW_RUN, atoms with fewer lanes than channels, every window-sum
  layout, CPEND on or off, inputs reaching int32's ends) laid out as NC1HWC2 atoms, lanes past the
  computed channels 0;
- the settings it refuses; a broken variant (a span one entry short at each end) is caught."""

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels import lut, lut_folded
from npuemu.emulator.kernels.dpu import (
    _OPERAND_MATRICES, EwConfig, OutCvtConfig, XStageConfig, _cvt_params, _ew_params, _x_params,
)
from npuemu.emulator.kernels.lut import LutConfig, LutTableConfig
from tests.emulator.reference import arithmetic as ref
from tests.emulator.test_lut_plain_table import C2, _expected, _inputs, cases

_MODES = {nm.ROUND_HALF_EVEN: "half_even", nm.ROUND_HALF_AWAY: "half_away"}
_ON = np.array([1, 1, 1], np.int64)


def _reference_after_bs(y, bn, bn_mul, config, tables, ew, other, cvt) -> int:
    """BN -> LUT -> EW -> OUT_CVT of one BS result (int8 out), on Python integers."""
    cfg = {name: (t.start, t.end, t.index_select, t.uflow_scale, t.uflow_shift, t.oflow_scale, t.oflow_shift)
           for name, t in (("le", config.le), ("lo", config.lo))}
    cfg.update(hybrid_priority=config.hybrid_priority, uflow_priority=config.uflow_priority,
               oflow_priority=config.oflow_priority)
    value = ref.lut(ref.bn(y, 0, bn_mul, dataclasses.asdict(bn)), tables[0].tolist(), tables[1].tolist(), cfg)
    value = ref.ew(value, other, dict(dataclasses.asdict(ew), cvt_round=_MODES[ew.cvt_round]))
    return ref.out_cvt(value, cvt.scale, cvt.shift, cvt.offset, _MODES[cvt.round_mode], ref.INT8)


def _after_lut(config, tables, ew, other, cvt):
    params = config.parameters()
    return lut.after_lut_values.get(params, tables[0], tables[1], other, _ew_params(ew),
                                    _cvt_params(cvt, np.dtype(np.int8)), np.dtype(np.int8))


@st.composite
def _bn(draw) -> XStageConfig:
    shift = draw(st.integers(1, 24))
    return XStageConfig(mul_enable=True, shift_positive=shift,
                        shift_negative=draw(st.sampled_from([shift, draw(st.integers(1, 24))])),
                        relu=draw(st.booleans()), relux=draw(st.booleans()),
                        relux_value=draw(st.integers(-5000, 2**31 - 1)))


@settings(max_examples=60, deadline=None)
@given(_bn(), st.integers(-(2**15), 2**15 - 1), st.integers(0, 6), st.booleans(), st.integers(-3000, 3000),
       st.integers(0, 2**32 - 1))
def test_folded_table_reads_the_reference_in_and_past_its_span(bn, bn_mul, select, bs_relu, other, seed):
    rng = np.random.default_rng(seed)
    config = LutConfig(LutTableConfig(-(512 << select), 0, select), LutTableConfig(0, 512 << select, select),
                       int(rng.integers(0, 2)), int(rng.integers(0, 2)), int(rng.integers(0, 2)))
    tables = rng.integers(-32768, 32768, (2, nm.LUT_ENTRIES)).astype(np.int16)
    ew = EwConfig(op_enable=True, alu_algo=nm.ALU_ADD, truncate_positive=int(rng.integers(0, 8)))
    cvt = OutCvtConfig(int(rng.integers(1, 300)), int(rng.integers(0, 16)), int(rng.integers(-20, 20)),
                       nm.ROUND_HALF_EVEN)
    base, table = _after_lut(config, tables, ew, other, cvt)
    bs = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=8, shift_negative=8,
                      relu=bs_relu)
    matrix = _OPERAND_MATRICES.get(8, ((0, "ALU"), (bn_mul, "MUL")), 2)
    folded = lut_folded.fold_tables.get(_x_params(bs), _x_params(bn), matrix, 8, table, int(base))
    low, high = (0 if bs_relu else nm.INT32_MIN), nm.INT32_MAX
    if folded is None:  # refused only for a span wider than FOLD_SPAN
        first, last = lut_folded._fold_span(_x_params(bn), np.int64(0), np.int64(bn_mul), table, np.int64(base),
                                            np.int64(low), np.int64(high))
        assert last - first + 1 > lut_folded.FOLD_SPAN
        return
    first, values = folded
    last = first + values.shape[0] - 1
    assert low <= first <= last <= high
    ys = np.concatenate([rng.integers(first, last + 1, 150), rng.integers(first - 2**20, first, 40),
                         rng.integers(last, last + 2**20, 40), [low, high, first, last, first - 1, last + 1]])
    ys = np.clip(ys, low, high)
    got = [int(values[min(max(int(y), first), last) - first]) for y in ys]
    assert got == [_reference_after_bs(int(y), bn, bn_mul, config, tables, ew, other, cvt) for y in ys]


def _run_folded(data, sums, operands, bn_mul, tables, case, narrow: bool = False):
    """``folded_to_atoms`` as units/dpu_plan.py ``_lut_store`` calls it (None where the fold is
    refused); the atoms as [S*C2][H][W]. ``narrow``: the broken variant's table."""
    channels, surfaces, height, width, bs, bn, config, ew, cvt, groups, _, rows, other, _ = case
    pixels = height * width
    blocks = np.ascontiguousarray(data.reshape(channels, pixels).T).reshape(1, pixels, channels)
    bs_matrix = _OPERAND_MATRICES.get(channels, tuple(zip(operands, ("ALU", "CPEND", "MUL"))), 3)
    bn_matrix = _OPERAND_MATRICES.get(channels, ((0, "ALU"), (bn_mul, "MUL")), 2)
    flat, layout, per_group = dp._NO_SUMS, dp.SUMS_NONE, 1
    if bs.cpend_enable:
        flat, layout, per_group = dp._window_layout(sums, channels, pixels)
    params = config.parameters()
    base, table = _after_lut(config, tables, ew, other, cvt)
    assert lut.table_flags(_ON, _x_params(bs), _x_params(bn), params, int(base), table.shape[0])[3]
    computed = min(channels, surfaces * C2)
    folded = lut_folded.fold_tables.get(_x_params(bs), _x_params(bn), bn_matrix, computed, table, int(base))
    if folded is None:
        _assert_rightly_refused(bs, bn, bn_mul, table, base)
        return None
    first, values = folded
    if narrow:
        first, values = first + 1, values[1:-1]
    target = np.zeros(surfaces * pixels * 2, np.uint64)
    lut_folded.folded_to_atoms(blocks, flat, layout, per_group, _x_params(bs), bs_matrix, values, np.int64(first),
                               channels, surfaces, width, np.zeros((rows, surfaces * C2), np.int8),
                               np.arange(surfaces * height, dtype=np.int64) * width * 2, target,
                               lut_folded.narrow_lanes(_x_params(bs), bs_matrix, computed, first, values.shape[0]))
    atoms = target.view(np.int8).reshape(surfaces, height, width, C2)
    return atoms.transpose(0, 3, 1, 2).reshape(surfaces * C2, height, width)


def _assert_rightly_refused(bs, bn, bn_mul, table, base):
    """A refused fold: an empty BS range, or a span wider than FOLD_SPAN."""
    bounds = lut_folded.bs_bounds(_x_params(bs))
    if bounds is not None:
        first, last = lut_folded._fold_span(_x_params(bn), np.int64(0), np.int64(bn_mul), table, np.int64(base),
                                            np.int64(bounds[0]), np.int64(bounds[1]))
        assert last - first + 1 > lut_folded.FOLD_SPAN


@settings(max_examples=60, deadline=None)
@given(cases())
def test_folded_kernel_equals_the_reference(case):
    data, sums, operands, bn_mul, tables = _inputs(case)
    channels, surfaces = case[0], case[1]
    got = _run_folded(data, sums, operands, bn_mul, tables, case)
    if got is None:  # (rightly refused: _run_folded checks)
        return
    computed = min(channels, surfaces * C2)
    np.testing.assert_array_equal(got[:computed], _expected(data, sums, operands, bn_mul, tables, case)[:computed])
    assert not got[computed:].any()  # lanes past the computed channels: 0


def _fixed_case(channels, surfaces, groups, sums_form, bs_negative=14, seed=None):
    bs = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=14,
                      shift_negative=bs_negative, cpend_enable=True)
    bn = XStageConfig(mul_enable=True, shift_positive=13, shift_negative=12, relu=True)
    config = LutConfig(LutTableConfig(-16384, 0, 5), LutTableConfig(0, 16384, 5))
    return (channels, surfaces, 3, 7, bs, bn, config, EwConfig(), OutCvtConfig(1, 0, 0, nm.ROUND_HALF_EVEN), groups,
            sums_form, 4, 0, channels if seed is None else seed)


def test_every_form_is_taken():
    """A case of each form - rows of 16 channels and of other counts; window sums shared, in place
    (pixel-major, one per channel), loaded (pixel-major groups, group-major), none; atoms with lanes
    past the channels; BS's shifts alike and not - against the reference."""
    for channels, surfaces, groups, form, negative in ((16, 1, 1, "pixel-major", 14), (16, 1, 16, "pixel-major", 9),
                                                       (64, 1, 64, "pixel-major", 14), (32, 2, 2, "pixel-major", 14),
                                                       (40, 3, 40, "group-major", 11), (96, 6, 2, "group-major", 14),
                                                       (130, 9, 130, "pixel-major", 14), (7, 1, 7, "pixel-major", 3)):
        case = _fixed_case(channels, surfaces, groups, form, negative)
        data, sums, operands, _, tables = _inputs(case)
        bn_mul = 12345
        got = _run_folded(data, sums, operands, bn_mul, tables, case)
        assert got is not None
        computed = min(channels, surfaces * C2)
        np.testing.assert_array_equal(got[:computed], _expected(data, sums, operands, bn_mul, tables, case)[:computed])
    case = _fixed_case(24, 2, 1, "pixel-major")
    case = case[:4] + (dataclasses.replace(case[4], cpend_enable=False),) + case[5:]  # (no window sums)
    data, sums, operands, _, tables = _inputs(case)
    np.testing.assert_array_equal(_run_folded(data, sums, operands, 777, tables, case)[:24],
                                  _expected(data, sums, operands, 777, tables, case))


def test_other_settings_are_refused():
    bs = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=14, shift_negative=14)
    bn = XStageConfig(mul_enable=True, shift_positive=13, shift_negative=13)
    table, base = np.arange(-100, 100, dtype=np.int8), -100

    def fold(bs=bs, bn=bn, muls=(300, 300, 300)):
        matrix = np.array([[0, 0, 0], list(muls)], np.int64)
        return lut_folded.fold_tables.get(_x_params(bs), _x_params(bn), matrix, 3, table, base)

    assert fold() is not None
    assert fold(muls=(300, 301, 300)) is None  # BN differing between channels
    assert fold(muls=(300, 300, 2**31)) is None  # (not an int32 operand)
    assert fold(bn=dataclasses.replace(bn, prelu=True)) is None
    assert fold(bn=dataclasses.replace(bn, alu_enable=True)) is None
    assert fold(bn=dataclasses.replace(bn, mul_enable=False)) is None
    assert fold(bs=dataclasses.replace(bs, relu=True, relux=True, relux_value=-1)) is None  # (an empty BS range)
    assert fold(bn=dataclasses.replace(bn, shift_positive=40, shift_negative=40), muls=(1, 1, 1)) is None  # (too wide)


def test_a_span_short_at_its_ends_is_caught():
    """The broken variant: the folded table one entry short at each end (BS results there clamped
    onto their neighbours) - the reference comparison fails, the right table passes."""
    case = _fixed_case(16, 1, 1, "pixel-major", seed=11)
    data, sums, operands, _, tables = _inputs(case)
    want = _expected(data, sums, operands, 4321, tables, case)
    np.testing.assert_array_equal(_run_folded(data, sums, operands, 4321, tables, case), want)
    data = np.clip(data.astype(np.int64) * 64, nm.INT32_MIN, nm.INT32_MAX).astype(np.int32)  # (reach both ends)
    want = _expected(data, sums, operands, 4321, tables, case)
    np.testing.assert_array_equal(_run_folded(data, sums, operands, 4321, tables, case), want)
    assert not np.array_equal(_run_folded(data, sums, operands, 4321, tables, case, narrow=True), want)
