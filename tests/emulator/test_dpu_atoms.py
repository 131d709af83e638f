"""The DPU chain from NC1HWC2 atoms to atoms (issue 20, kernels/dpu_atoms.py: a flying DPU task's
main cube and ERDMA operand as read, written as the WDMA's atoms) against the per-element reference
chain written in tests/emulator/reference (``expected_cube``): BS ALU / MUL (no CPEND: flying mode
has no window sums), BN ReLU / RELUX, an EW add with its converter (operand per pixel or per
channel) or none, OUT_CVT's either rounding and sign, int8 / int16 / int32 atoms, channels that
leave lanes of the last surface empty (written 0) and surfaces past the channels, odd sizes; the
refusals (other shapes: the caller's general run); a broken variant (the per-channel operands of
the wrong surface) is caught."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import EwConfig, OutCvtConfig, XStageConfig
from npuemu.emulator.kernels import dpu_atoms
from npuemu.emulator.kernels import dpu_pixel as dp
from tests.emulator.test_dpu_pixel import as_atoms, expected_cube

SENTINEL = 0x5A5A5A5A5A5A5A5A


@st.composite
def atom_cases(draw):
    out_dtype = draw(st.sampled_from([np.int8, np.int8, np.int16, np.int32]))
    in_dtype = draw(st.sampled_from([np.int8, np.int8, np.int16]))
    c2 = 16 // np.dtype(out_dtype).itemsize
    channels = draw(st.integers(1, 3 * c2 + 1))
    surfaces = -(-channels // c2) + draw(st.sampled_from([0, 0, 1]))  # (a WDMA surface past the channels)
    height, width = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    info = np.iinfo(in_dtype)
    data = rng.integers(int(info.min), int(info.max) + 1, (channels, height, width)).astype(in_dtype)
    data.flat[rng.integers(0, data.size)] = draw(st.sampled_from([int(info.min), int(info.max), 0, -1, 1]))
    shift = draw(st.sampled_from([0, 1, 8, 14, 20]))
    bs = XStageConfig(alu_enable=draw(st.booleans()), alu_algo=nm.ALU_ADD, mul_enable=draw(st.booleans()),
                      shift_positive=shift, shift_negative=shift, relu=draw(st.booleans()))
    bn = XStageConfig(relu=draw(st.booleans()), relux=draw(st.booleans()),
                      relux_value=draw(st.sampled_from([0, 127, 14037, 2**31 - 1])))
    ew = draw(st.none() | st.builds(
        EwConfig, cvt_enable=st.booleans(), cvt_offset=st.sampled_from([-128, 0, 7, 128]),
        cvt_scale=st.sampled_from([-(2**15), 1, 23062, 2**15 - 1]), cvt_shift=st.sampled_from([0, 1, 3, 16]),
        cvt_round=st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY]), op_enable=st.booleans(),
        alu_algo=st.just(nm.ALU_ADD), relu=st.booleans()))
    scales = [0, 1, 3, 19049, 2**15 - 1, -3, -(2**15)]
    cvt = OutCvtConfig(draw(st.sampled_from(scales)), draw(st.sampled_from([0, 1, 12, 20, 33])),
                       draw(st.sampled_from([-(2**31), -128, -1, 0, 12, 2**31 - 1])),
                       draw(st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])))
    alu = rng.integers(-(2**20), 2**20, channels)
    mul = rng.integers(-(2**15), 2**15, channels)
    operand = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    if draw(st.booleans()):  # one per channel
        operand = np.ascontiguousarray(np.broadcast_to(operand[:, :1, :1], operand.shape))
    stages = {"bs": draw(st.none() | st.just(bs)), "bn": draw(st.none() | st.just(bn)), "ew": ew, "cvt": cvt}
    return data, (alu, mul), stages, operand, out_dtype, c2, surfaces


def _atoms(cube: np.ndarray, c2: int, surfaces: int) -> np.ndarray:
    """[C][H][W] as the DMA's NC1HWC2 atoms [S][H*W][C2] (lanes past the channels 0)."""
    channels, height, width = cube.shape
    padded = np.zeros((surfaces * c2, height * width), cube.dtype)
    padded[:channels] = cube.reshape(channels, -1)
    return np.ascontiguousarray(padded.reshape(surfaces, c2, -1).transpose(0, 2, 1))


