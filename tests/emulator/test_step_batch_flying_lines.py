"""The FLYING_LINES op of kernels/step_batch.py (issue 20, session 25: ppocr_cls int8's nine SE-gate multiplies a
run ran as steps of their own between its batches, units/dpu_plan.py ``_flying_call``'s ``run.batch``): a flying
int8 task's ``dpu_flying_lines.flying_lines`` call as one op of a batch's ``run_ops`` call, ``per_pixel`` as 0 / 1.
Against test_dpu_flying_lines.py's reference arithmetic on Python integers (its cases: every stage form, rows
scattered, surfaces past the channels): the op writes the reference's elements and nothing else; a row whose
``per_pixel`` is flipped is caught; arguments off the spec (a bool, other element types) make no op."""

import numpy as np
from hypothesis import given, settings

from npuemu.emulator.kernels import dpu_flying_lines as fl
from npuemu.emulator.kernels import step_batch
from tests.emulator.test_dpu_flying_lines import _run, cases

_ROWS = []  # (the last op's table row, for the broken variant below)


def _as_op(main, main_rows, operand, operand_rows, per_pixel, form, channels, height, width, c2, out, rows):
    arguments = (main, main_rows, operand, operand_rows, int(per_pixel), form, channels, height, width, c2, out, rows)
    assert step_batch.kind_of(fl.flying_lines, arguments) == step_batch.FLYING_LINES
    row = step_batch.encoded(step_batch.FLYING_LINES, arguments)
    assert row is not None
    _ROWS[:] = [row, arguments]
    assert step_batch.run_ops(np.array([step_batch.nothing(), row]), 0, 2) == 2


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_op_writes_the_reference_elements(case):
    got, want = _run(_as_op, case)
    assert got == want


def test_a_flipped_per_pixel_flag_is_caught():
    """A per-pixel EW multiplier: the op's row with ``per_pixel`` 0 reads one operand a channel - other elements."""
    c = {"alu": 3, "mul": 1, "bs_on": 1, "bs_alu": 1, "bs_algo": 2, "bs_mul": 1, "bs_relu": 0, "bs_relux": 0,
         "bs_relux_value": 0, "ew_on": 1, "cvt_on": 0, "cvt_offset": 0, "cvt_scale": 1, "cvt_shift": 0, "cvt_mode": 1,
         "op_on": 1, "op_mul": 1, "ew_algo": 2, "ew_relu": 0, "ew_relux": 0, "ew_relux_value": 0, "out_scale": 1,
         "out_shift": 4, "out_mode": 1, "out_offset": 0, "low": -128, "high": 127}
    rng = np.random.default_rng(5)
    main, operand = (rng.integers(-128, 128, 32).astype(np.int8) for _ in range(2))
    case = (c, 16, 16, 1, 2, main, operand, True, np.array([0], np.int64))
    got, want = _run(_as_op, case)
    assert got == want
    row, arguments = _ROWS
    out = arguments[10]
    right = out.copy()
    broken = row.copy()
    broken[1 + step_batch.WORDS * 4] = 0
    step_batch.run_ops(broken[None], 0, 1)
    assert not np.array_equal(out, right)


def test_arguments_off_the_spec_make_no_op():
    main, rows, form = np.zeros(64, np.int8), np.zeros(4, np.int64), np.zeros(fl.F_COUNT, np.int64)
    arguments = (main, rows, np.zeros(1, np.int8), np.zeros(1, np.int64), 0, form, 16, 1, 4, 16, np.zeros(64, np.int8),
                 rows)
    assert step_batch.encoded(step_batch.FLYING_LINES, arguments) is not None
    for at, wrong in ((4, True), (0, main.view(np.uint8)), (5, form.astype(np.int32)), (10, np.zeros(64, np.uint8)),
                      (1, rows[::2])):
        changed = arguments[:at] + (wrong,) + arguments[at + 1:]
        assert step_batch.encoded(step_batch.FLYING_LINES, changed) is None
