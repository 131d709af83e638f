"""The int64 stages on NC1HWC2 atoms (kernels/dpu_atoms.py ``_stages_atoms``) with BS operands that
are one value for every channel - the SE gates' case, which runs with scalar operands in place of
lines of tiled ones (issue 20) - and with operands that differ in one channel only (the tiled run
must be taken), against the per-element reference chain of tests/emulator/reference
(``expected_cube``): EW multiply per channel or per pixel, PReLU, truncations, int8/16/32 atoms,
lanes and surfaces past the channels."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import EwConfig, OutCvtConfig, XStageConfig
from tests.emulator.test_dpu_atoms import _run_stages, stage_cases

EXTREMES = [-(2**31), -(2**20), -129, -1, 0, 1, 7, 109, 2**15 - 1, 2**31 - 1]


@st.composite
def uniform_cases(draw):
    data, (alu, mul), stages, operand, out_dtype, c2, surfaces = draw(stage_cases())
    channels = data.shape[0]
    alu = np.full(channels, draw(st.sampled_from(EXTREMES)), np.int64)
    mul = np.full(channels, draw(st.sampled_from([-(2**15), -3, 0, 1, 3, 2**15 - 1])), np.int64)
    odd = draw(st.none() | st.tuples(st.integers(0, channels - 1), st.integers(-(2**15), 2**15 - 1),
                                     st.sampled_from(["alu", "mul"])))
    if odd is not None:  # one channel's operand differs: the tiled lines must run
        (alu if odd[2] == "alu" else mul)[odd[0]] = odd[1]
    return data, (alu, mul), stages, operand, out_dtype, c2, surfaces


@settings(max_examples=150, deadline=None)
@given(uniform_cases())
def test_uniform_and_nearly_uniform_operands_match_the_reference(case):
    got, expected = _run_stages(case)
    assert np.array_equal(got, expected)


def test_a_last_channel_that_differs_is_not_taken_for_uniform():
    # 20 channels over two surfaces of 16 lanes: the odd one is the last (lane 3 of the second surface)
    rng = np.random.default_rng(5)
    channels, height, width = 20, 2, 5
    data = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    alu = np.full(channels, 109, np.int64)
    alu[-1] = 40
    mul = np.ones(channels, np.int64)
    operand = np.ascontiguousarray(np.broadcast_to(rng.integers(-128, 128, (channels, 1, 1)).astype(np.int8),
                                                   (channels, height, width)))
    stages = {"bs": XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD), "bn": None,
              "ew": EwConfig(cvt_enable=True, cvt_offset=128, op_enable=True, op_type=nm.EW_OP_MUL),
              "cvt": OutCvtConfig(21199, 21, -82, nm.ROUND_HALF_AWAY)}
    got, expected = _run_stages((data, (alu, mul), stages, operand, np.int8, 16, 2))
    assert np.array_equal(got, expected)
    assert len(np.unique(expected[1, ..., 3])) > 1  # (the odd channel's values are not all saturated)
