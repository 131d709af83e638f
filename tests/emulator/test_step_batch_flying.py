"""The FLYING_CHAIN op of kernels/step_batch.py (issue 20: silero-vad int8's twelve flying DPU tasks a run,
units/dpu_plan.py ``_chain_batch``): a flying int8 task's MRDMA rows copied out of memory into the step's
cube and the float64 chain without EW (kernels/dpu_atoms.py) into the WDMA's atoms, one op of a batch's
``run_ops`` call. Against the per-element reference chain (tests/emulator/reference, ``expected_cube``) on
main atoms scattered over a memory region in rows of random order and gaps: the op, and the step's own
form (``dpu_flying_lines.gather_chain``), write the reference's atoms and nothing outside them; arguments
off the op's spec make no op; broken variants (rows one element off, the other OUT_CVT rounding's loop)
are caught."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import OutCvtConfig, XStageConfig, dpu_flying_lines, step_batch
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels.dpu_pixel import CH_EVEN, CH_EW_ON, CH_LOW1
from tests.emulator.test_dpu_atoms import SENTINEL, _atoms, atom_cases
from tests.emulator.test_dpu_pixel import as_atoms, expected_cube


def _op(case, seed: int):
    """(gather_chain's arguments, the output words, its first element, the reference atoms) of an int8 case
    with a chain and no EW, its main atoms' rows placed in a region in a random order; None for others."""
    data, (alu, mul), stages, operand, out_dtype, c2, surfaces = case
    channels, height, width = data.shape
    if stages["ew"] is not None or np.dtype(out_dtype) != np.int8 or data.dtype != np.int8:
        return None
    plan = dp.plan_stages(channels, out_dtype, data.dtype, None, bs=stages["bs"], bs_alu=alu, bs_cpend=0,
                          bs_mul=mul, bn=stages["bn"], bn_alu=0, bn_mul=1, ew=None, cvt=stages["cvt"])
    if plan.chain is None or plan.chain[0][CH_EW_ON] != 0:
        return None
    rng = np.random.default_rng(seed)
    main = _atoms(data, c2, -(-channels // c2)).reshape(-1, width * c2)  # (the MRDMA's rows, in order)
    line = width * c2
    slots = rng.permutation(main.shape[0] + 3)[:main.shape[0]]  # (each row a slot of its own, gaps between)
    rows = (slots * (line + int(rng.integers(0, 5))) + int(rng.integers(0, 7))).astype(np.int64)
    region = rng.integers(0, 256, int(rows.max()) + line + 5).astype(np.uint8)
    for row, at in zip(main, rows):
        region[at:at + line] = row.view(np.uint8)
    words = np.full((surfaces * height * line) // 8 + 4, SENTINEL, np.uint64)
    out, first = words.view(np.int8), 16
    offsets = (first + np.arange(surfaces * height) * line).astype(np.int64)
    cube = np.zeros((main.shape[0] // height, height * width, c2), np.int8)
    chain = plan.chain[0]
    # (the loop as dpu_atoms picks it, from the chain's own flags)
    loop = 2 * int(chain[CH_EVEN] != 0) + int(chain[CH_LOW1] == 0.0)
    arguments = (region, rows, cube, plan.floats, chain, channels, height, width, out, offsets, loop)
    expected = expected_cube(data.astype(np.int64), np.zeros((1, height, width), np.int64), alu, np.zeros(channels),
                             mul, (0, 1), operand, stages, out_dtype)
    return arguments, words, first, as_atoms(expected, c2, surfaces, out_dtype)


def _written(words, first, expected) -> np.ndarray:
    assert (words[:2] == SENTINEL).all() and (words[-2:] == SENTINEL).all()  # nothing outside the lines
    return words.view(np.int8)[first:first + expected.size].reshape(expected.shape)


@settings(max_examples=150, deadline=None)
@given(atom_cases(), st.integers(0, 2**32 - 1))
def test_the_op_and_the_steps_call_write_the_reference_chains_atoms(case, seed):
    made = _op(case, seed)
    if made is None:
        return
    arguments, words, first, expected = made
    call = (dpu_flying_lines.gather_chain, arguments)
    assert step_batch.kind_of(*call) == step_batch.FLYING_CHAIN
    table = np.array([step_batch.nothing(), step_batch.encoded(step_batch.FLYING_CHAIN, arguments)])
    assert step_batch.run_ops(table, 0, 2) == 2
    np.testing.assert_array_equal(_written(words, first, expected), expected)
    words[2:-2] = SENTINEL
    dpu_flying_lines.gather_chain(*arguments)
    np.testing.assert_array_equal(_written(words, first, expected), expected)


def _fixed():
    """A case whose values round at ties (BS adds an odd number a channel; OUT_CVT halves): the two roundings
    differ."""
    rng = np.random.default_rng(3)
    channels, height, width, c2 = 21, 2, 3, 16
    data = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    bs = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD)
    stages = {"bs": bs, "bn": None, "ew": None, "cvt": OutCvtConfig(1, 1, 0, nm.ROUND_HALF_EVEN)}
    alu, mul = rng.integers(-60, 60, channels), np.ones(channels, np.int64)
    case = (data, (alu, mul), stages, np.zeros((channels, height, width), np.int8), np.int8, c2, 2)
    made = _op(case, 11)
    assert made is not None
    return made


def test_the_checks_catch_rows_one_element_off_and_the_other_roundings_loop():
    arguments, words, first, expected = _fixed()
    row = step_batch.encoded(step_batch.FLYING_CHAIN, arguments)
    step_batch.run_ops(row[None], 0, 1)
    np.testing.assert_array_equal(_written(words, first, expected), expected)
    rows = arguments[1]
    spare = np.concatenate([rows, rows[-1:]]) + 1  # (each row one byte on: in bounds)
    broken = row.copy()
    broken[1 + step_batch.WORDS] = spare.ctypes.data
    words[2:-2] = SENTINEL
    step_batch.run_ops(broken[None], 0, 1)
    assert not np.array_equal(_written(words, first, expected), expected)
    broken = row.copy()
    broken[1 + step_batch.WORDS * 10] ^= 2  # (half away in place of half even)
    words[2:-2] = SENTINEL
    step_batch.run_ops(broken[None], 0, 1)
    assert not np.array_equal(_written(words, first, expected), expected)


def test_arguments_off_the_spec_make_no_op():
    arguments = _fixed()[0]
    call = dpu_flying_lines.gather_chain
    assert step_batch.kind_of(call, arguments[:-1] + (4,)) is None  # (no such loop)
    assert step_batch.kind_of(call, arguments[:-1]) is None
    for at, wrong in ((0, arguments[0].view(np.int8)), (2, arguments[2].astype(np.int16)),
                      (2, arguments[2][:, :, ::2]), (5, True), (8, arguments[8].view(np.uint8))):
        changed = arguments[:at] + (wrong,) + arguments[at + 1:]
        assert step_batch.encoded(step_batch.FLYING_CHAIN, changed) is None
