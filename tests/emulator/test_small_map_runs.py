"""The runs the int8 build's small-map kernels take (issue 20, silero-vad's 1-5 pixel maps), against references
written in the tests:

- ``convert_stores.int8_store`` on 1x1 planes whose atoms follow each other (one run over the channels) and on
  other layouts (element by element), against test_step_batch_fp16's store written there;
- ``dpu_flying_lines.gather_cube`` with rows back to back in runs (one copy a run) and apart, against a copy
  written here;
- ``dpu_atoms``' chain on 1x1 maps whose atoms follow each other (one run over up to 600 channels) or lie apart
  (an atom a surface), against the per-element reference chain (test_dpu_atoms ``_run``: ``expected_cube``), EW
  on and off, lanes and surfaces past the channels;
- ``int_atoms_to_planes``' pixel-major pass on more channels than a block (test_int_to_fp16_small_maps' check
  against the unit path)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import EwConfig, OutCvtConfig, XStageConfig, convert_stores, dpu_atoms, dpu_flying_lines
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels.dpu import BLOCK
from tests.emulator.test_dpu_atoms import SENTINEL, _atoms, _run
from tests.emulator.test_dpu_pixel import as_atoms, expected_cube
from tests.emulator import test_int_to_fp16_small_maps as small_maps
from tests.emulator.test_step_batch_fp16 import _int8_reference


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 300), st.sampled_from([(1, 1), (1, 1), (1, 4), (2, 1)]), st.sampled_from([8, 16]),
       st.booleans(), st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_int8_store_writes_the_reference_bytes(channels, shape, c2, back_to_back, spare, half_even, seed):
    rng = np.random.default_rng(seed)
    height, width = shape
    values = (rng.standard_normal(channels * height * width + 2) * 90).astype(np.float32)
    values[rng.integers(0, values.size, 4)] = np.array([np.nan, 0.5, -2.5, 1e9], np.float32)
    surfaces, line = -(-channels // c2) + int(spare), width * c2  # (spare: a WDMA surface past the channels)
    if back_to_back:
        offsets = (7 + np.arange(surfaces * height) * line).astype(np.int64)
    else:
        offsets = (rng.permutation(surfaces * height + 2)[:surfaces * height] * (line + 3) + 5).astype(np.int64)
    data = rng.integers(0, 256, int(offsets.max()) + line + 9).astype(np.uint8)
    ints = np.zeros(values.size, np.int8)
    planes = ints[:channels * height * width].view(np.uint8).reshape(channels, height, width)
    expected = _int8_reference(values, half_even, (channels, height, width), c2, offsets, data)
    convert_stores.int8_store(values, half_even, ints, planes, c2, offsets, data)
    np.testing.assert_array_equal(data, expected)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.sampled_from([1, 3, 16]), st.lists(st.integers(0, 2), min_size=39, max_size=39),
       st.integers(0, 2**32 - 1))
def test_gather_cube_copies_the_rows(rows_count, size, gaps, seed):
    rng = np.random.default_rng(seed)
    # rows one after another, the next one ``gap`` bytes later (0: back to back, a run), or back to an earlier one
    rows = np.zeros(rows_count, np.int64)
    for r in range(1, rows_count):
        rows[r] = rows[r - 1] + size + gaps[r - 1] if gaps[r - 1] < 2 else rows[r - 1] // 2
    region = rng.integers(0, 256, int(rows.max()) + size + 3).astype(np.uint8)
    cube = np.zeros((rows_count, 1, size), np.int8)
    dpu_flying_lines.gather_cube(region, rows, cube)
    expected = np.array([region[at:at + size] for at in rows.tolist()]).view(np.int8)
    np.testing.assert_array_equal(cube.reshape(rows_count, size), expected)


@st.composite
def one_pixel_cases(draw):
    """test_dpu_atoms' cases on 1x1 maps of up to 600 channels (its ``_run`` lays the atoms back to back)."""
    c2 = 16
    channels = draw(st.integers(1, 600))
    surfaces = -(-channels // c2) + draw(st.sampled_from([0, 0, 1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    data = rng.integers(-128, 128, (channels, 1, 1)).astype(np.int8)
    bs = XStageConfig(alu_enable=draw(st.booleans()), alu_algo=nm.ALU_ADD, mul_enable=draw(st.booleans()),
                      shift_positive=8, shift_negative=8, relu=draw(st.booleans()))
    ew = draw(st.none() | st.just(EwConfig(cvt_enable=True, cvt_offset=7, cvt_scale=23062, cvt_shift=3,
                                           cvt_round=nm.ROUND_HALF_EVEN, op_enable=True, alu_algo=nm.ALU_ADD)))
    cvt = OutCvtConfig(draw(st.sampled_from([1, 3, 19049, -3])), draw(st.sampled_from([0, 1, 12, 20])), 0,
                       draw(st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])))
    alu, mul = rng.integers(-(2**20), 2**20, channels), rng.integers(-(2**15), 2**15, channels)
    operand = rng.integers(-128, 128, (channels, 1, 1)).astype(np.int8)
    stages = {"bs": bs, "bn": None, "ew": ew, "cvt": cvt}
    return data, (alu, mul), stages, operand, np.int8, c2, surfaces


