"""The int8 chain with an EW stage (residual adds) written straight into the atom lines, the
ERDMA's int8 atoms [S][P][16] read in place (issue 20, kernels/dpu_folded_lines.py ``ew_lines``,
NUMERICS.md 55) against per-element reference arithmetic on Python integers (BS, BN, EW's operand
conversion and ALU op, OUT_CVT: tests/emulator/reference), through the prepared DPU stage kernel's
``direct`` form as units/dpu_plan.py runs it (kernels/dpu_pixel_plan.py ``_ew_chain``):

- int8 atoms of 16 lanes, one to all of the channels' surfaces stored, lines with gaps between
  them (the words in between must stay as they were), channel counts not a multiple of 16 (the
  operand's last atoms' lanes past the channels hold garbage, never read);
- window sums none, one per pixel and one per pixel and channel, within the chain's bound and
  past it (the general run then writes the same atoms);
- EW: operand offset / scale / shift in both roundings, the ADD on or bypassed (the chain takes no
  other op), EW ReLU / RELUX;
- an operand read with its surfaces swapped is caught."""

import dataclasses

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_folded_lines
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels.dpu import EwConfig, OutCvtConfig, XStageConfig
from npuemu.emulator.kernels.dpu_pixel import plan_stages
from npuemu.emulator.kernels.dpu_pixel_plan import prepare_planned_to_atoms
from tests.emulator.reference import arithmetic as ref
from tests.emulator.test_dpu_folded_lines import _MODES, _layout, _read_atoms, _untouched