def _run(case, floats_of=None):
    """The kernel's atoms [S][H][W][C2] and the reference's; None where the plan has no chain."""
    data, (alu, mul), stages, operand, out_dtype, c2, surfaces = case
    channels, height, width = data.shape
    ew = stages["ew"]
    plan = dp.plan_stages(channels, out_dtype, data.dtype, None if ew is None else np.int8, bs=stages["bs"],
                          bs_alu=alu, bs_cpend=0, bs_mul=mul, bn=stages["bn"], bn_alu=0, bn_mul=1, ew=ew,
                          cvt=stages["cvt"])
    if plan.chain is None:
        return None
    itemsize = np.dtype(out_dtype).itemsize
    words = np.full((surfaces * height * width * c2 * itemsize) // 8 + 4, SENTINEL, np.uint64)
    out = words.view(out_dtype)
    first = 16 // itemsize  # (the atoms start 2 words in)
    offsets = first + np.arange(surfaces * height) * width * c2
    floats = plan.floats if floats_of is None else floats_of(plan.floats)
    run = dpu_atoms.prepare_chain_atoms(plan.chain[0], floats, channels, height, width, c2, out, offsets)
    main = _atoms(data, c2, -(-channels // c2))
    passed = None
    if ew is not None:
        passed = _atoms(operand, c2, -(-channels // c2))
        if (operand == operand[:, :1, :1]).all():
            passed = np.ascontiguousarray(passed[:, :1])
    assert run(main, passed)
    assert (words[:2] == SENTINEL).all() and (words[-2:] == SENTINEL).all()  # nothing outside the lines
    got = out[first:first + surfaces * height * width * c2].reshape(surfaces, height, width, c2)
    expected = expected_cube(data.astype(np.int64), np.zeros((1, height, width), np.int64), alu, np.zeros(channels),
                             mul, (0, 1), operand, stages, out_dtype)
    return got, as_atoms(expected, c2, surfaces, out_dtype)


@settings(max_examples=200, deadline=None)
@given(atom_cases())
def test_atoms_match_the_reference_chain(case):
    result = _run(case)
    if result is not None:
        got, expected = result
        assert np.array_equal(got, expected)


def _fixed_case():
    rng = np.random.default_rng(3)
    channels, height, width = 40, 3, 7
    data = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    stages = {"bs": XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=8,
                                 shift_negative=8),
              "bn": None, "ew": EwConfig(cvt_enable=True, cvt_offset=-12, cvt_scale=3, cvt_shift=1,
                                         op_enable=True, alu_algo=nm.ALU_ADD), "cvt": OutCvtConfig(1, 1, 0)}
    operand = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    return data, (rng.integers(-100, 100, channels), rng.integers(1, 300, channels)), stages, operand, \
        np.int8, 16, 3


def test_a_residual_add_matches():
    got, expected = _run(_fixed_case())
    assert np.array_equal(got, expected)
    assert len(np.unique(expected)) > 50 and (got[2, :, :, 8:] == 0).all()


def test_other_shapes_are_refused():
    data, _, stages, _, out_dtype, c2, surfaces = _fixed_case()
    plan = dp.plan_stages(40, out_dtype, np.int8, np.int8, bs=stages["bs"], bs_alu=np.ones(40), bs_cpend=0,
                          bs_mul=np.ones(40), ew=stages["ew"], cvt=stages["cvt"])
    out = np.zeros(3 * 21 * 16, np.int8)
    run = dpu_atoms.prepare_chain_atoms(plan.chain[0], plan.floats, 40, 3, 7, 16, out, np.arange(9) * 7 * 16)
    main = _atoms(data, 16, 3)
    assert not run(main[:, :20], main)  # pixels
    assert not run(main[:2], main)  # surfaces
    assert not run(main, None)  # no operand
    assert not run(main, main[:, :, :8].copy())  # lanes
    assert not run(main[:, ::2].repeat(2, axis=1)[:, :21][:, ::1].T.copy().T, main)  # not C-contiguous
    assert (out == 0).all()
    assert dpu_atoms.prepare_chain_atoms(plan.chain[0], plan.floats, 40, 3, 7, 16, out[:-1],
                                         np.arange(9) * 7 * 16) is None  # a line past the target


def test_the_checks_catch_operands_of_the_wrong_surface():
    # broken on purpose: the per-channel operands rolled by one atom's lanes
    result = _run(_fixed_case(), lambda floats: np.ascontiguousarray(np.roll(floats, 16, axis=1)))
    got, expected = result
    assert not np.array_equal(got, expected)


# ---------------------------------------------------------------------------------------------
# The int64 stages on atoms (settings without a chain: an EW multiply, PReLU)
# ---------------------------------------------------------------------------------------------


@st.composite
def stage_cases(draw):
    """``atom_cases`` with an EW multiply (its truncation, PReLU) or BS PReLU: no float chain."""
    data, (alu, mul), stages, operand, out_dtype, c2, surfaces = draw(atom_cases())
    ew = EwConfig(cvt_enable=draw(st.booleans()), cvt_offset=draw(st.sampled_from([-128, 0, 128])),
                  cvt_scale=draw(st.sampled_from([1, 3, 2**15 - 1, -7])), cvt_shift=draw(st.sampled_from([0, 1, 9])),
                  cvt_round=draw(st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])), op_enable=True,
                  op_type=nm.EW_OP_MUL, truncate_positive=draw(st.sampled_from([0, 1, 7, 20])),
                  truncate_negative=draw(st.sampled_from([0, 1, 7, 20])), prelu=draw(st.booleans()),
                  relu=draw(st.booleans()))
    if draw(st.booleans()):
        shift = draw(st.sampled_from([0, 3, 14]))
        stages = stages | {"bs": XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True,
                                              shift_positive=shift, shift_negative=shift + 1, prelu=True)}
    stages = stages | {"ew": draw(st.none() | st.just(ew)) if stages["bs"] is not None else ew}
    return data, (alu, mul), stages, operand, out_dtype, c2, surfaces


def _run_stages(case):
    data, (alu, mul), stages, operand, out_dtype, c2, surfaces = case
    channels, height, width = data.shape
    bs, bn, ew, cvt = stages["bs"], stages["bn"], stages["ew"], stages["cvt"]
    plan = dp.plan_stages(channels, out_dtype, data.dtype, None if ew is None else np.int8, bs=bs, bs_alu=alu,
                          bs_cpend=0, bs_mul=mul, bn=bn, bn_alu=0, bn_mul=1, ew=ew, cvt=cvt)
    settings_ = (dp._stage_flags(bs is not None, bn is not None, ew is not None), dp._x_params(bs or dp._BYPASSED),
                 plan.bs_operands, dp._x_params(bn or dp._BYPASSED), plan.bn_operands,
                 dp._ew_params(ew or dp._EW_BYPASSED), dp._cvt_params(cvt, np.dtype(out_dtype)))
    itemsize = np.dtype(out_dtype).itemsize
    words = np.full((surfaces * height * width * c2 * itemsize) // 8 + 4, SENTINEL, np.uint64)
    out = words.view(out_dtype)
    first = 16 // itemsize
    offsets = first + np.arange(surfaces * height) * width * c2
    run = dpu_atoms.prepare_stages_atoms(settings_, channels, height, width, c2, out, offsets)
    main = _atoms(data, c2, -(-channels // c2))
    passed = None
    if ew is not None:
        passed = _atoms(operand, c2, -(-channels // c2))
        if (operand == operand[:, :1, :1]).all():
            passed = np.ascontiguousarray(passed[:, :1])
    assert run(main, passed)
    assert (words[:2] == SENTINEL).all() and (words[-2:] == SENTINEL).all()
    got = out[first:first + surfaces * height * width * c2].reshape(surfaces, height, width, c2)
    expected = expected_cube(data.astype(np.int64), np.zeros((1, height, width), np.int64), alu, np.zeros(channels),
                             mul, (0, 1), operand, stages, out_dtype)
    return got, as_atoms(expected, c2, surfaces, out_dtype)


@settings(max_examples=150, deadline=None)
@given(stage_cases())
def test_stage_atoms_match_the_reference(case):
    got, expected = _run_stages(case)
    assert np.array_equal(got, expected)


def _gate_case():
    """An SE gate: x * (gate + 128) per channel, truncated by 7, OUT_CVT to int8."""
    data, (alu, mul), stages, operand, out_dtype, c2, surfaces = _fixed_case()
    gate = EwConfig(cvt_enable=True, cvt_offset=128, cvt_scale=1, cvt_shift=0, op_enable=True, op_type=nm.EW_OP_MUL,
                    truncate_positive=7, truncate_negative=7)
    operand = np.ascontiguousarray(np.broadcast_to(operand[:, :1, :1], operand.shape))
    return data, (alu, mul), stages | {"ew": gate}, operand, out_dtype, c2, surfaces


def test_an_se_gate_matches_and_a_wrong_gate_is_caught():
    got, expected = _run_stages(_gate_case())
    assert np.array_equal(got, expected) and len(np.unique(expected)) > 50
    data, operands, stages, operand, out_dtype, c2, surfaces = _gate_case()
    wrong = operand.copy()
    wrong[16:32] = operand[:16]  # broken on purpose: the second surface's gates from the first's
    got, _ = _run_stages((data, operands, stages, wrong, out_dtype, c2, surfaces))
    assert not np.array_equal(got, expected)