@settings(max_examples=80, deadline=None)
@given(one_pixel_cases())
def test_one_pixel_chains_match_the_reference(case):
    result = _run(case)
    if result is not None:
        got, expected = result
        np.testing.assert_array_equal(got, expected)


@settings(max_examples=60, deadline=None)
@given(one_pixel_cases(), st.integers(1, 200))
def test_one_pixel_chains_into_atoms_apart_match_the_reference(case, gap):
    data, (alu, mul), stages, operand, out_dtype, c2, surfaces = case
    channels, ew = data.shape[0], stages["ew"]
    plan = dp.plan_stages(channels, out_dtype, data.dtype, None if ew is None else np.int8, bs=stages["bs"],
                          bs_alu=alu, bs_cpend=0, bs_mul=mul, bn=None, bn_alu=0, bn_mul=1, ew=ew, cvt=stages["cvt"])
    if plan.chain is None:
        return
    words = np.full((surfaces * (c2 + gap)) // 8 + 6, SENTINEL, np.uint64)
    out = words.view(np.int8)
    offsets = (16 + np.arange(surfaces) * (c2 + gap)).astype(np.int64)  # (an atom a surface, ``gap`` bytes apart)
    run = dpu_atoms.prepare_chain_atoms(plan.chain[0], plan.floats, channels, 1, 1, c2, out, offsets)
    needed = -(-channels // c2)
    passed = None if ew is None else np.ascontiguousarray(_atoms(operand, c2, needed)[:, :1])
    assert run(_atoms(data, c2, needed), passed)
    expected = expected_cube(data.astype(np.int64), np.zeros((1, 1, 1), np.int64), alu, np.zeros(channels), mul,
                             (0, 1), operand, stages, out_dtype)
    want = as_atoms(expected, c2, surfaces, out_dtype).reshape(surfaces, c2)
    np.testing.assert_array_equal(np.array([out[at:at + c2] for at in offsets.tolist()]), want)
    between = np.ones(out.size, bool)  # (nothing written outside the atoms)
    for at in offsets.tolist():
        between[at:at + c2] = False
    untouched = np.full(words.size, SENTINEL, np.uint64).view(np.int8)
    np.testing.assert_array_equal(out[between], untouched[between])


def test_pixel_major_conversions_of_more_channels_than_a_block():
    for channels, width, seed in ((BLOCK + 37, 2, 5), (2 * BLOCK + 16, 1, 6)):
        stage = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=3)
        small_maps.test_small_maps_match_the_unit_stages.hypothesis.inner_test(
            channels, 1, width, 16, stage, stage, True, "channel", 30177, 0, 0, 14, seed)