@st.composite
def cases(draw):
    channels = draw(st.sampled_from([16, 24, 32, 40, 48, 64]))
    surfaces = draw(st.integers(1, channels // 16))
    height, width = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    window = draw(st.sampled_from(["none", "shared", "per-channel"]))
    shift = draw(st.integers(0, 24))
    bs = XStageConfig(alu_enable=draw(st.booleans()), mul_enable=True, shift_positive=shift, shift_negative=shift,
                      relu=draw(st.booleans()), relux=draw(st.booleans()),
                      relux_value=draw(st.integers(-3000, 2**31 - 1)), cpend_enable=window != "none")
    bn = draw(st.sampled_from([None, XStageConfig(relu=True), XStageConfig(relux=True, relux_value=90000)]))
    ew = EwConfig(cvt_enable=True, cvt_offset=draw(st.integers(-128, 127)), cvt_scale=draw(st.integers(0, 32767)),
                  cvt_shift=draw(st.integers(0, 20)), cvt_round=draw(st.sampled_from(sorted(_MODES))),
                  op_enable=draw(st.integers(0, 3)) > 0,
                  relu=draw(st.booleans()), relux=draw(st.booleans()), relux_value=draw(st.integers(0, 2**20)))
    cvt = OutCvtConfig(draw(st.integers(0, 32767)), draw(st.integers(0, 24)), draw(st.integers(-128, 127)),
                       draw(st.sampled_from(sorted(_MODES))))
    past = window != "none" and draw(st.integers(0, 4)) == 0
    return channels, surfaces, height, width, window, bs, bn, ew, cvt, past, draw(st.integers(0, 2**32 - 1))


def _inputs(case):
    channels, surfaces, height, width, window, bs, bn, ew, cvt, past, seed = case
    rng = np.random.default_rng(seed)
    pixels = height * width
    operands = dict(bs_alu=rng.integers(-5000, 5000, channels).astype(np.int32),
                    bs_cpend=rng.integers(-20, 20, channels).astype(np.int32),
                    bs_mul=rng.integers(-9000, 9000, channels).astype(np.int32))
    data = rng.integers(-2**16, 2**16, (1, pixels, channels)).astype(np.int32)
    atoms = rng.integers(-128, 128, (-(-channels // 16), pixels, 16)).astype(np.int8)
    if window == "shared":
        sums = rng.integers(-(2**40) if past else -4000, 2**40 if past else 4000, (1, height, width))
    elif window == "per-channel":
        limit = 2**31 - 1 if past else 4000
        sums = rng.integers(-limit, limit, (pixels, channels)).astype(np.int32).T.reshape(channels, height, width)
    else:
        sums = None
    return operands, data, atoms, sums


def _reference(case, operands, data, atoms, sums) -> np.ndarray:
    """[S * 16][P] int8 values of the reference chain for the stored channels."""
    channels, surfaces, height, width, window, bs, bn, ew, cvt, _, _ = case
    bs_cfg, ew_cfg = dataclasses.asdict(bs), dict(dataclasses.asdict(ew), cvt_round=_MODES[ew.cvt_round])
    bn_cfg = None if bn is None else dataclasses.asdict(bn)
    out = np.empty((surfaces * 16, height * width), np.int64)
    for c in range(surfaces * 16):
        for p in range(height * width):
            w = 0 if sums is None else int(sums[0 if window == "shared" else c].reshape(-1)[p])
            value = ref.bs(int(data[0, p, c]), w, int(operands["bs_alu"][c]), int(operands["bs_cpend"][c]),
                           int(operands["bs_mul"][c]), bs_cfg)
            if bn_cfg is not None:
                value = ref.bn(value, 0, 0, bn_cfg)
            value = ref.ew(value, int(atoms[c // 16, p, c % 16]), ew_cfg)
            out[c, p] = ref.out_cvt(value, cvt.scale, cvt.shift, cvt.offset, _MODES[cvt.round_mode], ref.INT8)
    return out


def _store(case, operands):
    channels, _, _, _, _, bs, bn, ew, cvt, _, _ = case
    return plan_stages(channels, np.int8, np.int32, np.int8, bs=bs, bn=bn, ew=ew, cvt=cvt, **operands)


@settings(max_examples=80, deadline=None)
@given(cases())
def test_ew_lines_store_equals_the_reference(case):
    channels, surfaces, height, width = case[:4]
    operands, data, atoms, sums = _inputs(case)
    plan = _store(case, operands)
    assume(plan.chain is not None)
    assert dpu_folded_lines.ew_takes(plan.chain[0], 1, surfaces * 16, surfaces)  # (the lines kernel's form)
    offsets, words = _layout(surfaces, height, width)
    store = prepare_planned_to_atoms(plan, height * width, width, words, offsets, 16, surfaces)
    assert store is not None and store.direct is not None
    want = _reference(case, operands, data, atoms, sums)
    for _ in range(2):  # (a prepared store runs again on the same inputs: the same atoms)
        store.direct(data, sums, atoms)
        np.testing.assert_array_equal(_read_atoms(words, offsets, surfaces, height, width), want)
        assert _untouched(words, offsets, width)


def test_operand_surfaces_swapped_are_caught():
    """The broken variant: the lines kernel handed the operand's atoms with their two surfaces
    swapped - the reference comparison fails; the atoms as they are pass."""
    case = (32, 2, 2, 5, "shared", XStageConfig(alu_enable=True, mul_enable=True, shift_positive=12,
                                                shift_negative=12, relu=True, cpend_enable=True), None,
            EwConfig(cvt_enable=True, cvt_offset=3, cvt_scale=9000, cvt_shift=4, op_enable=True),
            OutCvtConfig(20000, 15, -3, nm.ROUND_HALF_EVEN), False, 11)
    operands, data, atoms, sums = _inputs(case)
    plan = _store(case, operands)
    want = _reference(case, operands, data, atoms, sums)
    for operand, equal in ((atoms, True), (np.ascontiguousarray(atoms[::-1]), False)):
        offsets, words = _layout(2, 2, 5)
        dpu_folded_lines.ew_lines(data, sums.reshape(-1), dp.SUMS_SHARED, plan.floats, operand,
                                  plan.chain[0], 2, 5, offsets, words)
        assert np.array_equal(_read_atoms(words, offsets, 2, 2, 5), want) == equal
